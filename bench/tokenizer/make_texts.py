#!/usr/bin/env python3
"""The tokenizer benchmark's text sets, from files every Debian 12 machine with
fdtrain's dependencies has (nothing is downloaded, nothing is committed).

    python3 bench/tokenizer/make_texts.py OUT_DIR

writes OUT_DIR/prose.txt, code.txt and multilingual.txt, and OUT_DIR/SOURCES
(the files each set took, in order, with the bytes taken). The selection is
deterministic: sorted file lists, fixed byte caps, every cut at a line end.
A file that is not valid UTF-8 is dropped, never repaired.

  prose         ~2 MiB  English: /usr/share/common-licenses, then the fortune
                        files (/usr/share/games/fortunes, installed by
                        scripts/install_deps.sh), at most 256 KiB from each.
  code          ~2 MiB  half C++ (/usr/include/c++/12, libstdc++'s headers),
                        half Python (/usr/lib/python3.11, the standard library),
                        at most 32 KiB from each file.
  multilingual  ~1 MiB  translated man pages (/usr/share/man/LANG), rendered by
                        groff as UTF-8, one paragraph per line: 14 languages,
                        about equal shares (Japanese, Chinese, Korean; Russian,
                        Ukrainian, Serbian in Cyrillic; Czech, Polish, Turkish,
                        Portuguese, Italian, Spanish, German, French). Pages
                        still mostly in English (partial translations) are
                        skipped. No Arabic, Hebrew, Greek or Indic text is
                        installed here.

OUT_DIR/STAMP holds a hash of this script; the sets are rebuilt only when it
differs (rendering the man pages takes about a minute on 2 cores).
"""
import concurrent.futures
import gzip
import hashlib
import os
import subprocess
import sys

MIB = 1 << 20
# Fewest translated pages first (see multilingual()). zh_TW is left out: its
# translations put a space between every two characters.
LANGS = [("cs", True), ("sr", False), ("ko", False), ("ja", False), ("zh_CN", False),
         ("ru", False), ("uk", False), ("pl", True), ("tr", True), ("pt_BR", True),
         ("it", True), ("es", True), ("de", True), ("fr", True)]


def cut_at_line(data: bytes, cap: int) -> bytes:
    """The longest prefix of data of at most cap bytes that ends at a line end."""
    if len(data) <= cap:
        return data
    end = data.rfind(b"\n", 0, cap)
    return data[: end + 1] if end >= 0 else b""


def utf8_or_none(data: bytes):
    try:
        data.decode("utf-8")
        return data
    except UnicodeDecodeError:
        return None


def files_under(root, suffixes=None, skip_dirs=()):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            if suffixes is not None and not f.endswith(suffixes):
                continue
            out.append(p)
    return sorted(out)


def take(paths, total_cap, file_cap, sources, read=None):
    """Concatenates valid UTF-8 files (each cut to file_cap) up to total_cap."""
    parts, size = [], 0
    for p in paths:
        if size >= total_cap:
            break
        try:
            data = read(p) if read else open(p, "rb").read()
        except OSError:
            continue
        if not data or utf8_or_none(data) is None:
            continue
        data = cut_at_line(data, min(file_cap, total_cap - size))
        if not data:
            continue
        if not data.endswith(b"\n"):
            data += b"\n"
        parts.append(data)
        size += len(data)
        sources.append(f"{len(data):8d} {p}")
    return b"".join(parts)


def prose(sources):
    licenses = files_under("/usr/share/common-licenses")
    fortunes = [
        p
        for p in files_under("/usr/share/games/fortunes", skip_dirs=("off",))
        if not p.endswith((".dat", ".u8")) and not os.path.basename(p).startswith(("art", "ascii-art"))
    ]
    return take(licenses + fortunes, 2 * MIB, 256 << 10, sources)


def code(sources):
    cpp = take(files_under("/usr/include/c++/12"), MIB, 32 << 10, sources)
    py = take(
        files_under("/usr/lib/python3.11", (".py",), skip_dirs=("test", "tests", "idlelib", "site-packages", "dist-packages")),
        MIB,
        32 << 10,
        sources,
    )
    return cpp + py


def render_man(path):
    """A man page as UTF-8 text: one paragraph per line, no indentation, the
    header and footer lines dropped. groff directly (as man(1) runs it, without
    man's own start-up, which costs more than the rendering)."""
    try:
        with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
            source = f.read()
    except (OSError, EOFError):
        return b""
    r = subprocess.run(
        ["groff", "-k", "-Kutf8", "-mandoc", "-Tutf8", "-rLL=2000n", "-P-cbou"],
        input=source,
        env=dict(os.environ, LC_ALL="C.UTF-8"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    lines = [" ".join(l.split()) for l in r.stdout.decode("utf-8", "replace").split("\n")]
    nonempty = [i for i, l in enumerate(lines) if l]
    if len(nonempty) < 3:
        return b""
    lines = lines[nonempty[0] + 1 : nonempty[-1]]
    text, blank = [], True
    for l in lines:  # squeeze runs of blank lines
        if l or not blank:
            text.append(l)
        blank = not l
    return ("\n".join(text).strip("\n") + "\n").encode("utf-8")


def translated(data: bytes, latin: bool) -> bool:
    """Mostly translated: enough non-ASCII bytes for the language's script."""
    non_ascii = sum(1 for b in data if b >= 0x80)
    return non_ascii >= len(data) * (0.008 if latin else 0.25)


def one_language(lang, latin, cap, pool, sources):
    """Rendered pages of one language, in sorted order, up to cap bytes."""
    pages = files_under(f"/usr/share/man/{lang}")
    parts, size = [], 0
    batch = 2 * (os.cpu_count() or 2)  # rendered in parallel, taken in order
    for start in range(0, len(pages), batch):
        if size >= cap:
            break
        chunk = pages[start : start + batch]
        for p, data in zip(chunk, pool.map(render_man, chunk)):
            if size >= cap:
                break
            if not data or utf8_or_none(data) is None or not translated(data, latin):
                continue
            data = cut_at_line(data, cap - size)
            if not data:
                continue
            parts.append(data)
            size += len(data)
            sources.append(f"{len(data):8d} {p}")
    sources.append(f"# {lang}: {size} bytes")
    return b"".join(parts)


def multilingual(sources):
    # The languages with the fewest translated pages first: what one cannot
    # fill passes to the next (each gets the remaining bytes / languages left).
    langs = [(l, latin) for l, latin in LANGS if os.path.isdir(f"/usr/share/man/{l}")]
    out, size = [], 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for i, (lang, latin) in enumerate(langs):
            data = one_language(lang, latin, (MIB - size) // (len(langs) - i), pool, sources)
            out.append(data)
            size += len(data)
    return b"".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_texts.py OUT_DIR")
    out_dir = sys.argv[1]
    stamp = hashlib.sha256(open(__file__, "rb").read()).hexdigest()
    stamp_path = os.path.join(out_dir, "STAMP")
    names = ["prose", "code", "multilingual"]
    if os.path.exists(stamp_path) and open(stamp_path).read().strip() == stamp:
        if all(os.path.exists(os.path.join(out_dir, n + ".txt")) for n in names):
            return
    os.makedirs(out_dir, exist_ok=True)
    all_sources = []
    for name, make in zip(names, [prose, code, multilingual]):
        sources = []
        data = make(sources)
        if len(data) < 64 << 10:
            sys.exit(f"make_texts: only {len(data)} bytes of {name} text found on this machine "
                     f"(see {__file__} for where it looks)")
        with open(os.path.join(out_dir, name + ".txt"), "wb") as f:
            f.write(data)
        files = sum(1 for s in sources if not s.startswith("#"))
        all_sources.append(f"# {name}.txt: {len(data)} bytes from {files} files")
        all_sources.extend(sources)
        print(f"make_texts: {name}.txt {len(data)} bytes from {files} files", file=sys.stderr)
    with open(os.path.join(out_dir, "SOURCES"), "w") as f:
        f.write("\n".join(all_sources) + "\n")
    with open(stamp_path, "w") as f:
        f.write(stamp + "\n")


if __name__ == "__main__":
    main()
