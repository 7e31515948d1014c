#!/usr/bin/env bash
# check_gpu.sh: the GPU truth for everything landed so far, in one go on a machine with an NVIDIA GPU.
#   builds the GPU target in both precisions, runs test_gpt on the GPU against the PyTorch reference,
#   runs the bad-input tests against the GPU binary, runs the data-parallel tests with 2 to 4 ranks
#   sharing the one GPU (MPI engine), trains the default job on the GPU, and measures tokens/s of
#   GPT-2 124M (B=16, T=1024) from scratch on the default data.
# Logs go to $OUT (or ./build/gpu-check). Needs /usr/bin/python3 or python3 with torch for the reference.
# Without a system MPI, build a portable one first (.mpi/env.sh is sourced when present).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -f .mpi/env.sh ] && source .mpi/env.sh
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
PY=$(command -v /usr/bin/python3 2>/dev/null || command -v python3)
status=0
run() {  # run NAME CMD...: logs to $OUT/NAME.log, reports the exit code
    local name=$1
    shift
    echo "==== $name: $*"
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "==== $name: exit $rc"
    [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv | tee "$OUT/gpu.txt"
run build make -j8 gpu cpu
run reference "$PY" scripts/gpt2_reference.py --out-dir build/ref
run test_fp32 ./build/gpu-fp32/test_gpt build/ref
run test_bf16 ./build/gpu-bf16/test_gpt build/ref
run test_cli_gpu bash scripts/test_cli.sh build/gpu-bf16/train_gpt
run test_dp_fp32 bash scripts/test_dp.sh build/gpu-fp32/train_gpt
run test_tp_fp32 bash scripts/test_tp.sh build/gpu-fp32/train_gpt
run test_pp_fp32 bash scripts/test_pp.sh build/gpu-fp32/train_gpt
run trace_gpu bash -c "source scripts/parallel_test_lib.sh; \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt --pp 2 --layers 12 --channels 768 --heads 12 --max-seq-len 1024 --seq-len 1024 --batch-size 16 --micro-batches 8 --schedule 1f1b --steps 3 --val-every 0 --sample-every 0 --trace $OUT/trace_gpu.json"
run train_default ./build/gpu-bf16/train_gpt
# GPT-2 124M shapes: L=12 C=768 NH=12 V=50257 maxT=1024, B=16 T=1024; the default data has ~106k train
# tokens = 6 micro-batches, which is plenty for a throughput measurement
run bench_124M_bf16 ./build/gpu-bf16/train_gpt --layers 12 --channels 768 --heads 12 --max-seq-len 1024 \
    --batch-size 16 --seq-len 1024 --steps 30 --val-every 0 --sample-every 0 --lr 6e-4 --warmup 10
run bench_124M_fp32 ./build/gpu-fp32/train_gpt --layers 12 --channels 768 --heads 12 --max-seq-len 1024 \
    --batch-size 8 --seq-len 1024 --steps 10 --val-every 0 --sample-every 0 --lr 6e-4 --warmup 5
exit $status
