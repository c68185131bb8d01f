#!/usr/bin/env python3
"""Writes the tokenizer test corpus into tests/text/tokenizer/corpus/.

Every file is one test case for the tokenizer comparison against Hugging
Face's JS tokenizers (see hf_reference.mjs and README.md next to this script).
The output is deterministic (no randomness from the environment, no dates):
running the script again rewrites byte-identical files, and `git diff` after a
run shows only deliberate changes to this script's content.

Usage: python3 tests/text/tokenizer/make_corpus.py [OUT_DIR]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")

# (file name, one-line description for corpus/README.md, bytes)
FILES = []


def add(name, description, content):
    """content: str (written as UTF-8, exactly as given) or bytes."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    FILES.append((name, description, data))


def lcg_letters(n, seed):
    """n pseudo-random lowercase ASCII letters from a fixed 32-bit LCG."""
    out = []
    x = seed
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(chr(ord("a") + (x >> 16) % 26))
    return "".join(out)


# --------------------------------------------------------------------------
add("english_prose.txt", "English prose: several paragraphs, quotes, dashes, "
    "abbreviations, parentheses, a few curly quotes and an ellipsis.", """\
The lighthouse keeper had kept the same notebook for thirty-one years. Every
evening, before the lamp was lit, he wrote down the wind, the height of the
swell and the number of ships he had counted since morning. Most entries were
short: "NW, moderate; 4 ships." Some ran to a page or more, usually when a storm
had come through and he had not slept.

When the inspector from the harbour board arrived in the spring, she asked to
see the notebook. He handed it over without a word. She read for a long time,
turning the pages slowly, and then she said something he did not expect: "You
should have been a meteorologist, Mr. Hale." He laughed (it was the first time
anyone on the island had heard him laugh in years) and said that the sea had
been teacher enough.

The board's report, filed in May, recommended that the light be automated by
the end of the following year. It noted, in a paragraph that most readers
skipped, that the keeper's records were "of considerable scientific value" and
should be preserved. Nobody was quite sure who would do the preserving -- the
museum in town? the university? the keeper himself? -- and so, for a while,
nothing happened at all.

In the end it was his granddaughter who typed them up, one winter, on an old
laptop with a sticky "e" key. It took her four months. She found things in the
notebooks that nobody had noticed: a list of birds, a recipe for fish soup, a
half-finished letter to someone called Anna, and, on the last page, a single
line written in much smaller letters than the rest… “Calm today. No ships.”

Q: Why did the U.S.A. and the U.K. sign the treaty? A: Nobody knows, e.g.
because of the weather, i.e. the fog. See pp. 12-14, vol. III, etc.
""")

# --------------------------------------------------------------------------
add("code_python.txt", "Python code: 4-space indentation, a tab-indented "
    "function, nested blocks, strings with escapes, comments, decorators.", (
    "#!/usr/bin/env python3\n"
    "\"\"\"Small module used as a tokenizer test case.\"\"\"\n"
    "import collections\n"
    "from typing import Dict, List\n"
    "\n"
    "\n"
    "class WordCounter:\n"
    "    \"\"\"Counts words; ignores case.\"\"\"\n"
    "\n"
    "    def __init__(self, min_count: int = 1) -> None:\n"
    "        self.min_count = min_count\n"
    "        self._counts: Dict[str, int] = collections.Counter()\n"
    "\n"
    "    def add(self, text: str) -> None:\n"
    "        for word in text.lower().split():\n"
    "            word = word.strip(\".,;:!?\\\"'()[]{}\")\n"
    "            if not word:\n"
    "                continue\n"
    "            self._counts[word] += 1\n"
    "\n"
    "    @property\n"
    "    def frequent(self) -> List[str]:\n"
    "        return sorted(w for w, c in self._counts.items() if c >= self.min_count)\n"
    "\n"
    "\n"
    "def tab_indented(xs):\n"
    "\tresult = []\n"
    "\tfor i, x in enumerate(xs):\n"
    "\t\tif i % 2 == 0:\n"
    "\t\t\tresult.append(x ** 2)\n"
    "\t\telse:\n"
    "\t\t\tresult.append(-x)\n"
    "\treturn result\n"
    "\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    wc = WordCounter(min_count=2)\n"
    "    wc.add(\"the cat and the hat\\nand the bat\\t(tab)\")\n"
    "    print(f\"{len(wc.frequent)} frequent: {wc.frequent!r}\")  # -> 2 frequent\n"
    "    print(tab_indented([1, 2, 3, 4]), {'a': 1, \"b\": [2, 3]}, None, True)\n"
    "    assert 0x1F == 31 and 1_000 == 1000 and 1e-3 < 0.01, 'math'\n"
))

# --------------------------------------------------------------------------
add("code_cpp.txt", "C++ code: tab indentation, a 2-space indented block, "
    "templates, operators (::, ->, <<, >>=), comments, raw string, macros.", (
    "// Copyright example. Not part of the build.\n"
    "#include <cstdint>\n"
    "#include <string>\n"
    "#include <vector>\n"
    "\n"
    "#define FD_CHECK(cond) do { if (!(cond)) std::abort(); } while (0)\n"
    "\n"
    "namespace demo {\n"
    "\n"
    "template <typename T, std::size_t N = 4>\n"
    "class RingBuffer {\n"
    " public:\n"
    "\tvoid push(const T& value) {\n"
    "\t\tdata_[head_] = value;\n"
    "\t\thead_ = (head_ + 1) % N;\n"
    "\t\tif (size_ < N) ++size_;\n"
    "\t}\n"
    "\n"
    "\t[[nodiscard]] std::size_t size() const noexcept { return size_; }\n"
    "\n"
    " private:\n"
    "\tT data_[N]{};\n"
    "\tstd::size_t head_ = 0, size_ = 0;\n"
    "};\n"
    "\n"
    "inline std::uint32_t hash(const std::string& s) {\n"
    "  std::uint32_t h = 2166136261u;\n"
    "  for (unsigned char c : s) {\n"
    "    h ^= c;\n"
    "    h *= 16777619u;\n"
    "  }\n"
    "  h >>= 1; h <<= 1;\n"
    "  return h;\n"
    "}\n"
    "\n"
    "}  // namespace demo\n"
    "\n"
    "int main(int argc, char** argv) {\n"
    "\tdemo::RingBuffer<int> rb;\n"
    "\tfor (int i = 0; i < argc; ++i) rb.push(i);\n"
    "\tauto* p = &rb;\n"
    "\tFD_CHECK(p->size() <= 4 && argv != nullptr);\n"
    "\tconst char* raw = R\"(a \"raw\" string\\n with (parens))\";\n"
    "\treturn raw[0] == 'a' ? 0 : 1;  /* done */\n"
    "}\n"
))

# --------------------------------------------------------------------------
ws_lines = []
for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64):
    ws_lines.append("x" + " " * n + "y")
ws_lines += [
    "",
    " " * 1,
    " " * 4,
    " " * 40,
    "\t",
    "\t\t\t\t",
    " \t \t  \t\t   \t",
    "trailing one ",
    "trailing four    ",
    "trailing tab\t",
    "trailing mixed \t  \t ",
    "    four leading spaces",
    "\ttab leading",
    "\t\t  two tabs two spaces",
    "a \tb\t c \t d",
    "end of sentence.  Two spaces.   Three spaces.",
    "",
    "",
    "   ",
    "words  with  double  spaces  between  them",
]
add("whitespace.txt", "Whitespace runs: 1..64 spaces between letters, tab "
    "runs, mixed tabs/spaces, trailing spaces and tabs before newlines, lines "
    "of only spaces/tabs, and the file ends in spaces without a newline.",
    "\n".join(ws_lines) + "\n" + "last line then spaces" + " " * 5)

# --------------------------------------------------------------------------
crlf = [
    "First line with CRLF ending.",
    "Second line, trailing spaces before CRLF   ",
    "",
    "",
    "def f(x):",
    "    return x + 1",
    "\tindented with a tab",
    "lone CR\rinside a line",
    "CR CR LF next\r",
    "  ",
    "last line",
]
add("crlf.txt", "CRLF line endings (Windows): blank CRLF lines, trailing "
    "spaces before CRLF, a lone CR in a line, CR CR LF, code lines.",
    "\r\n".join(crlf) + "\r\n")

# --------------------------------------------------------------------------
blank = ["paragraph one"]
for n in (2, 3, 4, 5, 6, 8, 10, 16, 20):
    blank.append("\n" * n + "after %d newlines" % n)
blank.append("\n \n  \n\t\nafter blank lines holding spaces and a tab")
blank.append("\n\n\n\n\n\n")
add("blank_lines.txt", "Runs of blank lines: 2..20 newlines between lines, "
    "blank lines that hold spaces/tabs, and the file ends in 7 newlines.",
    "".join(blank))

# --------------------------------------------------------------------------
add("numbers.txt", "Digits and numbers: 1234567890, 3.14159, dates and "
    "times, 1,000,000, signs, exponents, hex, long digit runs, percent and "
    "currency, ordinals, versions, IPs, fullwidth/Arabic-Indic/Devanagari "
    "digits, superscripts, fractions, Roman numerals, circled numbers.", """\
1234567890
0 1 12 123 1234 12345 123456 1234567 12345678 123456789
3.14159 2.718281828 0.5 .5 5. -0.001 +42 -42
1,000,000 and 1.000.000 and 1 000 000 and 1_000_000
Dates: 2024-01-15, 15/01/2024, 01.15.2024, Jan 15th, 2024; time 12:30:45.678 UTC+05:30
1e10 1E-10 6.022e23 0x1F 0xDEADBEEF 0b1010 0o777
99.99% $1,234.56 €5 £3.50 ¥1000 ₹250
1st 2nd 3rd 4th 21st 101st
v1.2.3 version 10.0.19045 build-2024
192.168.0.1 and 2001:db8::1 and port :8080
Phone: +1 (555) 123-4567
123456789012345678901234567890123456789012345678901234567890
3141592653589793238462643383279502884197169399375105820974944
１２３４５ (fullwidth) ٠١٢٣٤٥٦٧٨٩ (Arabic-Indic) ۰۱۲۳ (Persian) १२३४ (Devanagari) ๑๒๓ (Thai)
x² + y³ = z⁴, H₂O, ½ ¼ ¾ ⅓, Ⅻ ⅻ Ⅳ, ① ② ⑳, 𝟏𝟐𝟑
""")

# --------------------------------------------------------------------------
add("contractions.txt", "Contractions in every case: It's/IT'S/it'S, "
    "we'Ll, you'RE, don't, I'm, they've, he'd, curly apostrophes, the long s "
    "U+017F in 'ſ and ſ words, leading/trailing apostrophes.", """\
It's IT'S it'S iT's
we'll WE'LL we'Ll We'lL
you're YOU'RE you'RE You'Re
don't DON'T Don't doN'T can't won't shouldn't've
I'm I'M i'm I'M
they've THEY'VE they'Ve
he'd HE'D he'D she'd
'tis 'Twas 'S 's 't 're 've 'm 'll 'd 'LL 'RE 'VE 'M 'D
rock'n'roll o'clock y'all ma'am ''s '''s
it’s don’t we’ll (curly apostrophe U+2019)
it'ſ IT'ſ 'ſ ſ ſtraße Weſt Maſs (long s U+017F)
John's car, James' car, the '90s, the 1990's, 5'11"
He said 'hello' and 'goodbye'.
""")

# --------------------------------------------------------------------------
add("punctuation.txt", "Punctuation runs: !!!, ???, ..., dashes, arrows, "
    "brackets, symbols, quotes, long rules (-----, =====), underscores, "
    "Markdown/code fences, Unicode punctuation (guillemets, CJK, inverted).", """\
Wait!!! Really??? Hmm... What?! No?!?! Yes!!!!!!!!!!
-- --- — – ‐ -> => <= >= != == === !== <=> :: ::= ... .... ……
((())) [[[]]] {{{}}} <<<>>> ([{<>}])
@#$%^&*()_+-=~`|\\/ ;:'",.<>?
/// \\\\\\ ~~~ ``` ''' \"\"\" *** ### ___ +++ ---
------------------------------------------------------------
============================================================
************************************************************
____________________________________________________________
# Heading
## Sub-heading
- item *emphasis* **strong** `code` [link](http://example.com/a_b?c=d&e=f#g)
> quoted text
```python
print("hi")
```
«Bonjour», „Hallo“, “Hello”, ‘hi’, ¿Qué? ¡Sí! ‽ ※ § ¶ † ‡ • · °
、。「」『』【】〔〕（）！？：；，．
email: someone@example.com, path: C:\\Users\\x\\file.txt, url: https://a.b/c
""")

# --------------------------------------------------------------------------
add("emoji.txt", "Emoji: single, with skin tones, ZWJ sequences (family, "
    "profession, rainbow flag), country flags (regional indicators), a tag "
    "sequence flag, keycaps, VS15/VS16 variation selectors, emoji glued to "
    "words.", """\
😀 😃 😄 😁 😆 😅 😂 🤣 🥲 ☺\ufe0f 😊
👍 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 👋🏽 🤝
👨\u200d👩\u200d👧\u200d👦 👩\u200d❤\ufe0f\u200d👨 🧑🏿\u200d💻 👩🏽\u200d🚀 🏳\ufe0f\u200d🌈 🏴\u200d☠\ufe0f
🇺🇸 🇯🇵 🇫🇷 🇩🇪 🇧🇷 🇮🇳 🇺🇦 🇪🇺
🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f (Scotland tag sequence)
1\ufe0f\u20e3 2\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3
❤\ufe0f ❤ ☺\ufe0e ✔\ufe0f ✔ ♠\ufe0f ♥
hello😀world 😀😀😀 ok👍 🎉Party🎉 I❤\ufe0fNY
Emoji at end 🚀
""")

# --------------------------------------------------------------------------
add("cjk.txt", "CJK: Simplified and Traditional Chinese, Japanese "
    "(hiragana, katakana, kanji, half-width katakana), Korean Hangul, "
    "fullwidth Latin, ideographic space U+3000, a supplementary-plane "
    "ideograph.", """\
今天天气很好，我们去公园散步吧。机器学习是人工智能的一个分支。
我們今天討論的是繁體中文的處理問題。臺灣、香港與澳門。
日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。
東京は日本の首都で、人口は約千四百万人です。
ｶﾀｶﾅ ﾃｷｽﾄ（半角）とＡＢＣ１２３（全角）
한국어 텍스트입니다. 안녕하세요, 만나서 반갑습니다!
대한민국의 수도는 서울입니다.
中文English混合mixed日本語と한국어
全角空白　がここに　あります
𠀀𠀁𠮷 (CJK Extension B)
""")

# --------------------------------------------------------------------------
add("rtl_arabic_hebrew.txt", "Right-to-left scripts: Arabic (with and "
    "without harakat, Arabic digits, tatweel), Persian with ZWNJ, Hebrew (with "
    "and without niqqud), LRM/RLM marks, mixed LTR/RTL.", """\
مرحبا بالعالم. هذا نص عربي للاختبار.
اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ
العدد ١٢٣ والعدد 456 في جملة واحدة، وكلمة مـــــمـــدودة.
می\u200cخواهم فارسی بنویسم (نیم\u200cفاصله)
שלום עולם! זהו טקסט בעברית.
בְּרֵאשִׁית בָּרָא אֱלֹהִים
Mixed: the word שלום means peace, and سلام too.
LRM:\u200ex\u200e RLM:\u200fy\u200f end
""")

# --------------------------------------------------------------------------
add("indic_thai.txt", "Devanagari (Hindi, with conjuncts, virama, nukta, "
    "danda), Bengali, Tamil, and Thai (no spaces between words, tone "
    "marks).", """\
नमस्ते दुनिया। यह हिंदी में एक परीक्षण वाक्य है।
क्षत्रिय, ज्ञान, श्रीमान, द्वार, ज़िंदगी, फ़ोन॥
संस्कृतम् भाषा अतीव प्राचीना अस्ति।
আমি বাংলায় গান গাই।
தமிழ் ஒரு செம்மொழி.
สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ
ประเทศไทยมีเมืองหลวงชื่อกรุงเทพมหานคร
""")

# --------------------------------------------------------------------------
NFD_E = "e\u0301"
add("combining_marks.txt", "Combining marks: decomposed é (e + U+0301) and "
    "other NFD text that NFC composes, the same words precomposed, marks in "
    "non-canonical order, singletons (U+212B, U+2126), a composition exclusion "
    "(U+0958), conjoining Hangul jamo that NFC composes, compatibility jamo, "
    "stacked marks, a mark at the start of a line.", (
    "caf" + NFD_E + " caf\u00e9 (decomposed, then precomposed)\n"
    "r" + NFD_E + "sum" + NFD_E + " r\u00e9sum\u00e9 na\u0131\u0308ve nai\u0308ve na\u00efve\n"
    "Espan\u0303a Espa\u00f1a, U\u0308ber \u00dcber, A\u030angstro\u0308m "
    "\u00c5ngstr\u00f6m \u212bngstr\u00f6m\n"
    "Ohm: \u2126 vs \u03a9; Kelvin: \u212a vs K\n"
    "order: a\u0301\u0323 a\u0323\u0301 \u1ea1\u0301 q\u0307\u0323 q\u0323\u0307\n"
    "Vi\u0065\u0302\u0323t Nam: Tie\u0302\u0301ng Vie\u0323\u0302t / "
    "Ti\u1ebfng Vi\u1ec7t\n"
    "U+0344: \u0344 and U+0958: \u0958 vs \u0915\u093c\n"
    "jamo: \u1112\u1161\u11ab\u1100\u1173\u11af (conjoining) "
    "\ud55c\uae00 (syllables) \u314e\u314f\u3134 (compatibility)\n"
    "\u0301 starts this line with a combining acute\n"
    "zalgo: Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319"
    "\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0336\u0317\u0320"
    "L\u0334\u0353G\u0335O\u0337\n"
    "ligatures: \ufb01 \ufb02 \ufb00 (not changed by NFC)\n"
))

# --------------------------------------------------------------------------
add("cyrillic_greek.txt", "Cyrillic (Russian, Ukrainian, Serbian) and Greek "
    "(monotonic with tonos, polytonic, final sigma, uppercase).", """\
Привет, мир! Это тестовый текст на русском языке.
СЪЕШЬ ЖЕ ЕЩЁ ЭТИХ МЯГКИХ ФРАНЦУЗСКИХ БУЛОК.
Їжак, ґанок, Європа — українська мова.
Ђорђе, Љубљана, Његош, Џеп.
Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο.
ΟΔΥΣΣΕΥΣ, ὀδυσσεύς, σοφός, ἀρχὴ ἥμισυ παντός.
""")

# --------------------------------------------------------------------------
add("math_symbols.txt", "Mathematics: Unicode operators and relations, "
    "super/subscripts, set and logic symbols, arrows, mathematical "
    "alphanumerics (supplementary plane), LaTeX and ASCII formulas.", """\
∀x ∈ ℝ: x² ≥ 0, ∃y ∈ ℕ: y ≠ 0
∑_{i=1}^{n} i = n(n+1)/2 and ∏ᵢ aᵢ, ∫₀^∞ e^{-x²} dx = √π/2
≤ ≥ ≠ ≈ ≡ ∞ ∂ ∇ ∆ ∈ ∉ ⊂ ⊆ ∪ ∩ ∧ ∨ ¬ ⊕ ⊗ → ← ↔ ⇒ ⇔ ↦ ∘ ⋅ × ÷ ± ∓ ∝ ∠ ⊥ ∥
𝔸𝔹ℂ 𝕒𝕓𝕔 𝒜ℬ𝒞 𝐀𝐁𝐂 𝑥𝑦𝑧 α β γ δ ε θ λ μ π σ φ ω Δ Σ Ω
\\frac{a}{b} + \\sqrt{x^2 + y^2} \\leq \\sum_{k=0}^{\\infty} \\binom{n}{k}
a^2 + b^2 = c^2; x*y/z - (a+b)%c >= 0 && f(x) != g(x)
""")

# --------------------------------------------------------------------------
add("special_tokens.txt", "Strings that are special/added tokens of the "
    "five tokenizers, with spaces around them, glued to words, adjacent, at "
    "line starts and ends, plus near-misses that must not match.", """\
Hello <|endoftext|> world
Hello<|endoftext|>world
<|begin_of_text|>Hi there<|eot_id|>
<|begin_of_text|><|start_header_id|>user<|end_header_id|>

What is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

4<|eot_id|>
<|im_start|>system
You are helpful.<|im_end|>
<|im_start|>user
Hi!<|im_end|>
<|im_start|>assistant
<think>

</think>

Hello!<|im_end|>
<s>[INST] What is the capital of France? [/INST] Paris</s>
<s> spaced </s> and<s>glued</s>words and <unk> and x<unk>y
<bos><start_of_turn>user
hello<end_of_turn>
<start_of_turn>model
hi there<end_of_turn>
  <s>  two spaces around  </s>\x20\x20
<s><s></s></s><unk><unk>
a <bos> b<bos>c <eos> <pad> <mask> [multimodal] <unused0> <tool_call>x</tool_call>
near misses: <|endoftext| <|endoftext |> < s> <S> <<s>> </ s> <|im_start> <start_of_turn
ends with a special token <|endoftext|>""")

# --------------------------------------------------------------------------
add("leading_space.txt", "Starts with a single space (Metaspace/prefix "
    "space handling); a second line starts with three spaces.",
    " Hello world, this file starts with a space.\n"
    "   and this line with three.\n")

add("leading_newline.txt", "Starts with a newline, then text.",
    "\nThe first line of this file is empty.\nSecond line.\n")

# --------------------------------------------------------------------------
add("long_word.txt", "Very long words: 2000 pseudo-random lowercase letters "
    "on line 1, 2000 times 'a' on line 2, then a short line.",
    lcg_letters(2000, seed=20240601) + "\n" + "a" * 2000 + "\nshort\n")

add("long_emoji_run.txt", "Long runs of one emoji: 1000 x U+1F600 on line 1, "
    "200 x the flag of Japan (regional-indicator pair) on line 2.",
    "\U0001F600" * 1000 + "\n" + "\U0001F1EF\U0001F1F5" * 200 + "\n")

# --------------------------------------------------------------------------
add("unicode_whitespace_controls.txt", "Unicode whitespace other than ASCII "
    "(NBSP, U+1680, U+2000..U+200A, U+2028/U+2029, U+202F, U+205F, U+3000), "
    "VT and FF, zero-width characters, ASCII and C1 controls (NUL, ESC "
    "sequences, DEL; never U+0085), soft hyphen, replacement character, "
    "private use and noncharacters up to U+10FFFF.", (
    "nbsp:a\u00a0b\u00a0\u00a0c ogham:a\u1680b\n"
    "en/em spaces:" + "".join("x" + chr(c) for c in range(0x2000, 0x200B)) + "x\n"
    "narrow nbsp:a\u202fb math space:a\u205fb ideographic:a\u3000b\n"
    "line sep:a\u2028b para sep:a\u2029b\n"
    "vt:a\x0bb ff:a\x0cb trailing vt\x0b\n"
    "zero width: a\u200bb a\u200cb a\u200db a\u2060b\n"
    "controls: nul[\x00] soh[\x01] bel[\x07] bs[\x08] esc[\x1b[31mred\x1b[0m] "
    "del[\x7f] us[\x1f]\n"
    "c1: [\u0080][\u0081][\u008a][\u009f] soft\u00adhyphen\n"
    "replacement: \ufffd and private use: \ue000\U000F0000 "
    "noncharacters: \ufffe\uffff\U0010FFFF\n"
))

# --------------------------------------------------------------------------
add("empty.txt", "Empty file (0 bytes).", b"")

# --------------------------------------------------------------------------
add("invalid_utf8.bin", "Invalid UTF-8 (decoded with WHATWG maximal-subpart "
    "U+FFFD replacement): lone continuation bytes, truncated 2/3/4-byte "
    "sequences (also at EOF), overlong encodings, UTF-16 surrogates encoded "
    "in UTF-8 (also a CESU-8 pair), 0xFE/0xFF, 0xF5..0xF7 and 5-byte forms, "
    "code points above U+10FFFF, Latin-1 bytes, all between valid text.", b"".join([
        b"valid ASCII first line\n",
        b"lone continuation: [\x80] [\xbf] a\x80\x80b \x80\x81\x82\x83\n",
        b"truncated: [\xc3] [\xe2\x82] [\xf0\x9f\x98] x\xc3y \xe2\x82\xac ok\n",
        b"overlong: [\xc0\xaf] [\xc1\xbf] [\xe0\x80\xaf] [\xf0\x80\x80\xaf] "
        b"nul[\xc0\x80]\n",
        b"surrogates: [\xed\xa0\x80] [\xed\xbf\xbf] cesu8 "
        b"[\xed\xa0\xbd\xed\xb8\x80]\n",
        b"bad lead: [\xfe] [\xff] [\xff\xfe] [\xf5\x80\x80\x80] "
        b"[\xf8\x88\x80\x80\x80] [\xf4\x90\x80\x80]\n",
        b"latin1: caf\xe9 na\xefve \xa9 2024\n",
        "valid after: caf\u00e9 \u65e5\u672c \U0001F600\n".encode("utf-8"),
        b"\xe6\x97\xa5\xe6\x97 mixed \xe6\x97\xa5 \xf0\x9f\x98\x80\xf0\x9f\x98\n",
        b"ends with a truncated emoji \xf0\x9f",
    ]))


# --------------------------------------------------------------------------
def readme():
    lines = [
        "# Tokenizer test corpus",
        "",
        "Generated by `../make_corpus.py` (deterministic; edit the script, not",
        "these files, then run `python3 tests/text/tokenizer/make_corpus.py`).",
        "Each file is one test case; `../hf_reference.mjs` also makes one case",
        "per non-empty line of each file. This README is not a test case: pass",
        "`corpus/*.txt corpus/*.bin` to the harness.",
        "",
        "Caveat: no UTF-8 file here contains U+0085 (NEXT LINE) or U+FEFF",
        "(BOM / ZERO WIDTH NO-BREAK SPACE). JavaScript's `\\s` differs from the",
        "Rust `tokenizers` crate on exactly these two code points (JS: U+FEFF",
        "is whitespace, U+0085 is not), and Hugging Face's JS port still uses",
        "`\\s` in places (e.g. GPT-2's ByteLevel pre-tokenizer regex), so its",
        "output there is not a valid reference. `make_corpus.py` checks this.",
        "",
        "| file | bytes | covers |",
        "| --- | ---: | --- |",
    ]
    for name, description, data in sorted(FILES):
        lines.append("| `%s` | %d | %s |" % (name, len(data), description))
    lines.append("")
    return "\n".join(lines).encode("utf-8")


def main():
    names = [n for n, _, _ in FILES]
    assert len(names) == len(set(names)), "duplicate file name"
    total = 0
    for name, _, data in FILES:
        total += len(data)
        if name.endswith(".txt"):
            text = data.decode("utf-8")  # strict: must be valid UTF-8
            for bad in ("\u0085", "\ufeff"):
                assert bad not in text, "%s contains U+%04X" % (name, ord(bad))
        assert not data.startswith(b"\xef\xbb\xbf"), name
    assert total <= 300 * 1024, "corpus is %d bytes" % total
    os.makedirs(OUT_DIR, exist_ok=True)
    # Remove stale cases (renamed or dropped from this script).
    for old in sorted(os.listdir(OUT_DIR)):
        if old.endswith((".txt", ".bin")) and old not in names:
            os.remove(os.path.join(OUT_DIR, old))
            print("make_corpus: removed stale %s" % old)
    # Byte-exact checkout (CRLF, trailing spaces) whatever core.autocrlf says.
    gitattributes = b"# Written by make_corpus.py: test cases are bytes, not text.\n* -text\n"
    for name, _, data in FILES + [("README.md", "", readme()),
                                  (".gitattributes", "", gitattributes)]:
        with open(os.path.join(OUT_DIR, name), "wb") as f:
            f.write(data)
    print("make_corpus: wrote %d files (%d bytes) to %s"
          % (len(FILES), total, os.path.relpath(OUT_DIR)))


if __name__ == "__main__":
    main()
