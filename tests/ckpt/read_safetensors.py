#!/usr/bin/env python3
"""An independent safetensors reader (json and struct only; any python3).

Usage: read_safetensors.py FILE
Prints one line per tensor, in file order:
    name<TAB>dtype<TAB>shape<TAB>sum<TAB>fnv1a64
where shape is comma-separated, sum is the float64 sum of the values in
storage order (repr, so it round-trips exactly) and fnv1a64 is the FNV-1a
64-bit hash of the raw little-endian bytes, in hex. Then "__metadata__" lines
as key<TAB>value. Exit 1 with a message on a malformed file.
"""
import json
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "F64": 8, "I64": 8, "U8": 1}


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def values(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "F32":
        return struct.unpack("<%df" % n, raw)
    if dtype == "F64":
        return struct.unpack("<%dd" % n, raw)
    if dtype == "F16":
        return struct.unpack("<%de" % n, raw)
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    if dtype == "I32":
        return struct.unpack("<%di" % n, raw)
    if dtype == "I64":
        return struct.unpack("<%dq" % n, raw)
    return list(raw)


def main(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        sys.exit("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        sys.exit("%s: header length %d exceeds the file" % (path, n))
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    # File order: by data offset.
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = e["data_offsets"]
        numel = 1
        for d in e["shape"]:
            numel *= d
        if e["dtype"] not in SIZES or end - begin != numel * SIZES[e["dtype"]] or end > len(data):
            sys.exit("%s: tensor %s: bad dtype or offsets" % (path, name))
        raw = data[begin:end]
        total = 0.0
        for v in values(e["dtype"], raw):
            total += float(v)
        print("%s\t%s\t%s\t%r\t%016x" % (name, e["dtype"], ",".join(str(d) for d in e["shape"]),
                                          total, fnv1a64(raw)))
    for k in sorted(meta):
        print("__metadata__\t%s\t%s" % (k, meta[k]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
