#!/usr/bin/env bash
# check_gpu.sh: the GPU truth for everything landed so far, in one go on a machine with an NVIDIA GPU.
#   builds the GPU target in all three precisions, runs test_gpt on the GPU against the PyTorch reference
#   (FP32, BF16, FP16, and BF16/FP16 again with --attention flash, the tensor-core flash attention), every
#   dev/cuda kernel check (including the flash kernels on odd shapes), the bad-input and checkpoint tests
#   against the GPU binary, the suites of data-parallel runs (data parallelism, ZeRO, faults, signals,
#   rank agreement, launch, staging), tensor- and pipeline-parallel suites with their ranks sharing the
#   one GPU (MPI engine), tensor parallelism with flash attention against classic, the default job, 200
#   steps of GPT-2 124M in FP16, BF16 and BF16 with flash attention (loss curves compared), recompute runs, the
#   --fused-kernels 1 checks (test_gpt in 3 precisions, 200 steps against the default path), and
#   scripts/benchmark_gpu.py (this trainer's two attention paths, torch.compile, and llm.c when
#   LLMC=path/to/llm.c-checkout is set). Its duration on a GPU is not yet measured (summary.txt gives
#   each step's seconds).
# Each step prints PASS or FAIL with its time; a summary of all steps ends the run (and $OUT/summary.txt),
# followed by the flash attention kernels' TFLOP/s. The exit code is 1 if any step failed.
# Logs go to $OUT (or ./build/gpu-check). Needs torch in $PYTHON (default /usr/bin/python3) for the reference.
# Without a system MPI, build a portable one first (.mpi/env.sh is sourced when present).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -f .mpi/env.sh ] && source .mpi/env.sh
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-/usr/bin/python3}
status=0
SUMMARY=()
run() {  # run NAME CMD...: logs to $OUT/NAME.log, shows its last TAIL (25) lines, PASS/FAIL and seconds
    local name=$1
    shift
    echo "==== $name: $*"
    local t0=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$? secs=$((SECONDS - t0)) verdict=PASS
    tail -n "${TAIL:-25}" "$OUT/$name.log"
    [ $rc -eq 0 ] || verdict=FAIL status=1
    echo "==== $name: $verdict (exit $rc, ${secs} s)"
    SUMMARY+=("$(printf '%-4s %5d s  %s' "$verdict" "$secs" "$name")")
}
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv | tee "$OUT/gpu.txt"
run build make -j8 gpu cpu
run reference "$PY" scripts/gpt2_reference.py --out-dir build/ref
run test_fp32 ./build/gpu-fp32/test_gpt build/ref
run test_bf16 ./build/gpu-bf16/test_gpt build/ref
run test_fp16 ./build/gpu-fp16/test_gpt build/ref
run test_bf16_flash ./build/gpu-bf16/test_gpt build/ref --attention flash
run test_fp16_flash ./build/gpu-fp16/test_gpt build/ref --attention flash
# --fused-kernels 1 (cuBLASLt epilogues, fused LayerNorm, the classifier's vector kernel, pinned id copies)
run test_bf16_fused_flash env LLMC_FUSED_KERNELS=1 ./build/gpu-bf16/test_gpt build/ref --attention flash
run test_fp16_fused_flash env LLMC_FUSED_KERNELS=1 ./build/gpu-fp16/test_gpt build/ref --attention flash
run test_fp32_fused env LLMC_FUSED_KERNELS=1 ./build/gpu-fp32/test_gpt build/ref
# training with --fused-kernels 1 equals --fused-kernels 0 (ids copied without waiting, with accumulation and a pipeline)
run fused_equals_unfused_fp32 bash tests/fused_emulated.sh build/gpu-fp32/train_gpt
# sublinear checkpointing bit-identical to no recomputation on the GPU (one rank, pp 2, tp 2)
run recompute_fp32 bash tests/recompute.sh build/gpu-fp32/train_gpt
run dev_cuda_build make -k -C dev/cuda -j8  # -k: one kernel file that fails to build leaves the others checked
# the tensor-core flash attention (--attention flash) on its own first, each step with its PASS/FAIL and
# time: the host emulation of its index maps and algorithm, then every GPU version against the CPU
# reference on odd shapes (T = 37..200, partial tiles) and at GPT-2 124M shapes, timed in TFLOP/s (targets
# on an H100: forward >= 150, backward >= 100); the backward is also rerun for bit-identical results
run flash_emulated make -C dev/cuda layout
TAIL=40 run flash_forward_bf16 ./dev/cuda/build/attention_forward 4
TAIL=40 run flash_forward_fp16 ./dev/cuda/build/attention_forward 5
TAIL=40 run flash_backward_bf16 ./dev/cuda/build/attention_backward 3
TAIL=40 run flash_backward_fp16 ./dev/cuda/build/attention_backward 4
run dev_cuda make -C dev/cuda run
run cli_gpu bash tests/cli.sh build/gpu-bf16/train_gpt
run checkpoints_gpu bash tests/checkpoints.sh build/gpu-bf16/train_gpt
# the suites of data-parallel runs (data parallelism, ZeRO, faults, signals, rank agreement, launch, staging)
DP_SUITES=(data_parallel zero faults signals rank_agreement launch staging)
for t in "${DP_SUITES[@]}"; do run "${t}_fp32" bash "tests/$t.sh" build/gpu-fp32/train_gpt; done
run tensor_parallel_fp32 bash tests/tensor_parallel.sh build/gpu-fp32/train_gpt
run pipeline_parallel_fp32 bash tests/pipeline_parallel.sh build/gpu-fp32/train_gpt
run trace_gpu bash -c "source tests/lib.sh; \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt --pp 2 --layers 12 --channels 768 --heads 12 --max-seq-len 1024 --seq-len 1024 --batch-size 16 --micro-batches 8 --schedule 1f1b --steps 3 --val-every 0 --sample-every 0 --trace $OUT/trace_gpu.json"
# the same with ZB-H1 (its B and W apart; the bubble printed beside 1F1B's above, both on one GPU shared by
# the two stages, so a measurement of the schedule's order more than of its speed)
run trace_gpu_zbh1 bash -c "source tests/lib.sh; \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt --pp 2 --layers 12 --channels 768 --heads 12 --max-seq-len 1024 --seq-len 1024 --batch-size 16 --micro-batches 8 --schedule zb-h1 --steps 3 --val-every 0 --sample-every 0 --trace $OUT/trace_gpu_zbh1.json"
# the MPI engine's chunked path through pinned slots (LLMC_MPI_STAGE_BYTES; not the default until these
# pass): the parallel suites in FP32; in BF16 (sums widened to float by a kernel) a dp2 ZeRO-2 run with
# accumulation must give the whole-buffer path's model file byte for byte (the suites' 1e-5 against one
# rank is an FP32 tolerance: BF16 rounds the gradients of 2 ranks differently from one rank's, e.g. 3e-5 in
# the loss on the CPU emulation); and the same traced pipeline, whose last line gives the engine's GB/s
# beside trace_gpu's (the whole-buffer default; target >= 5 GB/s)
for t in "${DP_SUITES[@]}"; do run "${t}_fp32_staged" env LLMC_MPI_STAGE_BYTES=8388608 bash "tests/$t.sh" build/gpu-fp32/train_gpt; done
# ZeRO-3's BF16 path (the parameter shard updated in place, layers gathered per use): the same reduced chunks
# and updates as ZeRO-2, so the same model file byte for byte (tests/nccl_emulated.sh checks it emulated)
run dp_bf16_zero3_identical bash -c "source tests/lib.sh; F='--comm mpi --layers 4 --channels 256 --heads 4 --seq-len 128 --batch-size 4 --grad-accum 2 --dp 2 --steps 4 --val-every 0 --sample-every 0'; \
    \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt \$F --zero 2 --save-model $OUT/zero2.bin && \
    \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt \$F --zero 3 --save-model $OUT/zero3.bin && \
    cmp $OUT/zero2.bin $OUT/zero3.bin && echo 'ZeRO-3 = ZeRO-2, byte for byte'"
run dp_bf16_staged_identical bash -c "source tests/lib.sh; F='--comm mpi --layers 4 --channels 256 --heads 4 --seq-len 128 --batch-size 4 --grad-accum 2 --dp 2 --zero 2 --steps 4 --val-every 0 --sample-every 0'; \
    \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt \$F --save-model $OUT/whole.bin && \
    LLMC_MPI_STAGE_BYTES=65536 \${MPIRUN[@]} -x LLMC_MPI_STAGE_BYTES -np 2 ./build/gpu-bf16/train_gpt \$F --save-model $OUT/staged.bin && \
    cmp $OUT/whole.bin $OUT/staged.bin && echo 'staged = whole-buffer, byte for byte'"
# ZB-H1's BF16 path (each weight product deferred, its output gradient kept per micro-batch): 1F1B's
# products, each weight gradient summed over the micro-batches in the same order, so the same model file
# byte for byte (tests/nccl_emulated.sh checks it emulated)
run pp_bf16_zbh1_identical bash -c "source tests/lib.sh; F='--comm mpi --layers 4 --channels 256 --heads 4 --seq-len 128 --batch-size 8 --micro-batches 4 --pp 2 --steps 4 --val-every 0 --sample-every 0'; \
    \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt \$F --schedule 1f1b --save-model $OUT/1f1b.bin && \
    \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt \$F --schedule zb-h1 --save-model $OUT/zbh1.bin && \
    cmp $OUT/1f1b.bin $OUT/zbh1.bin && echo 'ZB-H1 = 1F1B, byte for byte'"
run pipeline_parallel_fp32_staged env LLMC_MPI_STAGE_BYTES=8388608 bash tests/pipeline_parallel.sh build/gpu-fp32/train_gpt
run trace_gpu_staged bash -c "source tests/lib.sh; LLMC_MPI_STAGE_BYTES=8388608 \${MPIRUN[@]} -x LLMC_MPI_STAGE_BYTES -np 2 ./build/gpu-bf16/train_gpt --pp 2 --layers 12 --channels 768 --heads 12 --max-seq-len 1024 --seq-len 1024 --batch-size 16 --micro-batches 8 --schedule 1f1b --steps 3 --val-every 0 --sample-every 0 --trace $OUT/trace_gpu_staged.json"
run train_default ./build/gpu-bf16/train_gpt
# GPT-2 124M shapes: L=12 C=768 NH=12 V=50257 maxT=1024, B=16 T=1024; the default data has ~106k train
# tokens = 6 micro-batches, which is plenty for a throughput measurement
run bench_124M_bf16 ./build/gpu-bf16/train_gpt --layers 12 --channels 768 --heads 12 --max-seq-len 1024 \
    --batch-size 16 --seq-len 1024 --steps 30 --val-every 0 --sample-every 0 --lr 6e-4 --warmup 10
run bench_124M_fp32 ./build/gpu-fp32/train_gpt --layers 12 --channels 768 --heads 12 --max-seq-len 1024 \
    --batch-size 8 --seq-len 1024 --steps 10 --val-every 0 --sample-every 0 --lr 6e-4 --warmup 5
# FP16 with dynamic loss scaling against BF16: GPT-2 124M, B=16 T=1024, 200 steps on the default data
G124=(--layers 12 --channels 768 --heads 12 --max-seq-len 1024 --batch-size 16 --seq-len 1024 --steps 200 --lr 6e-4
      --warmup 20 --val-every 0 --sample-every 0)
run fp16_200 ./build/gpu-fp16/train_gpt "${G124[@]}" --log "$OUT/fp16.jsonl"
run bf16_200 ./build/gpu-bf16/train_gpt "${G124[@]}" --log "$OUT/bf16.jsonl"
run flash_bf16_200 ./build/gpu-bf16/train_gpt "${G124[@]}" --attention flash --log "$OUT/flash_bf16.jsonl"
run fp16_vs_bf16 "$PY" -c "
import json
def last(p): return [r for r in map(json.loads, open(p)) if 'loss' in r][-10:]
f, b = last('$OUT/fp16.jsonl'), last('$OUT/bf16.jsonl')
mf, mb = sum(r['loss'] for r in f) / len(f), sum(r['loss'] for r in b) / len(b)
skips = sum(1 for r in map(json.loads, open('$OUT/fp16.jsonl')) if r.get('skipped'))
print(f'mean loss of the last 10 steps: fp16 {mf:.4f}, bf16 {mb:.4f}, relative {abs(mf - mb) / mb:.4f} (target 0.02); fp16 skipped {skips} steps')
"
# flash attention against classic: the same 200-step curve within run-to-run noise (bf16 rounding differs)
run flash_vs_classic "$PY" -c "
import json, sys
def losses(p): return [r['loss'] for r in map(json.loads, open(p)) if 'loss' in r]
f, c = losses('$OUT/flash_bf16.jsonl'), losses('$OUT/bf16.jsonl')
worst = max(abs(a - b) / b for a, b in zip(f, c))
mf, mc = sum(f[-10:]) / 10, sum(c[-10:]) / 10
print(f'{len(f)} steps; mean loss of the last 10: flash {mf:.4f}, classic {mc:.4f}, relative {abs(mf - mc) / mc:.4f} (limit 0.02); worst step {worst:.4f}')
sys.exit(0 if len(f) == len(c) == 200 and abs(mf - mc) / mc < 0.02 else 1)
"
# tensor parallelism with flash attention (each rank its 6 local heads): 10 steps against classic
TPF=(--layers 2 --channels 768 --heads 12 --max-seq-len 256 --seq-len 256 --batch-size 4 --steps 10 --lr 6e-4
     --warmup 2 --val-every 0 --sample-every 0 --tp 2)
run tp_flash bash -c "source tests/lib.sh; \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt ${TPF[*]} --attention flash --log $OUT/tp_flash.jsonl"
run tp_classic bash -c "source tests/lib.sh; \${MPIRUN[@]} -np 2 ./build/gpu-bf16/train_gpt ${TPF[*]} --log $OUT/tp_classic.jsonl"
run tp_flash_vs_classic "$PY" -c "
import json, sys
def losses(p): return [r['loss'] for r in map(json.loads, open(p)) if 'loss' in r]
f, c = losses('$OUT/tp_flash.jsonl'), losses('$OUT/tp_classic.jsonl')
worst = max(abs(a - b) / b for a, b in zip(f, c))
print(f'tp=2, {len(f)} steps: flash {f}, classic {c}; worst relative difference {worst:.4f} (limit 0.02, bf16)')
sys.exit(0 if len(f) == len(c) == 10 and worst < 0.02 else 1)
"
# recomputation: a batch that does not fit with --recompute 0 (the plan says so) trains at --recompute 3
run plan_big ./build/gpu-bf16/train_gpt --plan "${G124[@]}" --batch-size 160 --device-memory 78GiB
run recompute3_big ./build/gpu-bf16/train_gpt "${G124[@]}" --batch-size 160 --steps 3 --recompute 3
# --fused-kernels 1 (off by default until this passes): the reference checks in every precision (same
# tolerances), its 200 BF16 steps against the default path's (mean of the last 10 losses within 1%),
# and its throughput; its kernels' own checks ran in dev_cuda above
run test_fp32_fused env LLMC_FUSED_KERNELS=1 ./build/gpu-fp32/test_gpt build/ref
run test_bf16_fused env LLMC_FUSED_KERNELS=1 ./build/gpu-bf16/test_gpt build/ref
run test_fp16_fused env LLMC_FUSED_KERNELS=1 ./build/gpu-fp16/test_gpt build/ref
run bf16_200_fused ./build/gpu-bf16/train_gpt "${G124[@]}" --fused-kernels 1 --log "$OUT/bf16_fused.jsonl"
run fused_vs_default "$PY" -c "
import json, sys
def last(p): return [r['loss'] for r in map(json.loads, open(p)) if 'loss' in r][-10:]
f, d = last('$OUT/bf16_fused.jsonl'), last('$OUT/bf16.jsonl')
mf, md = sum(f) / len(f), sum(d) / len(d)
print(f'mean loss of the last 10 of 200 BF16 steps: fused {mf:.4f}, default {md:.4f}, relative {abs(mf - md) / md:.4f} (limit 0.01)')
sys.exit(0 if len(f) == 10 and abs(mf - md) <= 0.01 * md else 1)
"
run bench_124M_bf16_fused ./build/gpu-bf16/train_gpt --layers 12 --channels 768 --heads 12 --max-seq-len 1024 \
    --batch-size 16 --seq-len 1024 --steps 30 --val-every 0 --sample-every 0 --lr 6e-4 --warmup 10 --fused-kernels 1
run plan_big_flash ./build/gpu-bf16/train_gpt --plan "${G124[@]}" --batch-size 160 --device-memory 78GiB --attention flash
run recompute3_flash ./build/gpu-bf16/train_gpt "${G124[@]}" --batch-size 32 --steps 3 --recompute 3 --attention flash
# this trainer (both attention paths) against PyTorch torch.compile, and llm.c if LLMC=path/to/llm.c (a
# checkout, patched for CUDA 13 as scripts/benchmark_gpu.py's header says); GPT-2 124M B=16, 32, 350M B=16
run benchmark "$PY" scripts/benchmark_gpu.py --steps 20 --warmup 5 ${LLMC:+--llmc "$LLMC"}
echo "==== summary (logs in $OUT)"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
grep -H "TFLOP/s" "$OUT"/flash_*.log 2>/dev/null | sed "s|^$OUT/|flash timing: |"
exit $status
