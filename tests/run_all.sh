#!/usr/bin/env bash
# run_all.sh: everything `make test` runs, in order. Whatever this machine can run, it runs:
#   1. check that the dependencies are there (scripts/install_deps.sh --check): if not, stop and say what
#      is missing (`make deps` installs it); nothing is installed here
#   2. the default dataset rebuilds byte for byte from the Debian package (scripts/check_data.sh)
#   3. the PyTorch reference files are generated (scripts/gpt2_reference.py -> build/ref)
#   4. CPU target: every header of llmc/ compiles on its own (make headers), build, test_gpt against the
#      references, bad-input tests and checkpoints, data parallelism, ZeRO, a rank that fails, signals,
#      ranks started differently, launchers, the MPI engine in pieces, tensor and pipeline parallelism
#      under mpirun, the NCCL id's exchange over TCP (llmc/comm/rendezvous.h), fuzzing of the file readers
#      (tests/fuzz/), the default training job (its final validation loss must be 2 nats below the first)
#      and every command block of README.md and docs/ (tests/readme.sh)
#   5. GPU target: each header alone, all precisions and dev/cuda compile where nvcc exists; with a GPU, test_gpt
#      and the dev/cuda checks run on it; without one the dev/cuda checks and test_gpt's GPU build run on
#      the CPU emulation of CUDA (dev/emulate/emulate.h), and the GPU memory plan is held to what the
#      emulated train_gpt allocates (tests/memory_plan_emulated.sh), and its NCCL engine runs over
#      emulated NCCL (tests/nccl_emulated.sh)
#   6. the build and the setup (tests/build.sh): Makefile errors and flags stamps, the GPU binaries
#      on a machine without a GPU, `make test` checking and `make deps` installing the dependencies, one Python
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}   # the Python of every script (see Makefile)

step() { printf '\n==== [%d s] %s\n' "$SECONDS" "$*"; }  # (the time since make test started: where CI's minutes go)

step "dependencies (checked; \`make deps\` installs them)"
bash scripts/install_deps.sh --check

step "default dataset rebuilds byte for byte"
bash scripts/check_data.sh

step "PyTorch reference (float64) -> build/ref"
"$PY" scripts/gpt2_reference.py --out-dir build/ref

step "CPU target: every header of llmc/ compiles on its own (make headers)"
make -s headers HEADERS_TARGETS=cpu

step "CPU target: build"
make -j2 cpu

step "CPU target: test_gpt against the reference"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} ./build/cpu/test_gpt build/ref

step "CPU target: bad input"
bash tests/cli.sh build/cpu/train_gpt

step "CPU target: checkpoints and resuming on one rank (forged files, requeues, rollbacks, other data, a crash)"
bash tests/checkpoints.sh build/cpu/train_gpt

step "CPU target: the GPT-2 encoder against the Python one, sampling with a prompt (one rank, TP, PP)"
bash tests/sampling.sh build/cpu/train_gpt

step "CPU target: multiple-choice evaluation against the PyTorch reference, over DP, TP and PP"
bash tests/eval.sh build/cpu/train_gpt

step "CPU target: data parallelism under mpirun"
bash tests/data_parallel.sh build/cpu/train_gpt

step "CPU target: ZeRO-1 and ZeRO-2 under mpirun, sharded checkpoints"
bash tests/zero.sh build/cpu/train_gpt

step "CPU target: a rank that dies, diverges, stops or is slow (deadlines, --comm-timeout, --io-timeout)"
bash tests/faults.sh build/cpu/train_gpt

step "CPU target: a signal stops the run with a checkpoint; its resume equals an uninterrupted run"
bash tests/signals.sh build/cpu/train_gpt

step "CPU target: ranks started differently end together with one line"
bash tests/rank_agreement.sh build/cpu/train_gpt

step "CPU target: launchers (Slurm, torchrun, PMIx, MPI) and OpenMP threads per rank"
bash tests/launch.sh build/cpu/train_gpt

step "CPU target: the MPI engine through host buffers in pieces (LLMC_MPI_STAGE_BYTES)"
bash tests/staging.sh build/cpu/train_gpt

step "CPU target: tensor parallelism under mpirun"
bash tests/tensor_parallel.sh build/cpu/train_gpt

step "CPU target: pipeline parallelism and 3D under mpirun"
bash tests/pipeline_parallel.sh build/cpu/train_gpt

step "CPU target: sublinear checkpointing, on one rank, with pipeline stages and tensor parallelism"
bash tests/recompute.sh build/cpu/train_gpt

step "the NCCL id over TCP at MASTER_ADDR:MASTER_PORT (torchrun without a shared folder), with processes on 127.0.0.1"
make -s build/cpu/test_rendezvous
bash tests/rendezvous.sh build/cpu/test_rendezvous

step "CPU target: dynamic loss scaling (an injected overflow is skipped everywhere)"
bash tests/loss_scale.sh build/cpu/train_gpt

step "fuzzing the file readers (libFuzzer, ASan, UBSan): kept regression inputs, then 12 s per reader"
bash tests/fuzz/run.sh build/cpu/train_gpt

step "CPU target: the default training job"
bash tests/train.sh build/cpu/train_gpt

step "the documentation's commands (README.md, docs/) run"
bash tests/readme.sh build/cpu/train_gpt

step "flash attention: the tensor-core kernels' index maps and their forward and backward, on ldmatrix/mma emulated on the host"
timeout 120 make -C dev/cuda layout

step "the GPU run's scripts without a GPU: check_gpu.sh's tiers, budget and results, the loss and ncu comparisons, the benchmark's plan"
timeout 120 bash tests/gpu_scripts.sh

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    step "GPU target: build FP32, BF16 and FP16, and the kernel variants in dev/cuda"
    # Without a GPU to run them on, the binaries are built for sm_90 only: that shows the code compiles
    # (no source differs between sm_80 and sm_90) in half the time. With a GPU: for that GPU (toolchain.mk).
    if nvidia-smi -L >/dev/null 2>&1; then arch=(); else arch=(GPU_ARCH="-gencode arch=compute_90,code=sm_90"); fi
    make -s headers HEADERS_TARGETS=gpu  # (every header of llmc/ on its own, BF16)
    make -j2 gpu "${arch[@]}"
    make -C dev/cuda -j2 "${arch[@]}"
    step "the static kernel report (make -C dev/cuda report): registers, spills, occupancy, inner loops, floors at 124M"
    make -C dev/cuda report
    if nvidia-smi -L >/dev/null 2>&1; then
        for p in fp32 bf16 fp16; do
            step "GPU target: test_gpt $p"
            ./build/gpu-$p/test_gpt build/ref
        done
        step "dev/cuda: every kernel variant against its CPU reference"
        make -C dev/cuda run
    else
        echo "no GPU here: the GPU target was compiled but not run"
        step "dev/cuda: the kernel files' checks on the CPU emulation of CUDA (dev/emulate/emulate.h), tensor-core flash attention included"
        timeout 600 make -C dev/cuda -j2 emulate
        step "GPU target: test_gpt on the CPU emulation of CUDA (make emulated): BF16; BF16 and FP16 with --fused-kernels 1 --attention flash; FP32 with --fused-kernels 1 (four at once)"
        make -j2 emulated  # test_gpt and train_gpt of each precision (train_gpt for the memory plan below)
        emulated_runs=(bf16:0:classic bf16:1:flash fp16:1:flash fp32:1:classic)  # precision:fused:attention
        pids=()
        for r in "${emulated_runs[@]}"; do
            IFS=: read -r p fused attention <<< "$r"
            OMP_NUM_THREADS=1 LLMC_FUSED_KERNELS=$fused timeout 900 ./build/emu-$p/test_gpt build/ref --attention "$attention" \
                > "build/emu/test_gpt-$p-$fused-$attention.log" 2>&1 &
            pids+=($!)
        done
        failed=0
        for i in "${!emulated_runs[@]}"; do
            IFS=: read -r p fused attention <<< "${emulated_runs[$i]}"
            log="build/emu/test_gpt-$p-$fused-$attention.log"
            if wait "${pids[$i]}"; then echo "$p, --fused-kernels $fused, --attention $attention: $(tail -n 1 "$log")"
            else cat "$log"; echo "FAILED: emulated test_gpt $p, --fused-kernels $fused, --attention $attention"; failed=1; fi
        done
        [ "$failed" = 0 ]
        step "GPU target: the memory plan against the device memory the emulated train_gpt allocates (each precision, fused, flash, recompute, ZeRO, TP, PP)"
        bash tests/memory_plan_emulated.sh build/emu
        step "the static kernel report's calls per step and cuBLAS FLOPs against one emulated step of each path"
        bash tests/kernel_report_emulated.sh build/emu-bf16/train_gpt
        step "GPU target: --fused-kernels on the emulation (ids copied from pinned memory without waiting, the update decided on the device) equals the unfused run"
        bash tests/fused_emulated.sh build/emu-fp32/train_gpt build/emu-fp16/train_gpt
        step "GPU target: the NCCL engine on the emulation (EMU_DEVICES GPUs, dev/emulate/emulate_nccl.h): DP/ZeRO, TP, PP, 3D, the id over MPI, TCP and a folder, deadlines"
        OMP_NUM_THREADS=1 bash tests/nccl_emulated.sh build/emu-fp32/train_gpt build/emu-bf16/train_gpt
    fi
else
    echo "nvcc not found: the GPU target was not compiled (install the CUDA toolkit)"
fi

step "the build: no nvcc is an error, flags stamps rebuild, GPU binaries without a GPU say so"
bash tests/build.sh

printf '\nall tests passed\n'
