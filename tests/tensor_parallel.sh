#!/usr/bin/env bash
# tensor_parallel.sh: tensor parallelism on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: tp in {2,3,4} (12 heads, vocabulary padded to 768), and dp x tp = 2 x 2 with ZeRO 0,
#      1, 2 and 3 (also with accumulation; ZeRO-3 at 3 layers, its gather slots reused): 10 steps equal the single-rank run of the same global batch, every loss to 1e-5 relative
#      and the final parameters to 1e-5 relative norm (partial sums are added in another order: ~1e-7)
#   2. checkpoints in the single-file format: saved at tp=4, resumed at tp=2 and at tp=1 with the same
#      losses; resumed at tp=4 bit-exactly
#   3. bad configurations: heads or padded vocabulary not divisible by tp, world size not a multiple
# usage: tests/tensor_parallel.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
make_tokens "$TMP/tokens.bin"
COMMON=(--layers 2 --channels 48 --heads 12 --vocab 700 --max-seq-len 16 --seq-len 16 --steps 10 --lr 1e-3
        --warmup 2 --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "" --shuffle 1)


echo "1. equivalence with the single-rank run"
"$BIN" "${COMMON[@]}" --batch-size 4 --log "$TMP/ref4.jsonl" --save-model "$TMP/ref4.bin" >/dev/null
"$BIN" "${COMMON[@]}" --batch-size 8 --log "$TMP/ref8.jsonl" --save-model "$TMP/ref8.bin" >/dev/null
for T in 2 3 4; do
    run $T --tp $T --batch-size 4 --log "$TMP/tp.jsonl" --save-model "$TMP/tp.bin"
    compare "tp=$T" "$TMP/tp.jsonl" "$TMP/tp.bin" "$TMP/ref4.jsonl" "$TMP/ref4.bin"
done
for Z in 0 1 2 3; do
    run 4 --tp 2 --dp 2 --zero $Z --batch-size 4 --log "$TMP/dptp.jsonl" --save-model "$TMP/dptp.bin"
    compare "dp=2 x tp=2, ZeRO-$Z" "$TMP/dptp.jsonl" "$TMP/dptp.bin" "$TMP/ref8.jsonl" "$TMP/ref8.bin"
done
# the same with gradient accumulation and ZeRO-2
"$BIN" "${COMMON[@]}" --batch-size 4 --grad-accum 2 --log "$TMP/refa.jsonl" --save-model "$TMP/refa.bin" >/dev/null
run 4 --tp 2 --dp 2 --zero 2 --batch-size 2 --grad-accum 2 --log "$TMP/dptpa.jsonl" --save-model "$TMP/dptpa.bin"
compare "dp=2 x tp=2, ZeRO-2, grad_accum 2" "$TMP/dptpa.jsonl" "$TMP/dptpa.bin" "$TMP/refa.jsonl" "$TMP/refa.bin"
"$BIN" "${COMMON[@]}" --layers 3 --batch-size 4 --grad-accum 2 --log "$TMP/refa.jsonl" --save-model "$TMP/refa.bin" >/dev/null
run 4 --tp 2 --dp 2 --zero 3 --layers 3 --batch-size 2 --grad-accum 2 --log "$TMP/dptpa.jsonl" --save-model "$TMP/dptpa.bin"
compare "dp=2 x tp=2, ZeRO-3, grad_accum 2, L=3" "$TMP/dptpa.jsonl" "$TMP/dptpa.bin" "$TMP/refa.jsonl" "$TMP/refa.bin"

echo "2. checkpoints"
run 4 --tp 4 --batch-size 4 --log "$TMP/s4.jsonl" --save-model "$TMP/s4.bin"
run 4 --tp 4 --batch-size 4 --stop-after 5 --checkpoint-dir "$TMP/ck"
run 4 --tp 4 --batch-size 4 --resume "$TMP/ck" --save-model "$TMP/r4.bin"
if cmp -s "$TMP/s4.bin" "$TMP/r4.bin"; then echo "  ok    saved and resumed at tp=4: final model byte-identical"
else echo "  FAIL  saved and resumed at tp=4: final model differs"; fails=$((fails + 1)); fi
run 2 --tp 2 --batch-size 4 --resume "$TMP/ck" --log "$TMP/r2.jsonl" --save-model "$TMP/r2.bin"
compare "saved at tp=4, resumed at tp=2" "$TMP/r2.jsonl" "$TMP/r2.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6
"$BIN" "${COMMON[@]}" --batch-size 4 --resume "$TMP/ck" --log "$TMP/r1.jsonl" --save-model "$TMP/r1.bin" >/dev/null 2>&1 \
    || { echo "  FAIL  resume on one rank"; fails=$((fails + 1)); }
compare "saved at tp=4, resumed at tp=1" "$TMP/r1.jsonl" "$TMP/r1.bin" "$TMP/s4.jsonl" "$TMP/s4.bin" 6

echo "3. bad configurations"
expect_mpi_error "heads not divisible by tp" "the 12 attention heads do not split evenly" 5 "$BIN" "${COMMON[@]}" --tp 5 --batch-size 4
expect_mpi_error "vocabulary not divisible by tp" "the padded vocabulary Vp=768 does not split evenly" 5 "$BIN" "${COMMON[@]}" \
    --channels 40 --heads 5 --tp 5 --batch-size 4
expect_mpi_error "world size not a multiple of tp" "world size 3 is not divisible by tp x pp = 2 x 1" 3 "$BIN" "${COMMON[@]}" --tp 2 --batch-size 4

if [ $fails -ne 0 ]; then echo "tensor_parallel: $fails FAILED"; exit 1; fi
echo "tensor_parallel: all passed"
