#!/usr/bin/env bash
# test_memory_plan_emulated.sh: the GPU target's memory plan (--plan, llmc's dry build) against what the
# GPU code really allocates, measured on the CPU emulation of CUDA (make emulated). There cudaMalloc counts
# every device block and cudaMemGetInfo reports their sum, with no CUDA context beside it, so after the
# first applied step the trainer's line "device memory after the first step: ... (in use - planned: D MiB)"
# must show D = 0 up to cudaMalloc's rounding of each block to 256 bytes: |D| <= 0.0625 MiB (the rounding
# of 256 blocks; measured at most 0.004 MiB, while one activation tensor here is 0.125 MiB or more). On a real GPU D also holds the CUDA context, so this check is for the
# emulation only. Cases: each precision, --fused-kernels 1, --attention flash, recompute levels, gradient
# accumulation, FP16 (whose first steps are skipped by the loss scaler), and 2 ranks of ZeRO-1, ZeRO-2, TP
# and PP.
# usage: scripts/test_memory_plan_emulated.sh [build/emu]   (build/emu-{fp32,bf16,fp16}/train_gpt)
set -u
EMU=${1:-build/emu}
BIN=$EMU-fp32/train_gpt
# shellcheck source=scripts/parallel_test_lib.sh
source "$(dirname "$0")/parallel_test_lib.sh"
make_tokens "$TMP/tokens.bin"
COMMON=(--layers 2 --channels 128 --heads 2 --vocab 512 --max-seq-len 128 --seq-len 128 --batch-size 4 --steps 3
        --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "")

# check NP PRECISION ARGS...
check() {
    local np=$1 p=$2 line
    shift 2
    local launch=("$EMU-$p/train_gpt")
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np" "$EMU-$p/train_gpt")
    timeout 300 "${launch[@]}" "${COMMON[@]}" "$@" >"$TMP/out" 2>&1
    line=$(grep "^device memory after the first step" "$TMP/out")
    if [ -n "$line" ] && "$PY" -c 'import re, sys; d = float(re.search(r"planned: ([-+0-9.]+) MiB", sys.argv[1]).group(1)); sys.exit(abs(d) > 0.0625)' "$line"; then
        echo "  ok    $p, $np rank(s) $*: ${line#device memory after the first step: }"
    else
        echo "  FAIL  $p, $np rank(s) $*: ${line:-no device memory line}"; tail -3 "$TMP/out"; fails=$((fails + 1))
    fi
}
check 1 fp32
check 1 fp32 --recompute 2 --grad-accum 2
check 1 bf16
check 1 bf16 --fused-kernels 1 --attention flash --recompute 3
check 1 fp16 --attention flash
check 2 bf16 --zero 1
check 2 bf16 --zero 2 --grad-accum 2
check 2 fp32 --tp 2
check 2 fp32 --pp 2 --micro-batches 2
[ $fails -eq 0 ] || { echo "test_memory_plan_emulated: $fails FAILED"; exit 1; }
echo "test_memory_plan_emulated: all passed"
