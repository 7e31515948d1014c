#!/usr/bin/env bash
# memory_plan_emulated.sh: the GPU target's memory plan (--plan, llmc's dry build) against what the
# GPU code really allocates, measured on the CPU emulation of CUDA (make emulated). There cudaMalloc counts
# every device block and cudaMemGetInfo reports their sum, with no CUDA context beside it, so after the
# first applied step every rank's line "device memory after the first step[, rank R]: ... (in use -
# planned: D MiB)" must show D = 0 up to cudaMalloc's rounding of each block to 256 bytes: |D| <= 16 KiB
# (the rounding of 64 blocks; measured at most 4 KiB, while one activation tensor here is 128 KiB or
# more). On a real GPU D also holds the CUDA context, so this check is for the emulation only. What is
# allocated and freed within a step is not seen. Cases: each precision, --fused-kernels 1, --attention
# flash, recompute levels, gradient accumulation, FP16 (whose first steps the loss scaler skips), and 2
# ranks (each checked) of ZeRO-1, ZeRO-2, ZeRO-3, TP, PP, interleaved PP and ZB-H1.
# usage: tests/memory_plan_emulated.sh [build/emu]   (build/emu-{fp32,bf16,fp16}/train_gpt)
set -u
EMU=${1:-build/emu}
BIN=$EMU-fp32/train_gpt
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
make_tokens "$TMP/tokens.bin"
COMMON=(--layers 2 --channels 128 --heads 2 --vocab 512 --max-seq-len 128 --seq-len 128 --batch-size 4 --steps 3
        --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "")

# check NP PRECISION ARGS...
check() {
    local np=$1 p=$2 rc start=$SECONDS
    shift 2
    local launch=("$EMU-$p/train_gpt")
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np" "$EMU-$p/train_gpt")
    timeout 300 "${launch[@]}" "${COMMON[@]}" "$@" >"$TMP/out" 2>&1
    rc=$?
    grep "^device memory after the first step" "$TMP/out" >"$TMP/lines"
    if [ $rc -eq 0 ] && "$PY" - "$TMP/lines" "$np" <<'PYEOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
diffs = [float(re.search(r"planned: ([-+0-9.]+) MiB", l).group(1)) for l in lines]
sys.exit(0 if len(diffs) == int(sys.argv[2]) and all(abs(d) <= 16 / 1024 for d in diffs) else 1)
PYEOF
    then echo "  ok    $p, $np rank(s) $*: in use - planned $(grep -o '[-+][0-9.]* MiB' "$TMP/lines" | tr '\n' ' ')($((SECONDS - start)) s)"
    else
        echo "  FAIL  $p, $np rank(s) $*: exit $rc$([ $rc -eq 124 ] && echo ' (timed out after 300 s)'), want one line per rank within 16 KiB:"
        sed 's/^/        /' "$TMP/lines"; tail -3 "$TMP/out"; fails=$((fails + 1))
    fi
}
check 1 fp32
check 1 fp32 --recompute 2 --grad-accum 2 --fused-kernels 0
check 1 bf16 --fused-kernels 0 --attention classic  # (the default here is the fast path)
check 1 bf16 --fused-kernels 1 --attention flash --recompute 3
check 1 bf16 --attention flash --recompute 3 --recompute-segment 2
check 1 bf16 --fused-kernels 1  # (no recomputation: GELU in the fc product's epilogue)
check 1 fp16 --attention flash
check 2 bf16 --zero 1
check 2 bf16 --zero 2 --grad-accum 2
check 2 bf16 --zero 3 --grad-accum 2 --attention flash --recompute 3 --recompute-segment 2
check 2 fp32 --tp 2
check 2 fp32 --pp 2 --micro-batches 2
check 2 bf16 --pp 2 --micro-batches 2 --pp-schedule interleaved --virtual-stages 2 --layers 4  # (each stage's 2 chunks)
check 2 bf16 --pp 2 --micro-batches 2 --pp-schedule zb-h1  # (every stage 2 slots, 1 and 2 sets of output gradients, the last stage one set of logits)
[ $fails -eq 0 ] || { echo "memory_plan_emulated: $fails FAILED"; exit 1; }
echo "memory_plan_emulated: all passed"
