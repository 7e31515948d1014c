#!/usr/bin/env bash
# recompute.sh: activation recomputation on the CPU target, under mpirun where ranks are involved.
# Recomputation repeats the same operations on the same inputs, so every run here must give the same bits
# as the run that recomputes nothing: the same loss lines, validation losses and final model file, byte
# for byte (test_gpt.cu's test_recompute checks each level on one rank, and the memory each keeps).
#   1. sublinear checkpointing (--recompute 3 --recompute-segment K) on one rank, L=5: K = 2 and 3 (which
#      do not divide 5), 5 (one segment) and 8 (more than the layers)
#   2. the same with pipeline stages (pp 2, 1F1B and GPipe with --pp-rematerialize: stages of 3 and 2
#      layers) and with tensor parallelism (tp 2, whose recomputed forward all-reduces again)
#   3. --recompute-segment without --recompute 3 is refused with one line; --plan names the best K
# usage: tests/recompute.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
make_tokens "$TMP/tokens.bin"
# --fused-kernels 0: on the GPU a run without recomputation computes GELU in the fc product's epilogue, from
# the unrounded sum, and a recomputing run in GELU's own kernel, which may differ in the last bit
# (llmc/device.h, separate_gelu); the unfused kernels compute it one way in both (the CPU target: either way)
COMMON=(--layers 5 --channels 32 --heads 4 --vocab 512 --max-seq-len 16 --seq-len 16 --batch-size 4 --steps 6 --lr 1e-3
        --warmup 2 --val-every 3 --val-batches 2 --sample-every 0 --train-data "$TMP/tokens.bin" --val-data "$TMP/tokens.bin"
        --tokenizer "" --fused-kernels 0)

same() {  # NAME OUT_A MODEL_A OUT_B MODEL_B: loss and val lines (less timings) and the model, byte for byte
    if cmp -s "$3" "$5" && diff <(grep -o "step *[0-9/]* | loss [0-9.]*\|val loss [0-9.]*" "$2") \
                                <(grep -o "step *[0-9/]* | loss [0-9.]*\|val loss [0-9.]*" "$4") >/dev/null; then
        echo "  ok    $1: losses and model bit-identical to no recomputation"
    else
        echo "  FAIL  $1: differs from no recomputation"; fails=$((fails + 1))
    fi
}

echo "1. sublinear checkpointing on one rank"
"$BIN" "${COMMON[@]}" --save-model "$TMP/r0.bin" >"$TMP/r0.out"
for K in 2 3 5 8; do
    "$BIN" "${COMMON[@]}" --recompute 3 --recompute-segment $K --save-model "$TMP/k.bin" >"$TMP/k.out" \
        || { echo "  FAIL  --recompute-segment $K did not run"; fails=$((fails + 1)); }
    same "--recompute 3 --recompute-segment $K" "$TMP/k.out" "$TMP/k.bin" "$TMP/r0.out" "$TMP/r0.bin"
done

echo "2. with pipeline stages and tensor parallelism"
for par in "--pp 2 --micro-batches 2 --pp-schedule 1f1b" "--pp 2 --micro-batches 2 --pp-schedule gpipe --pp-rematerialize 1" "--tp 2"; do
    # shellcheck disable=SC2086
    run 2 $par --save-model "$TMP/p0.bin" && cp "$TMP/run.out" "$TMP/p0.out"
    for K in 2 3; do
        # shellcheck disable=SC2086
        run 2 $par --recompute 3 --recompute-segment $K --save-model "$TMP/pk.bin"
        same "$par, segments of $K" "$TMP/run.out" "$TMP/pk.bin" "$TMP/p0.out" "$TMP/p0.bin"
    done
done

echo "3. the flag"
if "$BIN" "${COMMON[@]}" --recompute 2 --recompute-segment 2 >"$TMP/bad.out" 2>&1; then
    echo "  FAIL  --recompute-segment without --recompute 3 was accepted"; fails=$((fails + 1))
elif [ "$(wc -l <"$TMP/bad.out")" -eq 1 ] && grep -q "needs --recompute 3" "$TMP/bad.out"; then
    echo "  ok    --recompute-segment without --recompute 3: $(cat "$TMP/bad.out")"
else
    echo "  FAIL  --recompute-segment without --recompute 3: $(cat "$TMP/bad.out")"; fails=$((fails + 1))
fi
# the plan's best K: no K from 1 to L is planned below it (each K planned on its own)
PLAN=("$BIN" --plan --layers 12 --channels 768 --heads 12 --batch-size 8 --seq-len 1024 --max-seq-len 1024 --recompute 3)
line=$("${PLAN[@]}" | grep "the least memory with --recompute-segment")
best=$(echo "$line" | sed -n 's/.*--recompute-segment \([0-9]*\): \([0-9.]*\) GiB.*/\1/p')
best_total=$(echo "$line" | sed -n 's/.*--recompute-segment \([0-9]*\): \([0-9.]*\) GiB.*/\2/p')
below=""
for K in $(seq 1 12); do
    total=$("${PLAN[@]}" --recompute-segment "$K" | sed -n 's/.*total *\([0-9.]*\) GiB.*/\1/p')
    awk "BEGIN { exit !($total < $best_total) }" && below="$below $K"
done
if [ -n "$best" ] && [ -z "$below" ]; then echo "  ok    --plan names --recompute-segment $best ($best_total GiB): no K of 1..12 plans less"
else echo "  FAIL  --plan names K='$best' ($best_total GiB), but K =$below plan less"; fails=$((fails + 1)); fi

if [ $fails -ne 0 ]; then echo "recompute: $fails FAILED"; exit 1; fi
echo "recompute: all passed"
