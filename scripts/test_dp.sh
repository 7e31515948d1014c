#!/usr/bin/env bash
# test_dp.sh: data parallelism and ZeRO on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: dp in {2,3,4} x ZeRO in {0,1,2} x grad_accum in {1,2}: 10 steps equal the
#      single-rank run of the same global batch (dp x B sequences per micro-step): every loss to 1e-5
#      relative and the final parameters to 1e-5 relative norm (fp32; sums over ranks are taken in
#      another order than one rank's, so results agree to rounding, ~1e-7, not bit for bit)
#      (every run in the MPI engine's strict mode, see parallel_test_lib.sh; one also in the default mode)
#   2. checkpoints: resume at the same dp is bit-exact (same final model file, byte for byte); a run
#      saved at dp=4 (ZeRO-2) and resumed at dp=2 (ZeRO-1) re-shards and continues with the same losses
#      to 1e-5; a duplicated or forged shard (one that is not what its name says, or shards that cover
#      some parameters twice) is refused
#   3. failure: a rank killed mid-run ends every rank with a non-zero exit within 60 s; a divergence
#      ends both ranks with one error line and exit 1; a stopped rank (SIGSTOP) ends the job through the
#      watchdog (--comm-timeout) with one line; a slow checkpoint save, or a slow final model, waits under
#      --io-timeout instead;
#      a sample longer than --comm-timeout is no dead peer (every DP group samples)
#      --keep-last 1 leaves only the newest checkpoint's files (model and every shard)
#   4. bad input: a world size that is not dp x tp x pp
#   5. signals: SIGTERM sent to one rank of two (dp 2, ZeRO-1; a SIGUSR1 to the other right after it)
#      after step 3 (the run waits there for them: --fault-wait-signal 3), and SIGINT twice to a single rank, stop the run after the step in progress with a
#      checkpoint and exit code 3; the resumed run's losses and final model are bit-identical to an
#      uninterrupted run's
#   6. ranks started with different flags, data, checkpoints or LLMC_* variables end together with one line
#      naming the first difference (they hung, aborted in MPI, trained divergent replicas, reported a wrong
#      accuracy, saved into two folders or sampled differently)
#   7. launch: Slurm variables count only in a task of srun; torchrun's variables count over the PMIx ones
#      of the srun task that started torchrun, and contradicting an MPI world they are refused; a RANK
#      that is no number is named as such; OpenMP
#      threads default to cores / local ranks (CPU target; the GPU target's ranks run one host thread)
#   8. the MPI engine's chunked path (the GPU target's with LLMC_MPI_STAGE_BYTES, run here on host memory):
#      chunks of 4, 100 and 1000 bytes through the slots give the same losses and model file, byte for
#      byte, as MPI on the buffers (dp=2 ZeRO-2 with accumulation; dp2 x tp2 x pp2 ZeRO-1 1F1B); so does
#      pp=2 GPipe in 8 KiB chunks (beyond Open MPI's eager size: a send-receive whose send waited for its
#      receive chunk by chunk hung there, the next stage answering only after the whole message); a
#      traced run prints the engine's rate; a bad LLMC_MPI_STAGE_BYTES is refused
# usage: scripts/test_dp.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=scripts/parallel_test_lib.sh
source "$(dirname "$0")/parallel_test_lib.sh"
make_tokens "$TMP/tokens.bin"
COMMON=(--layers 2 --channels 32 --heads 4 --vocab 1000 --max-seq-len 16 --seq-len 16 --steps 10 --lr 1e-3
        --warmup 2 --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "" --shuffle 1)
B=2

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

# ZeRO-2 reuses its two gradient slots from the third layer on: in strict mode (parallel_test_lib.sh) a
# slot rewritten before the reduce-scatter that reads it was waited for gives wrong losses
"$BIN" "${COMMON[@]}" --layers 3 --batch-size 4 --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
run 2 --layers 3 --batch-size 2 --zero 2 --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin"
compare "dp=2 zero=2 L=3 (slots reused)" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
# and the default (not strict) MPI engine, which users run
LLMC_COMM_STRICT=0 run 2 --layers 3 --batch-size 2 --zero 2 --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin"
compare "dp=2 zero=2 L=3, not strict" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"

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

# a divergence (an inf gradient, no loss scaling) ends every rank together: one error line, exit 1
timeout 90 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" --batch-size 2 --zero 1 --loss-scale off --fault-inf-rank 1 --fault-inf-step 2 \
    --save-every 1 --checkpoint-dir "$TMP/ck_div" >"$TMP/div.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c '^error:' "$TMP/div.out")" -eq 1 ] && grep -q "^error: training diverged at step 2" "$TMP/div.out" \
    && ! grep -q "MPI_ABORT" "$TMP/div.out" && [ ! -e "$TMP/ck_div/model_00000002.bin" ]; then
    echo "  ok    diverged on 2 ranks: $(grep '^error:' "$TMP/div.out")"
else echo "  FAIL  diverged on 2 ranks: exit $rc (want 1, one error line, no abort, no checkpoint of step 2)"; tail -5 "$TMP/div.out"; fails=$((fails + 1)); fi

# the watchdog (--comm-timeout): a stopped rank (SIGSTOP: no error, no exit) hung the job forever
timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 100000 --comm-timeout 3 >"$TMP/stop.out" 2>&1 &
job=$!
for _ in $(seq 150); do grep -q "^step     3" "$TMP/stop.out" && break; sleep 0.2; done
launcher=$(children_of $job | head -1)
victim=$(children_of "$launcher" | tail -1)  # one of the two ranks
start=$(date +%s)
[ -n "$victim" ] && kill -STOP "$victim"
wait $job
rc=$?
took=$(($(date +%s) - start))
[ -n "$victim" ] && { kill -CONT "$victim"; kill -KILL "$victim"; } 2>/dev/null
if [ -n "$victim" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 20 ] && [ "$(grep -c '^error:' "$TMP/stop.out")" -eq 1 ] \
    && grep -q "^error: rank [01]: .* did not complete within 3 s (--comm-timeout)" "$TMP/stop.out"; then
    echo "  ok    a stopped rank: exit $rc after $took s: $(grep '^error:' "$TMP/stop.out")"
else echo "  FAIL  a stopped rank: exit $rc after $took s (want one error line naming the wait, within 20 s)"; tail -4 "$TMP/stop.out"; fails=$((fails + 1)); fi
# waits around file I/O have their own deadline (--io-timeout): a slow checkpoint save is no dead peer
SLOW=(--batch-size 2 --steps 4 --save-every 4 --comm-timeout 4 --fault-slow-save 8)
# (--io-timeout 3, not less: the deadline also covers the barrier after loading, where ranks arrive apart)
timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" "${SLOW[@]}" --checkpoint-dir "$TMP/ck_slow" >"$TMP/slow.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ -e "$TMP/ck_slow/model_00000004.bin" ]; then echo "  ok    a save 8 s slow with --comm-timeout 4: the run completes"
else echo "  FAIL  a save 8 s slow with --comm-timeout 4: exit $rc"; tail -3 "$TMP/slow.out"; fails=$((fails + 1)); fi
timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" "${SLOW[@]}" --io-timeout 3 --checkpoint-dir "$TMP/ck_slow2" >"$TMP/slow.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^error:' "$TMP/slow.out")" -eq 1 ] && grep -q "^error: rank 1: .*within 3 s (--io-timeout)" "$TMP/slow.out"; then
    echo "  ok    the same with --io-timeout 3: $(grep '^error:' "$TMP/slow.out")"
else echo "  FAIL  the same with --io-timeout 3: exit $rc (want one error line naming --io-timeout)"; tail -3 "$TMP/slow.out"; fails=$((fails + 1)); fi

# the same for the final model (--save-model): every rank waits for rank 0's write under --io-timeout
timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" "${SLOW[@]}" --save-every 0 --save-model "$TMP/slow.bin" >"$TMP/slow.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(stat -c %s "$TMP/slow.bin" 2>/dev/null)" = "$(stat -c %s "$TMP/ck_slow/model_00000004.bin")" ]; then
    echo "  ok    --save-model 8 s slow with --comm-timeout 4: the run completes, the model complete"
else echo "  FAIL  --save-model 8 s slow with --comm-timeout 4: exit $rc"; tail -3 "$TMP/slow.out"; fails=$((fails + 1)); fi
# sampling takes long on large models: at dp=2 only the first DP group sampled, and the other rank's
# next collective passed --comm-timeout while it waited ("a peer rank is stopped, hung or gone")
timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 4 --vocab 50257 --tokenizer data/gpt2_tokenizer.bin \
    --sample-every 2 --sample-len 4 --comm-timeout 2 --fault-slow-sample 4 >"$TMP/sample.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '^sample:' "$TMP/sample.out")" -eq 2 ]; then echo "  ok    samples 4 s slow with --comm-timeout 2 at dp=2: the run completes"
else echo "  FAIL  samples 4 s slow with --comm-timeout 2 at dp=2: exit $rc"; grep -m2 "^error" "$TMP/sample.out"; fails=$((fails + 1)); fi

echo "4. bad input"
expect_mpi_error "world size 3 with --dp 2" "world size 3 does not equal dp x tp x pp = 2 x 1 x 1" 3 "$BIN" "${COMMON[@]}" --batch-size 2 --dp 2

echo "5. a signal stops the run with a checkpoint; the resumed run equals an uninterrupted one bit for bit"
# the process of world rank R among the descendants of PID (timeout -> mpirun -> ranks, or timeout -> trainer)
rank_pid() {
    local p
    for p in $(children_of "$1"); do
        if [ "$2" = single ] || tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
        rank_pid "$p" "$2"
    done
}
# signal_case NAME NP "SIGNAL:RANK ..." ARGS...: an uninterrupted run of SIG_STEPS steps, then one that
# gets the signals (in order, at once) after step 3, then its resume; all with ARGS. The signalled run
# waits after step 3 until a signal has come (--fault-wait-signal 3), so the test does not race it.
SIG_STEPS=20
signal_case() {
    local name=$1 np=$2 signals=$3 launch=("$BIN") i sr p
    shift 3
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np" "$BIN")
    local args=("${COMMON[@]}" --steps $SIG_STEPS "$@")
    rm -rf "$TMP/sig_ck" "$TMP/sig_r.jsonl"
    timeout 120 "${launch[@]}" "${args[@]}" --log "$TMP/sig_u.jsonl" --save-model "$TMP/sig_u.bin" >"$TMP/sig.out" 2>&1 \
        || { echo "  FAIL  $name: the uninterrupted run did not complete (exit $?)"; tail -3 "$TMP/sig.out"; fails=$((fails + 1)); return; }
    # (sig.out is removed first: the background job truncates it only when it starts, and the loop below
    # must not find the uninterrupted run's "step 3" in it and signal a run that is not yet listening)
    rm -f "$TMP/sig.out"
    timeout 120 "${launch[@]}" "${args[@]}" --log "$TMP/sig_r.jsonl" --checkpoint-dir "$TMP/sig_ck" --fault-wait-signal 3 >"$TMP/sig.out" 2>&1 &
    local job=$!
    for i in $(seq 600); do grep -q "^step     3/" "$TMP/sig.out" || ! kill -0 $job 2>/dev/null && break; sleep 0.1; done
    for sr in $signals; do
        p=$(rank_pid $job "${sr#*:}")
        [ -n "$p" ] && kill -"${sr%:*}" "$p" 2>/dev/null  # (a second signal may come after the run ended)
    done
    wait $job
    local rc=$? stopped
    stopped=$(sed -n 's/^stopped by SIG[A-Z0-9]* after step \([0-9]*\):.*/\1/p' "$TMP/sig.out")
    if [ $rc -eq 3 ] && [ "$stopped" = 3 ] && [ -f "$TMP/sig_ck/model_$(printf %08d "$stopped").bin" ]; then
        echo "  ok    $name: exit 3, $(grep '^stopped by' "$TMP/sig.out")"
    else
        echo "  FAIL  $name: exit $rc (want 3), stopped after step '$stopped' (want 3)"; tail -5 "$TMP/sig.out"; fails=$((fails + 1)); return
    fi
    timeout 120 "${launch[@]}" "${args[@]}" --log "$TMP/sig_r.jsonl" --resume "$TMP/sig_ck" --save-model "$TMP/sig_r.bin" >"$TMP/sig.out" 2>&1 \
        || { echo "  FAIL  $name: the resume did not run"; tail -5 "$TMP/sig.out"; fails=$((fails + 1)); return; }
    if cmp -s "$TMP/sig_u.bin" "$TMP/sig_r.bin" && "$PY" - "$TMP/sig_u.jsonl" "$TMP/sig_r.jsonl" $SIG_STEPS <<'PYEOF'
import json, sys
u, r = ([(x["step"], x["loss"]) for x in map(json.loads, open(p)) if "loss" in x] for p in sys.argv[1:3])
sys.exit(0 if u == r and len(u) == int(sys.argv[3]) else 1)  # every loss, bit for bit (printed with 9 significant digits: float32 exactly)
PYEOF
    then echo "  ok    $name: resumed == uninterrupted ($SIG_STEPS losses and the final model, bit for bit)"
    else echo "  FAIL  $name: resumed run differs from the uninterrupted one"; fails=$((fails + 1)); fi
}
signal_case "SIGTERM to rank 1 of 2 (ZeRO-1)" 2 "TERM:1 USR1:0" --batch-size 4 --zero 1
signal_case "SIGINT twice, one rank" 1 "INT:single INT:single" --batch-size 8

echo "6. ranks started differently (mpirun -np 1 A : -np 1 B) end together with one line naming what differs"
# each case hung, aborted inside MPI or trained divergent replicas before ranks compared their jobs
make_tokens "$TMP/other/tokens.bin" 7  # same name, other content (node-local data that differs)
"$BIN" "${COMMON[@]}" --batch-size 4 --stop-after 2 --checkpoint-dir "$TMP/ckA" >/dev/null 2>&1
"$BIN" "${COMMON[@]}" --batch-size 4 --stop-after 2 --checkpoint-dir "$TMP/ckB" >/dev/null 2>&1  # another run
cp -r "$TMP/ckA" "$TMP/ckA_copy"
mismatch() {  # NAME PATTERN "ARGS OF RANK 0" "ARGS OF RANK 1" ["ENVIRONMENT OF RANK 0" "ENVIRONMENT OF RANK 1"]
    local name=$1 pattern=$2 start rc took
    read -r -a a0 <<<"$3"
    read -r -a a1 <<<"$4"
    read -r -a e0 <<<"${5:-}"
    read -r -a e1 <<<"${6:-}"
    start=$(date +%s)
    timeout 60 "${MPIRUN[@]}" -np 1 env "${e0[@]}" "$BIN" "${COMMON[@]}" "${a0[@]}" : -np 1 env "${e1[@]}" "$BIN" "${COMMON[@]}" "${a1[@]}" \
        >"$TMP/mm.out" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^error:' "$TMP/mm.out")" -eq 1 ] \
        && grep -q "^error: the ranks were started differently: $pattern.* differs" "$TMP/mm.out" && ! grep -q "MPI_ABORT\|MPI_ERR" "$TMP/mm.out"; then
        echo "  ok    $name: exit $rc after $took s: $(grep '^error:' "$TMP/mm.out")"
    else echo "  FAIL  $name: exit $rc after $took s (want one error line naming $pattern)"; tail -4 "$TMP/mm.out"; fails=$((fails + 1)); fi
}
mismatch "--steps 2 : 50" "--steps" "--batch-size 2 --steps 2" "--batch-size 2 --steps 50"
mismatch "--zero 1 : 0" "--zero" "--batch-size 2 --zero 1" "--batch-size 2 --zero 0"
mismatch "--lr" "--lr" "--batch-size 2 --lr 1e-3" "--batch-size 2 --lr 2e-3"
mismatch "--seed" "--seed" "--batch-size 2 --seed 1" "--batch-size 2 --seed 2"
mismatch "--batch-size 2 : 4" "--batch-size" "--batch-size 2" "--batch-size 4"
mismatch "data file" "the training data" "--batch-size 2" "--batch-size 2 --train-data $TMP/other/tokens.bin"
mismatch "--resume of two runs" "the checkpoint resumed from" "--batch-size 2 --resume $TMP/ckA" "--batch-size 2 --resume $TMP/ckB"
mismatch "--channels 16 : 32" "the model sizes" "--batch-size 2 --channels 16" "--batch-size 2 --channels 32"
# what evaluates, samples and saves (a wrong accuracy, checkpoints split across two folders, mixed samples)
"$PY" - "$TMP/eval.bin" "$TMP/other/eval.bin" <<'PYEOF'
import random, sys
sys.path.insert(0, "scripts")
from make_eval_data import write_evalfile
for seed, path in enumerate(sys.argv[1:]):
    rng = random.Random(seed)
    write_evalfile(path, [(rng.randrange(4), [rng.randrange(512) for _ in range(5)], [[rng.randrange(512)] * 3 for _ in range(4)])
                          for _ in range(8)])
PYEOF
mismatch "--eval-data (same name, other content)" "the multiple-choice data (--eval-data" "--batch-size 2 --eval-data $TMP/eval.bin" \
    "--batch-size 2 --eval-data $TMP/other/eval.bin"
mismatch "--eval-every" "the evaluation settings.*--eval-every" "--batch-size 2 --eval-data $TMP/eval.bin --eval-every 5" \
    "--batch-size 2 --eval-data $TMP/eval.bin --eval-every 10"
mismatch "--checkpoint-dir" "--checkpoint-dir" "--batch-size 2 --save-every 5 --checkpoint-dir $TMP/cdA" "--batch-size 2 --save-every 5 --checkpoint-dir $TMP/cdB"
mismatch "--save-model-dtype" "the saving settings" "--batch-size 2 --save-model $TMP/sm.bin --save-model-dtype bf16" \
    "--batch-size 2 --save-model $TMP/sm.bin --save-model-dtype fp32"
SAMPLE="--batch-size 2 --vocab 50257 --tokenizer data/gpt2_tokenizer.bin --sample-every 20"  # (a prompt needs sampling on)
mismatch "--prompt" "the sampling settings.*--prompt" "$SAMPLE --prompt Hello" "$SAMPLE --prompt World"
mismatch "--temperature" "the sampling settings.*--temperature" "--batch-size 2 --temperature 0" "--batch-size 2 --temperature 1"
mismatch "--top-k" "the sampling settings.*--top-k" "--batch-size 2 --top-k 0" "--batch-size 2 --top-k 40"
mismatch "--fused-kernels" "the kernel variants (--fused-kernels" "--batch-size 2 --fused-kernels 1" "--batch-size 2 --fused-kernels 0"
# OpenBLAS and the reference GEMM round differently: TP's partial products and DP's replicas would differ
if "$BIN" --cpu-matmul blas --plan >/dev/null 2>&1; then
    mismatch "--cpu-matmul" "the CPU matmul (--cpu-matmul)" "--batch-size 2 --cpu-matmul blas" "--batch-size 2 --cpu-matmul reference"
else echo "  skip  --cpu-matmul: this build has no BLAS"; fi
# the environment the engine reads (chunks of other sizes: messages of other sizes; strict mode on one rank only)
mismatch "LLMC_MPI_STAGE_BYTES" "the MPI engine's settings.*LLMC_MPI_STAGE_BYTES" "--batch-size 2" "--batch-size 2" "LLMC_MPI_STAGE_BYTES=100" ""
mismatch "LLMC_COMM_STRICT" "the MPI engine's settings.*LLMC_COMM_STRICT" "--batch-size 2" "--batch-size 2" "LLMC_COMM_STRICT=1" "LLMC_COMM_STRICT=0"
# node-local copies of the same checkpoint and data are the same job (saving into one folder: by default
# a resumed run saves into the folder it resumed from, and two folders would each hold part of a checkpoint)
mkdir -p "$TMP/copy" && cp "$TMP/tokens.bin" "$TMP/copy/tokens.bin"
if timeout 60 "${MPIRUN[@]}" -np 1 "$BIN" "${COMMON[@]}" --batch-size 2 --resume "$TMP/ckA" --checkpoint-dir "$TMP/ckS" : -np 1 "$BIN" \
    "${COMMON[@]}" --batch-size 2 --resume "$TMP/ckA_copy" --checkpoint-dir "$TMP/ckS" --train-data "$TMP/copy/tokens.bin" >"$TMP/mm.out" 2>&1
then echo "  ok    copies of the checkpoint and data in other folders: the run trains"
else echo "  FAIL  copies of the checkpoint and data in other folders"; tail -4 "$TMP/mm.out"; fails=$((fails + 1)); fi

echo "7. launch"
# `sbatch -n 4` runs its script once: one process that sees the allocation's SLURM_NTASKS=4 but no step
if env SLURM_JOB_ID=1 SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1 \
    && grep -q "1 rank(s)" "$TMP/sb.out"; then echo "  ok    Slurm variables without a step (a batch script): one rank"
else echo "  FAIL  Slurm variables without a step (a batch script) must run as one rank"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# in a task of srun the same variables make 4 ranks (which the CPU build can only run under mpirun)
env SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
if grep -q "^error: several ranks need mpirun" "$TMP/sb.out"; then echo "  ok    the same under srun: 4 ranks ($(grep '^error:' "$TMP/sb.out"))"
else echo "  FAIL  the same under srun must mean 4 ranks"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# `srun --mpi=pmix torchrun ...`: the workers inherit the PMIx variables of the srun task that ran torchrun,
# yet torchrun's describe them (2 ranks here, which the CPU build can only run under mpirun); they trained
# alone, each as a world of one
env PMIX_RANK=0 PMIX_NAMESPACE=slurm.pmix.1.0 SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 \
    WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
if grep -q "^error: several ranks need mpirun.*torchrun's WORLD_SIZE says 2" "$TMP/sb.out"; then echo "  ok    torchrun under srun with PMIx: torchrun's 2 ranks ($(grep '^error:' "$TMP/sb.out"))"
else echo "  FAIL  torchrun under srun with PMIx must mean torchrun's 2 ranks"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# mpirun's 2 processes with WORLD_SIZE=4 (no torchrun started once in each: that would make 2 x LOCAL_WORLD_SIZE)
timeout 60 "${MPIRUN[@]}" -np 2 -x WORLD_SIZE=4 -x RANK=0 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c '^error:' "$TMP/sb.out")" -eq 1 ] && grep -q "^error: the launchers disagree: .*WORLD_SIZE=4" "$TMP/sb.out"; then
    echo "  ok    mpirun -np 2 with WORLD_SIZE=4: exit $rc, $(grep '^error:' "$TMP/sb.out")"
else echo "  FAIL  mpirun -np 2 with WORLD_SIZE=4: exit $rc (want one line: the launchers disagree)"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# a launcher variable that is no number: atoi made RANK=abc rank 0, and two ranks 0 named another cause
env WORLD_SIZE=2 RANK=abc LOCAL_RANK=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c . "$TMP/sb.out")" -eq 1 ] && grep -q "^error: RANK is 'abc': not a number" "$TMP/sb.out"; then
    echo "  ok    RANK=abc: $(cat "$TMP/sb.out")"
else echo "  FAIL  RANK=abc: exit $rc (want 1 and one line: RANK is not a number)"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# an MPMD peer that never starts MPI (here `sleep`): MPI_Init cannot be polled, and waited until the peer ended
start=$(date +%s)
timeout 60 "${MPIRUN[@]}" -np 1 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 --comm-timeout 3 : -np 1 sleep 40 >"$TMP/mi.out" 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $took -le 20 ] && grep -q "^error: MPI_Init did not complete within 3 s (--comm-timeout)" "$TMP/mi.out"; then
    echo "  ok    a peer that never starts MPI: exit $rc after $took s, $(grep '^error:' "$TMP/mi.out")"
else echo "  FAIL  a peer that never starts MPI: exit $rc after $took s (want one line within 20 s: MPI_Init did not complete)"; grep -m2 . "$TMP/mi.out"; fails=$((fails + 1)); fi
# OpenMP threads: without OMP_NUM_THREADS, the cores this process may use / the ranks on the node
cores=$(env -u OMP_NUM_THREADS nproc)  # (nproc itself honours OMP_NUM_THREADS)
want=$((cores / 2)); [ $want -lt 1 ] && want=1
env -u OMP_NUM_THREADS timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/omp.out" 2>&1
if gpu_target; then echo "  skip  2 ranks, OMP_NUM_THREADS unset: the GPU target runs one host thread per rank (sets no OpenMP threads)"
elif grep -q "^threads: $want OpenMP thread(s) per rank (OMP_NUM_THREADS unset" "$TMP/omp.out"; then echo "  ok    2 ranks, OMP_NUM_THREADS unset: $want thread(s) each ($cores cores)"
else echo "  FAIL  2 ranks, OMP_NUM_THREADS unset: want $want thread(s) each"; grep "threads\|error" "$TMP/omp.out" | head -3; fails=$((fails + 1)); fi

echo "8. the MPI engine through host slots in chunks"
same() {  # NAME: $TMP/st.* equals $TMP/dr.* (losses of every step, model file byte for byte)
    if cmp -s "$TMP/dr.bin" "$TMP/st.bin" && "$PY" - "$TMP/dr.jsonl" "$TMP/st.jsonl" <<'PYEOF'
import json, sys
losses = [[(r["step"], r["loss"]) for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:]]
sys.exit(0 if losses[0] and losses[0] == losses[1] else 1)
PYEOF
    then echo "  ok    $1: identical to MPI on the buffers"
    else echo "  FAIL  $1: differs from MPI on the buffers"; fails=$((fails + 1)); fi
}
for cfg in "2|--layers 3 --batch-size 2 --grad-accum 2 --zero 2|4 1000" \
           "2|--channels 128 --batch-size 8 --pp 2 --schedule gpipe --micro-batches 2 --comm-timeout 20|16384" \
           "8|--batch-size 4 --dp 2 --tp 2 --pp 2 --zero 1 --micro-batches 4 --schedule 1f1b|100"; do
    IFS='|' read -r np flags sizes <<<"$cfg"
    # shellcheck disable=SC2086
    run "$np" $flags --steps 4 --log "$TMP/dr.jsonl" --save-model "$TMP/dr.bin"
    for bytes in $sizes; do
        # shellcheck disable=SC2086
        LLMC_MPI_STAGE_BYTES=$bytes run "$np" $flags --steps 4 --log "$TMP/st.jsonl" --save-model "$TMP/st.bin" --trace "$TMP/st.json"
        same "$np ranks $flags, $bytes-byte chunks"
    done
done
# the last run was traced: its rate over the traced steps
if grep -Eq "^communication, MPI engine: [1-9][0-9]* operations, [0-9.]+ MB in [0-9.]+ s per rank: [0-9.e+-]+ GB/s" "$TMP/run.out" \
    && ! grep -q " 0 GB/s" "$TMP/run.out"; then echo "  ok    a traced run prints the rate: $(grep '^communication' "$TMP/run.out")"
else echo "  FAIL  a traced run must print the engine's rate"; tail -3 "$TMP/run.out"; fails=$((fails + 1)); fi
LLMC_MPI_STAGE_BYTES=0 expect_mpi_error "LLMC_MPI_STAGE_BYTES=0" "LLMC_MPI_STAGE_BYTES must be" 2 "$BIN" "${COMMON[@]}" --batch-size 2

if [ $fails -ne 0 ]; then echo "test_dp: $fails FAILED"; exit 1; fi
echo "test_dp: all passed"
