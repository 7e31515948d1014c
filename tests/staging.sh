#!/usr/bin/env bash
# staging.sh: the MPI engine's path in pieces (the GPU target's with LLMC_MPI_STAGE_BYTES: GPU buffers
# through host buffers, llmc/comm/staging.h; run here on host memory), on the CPU target under mpirun:
# pieces of 4, 100 and 1000 bytes through the host buffers give the same losses and model file, byte for byte,
# as MPI on the buffers (dp=2 ZeRO-2 with accumulation; dp2 x tp2 x pp2 ZeRO-1 1F1B); so does pp=2 GPipe
# in 8 KiB pieces (beyond Open MPI's eager size: a send-receive whose send waited for its receive piece by
# piece hung there, the next stage answering only after the whole message); a traced run prints the
# engine's rate; a bad LLMC_MPI_STAGE_BYTES is refused.
# usage: tests/staging.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)

echo "the MPI engine through host buffers in pieces"
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
           "2|--channels 128 --batch-size 8 --pp 2 --pp-schedule gpipe --micro-batches 2 --comm-timeout 20|16384" \
           "8|--batch-size 4 --dp 2 --tp 2 --pp 2 --zero 1 --micro-batches 4 --pp-schedule 1f1b|100"; do
    IFS='|' read -r np flags sizes <<<"$cfg"
    # shellcheck disable=SC2086
    run "$np" $flags --steps 4 --log "$TMP/dr.jsonl" --save-model "$TMP/dr.bin"
    for bytes in $sizes; do
        # shellcheck disable=SC2086
        LLMC_MPI_STAGE_BYTES=$bytes run "$np" $flags --steps 4 --log "$TMP/st.jsonl" --save-model "$TMP/st.bin" --trace "$TMP/st.json"
        same "$np ranks $flags, $bytes-byte pieces"
    done
done
# the last run was traced: its rate over the traced steps
if grep -Eq "^communication, MPI engine: [1-9][0-9]* operations, [0-9.]+ MB in [0-9.]+ s per rank: [0-9.e+-]+ GB/s" "$TMP/run.out" \
    && ! grep -q " 0 GB/s" "$TMP/run.out"; then echo "  ok    a traced run prints the rate: $(grep '^communication' "$TMP/run.out")"
else echo "  FAIL  a traced run must print the engine's rate"; tail -3 "$TMP/run.out"; fails=$((fails + 1)); fi
LLMC_MPI_STAGE_BYTES=0 expect_mpi_error "LLMC_MPI_STAGE_BYTES=0" "LLMC_MPI_STAGE_BYTES must be" 2 "$BIN" "${COMMON[@]}" --batch-size 2

if [ $fails -ne 0 ]; then echo "staging: $fails FAILED"; exit 1; fi
echo "staging: all passed"
