#!/usr/bin/env bash
# zero.sh: ZeRO-1 and ZeRO-2 (optimizer state, then gradients, sharded over the data-parallel ranks,
# llmc/zero.h) on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: dp in {2,3,4} x ZeRO in {1,2} x grad_accum in {1,2}: 10 steps equal the
#      single-rank run of the same global batch (dp x B sequences per micro-step): every loss to 1e-5
#      relative and the final parameters to 1e-5 relative norm (fp32; sums over ranks are taken in
#      another order than one rank's, so results agree to rounding, ~1e-7, not bit for bit); ZeRO-2 with
#      its gradient slots reused (3 layers)
#      (every run in the MPI engine's strict mode, see lib.sh; one also in the default mode)
#   2. sharded checkpoints: resume at the same dp is bit-exact (same final model file, byte for byte); a
#      run saved at dp=4 (ZeRO-2) and resumed at dp=2 (ZeRO-1) re-shards and continues with the same
#      losses to 1e-5, and so does one resumed on one rank; a duplicated or forged shard (one that is not
#      what its name says, or shards that cover some parameters twice) is refused; --keep-last 1 leaves
#      only the newest checkpoint's files (model and every shard)
# ZeRO 0 (plain data parallelism): data_parallel.sh.
# usage: tests/zero.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)
B=2

echo "1. equivalence with the single-rank run of the same global batch"
dp_equivalence "$B" 1 2

# ZeRO-2 reuses its two gradient slots from the third layer on: in strict mode (lib.sh) a
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

if [ $fails -ne 0 ]; then echo "zero: $fails FAILED"; exit 1; fi
echo "zero: all passed"
