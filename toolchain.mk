# toolchain.mk: what the Makefiles (this folder's, dev/cuda's and dev/emulate's) build with, found in one place.
#   - finds nvcc, NCCL, Open MPI and OpenBLAS, and says once per make what it found and where (or what is missing
#     and what that costs), so a build that quietly left out NCCL or MPI cannot go unnoticed;
#   - `gpu-toolchain`, an order-only prerequisite of every nvcc target: without nvcc (or with an NCCL_HOME
#     that holds no nccl.h) the build stops with one `error:` line instead of running a recipe that
#     starts with a flag (make would read the leading `-` of `-O3` as "ignore errors" and exit 0);
#   - flags stamps: `$(call flags_stamp,FILE,TEXT)` rewrites FILE only when TEXT (compiler and flags)
#     differs from what it holds. Outputs depend on their stamp, so installing MPI after a first build,
#     or another NVCC or GPU_ARCH, rebuilds exactly what it affects (no `make clean` needed).
#
# Knobs (make VAR=value or the environment):
#   NVCC        nvcc to use              [nvcc on PATH, else $(CUDA_HOME)/bin/nvcc]
#   CUDA_HOME   where to look for nvcc when PATH has none [/usr/local/cuda]
#   NCCL_HOME   an NCCL outside the toolkit: NCCL_HOME/include/nccl.h, NCCL_HOME/lib (or lib64)
#               [unset: nccl.h next to nvcc's toolkit headers, or /usr/include from Debian's libnccl-dev]
#   MPI_CFLAGS, MPI_LIBS  Open MPI's compile and link flags [from `mpicxx --showme`]
#   GPU_ARCH    nvcc -gencode list       [the local GPU's if nvidia-smi finds one, else sm_80 and sm_90]
#   BLAS_CFLAGS, BLAS_LIBS  the CPU target's BLAS (cblas.h, cblas_sgemm) [Debian's OpenMP build of OpenBLAS,
#               libopenblas-openmp-dev; NO_BLAS=1 builds the CPU target with its reference GEMM only]

CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
# The toolkit's folder (its include/ has cublasLt.h and, in NVIDIA's packages, nccl.h). nvcc on PATH may
# be a wrapper script outside the toolkit (a /usr/local/bin/nvcc that execs /usr/local/cuda-13.0/bin/nvcc),
# so nvcc is asked: `--dryrun` prints TOP=<toolkit>/bin/.. without compiling. A path ending in bin/nvcc
# is the fallback for an nvcc that prints no TOP.
NVCC_TOP = $(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's|^\#\$$ TOP=\(.*\)/bin/\.\.$$|\1|p')
NVCC_ROOT := $(if $(NVCC),$(or $(NVCC_TOP),$(patsubst %/bin/nvcc,%,$(NVCC))))

# The folder of the toolkit's cuBLAS(Lt) (and NCCL, in NVIDIA's packages). GPU binaries carry it as their
# run path: on a machine whose loader path lacks the CUDA libraries (a container, a login without
# LD_LIBRARY_PATH) they still start, and say so in one line when there is no GPU, instead of failing in
# the loader with "libcublasLt.so.13: cannot open shared object file".
CUDA_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(addsuffix /libcublasLt.so*,$(NVCC_ROOT)/lib64 $(NVCC_ROOT)/lib $(NVCC_ROOT)/targets/*/lib)))))
CUDA_RPATH = $(if $(CUDA_LIBDIR),-Xlinker -rpath$(comma)$(CUDA_LIBDIR))
comma := ,

# sm_80 and sm_90 unless a local GPU says otherwise
LOCAL_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
ifneq ($(LOCAL_CC),)
GPU_ARCH ?= -gencode arch=compute_$(LOCAL_CC),code=sm_$(LOCAL_CC)
else
GPU_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
endif

# NCCL: NCCL_HOME if given, else the header where nvcc looks (the CUDA toolkit, or /usr/include);
# without it the GPU target is built with -DNO_NCCL and communicates through MPI only
ifneq ($(NCCL_HOME),)
NCCL_H := $(wildcard $(NCCL_HOME)/include/nccl.h)
NCCL_INC = -I$(NCCL_HOME)/include
NCCL_LIBDIRS = $(foreach d,$(wildcard $(NCCL_HOME)/lib $(NCCL_HOME)/lib64),-L$(d) -Xlinker -rpath,$(d))
else
NCCL_H := $(firstword $(wildcard $(NVCC_ROOT)/include/nccl.h /usr/include/nccl.h))
endif
ifneq ($(NCCL_H),)
NCCL_FLAGS = $(NCCL_INC)
NCCL_LIBS = $(NCCL_LIBDIRS) -lnccl
else
NCCL_FLAGS = -DNO_NCCL
NCCL_LIBS =
endif

# MPI (Open MPI): from the environment if set (e.g. a portable build's env.sh), else from mpicxx;
# without it the trainer still builds, for one rank (or, on GPUs, torchrun-style launches with NCCL)
MPICXX := $(shell command -v mpicxx 2>/dev/null)
MPI_SOURCE := $(if $(MPI_LIBS),MPI_CFLAGS and MPI_LIBS,$(MPICXX))
MPI_CFLAGS ?= $(shell mpicxx --showme:compile 2>/dev/null)
MPI_LIBS ?= $(shell mpicxx --showme:link 2>/dev/null)
ifneq ($(strip $(MPI_LIBS)),)
MPI_DEFINE = -DUSE_MPI
endif

# OpenBLAS for the CPU target's matmuls (llmc/matmul.h): from the environment if set, else Debian's OpenMP
# build (libopenblas-openmp-dev), so that OpenBLAS runs on the trainer's own OpenMP threads instead of a
# pool of its own competing with them (its pthread build, libopenblas-pthread-dev, would oversubscribe the
# cores). Its own folder, not the alternatives link /usr/include/<triplet>/cblas.h, which may be netlib's
# reference BLAS; the run path makes the binary load this libopenblas.so.0 whatever the alternatives say.
# Without it the CPU target builds with its reference GEMM only (--cpu-matmul reference).
# (the multiarch folder is Debian's /usr/include/<triplet>/: found by the header's own path, not by asking
# the compiler, which may be a wrapper)
OPENBLAS_H := $(firstword $(wildcard /usr/include/*/openblas-openmp/cblas.h))
OPENBLAS_TRIPLET = $(notdir $(patsubst %/openblas-openmp/cblas.h,%,$(OPENBLAS_H)))
ifeq ($(NO_BLAS),1)
BLAS_CFLAGS =
BLAS_LIBS =
BLAS_SOURCE = NO_BLAS=1
else ifneq ($(strip $(BLAS_LIBS)),)
BLAS_SOURCE = BLAS_CFLAGS and BLAS_LIBS
else ifneq ($(OPENBLAS_H),)
BLAS_LIBDIR = /usr/lib/$(OPENBLAS_TRIPLET)/openblas-openmp
BLAS_CFLAGS = -I$(patsubst %/,%,$(dir $(OPENBLAS_H)))
BLAS_LIBS = -L$(BLAS_LIBDIR) -Wl,-rpath,$(BLAS_LIBDIR) -lopenblas
BLAS_SOURCE = $(OPENBLAS_H) (OpenMP build)
endif
ifneq ($(strip $(BLAS_LIBS)),)
BLAS_DEFINE = -DLLMC_BLAS
endif

# the summary, once per make (not in make's own sub-makes, not for `make clean`)
ifeq ($(MAKELEVEL),0)
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
$(info toolchain: nvcc $(or $(NVCC),not found (on PATH or in $(CUDA_HOME)/bin): no GPU target; install the CUDA toolkit or set NVCC=))
$(info toolchain: NCCL $(if $(NCCL_H),$(NCCL_H),not found in $(if $(NCCL_HOME),NCCL_HOME=$(NCCL_HOME)/include,$(if $(NVCC_ROOT),$(NVCC_ROOT)/include or )/usr/include): GPU ranks talk through MPI; set NCCL_HOME))
$(info toolchain: MPI  $(if $(strip $(MPI_LIBS)),$(MPI_SOURCE),not found (no mpicxx): one rank only; install libopenmpi-dev))
$(info toolchain: BLAS $(if $(strip $(BLAS_LIBS)),$(BLAS_SOURCE),$(if $(filter 1,$(NO_BLAS)),off (NO_BLAS=1),not found (no /usr/include/*/openblas-openmp/cblas.h)): CPU matmuls through the reference loop only; install libopenblas-openmp-dev))
endif
endif

# (not the default goal of the Makefiles that include this file: their first own target stays it)
DEFAULT_GOAL_BEFORE := $(.DEFAULT_GOAL)
.PHONY: gpu-toolchain
gpu-toolchain:
	@if [ -z "$(NVCC)" ]; then \
	    echo "error: nvcc not found (not on PATH, not in $(CUDA_HOME)/bin): install the CUDA toolkit or pass NVCC=/path/to/nvcc (\`make cpu\` builds the CPU target)" >&2; exit 1; \
	elif ! command -v "$(firstword $(NVCC))" >/dev/null 2>&1; then \
	    echo "error: NVCC=$(NVCC) is not an executable" >&2; exit 1; \
	elif [ -n "$(NCCL_HOME)" ] && [ -z "$(NCCL_H)" ]; then \
	    echo "error: NCCL_HOME=$(NCCL_HOME) has no include/nccl.h" >&2; exit 1; \
	fi
.DEFAULT_GOAL := $(DEFAULT_GOAL_BEFORE)

# $(call flags_stamp,FILE,TEXT): FILE holds TEXT afterwards, and is rewritten only if it held something else.
# Evaluated while make reads the Makefile, so that make compares the outputs with a stamp that is already
# current (a `make -n` after a flag change shows the rebuild; the stamp then stays newer than the outputs).
same_text = $(and $(findstring x$(1)x,x$(2)x),$(findstring x$(2)x,x$(1)x))
flags_stamp = $(if $(call same_text,$(strip $(file <$(1))),$(strip $(2))),,$(shell mkdir -p $(dir $(1)))$(file >$(1),$(strip $(2))))
