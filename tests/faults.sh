#!/usr/bin/env bash
# faults.sh: a rank that dies, fails, diverges, stops or is slow, on the CPU target under mpirun: every
# rank ends together with one line, within the deadlines (--comm-timeout, on the engines' waits;
# --io-timeout around file I/O), or waits when it should. (The NCCL engine's: nccl_emulated.sh part 3.)
#   a rank killed mid-run ends every rank with a non-zero exit within 60 s; an error on every rank ends
#   them within 60 s; a divergence ends both ranks with one error line and exit 1; a stopped rank
#   (SIGSTOP) ends the job through the watchdog (--comm-timeout) with one line; a slow checkpoint save,
#   or a slow final model, waits under --io-timeout instead; a sample longer than --comm-timeout is no
#   dead peer (every DP group samples)
# usage: tests/faults.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)

echo "a rank that dies ends the run"
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

if [ $fails -ne 0 ]; then echo "faults: $fails FAILED"; exit 1; fi
echo "faults: all passed"
