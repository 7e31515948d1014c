# Builds the trainer and its tests for two targets from the same sources.
#   make cpu            build/cpu/train_gpt, build/cpu/test_gpt        (g++ -x c++ -DLLMC_CPU, OpenMP, OpenBLAS)
#   make gpu            build/gpu-{bf16,fp32,fp16}/...                  (nvcc, cuBLASLt, NCCL)
#   make dev            dev/cuda: kernel variants with checks and benchmarks (nvcc)
#   make emulated       build/emu-{bf16,fp32,fp16}/{train_gpt,test_gpt}: the GPU target on the CPU emulation
#                       of CUDA (dev/emulate/emulate.h; g++ and the CUDA headers, no GPU; `make test` runs test_gpt)
#   make train          trains the default model on data/ (GPU if one is present, else CPU)
#   make deps           installs what the tests need (Debian 12: apt-get, through sudo); elsewhere says what
#   make test           runs every test this machine can run (first checks the dependencies, installs nothing)
#   make headers        every header of llmc/ compiles on its own, on the CPU target and (with nvcc) the GPU target
#   make docs           rewrites the documentation's command outputs and draws its pictures again (tests/readme.sh)
# PRECISION=BF16|FP32|FP16 picks the GPU build used by `make train`, TRAIN_FLAGS adds flags to its run
# (e.g. TRAIN_FLAGS="--steps 20"); GPU_ARCH overrides the -arch list.

CXX ?= g++
PRECISION ?= BF16
# the Python of every script (Debian's python3-* packages install into /usr/bin/python3)
PYTHON ?= /usr/bin/python3
export PYTHON

# nvcc, NCCL, MPI, GPU_ARCH, the nvcc check and the flags stamps (see toolchain.mk)
include toolchain.mk

# -fno-math-errno: sqrtf and friends do not set errno (nothing here reads it after math), so the compiler
# may use the vector square root: the optimizer's loop (llmc/adamw.h) and the LayerNorms' vectorize. It
# changes no result.
CPU_FLAGS = -O3 -march=native -fno-math-errno -fopenmp -std=c++17 -Wall -Wno-unused-function $(MPI_DEFINE) $(MPI_CFLAGS) $(BLAS_DEFINE) $(BLAS_CFLAGS) -x c++ -DLLMC_CPU
HEADERS = $(wildcard llmc/*.h llmc/comm/*.h llmc/run/*.h)

NVCC_FLAGS = -O3 -std=c++17 $(GPU_ARCH) -diag-suppress 177 -Xcompiler -Wall,-Wno-unused-function,-Wno-unknown-pragmas \
             $(MPI_DEFINE) $(filter -I% -D%,$(MPI_CFLAGS)) $(NCCL_FLAGS)
NVCC_LIBS = $(CUDA_RPATH) -lcublasLt -lcublas $(NCCL_LIBS) $(filter -L% -l%,$(MPI_LIBS))
PRECISION_DEFINE_bf16 = -DENABLE_BF16
PRECISION_DEFINE_fp16 = -DENABLE_FP16
PRECISION_DEFINE_fp32 =

# build/flags-<target>.txt holds the compiler and flags of the last build of that target; it changes
# only when they do, and everything built for the target depends on it
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
$(call flags_stamp,build/flags-cpu.txt,$(CXX) $(CPU_FLAGS) $(MPI_LIBS) $(BLAS_LIBS))
ifneq ($(NVCC),)
$(foreach p,bf16 fp16 fp32,$(call flags_stamp,build/flags-gpu-$(p).txt,$(NVCC) $(NVCC_FLAGS) $(PRECISION_DEFINE_$(p)) $(NVCC_LIBS)))
endif
endif
# without nvcc the GPU stamps are left as they are (and may be missing): gpu-toolchain then stops the build
build/flags-%.txt: ;

HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
PRECISION_LC = $(shell echo $(PRECISION) | tr A-Z a-z)

.PHONY: all cpu gpu dev emulated train deps test clean references headers docs
all: cpu

cpu: build/cpu/train_gpt build/cpu/test_gpt

build/cpu/%: %.cu $(HEADERS) train_gpt.cu build/flags-cpu.txt
	@mkdir -p $(@D)
	$(CXX) $(CPU_FLAGS) $< $(MPI_LIBS) $(BLAS_LIBS) -o $@

gpu: build/gpu-bf16/train_gpt build/gpu-bf16/test_gpt build/gpu-fp32/train_gpt build/gpu-fp32/test_gpt \
     build/gpu-fp16/train_gpt build/gpu-fp16/test_gpt

# every nvcc target first checks that there is an nvcc (gpu-toolchain, toolchain.mk)
build/gpu-bf16/%: %.cu $(HEADERS) train_gpt.cu build/flags-gpu-bf16.txt | gpu-toolchain
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_DEFINE_bf16) $< $(NVCC_LIBS) -o $@

build/gpu-fp16/%: %.cu $(HEADERS) train_gpt.cu build/flags-gpu-fp16.txt | gpu-toolchain
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_DEFINE_fp16) $< $(NVCC_LIBS) -o $@

build/gpu-fp32/%: %.cu $(HEADERS) train_gpt.cu build/flags-gpu-fp32.txt | gpu-toolchain
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(PRECISION_DEFINE_fp32) $< $(NVCC_LIBS) -o $@

# The GPU target on the CPU emulation of CUDA (dev/emulate/emulate.h): every kernel, launcher, cuBLAS(Lt)
# call and device copy of the GPU code runs, on a machine without a GPU. Its ranks talk through the MPI
# engine, or with EMU_DEVICES=N (N emulated GPUs) through the NCCL engine, over dev/emulate/emulate_nccl.h
# (when nccl.h was found; tests/nccl_emulated.sh). The sources are first rewritten into build/emu/src/
# (dev/emulate/emulate_source.pl: the <<<...>>> launches and __shared__ declarations). -fno-inline-functions:
# the same checks, built in seconds instead of more than a minute.
EMU_SOURCES = $(patsubst %,build/emu/src/%,$(HEADERS) train_gpt.cu test_gpt.cu)
.SECONDARY: $(EMU_SOURCES)
build/emu/src/%: % dev/emulate/emulate_source.pl
	@mkdir -p $(@D)
	perl -0p dev/emulate/emulate_source.pl $< > $@.tmp && mv $@.tmp $@  # (no empty target left when the rewrite fails)
EMU_FLAGS = -O2 -fno-inline-functions -std=c++17 -fopenmp -Wall -Wno-unused-function -Wno-unknown-pragmas -Wno-class-memaccess \
            -Wno-sign-compare $(if $(NCCL_H),-DEMULATE_NCCL $(NCCL_INC),-DNO_NCCL) $(MPI_DEFINE) $(MPI_CFLAGS) -x c++ -include dev/emulate/emulate.h -I$(NVCC_ROOT)/include
emulated: $(foreach p,bf16 fp32 fp16,build/emu-$(p)/test_gpt build/emu-$(p)/train_gpt)
build/emu-%/test_gpt: $(EMU_SOURCES) $(wildcard dev/emulate/*.h) | gpu-toolchain
	@mkdir -p $(@D)
	$(CXX) $(EMU_FLAGS) $(PRECISION_DEFINE_$*) build/emu/src/test_gpt.cu $(MPI_LIBS) -o $@
build/emu-%/train_gpt: $(EMU_SOURCES) $(wildcard dev/emulate/*.h) | gpu-toolchain
	@mkdir -p $(@D)
	$(CXX) $(EMU_FLAGS) $(PRECISION_DEFINE_$*) build/emu/src/train_gpt.cu $(MPI_LIBS) -o $@

# the exchange of the NCCL id over TCP (llmc/comm/rendezvous.h), with real processes: tests/rendezvous.sh
build/cpu/test_rendezvous: tests/rendezvous.cpp llmc/comm/rendezvous.h llmc/common.h build/flags-cpu.txt
	@mkdir -p $(@D)
	$(CXX) -O2 -std=c++17 -Wall -Wextra $< -o $@

# Every header of llmc/ and its subfolders (comm/, run/) compiles on its own (tests/headers.sh): a translation unit
# that includes only it, for the CPU target (-fsyntax-only) and, where nvcc exists, the GPU target (BF16,
# one architecture, without -O3, to keep it cheap). HEADERS_TARGETS=cpu or gpu checks one target only.
HEADERS_TARGETS ?= all
HEADERS_NVCC_FLAGS = $(filter-out -O3 $(GPU_ARCH),$(NVCC_FLAGS)) -gencode arch=compute_90,code=sm_90 $(PRECISION_DEFINE_bf16)
headers:
	@CXX="$(CXX)" CPU_FLAGS="$(CPU_FLAGS)" NVCC="$(NVCC)" NVCC_FLAGS="$(HEADERS_NVCC_FLAGS)" \
	    bash tests/headers.sh $(HEADERS_TARGETS)

# kernel variants, checks and benchmarks (dev/cuda/README.md)
dev:
	$(MAKE) -C dev/cuda

# the PyTorch reference files the tests compare against (generated, never edited)
references: build/ref/ref_small_debug.bin
build/ref/ref_small_debug.bin: scripts/gpt2_reference.py
	$(PYTHON) scripts/gpt2_reference.py --out-dir build/ref

# the main job, then three things to try next
TRAIN_BIN = $(if $(filter 1,$(HAVE_GPU)),build/gpu-$(PRECISION_LC)/train_gpt,build/cpu/train_gpt)
train: $(TRAIN_BIN)
ifneq ($(HAVE_GPU),1)
	@echo "make train: no GPU here (nvidia-smi finds none), so it trains with the CPU build $(TRAIN_BIN) in FP32$(if $(filter command line environment,$(origin PRECISION)), (PRECISION=$(PRECISION) is for GPU builds),)"
endif
	./$(TRAIN_BIN) $(TRAIN_FLAGS)
	@echo ""
	@echo "next:"
	@echo "  make deps && make test     # every test this machine can run (tests/README.md lists them)"
	@echo "  ./$(TRAIN_BIN) --print-schedule --pp 4 --batch-size 8 --micro-batches 8 --pp-schedule 1f1b   # a pipeline schedule, drawn"
	@echo "  ./$(TRAIN_BIN) --steps 40 --log run.jsonl --val-every 10 && scripts/plot_log.py run.jsonl -o curves.png   # training curves"

deps:
	bash scripts/install_deps.sh

# the documentation's outputs and pictures, regenerated from the commands beside them (tests/README.md): every
# stale output block of README.md, docs/ and tests/README.md rewritten, and the pictures of docs/ drawn again
docs: build/cpu/train_gpt
	bash tests/readme.sh --update --pictures build/cpu/train_gpt

test:
	bash tests/run_all.sh

clean:
	rm -rf build
	$(MAKE) -C dev/cuda clean
	$(MAKE) -C dev/emulate clean
