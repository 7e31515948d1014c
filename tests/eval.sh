#!/usr/bin/env bash
# eval.sh: multiple-choice evaluation (--eval-data, llmc/run/eval.h) on llm.c's eval file format.
#   1. Losses: on the small reference model (build/ref/ref_small_model.bin, V=512), 40 examples of random
#      tokens with contexts of 1..40 and completions of 1..12 tokens (so with --seq-len 32 some rows lose
#      context from the left, and rows of different lengths share a forward), each example's 4 mean
#      completion losses (--eval-dump) must equal those of scripts/gpt2_reference.py's float64 PyTorch
#      forward, run on each row alone: independent of the trainer's packing, padding, truncation and its
#      kernels. Tolerance 1e-4 relative (float32 against float64 over a 2-layer model; the trainer's
#      validation loss meets the same reference to ~1e-6, test_gpt). The accuracy printed must equal the
#      share of examples whose label has the lowest reference loss.
#   2. The same accuracy with --dp 2, --tp 2, --pp 2 and --dp 3 --zero 3 (mpirun): examples split across DP
#      ranks (ZeRO-3 with uneven splits on a deeper model: zero.sh).
#   3. Malformed files end in one error line: truncated, wrong magic, wrong version, a length past the
#      file, a label out of range, a token id >= V, a wrong start marker, trailing bytes.
# The accuracy of a trained and an untrained model is checked by train.sh.
# usage: tests/eval.sh [path/to/train_gpt]
set -u
BIN=${1:-build/cpu/train_gpt}
PY=${PYTHON:-/usr/bin/python3}
REF=build/ref/ref_small_model.bin
[ -f "$REF" ] || { echo "no reference model at $REF (run scripts/gpt2_reference.py first)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { printf '  ok    %s\n' "$*"; }
fail() { printf '  FAIL  %s\n' "$*"; fails=$((fails + 1)); }

# the examples, and malformed variants of the file
"$PY" - "$TMP" <<'PYEOF'
import random, struct, sys
sys.path.insert(0, "scripts")
from make_eval_data import write_evalfile
d = sys.argv[1]
rng = random.Random(11)
ex = []
for i in range(40):
    ctx = [rng.randrange(512) for _ in range(rng.randint(1, 40))]
    ends = [[rng.randrange(512) for _ in range(rng.randint(1, 12))] for _ in range(4)]
    ex.append((rng.randrange(4), ctx, ends))
write_evalfile(f"{d}/ok.bin", ex)
good = open(f"{d}/ok.bin", "rb").read()
def put(name, data): open(f"{d}/{name}.bin", "wb").write(data)
def u16(data, i, v): return data[:1024 + 2 * i] + struct.pack("<H", v) + data[1024 + 2 * i + 2:]
put("truncated", good[:-6])
put("magic", struct.pack("<i", 20240520) + good[4:])
put("version", good[:4] + struct.pack("<i", 2) + good[8:])
put("marker", u16(good, 0, 7))
put("label", u16(good, 3, 4))
put("bigid", u16(good, 6, 600))
put("ctxlen", u16(good, 5, 9999))
put("trailing", good + b"\0\0")
PYEOF

# 1. the losses against the PyTorch reference
"$PY" - "$TMP/train.bin" <<'PYEOF'
import struct, sys
ids = [i % 512 for i in range(5000)]
open(sys.argv[1], "wb").write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)) + struct.pack("<%dH" % len(ids), *ids))
PYEOF
M=(--model "$REF" --steps 0 --seq-len 32 --batch-size 3 --val-every 0 --sample-every 0 --train-data "$TMP/train.bin")
timeout 120 "$BIN" "${M[@]}" --eval-data "$TMP/ok.bin" --eval-dump "$TMP/dump.txt" >"$TMP/one.out" 2>&1 || fail "one rank: $(tail -2 "$TMP/one.out")"
"$PY" - "$TMP" 32 <<'PYEOF'
import re, struct, sys
import numpy as np, torch
sys.path.insert(0, "scripts")
from gpt2_reference import forward, param_shapes, padded_vocab
d, T = sys.argv[1], int(sys.argv[2])
raw = open("build/ref/ref_small_model.bin", "rb").read()
_, _, maxT, V, L, NH, C, Vp = struct.unpack("<8i", raw[:32])
flat = torch.from_numpy(np.frombuffer(raw[1024:], dtype="<f4").astype(np.float64))
p, o = {}, 0
for name, shape in param_shapes(V, Vp, maxT, L, NH, C):
    n = int(np.prod(shape)); p[name] = flat[o:o + n].view(shape); o += n
cfg = dict(V=V, L=L, NH=NH)
data = open(f"{d}/ok.bin", "rb").read()
s = struct.unpack("<%dH" % ((len(data) - 1024) // 2), data[1024:])
i, ref, labels = 0, [], []
while i < len(s):
    n_words = s[i + 1] // 2; label = s[i + 3]; ctx_n = s[i + 5]
    ctx = list(s[i + 6:i + 6 + ctx_n]); j = i + 6 + ctx_n; ends = []
    for _ in range(4):
        ends.append(list(s[j + 1:j + 1 + s[j]])); j += 1 + s[j]
    i += n_words
    losses = []
    for e in ends:
        row = (ctx + e)[-(T + 1):]                       # at most T+1 tokens, the completion kept whole
        x, y = torch.tensor([row[:-1]]), torch.tensor([row[1:]])
        logits, _ = forward(p, x, y, cfg)
        lp = torch.log_softmax(logits[0], dim=-1)
        nll = -lp[torch.arange(len(row) - 1), y[0]]
        losses.append(float(nll[-len(e):].mean()))
    ref.append(losses); labels.append(label)
got = [list(map(float, line.split()[2:])) for line in open(f"{d}/dump.txt")]
assert len(got) == len(ref), f"{len(got)} dumped examples, {len(ref)} in the file"
err = max(abs(g - r) / abs(r) for gl, rl in zip(got, ref) for g, r in zip(gl, rl))
acc = sum(int(np.argmin(r)) == l for r, l in zip(ref, labels)) / len(ref)
printed = float(re.search(r"multiple-choice accuracy ([0-9.]+)", open(f"{d}/one.out").read()).group(1))
ok = err <= 1e-4 and abs(printed - acc) < 1e-6
print(f"  {'ok  ' if ok else 'FAIL'}  160 completion losses vs PyTorch float64: max rel err {err:.2e} (tolerance 1e-4); "
      f"accuracy {printed:.4f}, reference {acc:.4f}")
open(f"{d}/acc.txt", "w").write("%.4f" % acc)
sys.exit(0 if ok else 1)
PYEOF
[ $? -eq 0 ] || fails=$((fails + 1))

# 2. the same accuracy over DP, TP and PP ranks
MPIRUN=(mpirun --oversubscribe --bind-to none)
for mode in "--dp 2" "--tp 2" "--pp 2" "--dp 3 --zero 3"; do
    np=$(echo "$mode" | awk '{print $2}')
    timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" "${M[@]}" --eval-data "$TMP/ok.bin" $mode >"$TMP/par.out" 2>&1 || fail "$mode: $(tail -2 "$TMP/par.out")"
    got=$(grep -o 'multiple-choice accuracy [0-9.]*' "$TMP/par.out" | awk '{print $3}')
    [ -n "$got" ] && [ "$got" = "$(cat "$TMP/acc.txt" 2>/dev/null)" ] && ok "$mode: accuracy $got equals the reference's" \
        || fail "$mode: accuracy '$got', reference $(cat "$TMP/acc.txt" 2>/dev/null)"
done

# 3. malformed files
expect_error() {
    local name=$1 pattern=$2
    timeout 60 "$BIN" "${M[@]}" --eval-data "$TMP/$name.bin" >/dev/null 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 1 ] && [ "$(grep -c . "$TMP/err")" -eq 1 ] && grep -q "^error: .*$pattern" "$TMP/err"; then ok "$name: $(cat "$TMP/err")"
    else fail "$name: exit $rc, stderr: $(head -3 "$TMP/err")"; fi
}
expect_error truncated "past the end of the file"
expect_error magic "not a multiple-choice eval file"
expect_error version "unsupported eval file version 2"
expect_error marker "does not start with the marker"
expect_error label "label 4 is not one of"
expect_error bigid "token id 600 is outside the vocabulary of 512"
expect_error ctxlen "runs past"
expect_error trailing "after the last of its 40 examples"

[ $fails -eq 0 ] && echo "eval: passed" || { echo "eval: $fails failure(s)"; exit 1; }
