#!/usr/bin/env bash
# A short fp16 run with evaluation writes RUN/events.out.tfevents.<time>.<host>:
# decoded here independently (TFRecord framing with both CRC-32Cs checked, the
# Event/Summary/Value protobuf fields by hand), it starts with file_version
# "brain.Event:2" and holds, at every step of metrics.jsonl, the scalars of
# that line with equal values (as float32).
source "$(dirname "$0")/common.bash"
PY=/usr/bin/python3
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 8/; s/^  val_fraction: 0.0/  val_fraction: 0.2/' "$R"
"$FDTRAIN" train "$R" precision=fp16 logging.every=2 logging.eval_every=4 --run-dir "$TMP/run" \
  --no-progress > "$TMP/run.log" 2>&1 || { echo "FAIL: training run"; cat "$TMP/run.log"; exit 1; }
ls "$TMP/run"/events.out.tfevents.* > /dev/null || { echo "FAIL: no event file"; exit 1; }

$PY - "$TMP/run" <<'PY' || FAILURES=$((FAILURES+1))
import glob, json, os, re, socket, struct, sys

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF

def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283

def varint(b, i):
    v = shift = 0
    while True:
        v |= (b[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not b[i - 1] & 0x80:
            return v, i

def fields(b):  # protobuf message -> [(field, value)]
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0: v, i = varint(b, i)
        elif wt == 1: v, i = b[i:i + 8], i + 8
        elif wt == 5: v, i = b[i:i + 4], i + 4
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else: raise ValueError(f"wire type {wt}")
        out.append((f, v))
    return out

run = sys.argv[1]
files = glob.glob(f"{run}/events.out.tfevents.*")
assert len(files) == 1, files
assert re.fullmatch(r"events\.out\.tfevents\.\d{10}\." + re.escape(socket.gethostname()),
                    os.path.basename(files[0])), files[0]
data = open(files[0], "rb").read()
events, i = [], 0
while i < len(data):
    (n,) = struct.unpack_from("<Q", data, i)
    (len_crc,) = struct.unpack_from("<I", data, i + 8)
    assert len_crc == masked(crc32c(data[i:i + 8])), f"length CRC at byte {i}"
    rec = data[i + 12:i + 12 + n]
    (data_crc,) = struct.unpack_from("<I", data, i + 12 + n)
    assert data_crc == masked(crc32c(rec)), f"data CRC at byte {i}"
    events.append(fields(rec))
    i += 12 + n + 4
assert i == len(data)

first = dict(events[0])
assert first[3] == b"brain.Event:2", first
scalars = {}  # step -> {tag: value}
for ev in events[1:]:
    d = dict(ev)
    wall = struct.unpack("<d", d[1])[0]
    assert wall > 1.6e9, wall
    step = d[2]
    for f, v in fields(d[5]):
        assert f == 1
        val = dict(fields(v))
        scalars.setdefault(step, {})[val[1].decode()] = struct.unpack("<f", val[2])[0]

f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert [l["step"] for l in lines] == sorted(scalars), (sorted(scalars), [l["step"] for l in lines])
tags = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
        "train/loss_scale": "loss_scale", "train/tokens_per_s": "tokens_per_s",
        "eval/loss": "eval_loss"}
evals = 0
ratios = set()
for l in lines:
    got = scalars[l["step"]]
    for tag, key in tags.items():
        if key in l and l[key] is not None:
            assert got[tag] == f32(l[key]), (l["step"], tag, got[tag], l[key])
        else:
            assert tag not in got, (l["step"], tag)
    evals += "eval/loss" in got
    assert got["memory/peak_tracked_mib"] == f32(l["peak_memory_bytes"] / 2**20)
    assert got["memory/peak_rss_mib"] == f32(l["peak_rss_bytes"] / 2**20)
    ratios.add(round(got["train/effective_gflops"] / got["train/tokens_per_s"], 9))
assert evals == 2, evals  # steps 4 and 8
assert len(ratios) == 1, ratios  # GFLOP/s = tok/s x the model's FLOPs per token
print(f"ok: {len(events) - 1} events at steps {sorted(scalars)} match metrics.jsonl "
      f"({len(got)} tags at the last step, 2 evaluations)")
PY
finish
