#!/usr/bin/python3
"""Golden data for lib/quant: bitsandbytes' 4-bit blockwise quantization, re-derived in NumPy.

bitsandbytes cannot be installed where fdtrain's tests run, so this script re-implements the
algorithm its CUDA build computes (what transformers' load_in_4bit runs), from the semantics of
its source, independently of lib/quant:

  bitsandbytes/functional.py   quantize_4bit, dequantize_4bit, quantize_blockwise,
                               dequantize_blockwise, create_dynamic_map, get_4bit_type
  csrc/kernels.cu              kQuantizeBlockwise / kQuantizeBlockwiseSmall (absmax, 1.0f/absmax,
                               value * reciprocal), dQuantizeNF4 / dQuantizeFP4 (decision trees),
                               dQuantize<0> (8-bit binary search), kDequantizeBlockwise
                               (lut[code] * absmax, code[q] * absmax)
  CMakeLists.txt               --use_fast_math: -ftz=true (subnormal inputs and results of float
                               ops flushed to sign-preserving zero), -prec-div=false

Every float32 operation is a NumPy float32 operation (IEEE, round to nearest even); the
flush-to-zero of the fast-math build is applied explicitly (ftz()). Two things are modelled,
not bit-copied, and docs/QUANTIZATION.md says so: the reciprocal 1.0f/absmax is taken correctly
rounded (the GPU's approximate reciprocal is within 1 ulp of it), and the double-quantization
offset, torch's absmax.mean(), is taken as the float32 nearest the exact mean.

Writes tests/quant/golden/*.json (run from the repository root, or pass the output folder):
    /usr/bin/python3 scripts/make_quant_golden.py [tests/quant/golden]
"""

import hashlib
import json
import os
import sys
from fractions import Fraction

import numpy as np

F32 = np.float32
TINY = np.finfo(np.float32).tiny  # smallest normal float32


# ---------------------------------------------------------------------------- float32 helpers


def f32_from_decimal(text):
    """The float32 nearest the decimal literal `text` (what a C/CUDA `f` literal means)."""
    exact = Fraction(text)
    return f32_nearest(exact)


def f32_nearest(exact):
    """The float32 nearest an exact rational (ties to even); finite inputs only."""
    guess = F32(float(exact))  # within one float32 ulp
    best = None
    cands = [np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))]
    for c in cands:
        d = abs(Fraction(float(c)) - exact)
        if best is None or d < best[0] or (d == best[0] and (int(bits32(c)) & 1) == 0):
            best = (d, c)
    return F32(best[1])


def bits32(x):
    return np.array([x], dtype=np.float32).view(np.uint32)[0]


def from_bits32(u):
    return np.array([u], dtype=np.uint32).view(np.float32)[0]


def ftz(x):
    """Flush a float32 subnormal to a zero of the same sign (nvcc -ftz=true)."""
    x = F32(x)
    if x != 0 and abs(x) < TINY:
        return F32(-0.0) if np.signbit(x) else F32(0.0)
    return x


def mul_ftz(a, b):
    with np.errstate(invalid="ignore", over="ignore"):
        return ftz(F32(ftz(a) * ftz(b)))


def bf16_rne(x):
    """float32 -> bfloat16 bits, round to nearest even (__float2bfloat16, torch .to(bf16))."""
    u = int(bits32(x))
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return u >> 16


# ---------------------------------------------------------------------------- 4-bit tables

# csrc/kernels.cu, nf4_dequantization_lut (same decimals as get_4bit_type('nf4')).
NF4_DECIMALS = [
    "-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
    "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0.0",
    "0.07958029955625534", "0.16093020141124725", "0.24611230194568634", "0.33791524171829224",
    "0.44070982933044434", "0.5626170039176941", "0.7229568362236023", "1.0",
]
# csrc/kernels.cu, fp4_dequantization_lut (magnitudes by the 3 low bits; bit 3 is the sign).
FP4_LUT_DECIMALS = ["0.0", "0.005208333333", "0.66666667", "1.0", "0.33333333", "0.5",
                    "0.16666667", "0.25"]
# csrc/kernels.cu, dQuantizeNF4's literals, in the order the tree tests them.
NF4_TREE = {
    "root": "0.03979014977812767",
    "1": "0.3893125355243683", "11": "0.6427869200706482", "111": "0.8614784181118011",
    "110": "0.5016634166240692", "10": "0.2035212516784668", "101": "0.2920137718319893",
    "100": "0.1202552504837513", "0": "-0.33967943489551544", "01": "-0.13791173323988914",
    "011": "-0.045525018125772476", "010": "-0.23460740596055984", "00": "-0.6106329262256622",
    "001": "-0.4599952697753906", "000": "-0.8480964004993439",
}
# csrc/kernels.cu, dQuantizeFP4's literals (on |x|).
FP4_TREE = {"a": "0.29166667", "b": "0.583333", "c": "0.8333333", "d": "0.4166667",
            "e": "0.0859375", "f": "0.20833333", "g": "0.00260417"}

NF4_LUT = [f32_from_decimal(s) for s in NF4_DECIMALS]
FP4_LUT = [f32_from_decimal(s) for s in FP4_LUT_DECIMALS]
T_NF4 = {k: f32_from_decimal(v) for k, v in NF4_TREE.items()}
T_FP4 = {k: f32_from_decimal(v) for k, v in FP4_TREE.items()}


def quant_map_4bit(kind):
    """get_4bit_type(kind): the table saved as weight.quant_map (torch float32 tensor / absmax)."""
    if kind == "nf4":
        data = [F32(float(s)) for s in NF4_DECIMALS]  # torch.tensor(python floats) -> float32
    else:
        data = [F32(v) for v in [0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0,
                                 -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0]]
    m = max(abs(v) for v in data)
    return [F32(v / m) for v in data]


def q_nf4(x):
    """dQuantizeNF4: comparisons `x > t` in float32; NaN fails every test."""
    t = T_NF4
    if x > t["root"]:
        if x > t["1"]:
            if x > t["11"]:
                return 0b1111 if x > t["111"] else 0b1110
            return 0b1101 if x > t["110"] else 0b1100
        if x > t["10"]:
            return 0b1011 if x > t["101"] else 0b1010
        return 0b1001 if x > t["100"] else 0b1000
    if x > t["0"]:
        if x > t["01"]:
            return 0b0111 if x > t["011"] else 0b0110
        return 0b0101 if x > t["010"] else 0b0100
    if x > t["00"]:
        return 0b0011 if x > t["001"] else 0b0010
    return 0b0001 if x > t["000"] else 0b0000


def q_fp4(x):
    """dQuantizeFP4: sign from x < 0 (so -0 and NaN get sign 0), then a tree on |x|."""
    t = T_FP4
    sign = 0b1000 if x < 0 else 0
    a = abs(x)
    if a > t["a"]:
        if a > t["b"]:
            return (0b0011 if a > t["c"] else 0b0010) + sign
        return (0b0101 if a > t["d"] else 0b0100) + sign
    if a > t["e"]:
        return (0b0111 if a > t["f"] else 0b0110) + sign
    return (0b0001 if a > t["g"] else 0b0000) + sign


def deq_4bit_value(kind, code):
    if kind == "nf4":
        return NF4_LUT[code & 0xF]
    sign = F32(1.0) - F32(2 * ((code & 0b1000) >> 3))  # dDequantizeFP4Tree
    return F32(FP4_LUT[code & 0b111] * sign)


# ---------------------------------------------------------------------------- dynamic 8-bit map


def torch_linspace_f32(start, end, steps, vec=0, fma=False):
    """torch.linspace(start, end, steps, dtype=float32) on the CPU (RangeFactoriesKernel.cpp):
    step = (end - start) / (steps - 1) in float32; element i < steps/2 is start + step * i, the
    rest end - step * (steps - i - 1). With vec > 0, the kernel's vectorized chunks (2 vectors
    of `vec` lanes at a time) compute base + lane * step from the chunk's first element instead;
    with fma, a * b + c is fused. Used to show the map does not depend on those variants."""
    start, end = F32(start), F32(end)
    step = F32((end - start) / F32(steps - 1))
    half = steps // 2

    def mad(a, b, c):  # a * b + c
        if fma:
            return f32_nearest(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
        return F32(F32(a * b) + c)

    def msub(c, a, b):  # c - a * b
        if fma:
            return f32_nearest(Fraction(float(c)) - Fraction(float(a)) * Fraction(float(b)))
        return F32(c - F32(a * b))

    def scalar(i):
        return mad(step, F32(i), start) if i < half else msub(end, step, F32(steps - i - 1))

    out = [None] * steps
    i = 0
    if vec:
        while i + 2 * vec <= steps:
            for _ in range(2):
                base = scalar(i)
                for lane in range(vec):
                    out[i + lane] = base if lane == 0 else mad(F32(lane), step, base)
                i += vec
    while i < steps:
        out[i] = scalar(i)
        i += 1
    return out


def create_dynamic_map(vec=0, fma=False):
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)."""
    data = []
    max_exp, non_sign = 7, 7
    for i in range(max_exp):
        items = 2 ** (i + non_sign - max_exp) + 1
        b = torch_linspace_f32(0.1, 1.0, items, vec, fma)
        means = [F32(F32(b[k] + b[k + 1]) / F32(2.0)) for k in range(items - 1)]
        scale = F32(10.0 ** (-(max_exp - 1) + i))  # python scalar * float32 tensor
        data += [F32(scale * m) for m in means]
        data += [F32(F32(-scale) * m) for m in means]
    # additional_items = 2 ** (7 - 7) - 1 = 0: none
    data.append(F32(0.0))
    data.append(F32(1.0))
    assert len(data) == 256
    return sorted(data, key=float)


def dquantize8(code, x):
    """dQuantize<0>: the kernel's 7-step binary search, then the nearer neighbour by midpoint."""
    pivot, upper_pivot, lower_pivot = 127, 255, 0
    lower, upper = F32(-1.0), F32(1.0)
    val = code[pivot]
    i = 64
    while i > 0:
        if x > val:
            lower_pivot, lower = pivot, val
            pivot += i
        else:
            upper_pivot, upper = pivot, val
            pivot -= i
        val = code[pivot]
        i >>= 1
    if upper_pivot == 255:
        upper = code[upper_pivot]
    if lower_pivot == 0:
        lower = code[lower_pivot]
    if x > val:
        mid = ftz(F32(F32(upper + val) * F32(0.5)))
        return upper_pivot if x > mid else pivot
    mid = ftz(F32(F32(lower + val) * F32(0.5)))
    return lower_pivot if x < mid else pivot


# ---------------------------------------------------------------------------- blockwise


def block_absmax(vals):
    m = F32(0.0)
    for v in vals:
        m = max(m, abs(ftz(v)))  # fmaxf(fabsf(x)) under -ftz; padding zeros never raise it
    return F32(m)


def reciprocal(a):
    with np.errstate(divide="ignore"):
        return F32(F32(1.0) / a)  # modelled correctly rounded (see module doc)


def quantize_4bit(w, kind, bs):
    n = len(w)
    nblocks = -(-n // bs)
    absmax = []
    codes = []
    q = q_nf4 if kind == "nf4" else q_fp4
    for b in range(nblocks):
        vals = list(w[b * bs:(b + 1) * bs])
        a = block_absmax(vals)
        absmax.append(a)
        inv = reciprocal(a)
        if len(vals) % 2:
            vals.append(F32(0.0))  # the loader's padding value, quantized into the low nibble
        for v in vals:
            codes.append(q(mul_ftz(v, inv)))
    packed = bytes((codes[2 * k] << 4) | codes[2 * k + 1] for k in range(len(codes) // 2))
    return packed, absmax


def dequantize_4bit(packed, absmax, kind, bs, n):
    out = []
    for k in range(n):
        byte = packed[k // 2]
        code = byte >> 4 if k % 2 == 0 else byte & 0xF
        out.append(mul_ftz(deq_4bit_value(kind, code), absmax[k // bs]))
    return out


def exact_mean_f32(values):
    return f32_nearest(sum(Fraction(float(v)) for v in values) / len(values))


def quantize_blockwise8(x, code, bs=256):
    nblocks = -(-len(x) // bs)
    q, amax = [], []
    for b in range(nblocks):
        vals = x[b * bs:(b + 1) * bs]
        a = block_absmax(vals)
        amax.append(a)
        inv = reciprocal(a)
        for v in vals:
            q.append(dquantize8(code, mul_ftz(v, inv)))
    return bytes(q), amax


def double_quant(absmax, code):
    offset = exact_mean_f32(absmax)
    centred = [F32(a - offset) for a in absmax]  # torch subtraction: IEEE, no flush
    q, nested_absmax = quantize_blockwise8(centred, code)
    return offset, q, nested_absmax


def double_dequant(q, nested_absmax, offset, code, bs=256):
    return [F32(mul_ftz(code[v], nested_absmax[i // bs]) + offset) for i, v in enumerate(q)]


# ---------------------------------------------------------------------------- inputs


def hash_input(n, seed, scale_exp):
    """Deterministic inputs both this script and the C++ test can build from integers: xorshift32
    from `seed`; value = (int(h >> 8) - 2^23) * 2^(scale_exp - 23), exact in float32."""
    h = seed & 0xFFFFFFFF
    out = []
    for _ in range(n):
        h ^= (h << 13) & 0xFFFFFFFF
        h ^= h >> 17
        h ^= (h << 5) & 0xFFFFFFFF
        out.append(F32(((h >> 8) - (1 << 23)) * 2.0 ** (scale_exp - 23)))
    return out


def make_inputs(kind, bs):
    rng = np.random.default_rng(37 + (bs == 128) + 2 * (kind == "fp4"))
    cases = []
    # Ties: in block 0 absmax is 1.0 (element 0), so x = w exactly; every threshold t, its float32
    # neighbours, and the negative side. Then the table values themselves.
    tree = T_NF4 if kind == "nf4" else T_FP4
    lut = NF4_LUT if kind == "nf4" else FP4_LUT
    vals = []
    for t in tree.values():
        for v in (t, np.nextafter(t, F32(np.inf)), np.nextafter(t, F32(-np.inf))):
            vals += [F32(v), F32(-v)]
    vals += [F32(v) for v in lut] + [F32(-v) for v in lut] + [F32(0.0), F32(-0.0)]

    def blocks_led_by(lead, values):  # every block starts with `lead`, its absmax
        out = []
        for k in range(0, len(values), bs - 1):
            chunk = [lead] + values[k:k + bs - 1]
            out += chunk + [F32(0.0)] * (bs - len(chunk))
        return out

    tie = blocks_led_by(F32(1.0), vals)
    # Blocks whose absmax (2.0) makes w * (1/absmax) land exactly on the thresholds too.
    tie2 = blocks_led_by(F32(2.0), [F32(v * F32(2.0)) for v in vals if abs(v) <= 1])
    cases.append(("ties", tie + tie2, [1, len(tie + tie2)]))
    # Zeros and a block of all zeros (+0 and -0), followed by an odd partial block.
    z = [F32(0.0)] * bs + [F32(-0.0) if i % 3 == 0 else F32(0.0) for i in range(bs)]
    z += [F32(0.5), F32(0.0), F32(-0.25)] + [F32(0.0)] * 4
    cases.append(("zeros", z, [1, len(z)]))
    # Subnormals: a block of only subnormals, a block mixing them with normals, a tiny-absmax
    # block whose products and dequantized values are subnormal.
    sub = [from_bits32(u) for u in (1, 2, 0x7FFFFF, 0x400000, 0x80000001, 0x807FFFFF)]
    d1 = (sub * bs)[:bs]
    d2 = ([F32(0.75), F32(-0.5)] + sub * bs)[:bs]
    tiny = TINY
    d3 = ([F32(tiny * F32(4.0)), F32(-tiny), F32(tiny * F32(0.5) * F32(4.0)), F32(tiny * F32(3.0))]
          + [F32(tiny * F32(k % 5)) for k in range(bs)])[:bs]
    cases.append(("subnormals", d1 + d2 + d3, [3, bs]))
    # Negative-only values and mixed magnitudes; the last block partial and odd.
    neg = [F32(-abs(v)) for v in rng.standard_normal(bs + 13).astype(np.float32)]
    cases.append(("negative_partial", neg, [1, len(neg)]))
    # Random normal weights, a [rows, cols] matrix whose size is not a multiple of the block.
    rows, cols = 3, bs + bs // 2 - 5
    w = [F32(v) for v in (rng.standard_normal(rows * cols) * 0.02).astype(np.float32)]
    cases.append(("normal", w, [rows, cols]))
    return cases


# ---------------------------------------------------------------------------- output


def hexf32(vals):
    return np.array(vals, dtype=np.float32).tobytes().hex()


def hexu16(vals):
    return np.array(vals, dtype=np.uint16).tobytes().hex()


def sha(data):
    return hashlib.sha256(data).hexdigest()


def case_json(name, w, shape, kind, bs, dq, dmap, digests_only=False, hash_spec=None):
    n = len(w)
    packed, absmax = quantize_4bit(w, kind, bs)
    assert len(packed) == (n + 1) // 2
    doc = {"name": name, "quant_type": kind, "block_size": bs, "double_quant": dq,
           "shape": shape, "absmax": hexf32(absmax)}
    if hash_spec:
        doc["input_hash"] = hash_spec
    else:
        doc["input"] = hexf32(w)
    eff = absmax
    if dq:
        offset, q, nabs = double_quant(absmax, dmap)
        eff = double_dequant(q, nabs, offset, dmap)
        doc["nested"] = {"block_size": 256, "offset": hexf32([offset]), "codes": q.hex(),
                         "absmax": hexf32(nabs), "dequantized_absmax": hexf32(eff)}
    deq = dequantize_4bit(packed, eff, kind, bs, n)
    deq_bf16 = [bf16_rne(v) for v in deq]
    if digests_only:
        doc["packed_sha256"] = sha(packed)
        doc["dequant_f32_sha256"] = sha(np.array(deq, dtype=np.float32).tobytes())
        doc["dequant_bf16_sha256"] = sha(np.array(deq_bf16, dtype=np.uint16).tobytes())
    else:
        doc["packed"] = packed.hex()
        doc["dequant_f32"] = hexf32(deq)
        doc["dequant_bf16"] = hexu16(deq_bf16)
    return doc


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/quant/golden"
    os.makedirs(out_dir, exist_ok=True)

    # torch's CPU linspace rounds differently by build (vector width, FMA contraction): up to
    # 56 of the 256 entries move by one ulp between the variants below. The map used is the
    # scalar kernel with fused multiply-adds, the one equal to published dumps of
    # create_dynamic_map() (see docs/QUANTIZATION.md); the others are reported, not used.
    dmap = create_dynamic_map(vec=0, fma=True)
    for vec in (0, 4, 8, 16):
        for fma in (False, True):
            other = create_dynamic_map(vec, fma)
            ndiff = sum(bits32(a) != bits32(b) for a, b in zip(dmap, other))
            if ndiff:
                print(f"note: a linspace with vec={vec} fma={fma} moves {ndiff} map entries")
    tables = {
        "nf4_lut": hexf32(NF4_LUT), "fp4_lut": hexf32(FP4_LUT),
        "nf4_quant_map": hexf32(quant_map_4bit("nf4")),
        "fp4_quant_map": hexf32(quant_map_4bit("fp4")),
        "nf4_thresholds": hexf32(list(T_NF4.values())),
        "fp4_thresholds": hexf32(list(T_FP4.values())),
        "dynamic_map": hexf32(dmap),
    }
    # nvcc rounds a float literal straight from the decimal (checked in its PTX); for these
    # literals a detour through double would land elsewhere, which f32_from_decimal avoids.
    for dec in NF4_DECIMALS + FP4_LUT_DECIMALS + list(NF4_TREE.values()) + list(FP4_TREE.values()):
        if bits32(f32_from_decimal(dec)) != bits32(F32(float(dec))):
            print(f"note: {dec}f is 0x{int(bits32(f32_from_decimal(dec))):08x}, not float(double)")
    with open(os.path.join(out_dir, "tables.json"), "w") as f:
        json.dump(tables, f, indent=1)
        f.write("\n")

    written = 1
    for kind in ("nf4", "fp4"):
        for bs in (64, 128):
            for dq in (False, True):
                for name, w, shape in make_inputs(kind, bs):
                    doc = case_json(name, w, shape, kind, bs, dq, dmap)
                    path = os.path.join(out_dir, f"{kind}_b{bs}_{'dq' if dq else 'plain'}_{name}.json")
                    with open(path, "w") as f:
                        json.dump(doc, f, indent=1)
                        f.write("\n")
                    written += 1
        # Double quantization over more than one nested block (300 absmax values: blocks of 256
        # and 44), with nested blocks of very different spread; the input is the xorshift
        # stream (hash_input), so only digests of the 4-bit codes and values are stored.
        bs = 64
        n = 300 * bs - 7
        spec = {"n": n, "seed": 12345 if kind == "nf4" else 777, "scale_exp": -6}
        w = hash_input(n, spec["seed"], spec["scale_exp"])
        for k in range(256 * bs, n):  # the second nested block: larger weights
            w[k] = F32(w[k] * F32(64.0))
        spec["scale_tail_from"] = 256 * bs
        spec["scale_tail_by"] = 64.0
        doc = case_json("many_blocks", w, [1, n], kind, bs, True, dmap, digests_only=True,
                        hash_spec=spec)
        with open(os.path.join(out_dir, f"{kind}_b64_dq_many_blocks.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        written += 1
    print(f"wrote {written} files to {out_dir}")


if __name__ == "__main__":
    main()
