#!/usr/bin/env bash
# rank_agreement.sh: ranks started with different flags, data, checkpoints or LLMC_* variables (mpirun
# -np 1 A : -np 1 B) end together with one line naming the first difference (they hung, aborted in MPI,
# trained divergent replicas, reported a wrong accuracy, saved into two folders or sampled differently);
# copies of the same checkpoint and data in other folders are the same job.
# usage: tests/rank_agreement.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)

echo "ranks started differently (mpirun -np 1 A : -np 1 B) end together with one line naming what differs"
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

if [ $fails -ne 0 ]; then echo "rank_agreement: $fails FAILED"; exit 1; fi
echo "rank_agreement: all passed"
