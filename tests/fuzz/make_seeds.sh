#!/usr/bin/env bash
# make_seeds.sh: the seed corpus of the fuzz harnesses, made from the repository's data and a tiny model
# trained by the trainer itself (so the seeds are exactly what the trainer reads and writes):
#   OUT/tokens     slices of data/devil_train.bin and data/devil_val.bin (shards of 9 to 200 tokens)
#   OUT/tokenizer  the first 64 and 300 entries of data/gpt2_tokenizer.bin (versions 1 and 2)
#   OUT/model      the tiny model (L=1 C=4 NH=1 V=64 maxT=8) after 2 steps, fp32 (version 3) and bf16 (5)
#   OUT/state      its optimizer state: one shard (1 rank), and two shards (2 ranks, ZeRO-1) if mpirun is
#                  there; fuzz_state.cpp takes these sizes to be the model's (TINY_CONFIG there). And the
#                  state of the same model with L=2, which the reader must refuse.
# usage: tests/fuzz/make_seeds.sh TRAINER OUT      (run from the repository root; TRAINER: build/cpu/train_gpt)
set -euo pipefail
BIN=$1
OUT=$2
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$OUT"
mkdir -p "$OUT"/{tokens,tokenizer,model,state,scratch}
W=$OUT/scratch   # the tiny model's data, runs and checkpoints, not seeds

"$PY" - "$OUT" <<'PYEOF'
import struct, sys
out = sys.argv[1]
def shard(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)))
        f.write(struct.pack("<%dH" % len(ids), *ids))
def read_tokens(path):
    d = open(path, "rb").read()
    n = struct.unpack("<i", d[8:12])[0]
    return list(struct.unpack("<%dH" % n, d[1024:1024 + 2 * n]))
train, val = read_tokens("data/devil_train.bin"), read_tokens("data/devil_val.bin")
shard(f"{out}/tokens/train_200.bin", train[:200])
shard(f"{out}/tokens/val_40.bin", val[:40])
shard(f"{out}/tokens/train_9.bin", train[1000:1009])  # exactly one batch of 2x4 (+1)
# training data for the tiny model: ids below its vocabulary of 64
shard(f"{out}/scratch/tiny.bin", [t % 64 for t in train[:400]])

d = open("data/gpt2_tokenizer.bin", "rb").read()
def entries(count):  # the bytes of the first `count` entries (a uint8 length, then the token's bytes)
    pos = 1024
    for _ in range(count):
        pos += 1 + d[pos]
    return d[1024:pos]
for V, version in ((64, 1), (300, 2)):
    header = [20240328, version, V, V - 1 if version == 2 else 0] + [0] * 252
    with open(f"{out}/tokenizer/gpt2_first_{V}_v{version}.bin", "wb") as f:
        f.write(struct.pack("<256i", *header) + entries(V))
PYEOF

TINY=(--layers 1 --channels 4 --heads 1 --vocab 64 --max-seq-len 8 --batch-size 1 --seq-len 8 --steps 2
      --train-data "$W/tiny.bin" --val-data "" --tokenizer "" --val-every 0 --sample-every 0 --save-every 2)
OMP_NUM_THREADS=1 timeout 60 "$BIN" "${TINY[@]}" --checkpoint-dir "$W/ck1" >"$W/train1.out" 2>&1 \
    || { cat "$W/train1.out"; exit 1; }
cp "$W"/ck1/model_*.bin "$OUT/model/tiny_fp32.bin"
cp "$W"/ck1/state_*_00000.bin "$OUT/state/tiny_1shard.bin"
OMP_NUM_THREADS=1 timeout 60 "$BIN" "${TINY[@]}" --layers 2 --checkpoint-dir "$W/ck_l2" >"$W/train_l2.out" 2>&1 \
    || { cat "$W/train_l2.out"; exit 1; }
cp "$W"/ck_l2/state_*_00000.bin "$OUT/state/tiny_layers2.bin"
if command -v mpirun >/dev/null; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 120 \
        mpirun --oversubscribe --bind-to none -np 2 "$BIN" "${TINY[@]}" --zero 1 --checkpoint-dir "$W/ck2" \
        >"$W/train2.out" 2>&1 || { cat "$W/train2.out"; exit 1; }
    cp "$W"/ck2/state_*_00000.bin "$OUT/state/tiny_zero1_shard0.bin"
    cp "$W"/ck2/state_*_00001.bin "$OUT/state/tiny_zero1_shard1.bin"
fi

# the same model in bf16 (version 5): each float's upper 16 bits
"$PY" - "$OUT/model/tiny_fp32.bin" "$OUT/model/tiny_bf16.bin" <<'PYEOF'
import struct, sys
d = open(sys.argv[1], "rb").read()
header = bytearray(d[:1024])
header[4:8] = struct.pack("<i", 5)
values = d[1024:]
with open(sys.argv[2], "wb") as f:
    f.write(bytes(header) + b"".join(values[i + 2:i + 4] for i in range(0, len(values), 4)))
PYEOF
rm -rf "$W"
ls -l "$OUT"/*
