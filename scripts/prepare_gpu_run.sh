#!/usr/bin/env bash
# prepare_gpu_run.sh: everything scripts/check_gpu.sh needs built, made on a machine without a GPU (with the
# CUDA toolkit and Debian's python3-torch), packed into one file, so that a GPU rented by the minute spends
# none of them compiling.
#
# usage: scripts/prepare_gpu_run.sh [--llmc DIR]
#   --llmc DIR   also build llm.c's train_gpt2cu from the checkout DIR (a copy of it, patched for CUDA 13 as
#                scripts/benchmark_gpu.py's header describes; DIR itself is not touched), for the benchmark
#
# Builds the GPU trainer and test_gpt in BF16, FP16 and FP32 and the dev/cuda kernel programs (for sm_80
# and sm_90 unless GPU_ARCH says otherwise), writes the PyTorch reference files (build/ref), stamps them
# with the hash of their sources (scripts/check_gpu.sh --sources-hash) and packs them into
# build/gpu-bundle.tar.gz. On the GPU machine, with this checkout (the same sources) and the bundle in its
# build/, `scripts/check_gpu.sh` unpacks it in its first step and uses the binaries as they are if the hash
# matches and their libraries load (cuBLAS and NCCL from the CUDA installation, Open MPI's libmpi if it was
# built with MPI: bring a portable Open MPI as .mpi/env.sh where the GPU machine has none); else it builds.
set -euo pipefail
cd "$(dirname "$0")/.."
LLMC_SRC=""
while [ $# -gt 0 ]; do
    case $1 in
        --llmc) LLMC_SRC=${2:?--llmc needs the llm.c checkout}; shift 2 ;;
        *) echo "prepare_gpu_run.sh: unknown argument '$1' (usage: scripts/prepare_gpu_run.sh [--llmc DIR])" >&2; exit 2 ;;
    esac
done
[ -z "$LLMC_SRC" ] || [ -f "$LLMC_SRC/train_gpt2.cu" ] || { echo "prepare_gpu_run.sh: $LLMC_SRC has no train_gpt2.cu (not an llm.c checkout)" >&2; exit 2; }
PY=${PYTHON:-/usr/bin/python3}
JOBS=$(nproc)

# (the binaries scripts/check_gpu.sh looks for in the bundle: its GPU_BINS and KERNEL_BINS)
BINS=(build/gpu-{bf16,fp16,fp32}/{train_gpt,test_gpt})
KERNELS=()
for f in dev/cuda/*.cu; do KERNELS+=("dev/cuda/build/$(basename "$f" .cu)"); done
make -j"$JOBS" "${BINS[@]}"
# check_gpu.sh's multi-rank steps need the GPU binaries built with MPI (the stamp does not say how they
# were built: a bundle without MPI would pass it and fail those steps)
grep -q -- "-DUSE_MPI" build/flags-gpu-bf16.txt || {
    echo "prepare_gpu_run.sh: the GPU build has no MPI (install libopenmpi-dev, or set MPI_CFLAGS and MPI_LIBS): check_gpu.sh's multi-rank steps need it" >&2
    exit 1
}
make -C dev/cuda -j"$JOBS" "${KERNELS[@]#dev/cuda/}"
make references PYTHON="$PY"
bash scripts/check_gpu.sh --sources-hash >build/gpu-sources-hash.txt
PACK=("${BINS[@]}" "${KERNELS[@]}" build/ref build/gpu-sources-hash.txt)

if [ -n "$LLMC_SRC" ]; then
    # CUDA 13: cudaMemAdvise takes a cudaMemLocation (the host, here) instead of cudaCpuDeviceId, and the
    # toolkit has no link library for NVML (llm.c uses NVML only where nvml.h is found, which it is not here)
    rm -rf build/llmc-src .llmc
    mkdir -p build/llmc-src .llmc
    cp -r "$LLMC_SRC"/. build/llmc-src/
    sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        build/llmc-src/llmc/cuda_utils.cuh
    sed -i 's/^\( *NVCC_LDFLAGS += -lnvidia-ml\)/# \1/' build/llmc-src/Makefile
    make -C build/llmc-src train_gpt2cu GPU_COMPUTE_CAPABILITY="${LLMC_CC:-90}" NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 NO_OMP=1
    cp build/llmc-src/train_gpt2cu .llmc/
    PACK+=(.llmc/train_gpt2cu)
fi
tar -czf build/gpu-bundle.tar.gz "${PACK[@]}"
echo "build/gpu-bundle.tar.gz: $(du -h build/gpu-bundle.tar.gz | cut -f1), sources $(cat build/gpu-sources-hash.txt)"
echo "on the GPU machine, in this checkout with the bundle in build/: scripts/check_gpu.sh [--tier 1] [--budget SECONDS]"
