/*
 * emulate_runtime.h: the CUDA runtime and the cuBLAS(Lt) calls that dev/cuda and llmc make, over host
 * memory, for the CPU emulation of emulate.h (which includes this file last). "Device" memory is host
 * memory; kernels, copies and memsets on the default stream run at their call unless it has work queued,
 * those on a stream the program created are queued until the host waits (see "streams and events"
 * below, and EMU_STREAMS=main-late there); what needs other processes (the emulated NCCL's operations)
 * and copies from pinned host memory wait in their stream's queue until the host waits for the stream,
 * and so does what follows them on it. The device reports an H100's limits, so grids and shared memory are sized as there.
 * Device allocations are counted against its 80 GiB: cudaMemGetInfo reports what is allocated (with no
 * CUDA context beside it, so a memory plan can be compared with it exactly; pinned host memory is not
 * device memory and not counted), and an allocation beyond the 80 GiB fails as on the GPU.
 */
#pragma once
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------------------------------
// streams and events
//
// On the default stream (stream 0, the trainer's main stream), kernels, copies and memsets run at their
// call, in the host's order, while the stream has nothing queued. A stream the program creates
// (cudaStreamCreateWithFlags: the communication groups', the staging copies') runs behind the host
// instead: everything issued on it is queued and carried out only when the host waits for something, so
// main-stream work that reads what a side stream writes without waiting for an event of it reads too
// early, and side-stream work that reads what the main stream overwrites after it without such a wait
// reads too late, as either may on a GPU. EMU_STREAMS=main-late mirrors the order: the default stream's
// work is queued too, and a wait of the host runs the created streams' queues before the default
// stream's, so a created stream that reads what the main stream has yet to write (started before the
// main stream's event that says its input is ready), or overwrites what the main stream has yet to read,
// does so here. Two kinds of operation are queued on any stream and carried out as late as CUDA allows,
// when the host waits for the stream (cudaStreamSynchronize, cudaStreamQuery, cudaEventSynchronize or
// cudaStreamWaitEvent on an event recorded after them, cudaDeviceSynchronize, a copy to the host):
//   - what needs other processes (emulate_nccl.h's collectives, sends and receives): a send reads its
//     buffer, and a receive or collective writes its, only then;
//   - a copy to the device from pinned host memory (cudaMallocHost's): it reads the host buffer only
//     then, as a GPU's copy engine may read it long after cudaMemcpyAsync has returned. (From pageable
//     memory CUDA stages the bytes before the call returns: such a copy reads its source at the call.)
// Whatever is issued on a stream that queues (a created one, or one with work queued) joins the queue behind it (kernels, cuBLAS
// products, memsets, copies), so the stream's order holds and the host runs ahead of the stream as it
// does of a GPU. A host buffer written, or freed (cudaFreeHost stops the program), before the host has
// waited for the copy or communication that reads it gives wrong results here, as it may on a GPU; so
// does a buffer read that such work writes. An event marks its stream's position at cudaEventRecord;
// waiting for it (cudaEventSynchronize, cudaStreamWaitEvent) completes the stream up to there. While the
// host waits for anything, every stream makes progress (a GPU's streams run on without the host and
// without each other), so only a true deadlock, every process waiting for another, waits past
// EMU_NCCL_TIMEOUT (default 300 s); it ends the process with one line naming what each stream waits for.

namespace emu {
struct QueuedOp {
    std::function<bool()> step;  // makes what progress it can; true once the operation is complete
    std::string what;            // what it is, for the message of a deadlock
};
struct Stream {
    std::deque<QueuedOp> queue;
    long queued = 0, done = 0;  // operations queued and completed, ever
};
inline Stream default_stream;  // stream 0 (the trainer's main stream)
inline std::vector<Stream*> streams = {&default_stream};
// EMU_STREAMS=main-late: the default stream runs behind the host too, and after the created streams
inline bool streams_order(const char* v) {  // EMU_STREAMS: unset, "default" or "main-late"; anything else stops
    if (v == NULL || strcmp(v, "default") == 0) return false;
    if (strcmp(v, "main-late") == 0) return true;
    fprintf(stderr, "emulated CUDA: EMU_STREAMS=%s: want default or main-late\n", v);
    exit(1);
}
inline bool main_late = streams_order(getenv("EMU_STREAMS"));
inline Stream* stream_of(cudaStream_t s) { return s ? (Stream*)s : &default_stream; }
struct Event {
    double ms;       // host time of the record (not of the stream reaching it: a queued stream's timings are 0)
    Stream* stream;  // the stream it was recorded on, and that stream's position then: the event has
    long position;   // happened once the stream has completed that many operations
};

// one pass over every stream: each completes its queued operations in order, as far as they can go now;
// `held` only up to its operation number `upto` (a wait for an event runs its stream no further than the
// event, so what was queued after it still runs late)
inline void progress_all(const Stream* held = NULL, long upto = 0) {
    for (size_t i = 0; i < streams.size(); i++) {
        Stream* s = streams[main_late ? streams.size() - 1 - i : i];  // (main-late: the default stream last)
        while (!s->queue.empty() && !(s == held && s->done >= upto) && s->queue.front().step()) s->queue.pop_front(), s->done++;
    }
}
// how long a wait for other processes may take (EMU_NCCL_TIMEOUT, default 300 s)
inline double wait_timeout_s() {
    const char* t = getenv("EMU_NCCL_TIMEOUT");
    return t ? atof(t) : 300.0;
}
// the host waits until ready() while every stream makes progress (`held` up to `upto` only)
inline void wait_until(const std::function<bool()>& ready, const char* waiting_in, const Stream* held = NULL, long upto = 0) {
    double timeout = wait_timeout_s();
    auto begun = std::chrono::steady_clock::now();
    for (;;) {
        if (ready()) return;
        progress_all(held, upto);
        if (ready()) return;
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count() > timeout) {
            std::string waits;
            for (Stream* s : streams)
                if (!s->queue.empty()) waits += (waits.empty() ? "" : "; ") + s->queue.front().what;
            fprintf(stderr, "emulated CUDA, pid %d: deadlock: %s waited %.0f s (EMU_NCCL_TIMEOUT) for queued communication that "
                            "never completed: %s\n", (int)getpid(), waiting_in, timeout, waits.c_str());
            exit(1);
        }
        usleep(200);
    }
}
inline void queue_op(cudaStream_t s, std::function<bool()> step, std::string what) {
    Stream* st = stream_of(s);
    st->queue.push_back({std::move(step), std::move(what)});
    st->queued++;
}
// whether an operation issued on s now is queued: always on a created stream (it runs behind the host),
// on the default stream while it has work queued (always, with EMU_STREAMS=main-late)
inline bool stream_busy(cudaStream_t s) {
    Stream* st = stream_of(s);
    return st != &default_stream || main_late || !st->queue.empty();
}
// an operation on s: at the call where s does not queue (stream_busy), else queued behind what it has
inline void in_order(cudaStream_t s, std::function<void()> op, const char* what) {
    if (!stream_busy(s)) op();
    else queue_op(s, [op] { return op(), true; }, what);
}
// the host waits for what s has queued (before an operation whose result it needs at the call)
inline void drain(cudaStream_t s, const char* waiting_in) {
    Stream* st = stream_of(s);
    if (!st->queue.empty()) wait_until([st] { return st->queue.empty(); }, waiting_in);
}
inline void drain_all(const char* waiting_in) {
    wait_until([] {
        for (Stream* s : streams)
            if (!s->queue.empty()) return false;
        return true;
    }, waiting_in);
}
}  // namespace emu

extern "C" {
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
    emu::Stream* st = new emu::Stream;
    emu::streams.push_back(st);
    return *s = (cudaStream_t)st, cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    emu::drain(s, "cudaStreamDestroy");
    emu::Stream* st = emu::stream_of(s);
    if (st == &emu::default_stream) return cudaErrorInvalidValue;
    emu::streams.erase(std::find(emu::streams.begin(), emu::streams.end(), st));
    delete st;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return emu::drain(s, "cudaStreamSynchronize"), cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return emu::drain_all("cudaDeviceSynchronize"), cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t s) {
    emu::progress_all();
    return emu::stream_of(s)->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return *e = (cudaEvent_t) new emu::Event{0.0, &emu::default_stream, 0}, cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { return delete (emu::Event*)e, cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    emu::Event* ev = (emu::Event*)e;
    ev->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
    ev->stream = emu::stream_of(s), ev->position = ev->stream->queued;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    emu::Stream* st = ((emu::Event*)e)->stream;
    long position = ((emu::Event*)e)->position;
    emu::wait_until([st, position] { return st->done >= position; }, "cudaEventSynchronize", st, position);
    return cudaSuccess;
}
// Later work on s follows the event. Where s queues what is issued on it (a created stream, or one with
// operations queued), the wait joins its queue; otherwise the host waits here, since what it launches on
// s next runs at the call.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    emu::Stream *st = ((emu::Event*)e)->stream, *waiter = emu::stream_of(s);
    long position = ((emu::Event*)e)->position;
    if (st == waiter || st->done >= position) return cudaSuccess;
    if (emu::stream_busy(s)) emu::queue_op(s, [st, position] { return st->done >= position; }, "a wait for an event of another stream");
    else emu::wait_until([st, position] { return st->done >= position; }, "cudaStreamWaitEvent", st, position);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    return *ms = (float)(((emu::Event*)b)->ms - ((emu::Event*)a)->ms), cudaSuccess;
}
}

// ----------------------------------------------------------------------------------------------------
// the runtime, over host memory

namespace emu {
const size_t DEVICE_BYTES = (size_t)80 << 30;
inline std::map<void*, size_t> device_blocks;  // allocation -> its bytes (rounded up to 256, as cudaMalloc aligns)
inline size_t device_in_use = 0;
struct PinnedBlock {
    size_t bytes;
    int reads_queued;  // copies queued that will read it
};
inline std::map<const char*, PinnedBlock> pinned_blocks;  // cudaMallocHost's allocations
// the pinned allocation that holds p, or NULL
inline PinnedBlock* pinned_block(const void* p) {
    auto it = pinned_blocks.upper_bound((const char*)p);
    if (it == pinned_blocks.begin()) return NULL;
    --it;
    return (const char*)p < it->first + it->second.bytes ? &it->second : NULL;
}
// does the copy's source (destination) lie on the host? (cudaMemcpyDefault: where it is not device memory)
inline bool host_side(cudaMemcpyKind kind, const void* p, bool source) {
    if (kind == cudaMemcpyDefault) {
        auto it = device_blocks.upper_bound((void*)p);
        return it == device_blocks.begin() || (const char*)p >= (const char*)std::prev(it)->first + std::prev(it)->second;
    }
    return source ? kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost
                  : kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
}
// A copy on stream s of `rows` rows of `width` bytes (`spitch`, `dpitch` apart): to the host, the stream
// is waited for and the copy made at the call (the host has the bytes when it returns); from pinned host
// memory it is queued, reading the source when the stream gets to it; from pageable host memory the
// source is read at the call (CUDA stages it); device to device it is made in the stream's order.
inline void copy_on_stream(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, cudaMemcpyKind kind,
                           cudaStream_t s, const char* what) {
    auto copy = [=] {
        for (size_t r = 0; r < rows; r++) memcpy((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
    };
    bool from_host = host_side(kind, src, true);
    if (host_side(kind, dst, false)) {
        drain(s, what);
        copy();
    } else if (PinnedBlock* pinned = from_host ? pinned_block(src) : NULL) {
        pinned->reads_queued++;
        queue_op(s, [copy, src] {
            copy();
            pinned_block(src)->reads_queued--;
            return true;
        }, "a copy from pinned host memory");
    } else if (from_host && stream_busy(s)) {
        auto staged = std::make_shared<std::vector<char>>(rows * width);
        for (size_t r = 0; r < rows; r++) memcpy(staged->data() + r * width, (const char*)src + r * spitch, width);
        queue_op(s, [=] {
            for (size_t r = 0; r < rows; r++) memcpy((char*)dst + r * dpitch, staged->data() + r * width, width);
            return true;
        }, "a copy from pageable host memory");
    } else {
        in_order(s, copy, "a copy on the device");
    }
}
}  // namespace emu
extern "C" {
cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = NULL;
    if (bytes > emu::DEVICE_BYTES - emu::device_in_use) return cudaErrorMemoryAllocation;  // (before rounding can wrap)
    size_t rounded = (bytes + 255) / 256 * 256;
    if (rounded > emu::DEVICE_BYTES - emu::device_in_use) return cudaErrorMemoryAllocation;
    if ((*p = aligned_alloc(256, rounded > 0 ? rounded : 256)) == NULL) return cudaErrorMemoryAllocation;
    emu::device_blocks[*p] = rounded, emu::device_in_use += rounded;
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    if (p == NULL) return cudaSuccess;
    emu::drain_all("cudaFree");  // (cudaFree waits for the device: queued work may still use the memory)
    auto block = emu::device_blocks.find(p);
    if (block == emu::device_blocks.end()) return cudaErrorInvalidValue;  // not from cudaMalloc, or freed twice
    emu::device_in_use -= block->second;
    emu::device_blocks.erase(block);
    free(p);
    return cudaSuccess;
}
// the blocking calls follow the default stream's work
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    emu::drain(0, "cudaMemcpy");
    return memcpy(dst, src, bytes), cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    emu::copy_on_stream(dst, bytes, src, bytes, bytes, 1, kind, s, "cudaMemcpyAsync");
    return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t bytes) {
    emu::drain(0, "cudaMemset");
    return memset(p, v, bytes), cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t bytes, cudaStream_t s) {
    emu::in_order(s, [=] { memset(p, v, bytes); }, "a memset");
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    return *free_bytes = emu::DEVICE_BYTES - emu::device_in_use, *total = emu::DEVICE_BYTES, cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::last_error; }
// the errors this emulation returns
const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        default: return "cudaError (emulated)";
    }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }
// EMU_DEVICES=N: a machine with N GPUs (default 1), each with its own UUID, so that ranks launched
// together take different ones (and the NCCL engine, emulate_nccl.h) instead of sharing one
namespace emu {
inline int current_device = 0;
inline int device_count() {
    const char* n = getenv("EMU_DEVICES");
    return n && atoi(n) > 0 ? atoi(n) : 1;
}
}  // namespace emu
cudaError_t cudaGetDeviceCount(int* n) { return *n = emu::device_count(), cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { return *d = emu::current_device, cudaSuccess; }
cudaError_t cudaDriverGetVersion(int* v) { return *v = CUDART_VERSION, cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) { return *v = CUDART_VERSION, cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = 132; break;  // an H100 SXM's, so grids are sized as there
        case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)emu::SHARED_MAX; break;
        case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        default: return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "emulated on the CPU (H100-shaped limits)");
    prop->major = 9, prop->multiProcessorCount = 132, prop->l2CacheSize = 50 << 20;
    prop->sharedMemPerBlockOptin = emu::SHARED_MAX, prop->maxThreadsPerBlock = 1024, prop->totalGlobalMem = emu::DEVICE_BYTES;
    snprintf(prop->uuid.bytes, sizeof(prop->uuid.bytes), "emulated GPU %d", device);
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > emu::SHARED_MAX) return cudaErrorInvalidValue;
        emu::shared_opt_in[kernel] = value;
    }
    return cudaSuccess;
}
}
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) { return cudaFuncSetAttribute((const void*)kernel, attr, value); }

// ----------------------------------------------------------------------------------------------------
// cuBLAS and cuBLASLt, as far as llmc calls them: the handles, the strided batched product of the
// classic attention and cuBLASLt's matmul with the epilogues llmc uses (BIAS, GELU_AUX_BIAS, BGRADB), as
// plain loops in float over column-major matrices (the products and epilogues cuBLASLt documents; not its
// summation order). An attribute or an epilogue llmc does not use is refused with
// CUBLAS_STATUS_NOT_SUPPORTED, so nothing passes unnoticed.

namespace emu {
inline float load_element(const void* p, size_t i, cudaDataType type) {
    if (type == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16*)p)[i]);
    if (type == CUDA_R_16F) return __half2float(((const __half*)p)[i]);
    return ((const float*)p)[i];
}
inline size_t elem(cudaDataType type) { return type == CUDA_R_16BF || type == CUDA_R_16F ? 2 : 4; }
inline void store_element(void* p, size_t i, cudaDataType type, float v) {
    if (type == CUDA_R_16BF) ((__nv_bfloat16*)p)[i] = __float2bfloat16(v);
    else if (type == CUDA_R_16F) ((__half*)p)[i] = __float2half(v);
    else ((float*)p)[i] = v;
}
inline int handle_storage;  // what the handles point at
inline cudaStream_t cublas_stream = 0;  // the stream cublasSetStream gave the cuBLAS handle

struct LtDesc {  // behind a cublasLtMatmulDesc_t
    int32_t trans_a, trans_b;  // cublasOperation_t
    int32_t epilogue;          // cublasLtEpilogue_t
    const void* bias;          // the bias, or where a bias gradient goes
    int32_t bias_type;         // cudaDataType
    const void* aux;           // the GELU input, written by GELU_AUX_BIAS (of D's type)
    int64_t aux_ld;
};
struct LtLayout {  // behind a cublasLtMatrixLayout_t
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
// element (i, l) of op(X) for a column-major X of leading dimension ld
inline size_t op_index(bool trans, size_t i, size_t l, int64_t ld) { return trans ? l + i * ld : i + l * ld; }

// GELU as cuBLASLt's epilogue defines it: the tanh form GPT-2 uses
inline float gelu(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); }

// What follows the product (cublasLtEpilogue_t, llmc's subset): `vec` is the bias (read) or the bias
// gradient (written), of type vec_type; `aux` the GELU input, of D's type.
struct Epilogue {
    int32_t kind;  // cublasLtEpilogue_t
    const void* vec;
    cudaDataType vec_type;
    const void* aux;
    int64_t aux_ld;
};

// D (m x n) = alpha op(A) (m x k) . op(B) (k x n) + beta C, column-major, then the epilogue:
//   BIAS           D += bias (m), broadcast over the n columns
//   GELU_AUX_BIAS  aux = D + bias (stored in D's type); D = gelu(D + bias), from the unrounded sum
//   BGRADB         bias gradient (n) = sums of op(B) over its k rows
// C is not read when beta = 0. The operands are first copied to float rows, so the products are
// contiguous dot products.
struct Operand {
    const void* p;
    cudaDataType type;
    int64_t ld;
};
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, Operand A, Operand B, float beta, Operand C,
                 void* D, cudaDataType d_type, int64_t ldd, Epilogue epi = {CUBLASLT_EPILOGUE_DEFAULT, NULL, CUDA_R_32F, NULL, 0}) {
    float* rows_a = (float*)malloc((size_t)(m * k + n * k + 1) * sizeof(float));  // op(A) row i | op(B) column j
    float* cols_b = rows_a + m * k;
    for (int64_t i = 0; i < m; i++)
        for (int64_t l = 0; l < k; l++) rows_a[i * k + l] = load_element(A.p, op_index(ta, i, l, A.ld), A.type);
    for (int64_t j = 0; j < n; j++)
        for (int64_t l = 0; l < k; l++) cols_b[j * k + l] = load_element(B.p, op_index(tb, l, j, B.ld), B.type);
#pragma omp parallel for
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float sum = 0.0f;
            for (int64_t l = 0; l < k; l++) sum += rows_a[i * k + l] * cols_b[j * k + l];
            float out = alpha * sum + (beta != 0.0f ? beta * load_element(C.p, i + j * C.ld, C.type) : 0.0f);
            if (epi.kind == CUBLASLT_EPILOGUE_BIAS || epi.kind == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) out += load_element(epi.vec, i, epi.vec_type);
            if (epi.kind == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                store_element((void*)epi.aux, i + j * epi.aux_ld, d_type, out);
                out = gelu(out);
            }
            store_element(D, i + j * ldd, d_type, out);
        }
    if (epi.kind == CUBLASLT_EPILOGUE_BGRADB)
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t l = 0; l < k; l++) s += cols_b[j * k + l];
            store_element((void*)epi.vec, j, epi.vec_type, s);
        }
    free(rows_a);
}

// EMU_COUNTS=FILE (emulate.h, Launch): what this process issued, written to FILE at its exit (one
// process per FILE: ranks would overwrite each other's): a line
// "launch NAME N" per kernel, then "flops cublasLt N" and "flops cublas_batched N" (2 m n k per product).
// tests/kernel_report_emulated.sh holds dev/cuda/kernel_report.py's step to what a trainer step issues.
inline std::map<std::string, uint64_t> launch_counts;
inline uint64_t lt_flops = 0, batched_flops = 0;
inline void count_write() {
    FILE* f = fopen(getenv("EMU_COUNTS"), "w");
    if (f == NULL) {
        fprintf(stderr, "emulated CUDA: cannot write EMU_COUNTS=%s\n", getenv("EMU_COUNTS"));
        fflush(NULL);
        _exit(1);
    }
    for (const auto& [name, n] : launch_counts) fprintf(f, "launch %s %llu\n", name.c_str(), (unsigned long long)n);
    fprintf(f, "flops cublasLt %llu\nflops cublas_batched %llu\n", (unsigned long long)lt_flops, (unsigned long long)batched_flops);
    fclose(f);
}
inline bool counting() {  // whether EMU_COUNTS is set; the first call arranges the write at exit
    static const bool on = getenv("EMU_COUNTS") != NULL && atexit(count_write) == 0;
    return on;
}
inline void count_launch(const char* kernel) {
    if (counting()) launch_counts[kernel]++;
}
inline void count_flops(uint64_t* total, int64_t m, int64_t n, int64_t k, int64_t batch) {
    if (counting()) *total += 2 * (uint64_t)(m * n * k * batch);
}
}  // namespace emu

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) { return *h = (cublasHandle_t)&emu::handle_storage, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { return *h = (cublasLtHandle_t)&emu::handle_storage, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t s) { return emu::cublas_stream = s, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
// C_b (m x n) = alpha op(A_b) (m x k) . op(B_b) (k x n) + beta C_b for b < batch; C is not read when beta = 0
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
                                          const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
                                          cudaDataType Ctype, int ldc, long long strideC, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
    if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    float al = *(const float*)alpha, be = *(const float*)beta;  // (host scalars: read at the call)
    emu::count_flops(&emu::batched_flops, m, n, k, batch);
    emu::in_order(emu::cublas_stream, [=] {
        for (int b = 0; b < batch; b++)
            emu::gemm(transa != CUBLAS_OP_N, transb != CUBLAS_OP_N, m, n, k, al, {(const char*)A + b * strideA * emu::elem(Atype), Atype, lda},
                      {(const char*)B + b * strideB * emu::elem(Btype), Btype, ldb}, be, {(const char*)C + b * strideC * emu::elem(Ctype), Ctype, ldc},
                      (char*)C + b * strideC * emu::elem(Ctype), Ctype, ldc);
    }, "a cuBLAS product");
    return CUBLAS_STATUS_SUCCESS;
}
}

extern "C" {
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = (cublasLtMatmulDesc_t) new emu::LtDesc{CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, CUDA_R_32F, NULL, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) { return delete (emu::LtDesc*)desc, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes) {
    emu::LtDesc* d = (emu::LtDesc*)desc;
    void* field = attr == CUBLASLT_MATMUL_DESC_TRANSA ? (void*)&d->trans_a
                  : attr == CUBLASLT_MATMUL_DESC_TRANSB ? (void*)&d->trans_b
                  : attr == CUBLASLT_MATMUL_DESC_EPILOGUE ? (void*)&d->epilogue
                  : attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER ? (void*)&d->bias
                  : attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE ? (void*)&d->bias_type
                  : attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER ? (void*)&d->aux
                  : attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD ? (void*)&d->aux_ld
                  : NULL;
    size_t want = attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER || attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER ? sizeof(void*)
                  : attr == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD ? sizeof(int64_t) : 4;
    if (field == NULL || bytes != want) return CUBLAS_STATUS_NOT_SUPPORTED;
    memcpy(field, buf, bytes);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    if ((int64_t)rows > ld) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = (cublasLtMatrixLayout_t) new emu::LtLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) { return delete (emu::LtLayout*)layout, CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    return *pref = (cublasLtMatmulPreference_t)&emu::handle_storage, CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void*, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* found) {
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    memset(&results[0], 0, sizeof(results[0]));
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
// D (m x n) = alpha op(A) (m x k) . op(B) (k x n) + beta C [+ bias (m) broadcast over n]; C is not read when beta = 0
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* A, cublasLtMatrixLayout_t la,
                              const void* B, cublasLtMatrixLayout_t lb, const void* beta, const void* C, cublasLtMatrixLayout_t lc, void* D,
                              cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
    const emu::LtDesc* d = (const emu::LtDesc*)desc;
    const emu::LtLayout *a = (const emu::LtLayout*)la, *b = (const emu::LtLayout*)lb, *c = (const emu::LtLayout*)lc, *o = (const emu::LtLayout*)ld;
    bool ta = d->trans_a != CUBLAS_OP_N, tb = d->trans_b != CUBLAS_OP_N;
    uint64_t m = o->rows, n = o->cols, k = ta ? a->rows : a->cols;
    if ((ta ? a->cols : a->rows) != m || (tb ? b->cols : b->rows) != k || (tb ? b->rows : b->cols) != n || c->rows != m || c->cols != n)
        return CUBLAS_STATUS_INVALID_VALUE;
    int32_t e = d->epilogue;
    if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
        e != CUBLASLT_EPILOGUE_BGRADB)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    bool gelu = e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    // what cuBLASLt requires of the epilogue's operands: a vector, and a GELU input with an ld that is a
    // multiple of 8 and covers D's rows
    if (e != CUBLASLT_EPILOGUE_DEFAULT && d->bias == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    if (gelu && (d->aux == NULL || d->aux_ld % 8 != 0 || d->aux_ld < (int64_t)m)) return CUBLAS_STATUS_INVALID_VALUE;
    // (the descriptors and host scalars are read at the call; the product runs in its stream's order)
    float al = *(const float*)alpha, be = *(const float*)beta;
    emu::Operand opa = {A, a->type, a->ld}, opb = {B, b->type, b->ld}, opc = {C, c->type, c->ld};
    emu::Epilogue epi = {e, d->bias, (cudaDataType)d->bias_type, d->aux, d->aux_ld};
    cudaDataType d_type = o->type;
    int64_t ldd = o->ld;
    emu::count_flops(&emu::lt_flops, m, n, k, 1);
    emu::in_order(stream, [=] { emu::gemm(ta, tb, m, n, k, al, opa, opb, be, opc, D, d_type, ldd, epi); }, "a cuBLASLt product");
    return CUBLAS_STATUS_SUCCESS;
}

// the rest of the runtime the trainer's code names: pinned memory, the device, 2D copies
// pinned host memory: host memory, not counted against the device; copies from it are queued (above)
cudaError_t cudaMallocHost(void** p, size_t bytes) {
    if ((*p = malloc(bytes > 0 ? bytes : 1)) == NULL) return cudaErrorMemoryAllocation;
    emu::pinned_blocks[(const char*)*p] = {bytes > 0 ? bytes : 1, 0};
    return cudaSuccess;
}
// Freeing pinned memory that a queued copy has yet to read is a use after free on a GPU: stopped here.
cudaError_t cudaFreeHost(void* p) {
    if (p == NULL) return cudaSuccess;
    auto block = emu::pinned_blocks.find((const char*)p);
    if (block == emu::pinned_blocks.end()) return cudaErrorInvalidValue;  // not from cudaMallocHost, or freed twice
    if (block->second.reads_queued > 0) {
        fprintf(stderr, "emulated CUDA: cudaFreeHost of pinned host memory that a queued copy still reads (wait for the copy first)\n");
        exit(1);
    }
    emu::pinned_blocks.erase(block);
    return free(p), cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emu::device_count()) return cudaErrorInvalidDevice;
    return emu::current_device = device, cudaSuccess;
}
// rows of `width` bytes from src (rows `spitch` apart) to dst (rows `dpitch` apart)
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, cudaMemcpyKind kind,
                              cudaStream_t s) {
    if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
    emu::copy_on_stream(dst, dpitch, src, spitch, width, rows, kind, s, "cudaMemcpy2DAsync");
    return cudaSuccess;
}
}
