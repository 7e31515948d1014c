#!/usr/bin/env bash
# test_dp.sh: data parallelism and ZeRO on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: dp in {2,3,4} x ZeRO in {0,1,2} x grad_accum in {1,2}: 10 steps equal the
#      single-rank run of the same global batch (dp x B sequences per micro-step): every loss to 1e-5
#      relative and the final parameters to 1e-5 relative norm (fp32; sums over ranks are taken in
#      another order than one rank's, so results agree to rounding, ~1e-7, not bit for bit)
#   2. checkpoints: resume at the same dp is bit-exact (same final model file, byte for byte); a run
#      saved at dp=4 (ZeRO-2) and resumed at dp=2 (ZeRO-1) re-shards and continues with the same losses
#      to 1e-5
#   3. failure: a rank killed mid-run ends every rank with a non-zero exit within 60 s
#   4. bad input: a world size that is not dp x tp x pp
# usage: scripts/test_dp.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
PY=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
command -v mpirun >/dev/null || { echo "test_dp: mpirun not found (Debian package openmpi-bin)"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

"$PY" - "$TMP/tokens.bin" <<'PYEOF'
import random, struct, sys
random.seed(3)
ids = [random.randrange(512) for _ in range(40000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)))
    f.write(struct.pack("<%dH" % len(ids), *ids))
PYEOF
COMMON=(--layers 2 --channels 32 --heads 4 --vocab 1000 --max-seq-len 16 --seq-len 16 --steps 10 --lr 1e-3
        --warmup 2 --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "" --shuffle 1)
B=2

# compare NAME A.jsonl A.bin B.jsonl B.bin [first_step]: losses (from first_step on) and final params
compare() {
    if "$PY" - "$@" <<'PYEOF'
import json, sys
import numpy as np
name, la, pa, lb, pb = sys.argv[1:6]
first = int(sys.argv[6]) if len(sys.argv) > 6 else 1
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = losses(la), losses(lb)
steps = [s for s in sorted(b) if s >= first]
assert steps and all(s in a for s in steps), "missing steps"
loss_err = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
x, y = np.fromfile(pa, "<f4", offset=1024), np.fromfile(pb, "<f4", offset=1024)
param_err = float(np.linalg.norm(x - y) / np.linalg.norm(y))
ok = loss_err <= 1e-5 and param_err <= 1e-5
print(f"  {'ok  ' if ok else 'FAIL'}  {name:28s} losses {loss_err:.2e}, params {param_err:.2e} (tolerance 1e-5)")
sys.exit(0 if ok else 1)
PYEOF
    then :; else fails=$((fails + 1)); fi
}

echo "1. equivalence with the single-rank run of the same global batch"
for D in 2 3 4; do
    for A in 1 2; do
        "$BIN" "${COMMON[@]}" --batch-size $((D * B)) --grad-accum $A --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null \
            || { echo "  FAIL  single-rank reference D=$D A=$A"; fails=$((fails + 1)); continue; }
        for Z in 0 1 2; do
            if timeout 120 "${MPIRUN[@]}" -np $D "$BIN" "${COMMON[@]}" --batch-size $B --grad-accum $A --zero $Z \
                --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin" >"$TMP/dp.out" 2>&1; then
                compare "dp=$D zero=$Z grad_accum=$A" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
            else
                echo "  FAIL  dp=$D zero=$Z grad_accum=$A did not run:"; tail -5 "$TMP/dp.out"; fails=$((fails + 1))
            fi
        done
    done
done

echo "2. sharded checkpoints"
run_dp() {  # run_dp NP EXTRA...
    local np=$1
    shift
    timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" "${COMMON[@]}" "$@" >"$TMP/run.out" 2>&1 || { echo "  FAIL  run: $*"; tail -5 "$TMP/run.out"; fails=$((fails + 1)); }
}
# straight runs to compare with
run_dp 2 --batch-size 4 --zero 2 --log "$TMP/s2.jsonl" --save-model "$TMP/s2.bin"
run_dp 4 --batch-size 2 --zero 2 --log "$TMP/s4.jsonl" --save-model "$TMP/s4.bin"
# same dp: stop at 5, resume at 5: byte-identical final model
run_dp 2 --batch-size 4 --zero 2 --stop-after 5 --checkpoint-dir "$TMP/ck2"
run_dp 2 --batch-size 4 --zero 2 --resume "$TMP/ck2" --log "$TMP/r2.jsonl" --save-model "$TMP/r2.bin"
if cmp -s "$TMP/s2.bin" "$TMP/r2.bin"; then echo "  ok    resume at dp=2 ZeRO-2: final model byte-identical"
else echo "  FAIL  resume at dp=2 ZeRO-2: final model differs"; fails=$((fails + 1)); fi
nshards=$(ls "$TMP"/ck2/state_00000005_*.bin 2>/dev/null | wc -l)
if [ "$nshards" -eq 2 ]; then echo "  ok    dp=2 ZeRO-2 wrote 2 state shards"; else echo "  FAIL  dp=2 ZeRO-2 wrote $nshards state shards (want 2)"; fails=$((fails + 1)); fi
# re-sharding: save at dp=4 (ZeRO-2), resume at dp=2 (ZeRO-1) with the same global batch
run_dp 4 --batch-size 2 --zero 2 --stop-after 5 --checkpoint-dir "$TMP/ck4"
run_dp 2 --batch-size 4 --zero 1 --resume "$TMP/ck4" --log "$TMP/r42.jsonl" --save-model "$TMP/r42.bin"
compare "save dp=4, resume dp=2" "$TMP/r42.jsonl" "$TMP/r42.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6
# and down to one rank without ZeRO
"$BIN" "${COMMON[@]}" --batch-size 8 --resume "$TMP/ck4" --log "$TMP/r41.jsonl" --save-model "$TMP/r41.bin" >/dev/null 2>&1 \
    || { echo "  FAIL  resume dp=4 checkpoint on one rank"; fails=$((fails + 1)); }
compare "save dp=4, resume dp=1" "$TMP/r41.jsonl" "$TMP/r41.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6

echo "3. a rank that dies ends the run"
start=$(date +%s)
timeout 90 "${MPIRUN[@]}" -np 3 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1000 --fault-rank 1 --fault-step 3 >"$TMP/fault.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ]; then echo "  ok    killed rank 1: all ranks ended, exit $rc after $took s"
else echo "  FAIL  killed rank 1: exit $rc after $took s (want non-zero within 60 s)"; tail -5 "$TMP/fault.out"; fails=$((fails + 1)); fi
start=$(date +%s)
timeout 90 "${MPIRUN[@]}" -np 3 "$BIN" "${COMMON[@]}" --batch-size 2 --resume "$TMP/nothing_here" >"$TMP/err.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] && grep -q "error: no checkpoint" "$TMP/err.out"; then echo "  ok    an error on every rank: exit $rc after $took s"
else echo "  FAIL  an error on every rank: exit $rc after $took s"; fails=$((fails + 1)); fi

echo "4. bad input"
timeout 60 "${MPIRUN[@]}" -np 3 "$BIN" "${COMMON[@]}" --batch-size 2 --dp 2 >"$TMP/bad.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "error: world size 3 does not equal dp x tp x pp = 2 x 1 x 1" "$TMP/bad.out"; then echo "  ok    world size 3 with --dp 2: $(grep -m1 'error:' "$TMP/bad.out")"
else echo "  FAIL  world size 3 with --dp 2: exit $rc"; tail -3 "$TMP/bad.out"; fails=$((fails + 1)); fi

if [ $fails -ne 0 ]; then echo "test_dp: $fails FAILED"; exit 1; fi
echo "test_dp: all passed"
