#!/usr/bin/env bash
# test_dp.sh: data parallelism and ZeRO on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: dp in {2,3,4} x ZeRO in {0,1,2} x grad_accum in {1,2}: 10 steps equal the
#      single-rank run of the same global batch (dp x B sequences per micro-step): every loss to 1e-5
#      relative and the final parameters to 1e-5 relative norm (fp32; sums over ranks are taken in
#      another order than one rank's, so results agree to rounding, ~1e-7, not bit for bit)
#   2. checkpoints: resume at the same dp is bit-exact (same final model file, byte for byte); a run
#      saved at dp=4 (ZeRO-2) and resumed at dp=2 (ZeRO-1) re-shards and continues with the same losses
#      to 1e-5; a duplicated or forged shard (one that is not what its name says, or shards that cover
#      some parameters twice) is refused
#   3. failure: a rank killed mid-run ends every rank with a non-zero exit within 60 s; a divergence
#      ends both ranks with one error line and exit 1
#   4. bad input: a world size that is not dp x tp x pp
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

echo "4. bad input"
expect_mpi_error "world size 3 with --dp 2" "world size 3 does not equal dp x tp x pp = 2 x 1 x 1" 3 "$BIN" "${COMMON[@]}" --batch-size 2 --dp 2

if [ $fails -ne 0 ]; then echo "test_dp: $fails FAILED"; exit 1; fi
echo "test_dp: all passed"
