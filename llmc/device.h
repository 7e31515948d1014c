/*
 * device.h: the thin device layer, the only place where the two targets differ in plumbing.
 *
 * The model code in train_gpt.cu allocates, copies and clears memory through these functions and never
 * touches CUDA directly, so the same source builds:
 *   GPU target: nvcc, memory is cudaMalloc'ed device memory, floatX is float (PRECISION=FP32),
 *               __nv_bfloat16 (PRECISION=BF16, the default) or __half (PRECISION=FP16, with loss scaling);
 *   CPU target: g++ -x c++ -DLLMC_CPU, "device" memory is host memory, floatX is float.
 *
 * floatX is the type of parameters, gradients and activations. Optimizer state and master weights are
 * always float (see train_gpt.cu). Host code moves data with upload_floats/download_floats, which convert
 * between float and floatX.
 */
#pragma once

#include "common.h"         // fatal, malloc_check
#include "comm/watchdog.h"  // the watchdog around blocking CUDA calls

#ifdef LLMC_CPU
// ----------------------------------------------------------------------------------------------------
// CPU target

typedef float floatX;
#define PRECISION_NAME "FP32"
#define FP16_BUILD 0
#define BF16_BUILD 0
#define TARGET_NAME "CPU"
#define TARGET_IS_CPU 1
static inline float floatX_to_float(floatX x) { return x; }
static inline floatX float_to_floatX(float x) { return x; }

#else
// ----------------------------------------------------------------------------------------------------
// GPU target

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) fatal("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
}
#define cudaCheck(err) cuda_check((err), __FILE__, __LINE__)

// A CUDA call that can block the host until the GPU gets there (a wait; a copy to or from pageable host
// memory), marked for the NCCL engine's watchdog (llmc/comm/watchdog.h): should the GPU be held up by
// communication that never completes, the watchdog ends the rank, naming the call (`what`).
#define cudaCheckBlocking(what, call)       \
    do {                                    \
        watchdog_enter(what);               \
        cudaError_t blocking_err_ = (call); \
        watchdog_leave();                   \
        cudaCheck(blocking_err_);           \
    } while (0)

static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) fatal("cuBLAS error %d at %s:%d", (int)status, file, line);
}
#define cublasCheck(status) cublas_check((status), __FILE__, __LINE__)

#if defined(ENABLE_BF16)
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "BF16"
#define CUDA_FLOATX CUDA_R_16BF
#define FP16_BUILD 0
#define BF16_BUILD 1
#elif defined(ENABLE_FP16)
typedef __half floatX;
#define PRECISION_NAME "FP16"
#define CUDA_FLOATX CUDA_R_16F
#define FP16_BUILD 1
#define BF16_BUILD 0
#else
typedef float floatX;
#define PRECISION_NAME "FP32"
#define CUDA_FLOATX CUDA_R_32F
#define FP16_BUILD 0
#define BF16_BUILD 0
#endif
#define TARGET_IS_CPU 0
#ifdef DEV_CUDA_EMULATED  // the GPU code on the CPU emulation of dev/emulate/emulate.h (`make emulated`)
#define TARGET_NAME "GPU (emulated on the CPU)"
#else
#define TARGET_NAME "GPU"
#endif

// both directions work on host and device; bf16 conversion rounds to nearest even
__host__ __device__ static inline float floatX_to_float(floatX x) { return (float)x; }
__host__ __device__ static inline floatX float_to_floatX(float x) { return (floatX)x; }

// Every kernel runs on this stream (communication has its own, llmc/comm.h). Process-wide on purpose: it
// is the device's compute queue, which every model and launcher in the process shares, not run state.
static cudaStream_t main_stream = 0;
#endif

// Which kernel variants a run launches, chosen once from the command line and held by the model
// (GPT2.kernels, set when it is built): forward, backward and the memory planner pass the choice to each
// launcher that branches on it, as an argument, so no launcher reads a setting of the run from a global.
typedef struct {
    // --fused-kernels 1 (README): the GPU target uses the fused and vectorized kernels of the layer headers
    // (LayerNorm backward in one pass, residual + LayerNorm forward, 16-byte GELU, bias-gradient and
    // classifier kernels), cached cuBLASLt plans and their epilogues (GELU and bias gradients inside the
    // products, llmc/matmul.h), no host synchronization for the inputs of a micro-step,
    // and a step's losses summed on the device (one copy per step, llmc/classifier.h loss_mean). On by
    // default since check_gpu.sh passed with it (README's status). The CPU target accepts it and runs the
    // same reference loops (identical results).
    int fused;
    // --attention flash (llmc/attention.h; 0: classic attention; ATTENTION_AUTO, the default until the model
    // is known: flash where it can run, see attention_choice). The activations follow it (the (B, NH, T)
    // logsumexp instead of the (B, NH, T, T) probabilities), and so does the memory plan.
    int flash_attention;
    // Not a flag: 1 keeps GELU in its own kernel where --fused-kernels would put it in the fc product's
    // epilogue (which a run without --recompute does). The epilogue computes GELU from the unrounded sum,
    // so its output may differ in the last bit from the kernel's, which recomputation uses; the test of
    // recomputation sets this to compare every level with level 0 bit for bit.
    int separate_gelu;
    // --cpu-matmul (llmc/matmul.h): 1 the CPU target's matmuls through OpenBLAS's cblas_sgemm, 0 through
    // its reference GEMM. Default 1 where the build linked OpenBLAS (toolchain.mk), else 0; the GPU target
    // has no CPU matmul and ignores it.
    int cpu_blas;
} KernelChoice;
enum { ATTENTION_AUTO = -1 };

// The name of the device this rank computes on (for the log): the GPU's, or the CPU's model name.
static inline void device_name(char* buf, size_t cap) {
#ifndef LLMC_CPU
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
        snprintf(buf, cap, "%s", prop.name);
        return;
    }
#endif
    snprintf(buf, cap, "CPU");
    FILE* f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        char* colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || colon == NULL) continue;
        colon += strspn(colon + 1, " \t") + 1;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(buf, cap, "CPU: %s", colon);
        break;
    }
    if (f != NULL) fclose(f);
}

// The compute capability (major, minor) of GPU number `dev` (9.0: an H100 or H200), for the peak throughput
// the MFU is reported against. The CPU target has no GPU: 0.0.
static inline void device_compute_capability(int dev, int* major, int* minor) {
#ifndef LLMC_CPU
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    *major = prop.major;
    *minor = prop.minor;
#else
    (void)dev;
    *major = *minor = 0;
#endif
}

// The memory of this rank's GPU, free and in all (bytes), as the GPU reports it: what the CUDA context and
// every allocation of the process hold counts as used. The CPU target has no device memory of its own: 0, 0.
static inline void device_memory_info(size_t* free_bytes, size_t* total_bytes) {
#ifndef LLMC_CPU
    cudaCheck(cudaMemGetInfo(free_bytes, total_bytes));
#else
    *free_bytes = *total_bytes = 0;
#endif
}

// peak dense BF16 tensor throughput of known GPUs, for MFU (0: unknown, MFU not printed)
static double device_peak_flops(void) {
    int major, minor;
    device_compute_capability(0, &major, &minor);  // (0.0 on the CPU target)
    if (major == 9 && minor == 0) return 989e12;  // H100 SXM / H200
    if (major == 8 && minor == 0) return 312e12;  // A100
    return 0.0;
}

// ----------------------------------------------------------------------------------------------------
// is there a GPU at all?

// The GPU programs call this first. Without a driver or a device, every CUDA call fails, and the first
// one to fail (an allocation, in the trainer) would report something unrelated ("out of GPU memory:
// CUDA driver version is insufficient"): say what is wrong once, before anything else.
static inline void device_require_gpu(void) {
#ifndef LLMC_CPU
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    cudaRuntimeGetVersion(&runtime);
    if (err == cudaSuccess || err == cudaErrorNoDevice)
        fatal("no GPU: the NVIDIA driver finds no CUDA device (the CPU build, `make cpu`, runs without one)");
    if (driver == 0)
        fatal("no GPU: no NVIDIA driver is installed (cudaGetDeviceCount: %s); the CPU build, `make cpu`, runs "
              "without one", cudaGetErrorString(err));
    if (err == cudaErrorInsufficientDriver)
        fatal("the NVIDIA driver supports CUDA %d.%d, this build needs %d.%d: update the driver",
              driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    fatal("cannot use a GPU: cudaGetDeviceCount: %s (%s)", cudaGetErrorName(err), cudaGetErrorString(err));
#endif
}

// ----------------------------------------------------------------------------------------------------
// allocate, copy, clear (the same names on both targets)

// Every byte device_malloc has allocated (the memory planner's test compares it with the plan). A counter
// of the process's device memory, whichever model allocates, so process-wide by nature.
static size_t device_allocated_bytes = 0;

#ifndef LLMC_CPU
// Words a failed cudaMalloc by its cause: only cudaErrorMemoryAllocation means the GPU is full.
[[noreturn]] static inline void device_malloc_failed(cudaError_t err, size_t bytes) {
    double mib = bytes / 1048576.0;
    if (err == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
            fatal("out of GPU memory allocating %.1f MiB (%.2f of %.2f GiB free; --plan shows what each rank needs)",
                  mib, free_b / 1073741824.0, total_b / 1073741824.0);
        fatal("out of GPU memory allocating %.1f MiB (--plan shows what each rank needs)", mib);
    }
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError)
        fatal("no usable GPU: allocating %.1f MiB failed with %s (%s)", mib, cudaGetErrorName(err),
              cudaGetErrorString(err));
    fatal("allocating %.1f MiB on the GPU failed: %s (%s)", mib, cudaGetErrorName(err), cudaGetErrorString(err));
}
#endif

static inline void* device_malloc(size_t bytes) {
    device_allocated_bytes += bytes;
#ifdef LLMC_CPU
    void* p = NULL;
    if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0) fatal("out of memory allocating %zu bytes", bytes);
    return p;
#else
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 256);
    if (err != cudaSuccess) device_malloc_failed(err, bytes);
    return p;
#endif
}

static inline void device_free(void* p) {  // NULL: nothing (as free), so a dry-built model frees nothing
    if (p == NULL) return;
#ifdef LLMC_CPU
    free(p);
#else
    cudaCheckBlocking("freeing GPU memory", cudaFree(p));  // (cudaFree waits for the GPU)
#endif
}

static inline void device_memset_zero(void* p, size_t bytes) {
#ifdef LLMC_CPU
    memset(p, 0, bytes);
#else
    cudaCheck(cudaMemsetAsync(p, 0, bytes, main_stream));
#endif
}

// How a model's buffers are allocated. A training run allocates them for real, in this build's precision;
// the memory planner (--plan) builds the model dry, for any precision (a CPU build plans a GPU's bf16
// run), and reads off the bytes.
typedef struct {
    size_t elem_bytes;  // bytes of one parameter, gradient or activation element
    int dry;            // count every allocation; allocate, clear and free nothing
} BuildMode;
static const BuildMode BUILD_FOR_RUN = {.elem_bytes = sizeof(floatX), .dry = 0};

// a cleared allocation, its bytes added to *account (the memory plan's categories); built dry, only
// counted (NULL)
static inline void* zeroed_device_buffer(const BuildMode* mode, size_t bytes, size_t* account) {
    *account += bytes;
    if (mode->dry) return NULL;
    void* p = device_malloc(bytes);
    device_memset_zero(p, bytes);
    return p;
}

// One buffer of allocate_buffers: where its pointer goes, and its size
typedef struct {
    void** ptr;
    size_t bytes;
} BufferSpec;

// Lays out `n` buffers in one allocation (256-byte aligned each); returns the base pointer (NULL when
// built dry, with the buffers' pointers as offsets from it).
static void* allocate_buffers(const BuildMode* mode, BufferSpec* specs, int n, size_t* total_bytes) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += round_up(specs[i].bytes, 256);
    char* base = NULL;
    if (!mode->dry) {
        base = (char*)device_malloc(total);
        device_memset_zero(base, total);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        *specs[i].ptr = base + offset;
        offset += round_up(specs[i].bytes, 256);
    }
    *total_bytes = total;
    return base;
}

#ifndef LLMC_CPU
// a copy on the main stream, waited for
static inline cudaError_t copy_and_wait(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, main_stream);
    return err != cudaSuccess ? err : cudaStreamSynchronize(main_stream);
}
#endif

static inline void copy_to_host(void* dst, const void* src, size_t bytes) {
#ifdef LLMC_CPU
    memcpy(dst, src, bytes);
#else
    cudaCheckBlocking("a copy from the GPU", copy_and_wait(dst, src, bytes, cudaMemcpyDeviceToHost));
#endif
}

static inline void copy_to_device(void* dst, const void* src, size_t bytes) {
#ifdef LLMC_CPU
    memcpy(dst, src, bytes);
#else
    cudaCheckBlocking("a copy to the GPU", copy_and_wait(dst, src, bytes, cudaMemcpyHostToDevice));
#endif
}

// ----------------------------------------------------------------------------------------------------
// pinned host memory and events: copies to the device that do not wait
//
// A cudaMemcpyAsync from pageable (malloc'ed) host memory is not asynchronous: CUDA stages the bytes through
// a buffer of its own before the call returns. From pinned (page-locked) memory, cudaMallocHost'ed, the
// call returns at once and the GPU's copy engine reads the host buffer when the stream gets to the copy,
// which may be long after. So the host must neither write nor free such a buffer until the copy is done:
// an event recorded after the copy, waited for before the buffer is written again, says when (the
// trainer's token ids: one pinned buffer and one event per activation set, train_gpt.cu; the encoder
// backward's grouping: a HostStaging below). The CPU target has no copies: plain memory, events that are
// always complete.

// Host memory for the copies above. `pinned` (the GPU target's --fused-kernels, whose copies do not wait):
// page-locked; otherwise plain malloc'ed memory, copied with waiting, as the path verified on GPUs always
// was. The CPU target has no copies: plain memory.
static inline void* host_buffer_malloc(size_t bytes, int pinned) {
#ifndef LLMC_CPU
    if (pinned) {
        void* p = NULL;
        cudaError_t err = cudaMallocHost(&p, bytes > 0 ? bytes : 1);
        if (err != cudaSuccess)
            fatal("allocating %zu bytes of pinned host memory failed: %s", bytes, cudaGetErrorString(err));
        return p;
    }
#endif
    (void)pinned;
    return malloc_check(bytes > 0 ? bytes : 1);
}

// Frees host_buffer_malloc's memory (NULL: nothing), with the same `pinned`. Pinned memory on the GPU target
// is freed only once the device is idle, so that no copy still queued reads it afterwards (teardown and
// rare growth only: it costs a wait).
static inline void host_buffer_free(void* p, int pinned) {
    if (p == NULL) return;
#ifndef LLMC_CPU
    if (pinned) {
        cudaCheckBlocking("waiting for the GPU before freeing pinned memory", cudaDeviceSynchronize());
        cudaCheck(cudaFreeHost(p));
        return;
    }
#endif
    (void)pinned;
    free(p);
}

// An event on the main stream: recorded after a copy from pinned memory, waited for before the memory is
// written again. Zero-initialized it is "none": waiting for it returns at once, destroying it does nothing.
typedef struct {
#ifdef LLMC_CPU
    int unused;
#else
    cudaEvent_t event;
#endif
} DeviceEvent;

static inline void device_event_create(DeviceEvent* e) {
#ifdef LLMC_CPU
    e->unused = 0;
#else
    cudaCheck(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming));
#endif
}
static inline void device_event_destroy(DeviceEvent* e) {
#ifndef LLMC_CPU
    if (e->event != NULL) cudaCheck(cudaEventDestroy(e->event));
    e->event = NULL;
#else
    (void)e;
#endif
}
// marks the main stream's work queued so far
static inline void device_event_record(DeviceEvent* e) {
#ifndef LLMC_CPU
    cudaCheck(cudaEventRecord(e->event, main_stream));
#else
    (void)e;
#endif
}
// the host waits until the work before the last record has run (at once if never recorded)
static inline void device_event_wait(DeviceEvent* e) {
#ifndef LLMC_CPU
    if (e->event != NULL) cudaCheckBlocking("waiting for a copy to the GPU", cudaEventSynchronize(e->event));
#else
    (void)e;
#endif
}

// host `src` -> device `dst` on the main stream, without waiting. `src` must be pinned host_buffer_malloc
// memory, left unwritten and not freed until the copy has run: record a DeviceEvent after this call and
// wait for it before writing `src` again. The copy is ordered after the main stream's earlier work (which
// may still read `dst`).
static inline void copy_to_device_nowait(void* dst, const void* src, size_t bytes) {
#ifdef LLMC_CPU
    memcpy(dst, src, bytes);
#else
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, main_stream));
#endif
}

// host_buffer_malloc's `src` -> device `dst`: with `nowait` (--fused-kernels; `src` pinned) queued on the
// main stream and `done` recorded after it (wait for `done` before writing `src` again); else copied and
// waited for
static inline void copy_host_buffer_to_device(void* dst, const void* src, size_t bytes, DeviceEvent* done, int nowait) {
    if (nowait) {
        copy_to_device_nowait(dst, src, bytes);
        device_event_record(done);
    } else {
        copy_to_device(dst, src, bytes);
    }
}

// A host buffer grown on demand, for data that goes to the device (pinned with --fused-kernels, whose
// copies do not wait: host_buffer_malloc), and the event of the last copy from it. host_staging_get hands
// it out only once that copy has run. Zero-initialized it is empty; host_staging_free frees it.
typedef struct {
    void* ptr;
    size_t bytes;
    int pinned;          // how ptr was allocated
    DeviceEvent copied;  // recorded by host_staging_upload (created with the first buffer)
} HostStaging;

// the buffer, at least `bytes`, safe to write: the previous copy from it has run
static inline void* host_staging_get(HostStaging* s, size_t bytes, int pinned) {
    device_event_wait(&s->copied);
    if (bytes > s->bytes || s->ptr == NULL || pinned != s->pinned) {
        host_buffer_free(s->ptr, s->pinned);
        s->ptr = host_buffer_malloc(bytes, pinned);
        s->bytes = bytes;
        s->pinned = pinned;
#ifndef LLMC_CPU
        if (s->copied.event == NULL) device_event_create(&s->copied);
#endif
    }
    return s->ptr;
}
// its first `bytes` -> device `dst` (copy_host_buffer_to_device)
static inline void host_staging_upload(HostStaging* s, void* dst, size_t bytes, int nowait) {
    copy_host_buffer_to_device(dst, s->ptr, bytes, &s->copied, nowait);
}
static inline void host_staging_free(HostStaging* s) {
    host_buffer_free(s->ptr, s->pinned);
    device_event_destroy(&s->copied);
    s->ptr = NULL;
    s->bytes = 0;
}

static inline void device_copy(void* dst, const void* src, size_t bytes) {
#ifdef LLMC_CPU
    memcpy(dst, src, bytes);
#else
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, main_stream));
#endif
}

static inline void device_synchronize(void) {
#ifndef LLMC_CPU
    cudaCheckBlocking("waiting for the GPU", cudaStreamSynchronize(main_stream));
#endif
}

// A layer launcher's scratch: memory the launcher needs only while it runs, grown on demand and kept for
// reuse. The caller owns it (the model keeps one per purpose: KernelScratch in train_gpt.cu) and frees it
// with scratch_free. Device memory on the GPU; on the CPU target plain malloc'ed memory, as the CPU loops'
// other temporaries (not counted in device_allocated_bytes).
typedef struct {
    void* ptr;
    size_t bytes;
} Scratch;
static inline void scratch_free(Scratch* s) {
#ifdef LLMC_CPU
    free(s->ptr);
#else
    device_free(s->ptr);
#endif
    s->ptr = NULL;
    s->bytes = 0;
}
static inline void* scratch_get(Scratch* s, size_t bytes) {
    if (bytes > s->bytes) {
        scratch_free(s);
#ifdef LLMC_CPU
        s->ptr = malloc_check(bytes);
#else
        s->ptr = device_malloc(bytes);
#endif
        s->bytes = bytes;
    }
    return s->ptr;
}

// host float[n] -> device floatX[n], converting in chunks so no large host temporary is needed
static inline void upload_floats(floatX* dst, const float* src, size_t n) {
    if (sizeof(floatX) == sizeof(float)) { copy_to_device(dst, src, n * sizeof(float)); return; }
    const size_t chunk = 1 << 20;
    floatX* tmp = (floatX*)malloc_check(chunk * sizeof(floatX));
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        for (size_t j = 0; j < m; j++) tmp[j] = float_to_floatX(src[i + j]);
        copy_to_device(dst + i, tmp, m * sizeof(floatX));
    }
    free(tmp);
}

// device floatX[n] -> host float[n]
static inline void download_floats(float* dst, const floatX* src, size_t n) {
    if (sizeof(floatX) == sizeof(float)) { copy_to_host(dst, src, n * sizeof(float)); return; }
    const size_t chunk = 1 << 20;
    floatX* tmp = (floatX*)malloc_check(chunk * sizeof(floatX));
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        copy_to_host(tmp, src + i, m * sizeof(floatX));
        for (size_t j = 0; j < m; j++) dst[i + j] = floatX_to_float(tmp[j]);
    }
    free(tmp);
}

// launch configuration helper for elementwise kernels. Every kernel states its block size with
// __launch_bounds__(N), N a named constant (GELU_THREADS, ...) that its launcher launches it with too: the
// compiler then allocates registers for that many threads, and a static report of registers and occupancy
// (dev/cuda/kernel_report.py) knows the block. A launch with more threads than the bound fails on the GPU
// ("too many resources requested for launch"), and the CPU emulation refuses it too (dev/emulate/emulate.h).
#ifndef LLMC_CPU
static inline int grid_for(size_t n, int block) { return (int)((n + block - 1) / block); }
#define launchCheck() cudaCheck(cudaGetLastError())
#endif

// out += x, elementwise (n floatX), on the main stream: each sum taken in float and rounded once to floatX,
// the arithmetic of the residual add (llmc/residual.h). ZeRO-2 adds each micro-step's reduced gradient
// chunks into its shard with it (llmc/zero.h).
#ifndef LLMC_CPU
#define ACCUMULATE_THREADS 256  // threads per block, one element each
__global__ void __launch_bounds__(ACCUMULATE_THREADS) device_accumulate_kernel(floatX* out, const floatX* x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float_to_floatX(floatX_to_float(out[i]) + floatX_to_float(x[i]));
}
#endif
static inline void device_accumulate(floatX* out, const floatX* x, size_t n) {
#ifdef LLMC_CPU
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = out[i] + x[i];
#else
    device_accumulate_kernel<<<grid_for(n, ACCUMULATE_THREADS), ACCUMULATE_THREADS, 0, main_stream>>>(out, x, n);
    launchCheck();
#endif
}

#ifndef LLMC_CPU
// sum across the 32 lanes of a warp; every lane gets the result
__device__ static inline float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}
__device__ static inline float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

// Kernels that handle many ranges in one launch (the global norm, AdamW) give each range a run of
// blocks; the range of this block is the last of the k whose first_block (ascending, the first 0) is at
// or before blockIdx.x: a binary search
template <typename Range>
__device__ static inline int range_of_block(const Range* r, int k) {
    int found = 0;
    for (int lo = 0, hi = k - 1; lo <= hi;) {
        int mid = (lo + hi) / 2;
        if (r[mid].first_block <= (int)blockIdx.x) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

// 16 bytes of floatX as one value (8 bf16/fp16 or 4 float), for 128-bit loads and stores. Only for
// addresses that are 16-byte aligned: every launcher that uses it checks with aligned16() and otherwise
// falls back to its scalar kernel.
struct alignas(16) Pack128 {
    static constexpr int size = 16 / sizeof(floatX);
    floatX v[16 / sizeof(floatX)];
};
static inline bool aligned16(const void* p) { return p == NULL || ((uintptr_t)p % 16) == 0; }
#ifdef DEV_CUDA_EMULATED  // (a GPU faults on a misaligned 16-byte access; the emulation says so too)
__device__ static inline Pack128 load128(const floatX* p) {
    emu::check_aligned(p, 16, "load128");
    return *(const Pack128*)p;
}
__device__ static inline void store128(floatX* p, Pack128 x) {
    emu::check_aligned(p, 16, "store128");
    *(Pack128*)p = x;
}
#else
__device__ static inline Pack128 load128(const floatX* p) { return *(const Pack128*)p; }
__device__ static inline void store128(floatX* p, Pack128 x) { *(Pack128*)p = x; }
#endif
#endif
