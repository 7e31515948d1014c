#!/usr/bin/env bash
# zero.sh: ZeRO-1, 2 and 3 (optimizer state, then gradients, then parameters sharded over the
# data-parallel ranks, llmc/zero.h, llmc/zero3.h) on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: dp in {2,3,4} x ZeRO in {1,2,3} x grad_accum in {1,2}: 10 steps equal the
#      single-rank run of the same global batch (dp x B sequences per micro-step): every loss to 1e-5
#      relative and the final parameters to 1e-5 relative norm (fp32; sums over ranks are taken in
#      another order than one rank's, so results agree to rounding, ~1e-7, not bit for bit); ZeRO-2 with
#      its gradient slots reused (3 layers); ZeRO-3 with its gather slots reused (5 layers), under
#      recomputation (recomputed layers are gathered again: levels 1 and 3, segments of 2 and 3 layers)
#      (every run in the MPI engine's strict mode, see lib.sh; one also in the default mode)
#   2. sharded checkpoints: resume at the same dp is bit-exact (same final model file, byte for byte); a
#      run saved at dp=4 (ZeRO-2) and resumed at dp=2 (ZeRO-1) re-shards and continues with the same
#      losses to 1e-5, and so does one resumed on one rank; a duplicated or forged shard (one that is not
#      what its name says, or shards that cover some parameters twice) is refused; --keep-last 1 leaves
#      only the newest checkpoint's files (model and every shard); ZeRO-3: resume at the same dp is
#      bit-exact, a ZeRO-3 run's checkpoint resumes at dp=2 ZeRO-1 and a ZeRO-1 run's at dp=4 ZeRO-3
#   3. ZeRO-3 outside training steps: validation loss, samples and multiple-choice accuracy equal ZeRO-0's
#      (dp=3: the ranks hold different numbers of examples, yet every rank gathers in every forward);
#      --trace puts each gather on the communication lane, exactly as many as the two slots need, and
#      titles the trace "dp 2 · ZeRO-3 · tp 1 · pp 1", its reduce-scatters and gathers apart in the legend;
#      --zero 3 with --pp is refused in one line
#   4. the learner model (--model-preset learner, docs/data_parallel.md), from --plan: each rank's memory
#      falls from ZeRO-0 to 1 to 2 to 3 at dp 2 and dp 4; each line says its change against ZeRO-0; its pipeline stages' work per token is even to 5% at --pp 2 and 4 (the
#      default model's last stage: 30 times the others'); size and data flags win over the preset's;
#      scripts/learner_data.py makes its data, on which it trains, validates and samples
# ZeRO 0 (plain data parallelism): data_parallel.sh.
# usage: tests/zero.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)
B=2

echo "1. equivalence with the single-rank run of the same global batch"
dp_equivalence "$B" 1 2 3

# ZeRO-2 reuses its two gradient slots from the third layer on: in strict mode (lib.sh) a
# slot rewritten before the reduce-scatter that reads it was waited for gives wrong losses
"$BIN" "${COMMON[@]}" --layers 3 --batch-size 4 --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
run 2 --layers 3 --batch-size 2 --zero 2 --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin"
compare "dp=2 zero=2 L=3 (slots reused)" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
# and the default (not strict) MPI engine, which users run
LLMC_COMM_STRICT=0 run 2 --layers 3 --batch-size 2 --zero 2 --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin"
compare "dp=2 zero=2 L=3, not strict" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"

# ZeRO-3 gathers layer l into slot l % 2: from the third layer on a slot is gathered into again, and in
# strict mode a slot rewritten before its gather (or read before it) gives wrong losses; recomputation
# gathers the layers it recomputes again (with segments: a segment forward, then its backward)
for R in "0" "1" "3 --recompute-segment 2" "3 --recompute-segment 3"; do
    "$BIN" "${COMMON[@]}" --layers 5 --batch-size 4 --grad-accum 2 --recompute $R --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
    run 2 --layers 5 --batch-size 2 --grad-accum 2 --recompute $R --zero 3 --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin"
    compare "dp=2 zero=3 L=5 --recompute $R" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
done
LLMC_COMM_STRICT=0 run 2 --layers 5 --batch-size 2 --grad-accum 2 --recompute 0 --zero 3 --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin"
"$BIN" "${COMMON[@]}" --layers 5 --batch-size 4 --grad-accum 2 --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
compare "dp=2 zero=3 L=5, not strict" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"

echo "2. sharded checkpoints"
# straight runs to compare with
run 2 --batch-size 4 --zero 2 --log "$TMP/s2.jsonl" --save-model "$TMP/s2.bin"
run 4 --batch-size 2 --zero 2 --log "$TMP/s4.jsonl" --save-model "$TMP/s4.bin"
# same dp: stop at 5, resume at 5: byte-identical final model
run 2 --batch-size 4 --zero 2 --stop-after 5 --checkpoint-dir "$TMP/ck2"
run 2 --batch-size 4 --zero 2 --resume "$TMP/ck2" --log "$TMP/r2.jsonl" --save-model "$TMP/r2.bin"
if cmp -s "$TMP/s2.bin" "$TMP/r2.bin"; then echo "  ok    resume at dp=2 ZeRO-2: final model byte-identical"
else echo "  FAIL  resume at dp=2 ZeRO-2: final model differs"; fails=$((fails + 1)); fi
nshards=$(ls "$TMP"/ck2/state_00000005_*.bin 2>/dev/null | wc -l)
if [ "$nshards" -eq 2 ]; then echo "  ok    dp=2 ZeRO-2 wrote 2 state shards"; else echo "  FAIL  dp=2 ZeRO-2 wrote $nshards state shards (want 2)"; fails=$((fails + 1)); fi
# re-sharding: save at dp=4 (ZeRO-2), resume at dp=2 (ZeRO-1) with the same global batch
run 4 --batch-size 2 --zero 2 --stop-after 5 --checkpoint-dir "$TMP/ck4"
run 2 --batch-size 4 --zero 1 --resume "$TMP/ck4" --log "$TMP/r42.jsonl" --save-model "$TMP/r42.bin"
compare "save dp=4, resume dp=2" "$TMP/r42.jsonl" "$TMP/r42.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6
# and down to one rank without ZeRO
"$BIN" "${COMMON[@]}" --batch-size 8 --resume "$TMP/ck4" --log "$TMP/r41.jsonl" --save-model "$TMP/r41.bin" >/dev/null 2>&1 \
    || { echo "  FAIL  resume dp=4 checkpoint on one rank"; fails=$((fails + 1)); }
compare "save dp=4, resume dp=1" "$TMP/r41.jsonl" "$TMP/r41.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6

# a shard must be the one its name says, and the shards together must cover the model exactly once
run 2 --batch-size 4 --zero 1 --stop-after 4 --checkpoint-dir "$TMP/ckz"
cp -r "$TMP/ckz" "$TMP/ckz_dup" && cp "$TMP/ckz_dup/state_00000004_00000.bin" "$TMP/ckz_dup/state_00000004_00001.bin"
expect_mpi_error "shard 0 copied over shard 1" "state_00000004_00001.bin' holds shard 0 of step 4, not what its name says" 2 \
    "$BIN" "${COMMON[@]}" --batch-size 4 --zero 1 --resume "$TMP/ckz_dup"
cp -r "$TMP/ckz" "$TMP/ckz_forged"  # shard 0's ranges under shard 1's name and index
"$PY" "$(dirname "$0")/forge_state.py" "$TMP/ckz/state_00000004_00000.bin" "$TMP/ckz_forged/state_00000004_00001.bin" shard=1
expect_mpi_error "shard 0's ranges as shard 1" "shards of step 4 .* do not cover the model: parameters .* are in more than one shard" 2 \
    "$BIN" "${COMMON[@]}" --batch-size 4 --zero 1 --resume "$TMP/ckz_forged"

# --keep-last 1 deletes every shard of the older checkpoints
run 2 --batch-size 4 --zero 1 --steps 3 --save-every 1 --keep-last 1 --checkpoint-dir "$TMP/ckk"
if [ "$(ls "$TMP/ckk" | tr '\n' ' ')" = "model_00000003.bin state_00000003_00000.bin state_00000003_00001.bin " ]; then
    echo "  ok    --keep-last 1 at dp=2 ZeRO-1: only step 3's model and 2 shards remain"
else echo "  FAIL  --keep-last 1 at dp=2 ZeRO-1 left: $(ls "$TMP/ckk" | tr '\n' ' ')"; fails=$((fails + 1)); fi

# ZeRO-3 checkpoints: bit-exact at the same dp; re-sharded to ZeRO-1 and from ZeRO-1 (s4: dp=4 x 2 sequences)
run 2 --batch-size 4 --zero 3 --log "$TMP/s23.jsonl" --save-model "$TMP/s23.bin"
run 2 --batch-size 4 --zero 3 --stop-after 5 --checkpoint-dir "$TMP/ck23"
run 2 --batch-size 4 --zero 3 --resume "$TMP/ck23" --save-model "$TMP/r23.bin"
if cmp -s "$TMP/s23.bin" "$TMP/r23.bin"; then echo "  ok    resume at dp=2 ZeRO-3: final model byte-identical"
else echo "  FAIL  resume at dp=2 ZeRO-3: final model differs"; fails=$((fails + 1)); fi
run 4 --batch-size 2 --zero 3 --stop-after 5 --checkpoint-dir "$TMP/ck43"
run 2 --batch-size 4 --zero 1 --resume "$TMP/ck43" --log "$TMP/r43.jsonl" --save-model "$TMP/r43.bin"
compare "save dp=4 ZeRO-3, resume dp=2 ZeRO-1" "$TMP/r43.jsonl" "$TMP/r43.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6
run 2 --batch-size 4 --zero 1 --stop-after 5 --checkpoint-dir "$TMP/ck21"
run 4 --batch-size 2 --zero 3 --resume "$TMP/ck21" --log "$TMP/r21.jsonl" --save-model "$TMP/r21.bin"
compare "save dp=2 ZeRO-1, resume dp=4 ZeRO-3" "$TMP/r21.jsonl" "$TMP/r21.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6

echo "3. ZeRO-3 outside the training step"
# validation and samples print the same at ZeRO-3 as at ZeRO-0 (every forward gathers; the update
# between them makes every gathered copy stale)
"$PY" -c 'import struct, sys
with open(sys.argv[1], "wb") as f:  # a tokenizer for the 1000-token vocabulary: token i reads " t<i>"
    f.write(struct.pack("<256i", *([20240328, 2, 1000, 999] + [0] * 252)))
    for i in range(1000): w = b" t%d" % i; f.write(bytes([len(w)]) + w)' "$TMP/tok1000.bin"
EVAL=(--batch-size 2 --layers 3 --val-data "$TMP/tokens.bin" --val-every 4 --val-batches 3 --sample-every 4 --sample-len 6
      --tokenizer "$TMP/tok1000.bin")
run 2 "${EVAL[@]}" --zero 0 && grep -E '^step .*val loss|^sample' "$TMP/run.out" >"$TMP/z0.txt"
run 2 "${EVAL[@]}" --zero 3 && grep -E '^step .*val loss|^sample' "$TMP/run.out" >"$TMP/z3.txt"
if grep -q 'val loss' "$TMP/z0.txt" && grep -q '^sample' "$TMP/z0.txt" && cmp -s "$TMP/z0.txt" "$TMP/z3.txt"; then
    echo "  ok    dp=2 ZeRO-3: $(grep -c 'val loss' "$TMP/z3.txt") validation losses and $(grep -c '^sample' "$TMP/z3.txt") samples as at ZeRO-0"
else echo "  FAIL  dp=2 ZeRO-3: validation or samples differ from ZeRO-0"; diff "$TMP/z0.txt" "$TMP/z3.txt" | head -5; fails=$((fails + 1)); fi

# multiple-choice accuracy at dp=3, one row per forward: the ranks hold 14, 13 and 13 examples (56, 52, 52
# rows), yet with 3 layers every forward gathers (two slots), so every rank must run as many forwards
"$PY" -c 'import random, sys; sys.path.insert(0, "scripts"); from make_eval_data import write_evalfile
rng = random.Random(5)
write_evalfile(sys.argv[1], [(rng.randrange(4), [rng.randrange(1000) for _ in range(rng.randint(1, 9))],
               [[rng.randrange(1000) for _ in range(rng.randint(1, 6))] for _ in range(4)]) for _ in range(40)])' "$TMP/mc.bin"
for Z in 0 3; do
    run 3 --layers 3 --batch-size 1 --steps 2 --eval-data "$TMP/mc.bin" --eval-every 1 --zero $Z
    grep -o 'multiple-choice accuracy [0-9.]*' "$TMP/run.out" >"$TMP/mc$Z.txt"
done
if [ "$(wc -l <"$TMP/mc0.txt")" -ge 2 ] && cmp -s "$TMP/mc0.txt" "$TMP/mc3.txt"; then
    echo "  ok    dp=3 ZeRO-3, uneven examples per rank: accuracies $(awk '{print $3}' "$TMP/mc3.txt" | tr '\n' ' ')as at ZeRO-0"
else echo "  FAIL  dp=3 ZeRO-3 multiple-choice accuracy: $(cat "$TMP/mc3.txt"), ZeRO-0: $(cat "$TMP/mc0.txt")"; fails=$((fails + 1)); fi

# the trace: every gather on the communication lane (tid 1). How many, with L layers and M micro-steps:
# the first step gathers the ends (2 buckets) and all L layers in its first forward, then L-2 in each
# backward (the last two are still there) and L-2 in each later forward (the first two are still there),
# so 2 + L + (L-2)(2M-1); every later step (the update made every copy stale) the same
run 2 --layers 5 --batch-size 2 --grad-accum 2 --zero 3 --steps 3 --trace "$TMP/z3trace.json"
"$PY" - "$TMP/z3trace.json" 5 2 3 <<'PYEOF' || fails=$((fails + 1))
import json, sys
path, L, M, steps = sys.argv[1], *map(int, sys.argv[2:])
events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
gathers = [e for e in events if e["cat"] == "allgather"]
per_rank = {p: sum(1 for e in gathers if e["pid"] == p) for p in sorted({e["pid"] for e in events})}
opt = sum(1 for e in events if e["cat"] == "optimizer" and e["pid"] == 0)
want = opt * (2 + L + (L - 2) * (2 * M - 1))
lanes = {e["tid"] for e in gathers}
ok = len(per_rank) == 2 and lanes == {1} and all(n == want for n in per_rank.values())
print(f"  {'ok  ' if ok else 'FAIL'}  trace: gathers per rank {per_rank} over {opt} traced step(s), want {want} each; lanes {sorted(lanes)}")
sys.exit(0 if ok else 1)
PYEOF
# its title names ZeRO-3 and no pipeline schedule; its reductions are reduce-scatters, drawn apart from
# the all-gathers
check_title "dp=2 ZeRO-3" "$TMP/z3trace.json" "$TMP/run.out" "dp 2 · ZeRO-3 · tp 1 · pp 1" 0 \
    "reduce-scatter;all-gather;!all-reduce" || fails=$((fails + 1))

expect_mpi_error "--zero 3 with --pp" "--zero 3 with --pp is not supported" 2 "$BIN" "${COMMON[@]}" --batch-size 2 --pp 2 --zero 3

echo "4. the learner model"
"$PY" - "$BIN" <<'PYEOF' || fails=$((fails + 1))
import re, subprocess, sys
BIN, ok = sys.argv[1], True
def check(good, what):
    global ok
    ok &= bool(good)
    print(f"  {'ok  ' if good else 'FAIL'}  {what}")
def plan(*args):
    return subprocess.run([BIN, "--plan", *args], capture_output=True, text=True, timeout=60, check=True).stdout
def stages(out):
    return [l for l in out.splitlines() if l.startswith("  stage ")]
def gib(line, name):
    return float(re.search(name + r" +([0-9.]+)", line).group(1))
# (the printed GiB have 3 decimals: sums of them agree to 0.002)
for D in (2, 4):
    lines = [stages(plan("--model-preset", "learner", "--dp", str(D), "--zero", str(z)))[0] for z in range(4)]
    t = [gib(l, "total") for l in lines]
    marks = [re.search(r"total +[0-9.]+ GiB \(([-+][0-9]+)% vs ZeRO-0\)$", l) for l in lines]
    said = marks[0] is None and all(m and abs(int(m.group(1)) - 100 * (x / t[0] - 1)) <= 1
                                    for m, x in zip(marks[1:], t[1:]))
    pcts = " ".join(m.group(1) + "%" for m in marks[1:] if m)
    check(said, f"dp={D}: ZeRO 1-3 say their change against ZeRO-0: {pcts}")
    check(t[0] > t[1] > t[2] > t[3], f"dp={D}: per rank, ZeRO 0 > 1 > 2 > 3: {t} GiB")
# a stage's forward multiply-adds per token: 12 C^2 for a layer's four matmuls, about T C for its causal
# attention, Vp C for the classifier on the last stage (the embedding is a lookup)
def imbalance(P, *model):
    out = plan(*model, "--pp", str(P), "--batch-size", str(P), "--micro-batches", str(P))
    C, V, T = (int(re.search(r"\b" + k + r"=([0-9]+)", out).group(1)) for k in ("C", "V", "T"))
    work = []
    for s, line in enumerate(stages(out)):
        a, b = map(int, re.search(r"layers +([0-9]+)- *([0-9]+)", line).groups())
        work.append((b - a + 1) * (12 * C * C + T * C) + ((V + 127) // 128 * 128 * C if s == P - 1 else 0))
    return max(work) / min(work)
for P in (2, 4):
    r = imbalance(P, "--model-preset", "learner")
    check(r <= 1.05, f"--pp {P}: the learner model's busiest stage has {r:.3f} times the least busy one's work")
r = imbalance(4)
check(r >= 10, f"--pp 4: the default model's busiest stage has {r:.1f} times the least busy one's work (classifier)")
# size flags win over the preset's, given before it or after
for args in (["--layers", "8", "--model-preset", "learner"], ["--model-preset", "learner", "--layers", "8"]):
    check("L=8 C=256 NH=4 V=256 maxT=128," in plan(*args), f"--plan {' '.join(args)}: L=8, the rest the preset's")
sys.exit(0 if ok else 1)
PYEOF
expect_one_rank_error() {  # NAME PATTERN COMMAND...: it fails with one line naming the problem
    local name=$1 pattern=$2
    shift 2
    if ! "$@" >"$TMP/bad.out" 2>&1 && grep -q "^error: .*$pattern" "$TMP/bad.out"; then
        echo "  ok    $name: $(grep -m1 '^error:' "$TMP/bad.out")"
    else echo "  FAIL  $name"; tail -3 "$TMP/bad.out"; fails=$((fails + 1)); fi
}
ABS_BIN=$(realpath "$BIN")
LEARNER_DATA=$(realpath "$(dirname "$0")/../scripts/learner_data.py")
mkdir -p "$TMP/learner"
expect_one_rank_error "unknown preset" "--model-preset must be learner, got 'huge'" "$BIN" --model-preset huge
expect_one_rank_error "preset without its data" \
    "trains on build/learner/train.bin, which does not exist: make it with scripts/learner_data.py" \
    sh -c "cd '$TMP/learner' && '$ABS_BIN' --model-preset learner --steps 1"
# its data made by the script, and a run on the preset's paths (relative to the working folder)
if (cd "$TMP/learner" && "$PY" "$LEARNER_DATA" --out build/learner >/dev/null \
    && "$ABS_BIN" --model-preset learner --steps 2 --val-every 2 --val-batches 2 --sample-every 2 --sample-len 16) \
    >"$TMP/run.out" 2>&1 && grep -q "^model: L=16 C=256 NH=4 V=256 " "$TMP/run.out" \
    && grep -q "^step 2: val loss" "$TMP/run.out" && grep -q "^sample:" "$TMP/run.out"; then
    echo "  ok    scripts/learner_data.py, --model-preset learner: $(grep -m1 '^step 2: val loss' "$TMP/run.out")"
else
    echo "  FAIL  --model-preset learner on scripts/learner_data.py's data"; tail -5 "$TMP/run.out"
    fails=$((fails + 1))
fi

if [ $fails -ne 0 ]; then echo "zero: $fails FAILED"; exit 1; fi
echo "zero: all passed"
