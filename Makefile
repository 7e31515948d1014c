# Builds the trainer and its tests for two targets from the same sources.
#   make cpu            build/cpu/train_gpt, build/cpu/test_gpt        (g++ -x c++ -DLLMC_CPU, OpenMP)
#   make gpu            build/gpu-{bf16,fp32,fp16}/...                  (nvcc, cuBLASLt, NCCL)
#   make dev            dev/cuda: kernel variants with checks and benchmarks (nvcc)
#   make train          trains the default model on data/ (GPU if one is present, else CPU)
#   make test           installs what is missing, then runs every test this machine can run
# PRECISION=BF16|FP32|FP16 picks the GPU build used by `make train`; GPU_ARCH overrides the -arch list.

CXX ?= g++
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PRECISION ?= BF16
PYTHON ?= /usr/bin/python3

# MPI (Open MPI): from the environment if set (e.g. a portable build's env.sh), else from mpicxx;
# without it the trainer still builds, for one rank (or, on GPUs, torchrun-style launches with NCCL)
MPI_CFLAGS ?= $(shell mpicxx --showme:compile 2>/dev/null)
MPI_LIBS ?= $(shell mpicxx --showme:link 2>/dev/null)
ifneq ($(strip $(MPI_LIBS)),)
MPI_DEFINE = -DUSE_MPI
endif

CPU_FLAGS = -O3 -march=native -fopenmp -std=c++17 -Wall -Wno-unused-function $(MPI_DEFINE) $(MPI_CFLAGS) -x c++ -DLLMC_CPU
HEADERS = $(wildcard llmc/*.h)

# sm_80 and sm_90 unless a local GPU says otherwise
LOCAL_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
ifneq ($(LOCAL_CC),)
GPU_ARCH ?= -gencode arch=compute_$(LOCAL_CC),code=sm_$(LOCAL_CC)
else
GPU_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
endif
# NCCL: if its header is where nvcc looks (the CUDA toolkit, or /usr/include from libnccl-dev);
# without it the GPU target communicates through MPI only
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
HAVE_NCCL := $(shell test -f $(CUDA_HOME)/include/nccl.h -o -f /usr/include/nccl.h && echo 1)
ifeq ($(HAVE_NCCL),1)
NCCL_FLAGS =
NCCL_LIBS = -lnccl
else
NCCL_FLAGS = -DNO_NCCL
NCCL_LIBS =
endif
NVCC_FLAGS = -O3 -std=c++17 $(GPU_ARCH) -diag-suppress 177 -Xcompiler -Wall,-Wno-unused-function,-Wno-unknown-pragmas \
             $(MPI_DEFINE) $(filter -I% -D%,$(MPI_CFLAGS)) $(NCCL_FLAGS)
NVCC_LIBS = -lcublasLt -lcublas $(NCCL_LIBS) $(filter -L% -l%,$(MPI_LIBS))

HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
PRECISION_LC = $(shell echo $(PRECISION) | tr A-Z a-z)

.PHONY: all cpu gpu dev train test clean references
all: cpu

cpu: build/cpu/train_gpt build/cpu/test_gpt

build/cpu/%: %.cu $(HEADERS) train_gpt.cu
	@mkdir -p $(@D)
	$(CXX) $(CPU_FLAGS) $< $(MPI_LIBS) -o $@

gpu: build/gpu-bf16/train_gpt build/gpu-bf16/test_gpt build/gpu-fp32/train_gpt build/gpu-fp32/test_gpt \
     build/gpu-fp16/train_gpt build/gpu-fp16/test_gpt

build/gpu-bf16/%: %.cu $(HEADERS) train_gpt.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -DENABLE_BF16 $< $(NVCC_LIBS) -o $@

build/gpu-fp16/%: %.cu $(HEADERS) train_gpt.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -DENABLE_FP16 $< $(NVCC_LIBS) -o $@

build/gpu-fp32/%: %.cu $(HEADERS) train_gpt.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $< $(NVCC_LIBS) -o $@

# kernel variants, checks and benchmarks (dev/cuda/README.md)
dev:
	$(MAKE) -C dev/cuda

# the PyTorch reference files the tests compare against (generated, never edited)
references: build/ref/ref_small_debug.bin
build/ref/ref_small_debug.bin: scripts/gpt2_reference.py
	$(PYTHON) scripts/gpt2_reference.py --out-dir build/ref

ifeq ($(HAVE_GPU),1)
train: build/gpu-$(PRECISION_LC)/train_gpt
	./build/gpu-$(PRECISION_LC)/train_gpt
else
train: build/cpu/train_gpt
	./build/cpu/train_gpt
endif

test:
	bash scripts/run_tests.sh

clean:
	rm -rf build
	$(MAKE) -C dev/cuda clean
