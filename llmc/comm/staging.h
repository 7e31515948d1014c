/*
 * comm/staging.h: the copies between device buffers and host memory under the MPI engine (mpi_engine.h).
 *
 * MPI moves host memory; on the GPU target the engine's buffers live on the device. An operation is cut
 * into pieces, and each piece goes through one of STAGE_BUFFERS pinned host buffers:
 *
 *     download (device -> host buffer, stream `down`)  ->  MPI on the host buffer  ->  upload (-> device, `up`)
 *
 * While MPI works on piece k, the downloads of pieces k+1 .. k+BUFFERS-1 and the upload of piece k-1 run
 * on the GPU's copy engines, so that the copies can hide behind the transfer (not yet measured). A host
 * buffer's reuse is ordered by events: the download of piece k+BUFFERS into host buffer s waits (on the
 * GPU) for the upload of piece k out of it.
 *
 * A piece covers columns [col0, col0 + w) of `rows` rows of the device buffer (rows > 1: the blocks of a
 * reduce-scatter or all-gather, `pitch` elements apart); in the host buffer its rows lie w elements apart,
 * which is the layout MPI's block collectives want. Data moves as bytes, with no conversion, except for
 * sums of 16-bit floatX (bf16, fp16), which travel and are summed in float: a kernel widens each piece
 * into a device float buffer before the download and narrows it after the upload.
 *
 * A send-receive is the exception: its send must not wait for its receive (the peer may answer only
 * after taking the whole message), so its send half is downloaded whole into `out` and every piece of
 * it posted at once; only its receive half goes through the host buffers (mpi_engine.h,
 * mpi_run_staged_sendrecv).
 *
 * The pieces are used when LLMC_MPI_STAGE_BYTES sets their size (8388608, 8 MiB, is the size meant for
 * GPUs: each MPI call then moves megabytes). Until this path has run on a GPU, the GPU target's default is
 * the simple whole-buffer copy that has (mpi_run_host_copy in mpi_engine.h). The CPU target cuts the
 * same pieces with plain copies when the variable is set (a test of the logic; by default its MPI engine
 * works on the buffers directly).
 */
#pragma once

#include "../device.h"  // floatX, malloc_check, calloc_check; GPU target: cudaCheck, main_stream, grid_for

#define STAGE_BUFFERS 4

typedef struct {  // one side of a staged operation: where the download reads, or the upload writes
    char* dev;        // the device buffer (NULL: the operation has no such side on this rank)
    size_t pitch;     // elements between its rows
    int rows;
    size_t host_row;  // where its first row goes in the host buffer, in piece widths
} StageSide;

typedef struct {
    StageSide down, up;
    size_t n;        // columns: elements per row
    size_t elem;     // bytes of an element in device memory
    size_t wire;     // bytes of an element in the host buffer and in MPI (4 when widened to float)
    int convert;     // floatX <-> float on the way (a sum of 16-bit floatX)
    int widths;      // piece widths a host buffer must hold (the rows of the block collectives; 2 for point-to-point)
} StagePlan;

typedef struct Staging {
    size_t cap;                // bytes of each host buffer
    char* host[STAGE_BUFFERS];   // pinned on the GPU target
    float* wide[STAGE_BUFFERS];  // GPU: a piece widened to float (allocated on the first conversion)
    char* out;                 // a send-receive's send half, whole (pinned on the GPU target; grown on demand)
    size_t out_cap;
#ifndef LLMC_CPU
    cudaStream_t down, up;
    cudaEvent_t ready, down_done[STAGE_BUFFERS], up_done[STAGE_BUFFERS];
#endif
} Staging;

// Elements per piece and row: what fits a host buffer of `bytes` (the same on every rank of an operation, so
// that the pieces of a send match those of its receive)
static size_t stage_width(const StagePlan* p, size_t bytes) {
    size_t w = bytes / ((size_t)p->widths * p->wire);
    return w > 0 ? w : 1;
}

// columns [col0, col0 + w) of piece k
static size_t stage_piece(const StagePlan* p, size_t S, size_t k, size_t* w) {
    size_t col0 = k * S;
    *w = p->n - col0 < S ? p->n - col0 : S;
    return col0;
}

#ifdef LLMC_CPU
// ----------------------------------------------------------------------------------------------------
// CPU target: "device" buffers are host memory, copies are memcpy, nothing runs asynchronously


static void stage_rows(char* dst, size_t dpitch, const char* src, size_t spitch, size_t width, int rows) {
    for (int r = 0; r < rows; r++) memcpy(dst + r * dpitch, src + r * spitch, width);
}
static void staging_create(Staging* st, size_t cap) {
    st->cap = cap;
    for (int s = 0; s < STAGE_BUFFERS; s++) st->host[s] = (char*)malloc_check(cap);
}
static void staging_destroy(Staging* st) {
    for (int s = 0; s < STAGE_BUFFERS; s++) free(st->host[s]);
    free(st->out);
}
static char* staging_out(Staging* st, size_t bytes) {
    if (bytes > st->out_cap) {
        free(st->out);
        st->out = (char*)malloc_check(bytes > 0 ? bytes : 1);
        st->out_cap = bytes;
    }
    return st->out;
}
static void stage_download_whole(Staging* st, char* host, const char* dev, size_t bytes) {
    (void)st;
    memcpy(host, dev, bytes);
}
static void stage_begin(Staging* st) { (void)st; }
static void stage_end(Staging* st) { (void)st; }
static void stage_wait_download(Staging* st, int s) { (void)st; (void)s; }
static void stage_wait_upload(Staging* st, int s) { (void)st; (void)s; }

static void stage_download(Staging* st, const StagePlan* p, size_t S, size_t k) {
    size_t w, col0 = stage_piece(p, S, k, &w);
    const StageSide* d = &p->down;
    stage_rows(st->host[k % STAGE_BUFFERS] + d->host_row * w * p->wire, w * p->wire, d->dev + col0 * p->elem,
               d->pitch * p->elem, w * p->elem, d->rows);
}
static void stage_upload(Staging* st, const StagePlan* p, size_t S, size_t k) {
    size_t w, col0 = stage_piece(p, S, k, &w);
    const StageSide* u = &p->up;
    stage_rows(u->dev + col0 * p->elem, u->pitch * p->elem, st->host[k % STAGE_BUFFERS] + u->host_row * w * p->wire,
               w * p->wire, w * p->elem, u->rows);
}

#else
// ----------------------------------------------------------------------------------------------------
// GPU target: pinned host buffers, two copy streams, events per host buffer


// rows x w floatX (rows `pitch` apart) <-> rows x w float (contiguous), one element per thread
#define STAGE_THREADS 256
__global__ void __launch_bounds__(STAGE_THREADS) stage_widen_kernel(float* dst, const floatX* src, size_t w,
                                                                    size_t pitch, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) dst[i] = floatX_to_float(src[(i / w) * pitch + i % w]);
}
__global__ void __launch_bounds__(STAGE_THREADS) stage_narrow_kernel(floatX* dst, const float* src, size_t w,
                                                                     size_t pitch, size_t total) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) dst[(i / w) * pitch + i % w] = float_to_floatX(src[i]);
}

static void staging_create(Staging* st, size_t cap) {
    st->cap = cap;
    for (int s = 0; s < STAGE_BUFFERS; s++) {
        cudaCheck(cudaMallocHost((void**)&st->host[s], cap));
        cudaCheck(cudaEventCreateWithFlags(&st->down_done[s], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&st->up_done[s], cudaEventDisableTiming));
    }
    cudaCheck(cudaEventCreateWithFlags(&st->ready, cudaEventDisableTiming));
    cudaCheck(cudaStreamCreateWithFlags(&st->down, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&st->up, cudaStreamNonBlocking));
}
static void staging_destroy(Staging* st) {
    for (int s = 0; s < STAGE_BUFFERS; s++) {
        cudaCheck(cudaFreeHost(st->host[s]));
        if (st->wide[s]) cudaCheck(cudaFree(st->wide[s]));  // (the engine's own, like NCCL's buffers: not in the plan)
        cudaCheck(cudaEventDestroy(st->down_done[s]));
        cudaCheck(cudaEventDestroy(st->up_done[s]));
    }
    if (st->out) cudaCheck(cudaFreeHost(st->out));
    cudaCheck(cudaEventDestroy(st->ready));
    cudaCheck(cudaStreamDestroy(st->down));
    cudaCheck(cudaStreamDestroy(st->up));
}
static char* staging_out(Staging* st, size_t bytes) {
    if (bytes > st->out_cap) {
        if (st->out) cudaCheck(cudaFreeHost(st->out));
        cudaCheck(cudaMallocHost((void**)&st->out, bytes > 0 ? bytes : 1));
        st->out_cap = bytes;
    }
    return st->out;
}

// both copy streams start after the work queued so far on the main stream (which writes what the
// downloads read, and may still read what the uploads overwrite)
static void stage_begin(Staging* st) {
    cudaCheck(cudaEventRecord(st->ready, main_stream));
    cudaCheck(cudaStreamWaitEvent(st->down, st->ready, 0));
    cudaCheck(cudaStreamWaitEvent(st->up, st->ready, 0));
}
// the operation is complete when its call returns: the uploads are done
static void stage_end(Staging* st) {
    cudaCheckBlocking("a staged copy", cudaStreamSynchronize(st->down));
    cudaCheckBlocking("a staged copy", cudaStreamSynchronize(st->up));
}
static void stage_wait_download(Staging* st, int s) {
    cudaCheckBlocking("a staged copy", cudaEventSynchronize(st->down_done[s]));
}
// bytes of a device buffer into host memory, on the download stream (after stage_begin), waited for
static void stage_download_whole(Staging* st, char* host, const char* dev, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st->down));
    cudaCheckBlocking("a staged copy", cudaStreamSynchronize(st->down));
}
static void stage_wait_upload(Staging* st, int s) {
    cudaCheckBlocking("a staged copy", cudaEventSynchronize(st->up_done[s]));
}

static float* stage_wide(Staging* st, int s) {
    if (st->wide[s] == NULL) cudaCheck(cudaMalloc((void**)&st->wide[s], st->cap));
    return st->wide[s];
}

static void stage_download(Staging* st, const StagePlan* p, size_t S, size_t k) {
    int s = (int)(k % STAGE_BUFFERS);
    size_t w, col0 = stage_piece(p, S, k, &w);
    const StageSide* d = &p->down;
    char* host = st->host[s] + d->host_row * w * p->wire;
    const char* src = d->dev + col0 * p->elem;
    if (k >= STAGE_BUFFERS && p->up.dev)  // piece k-BUFFERS left the host buffer
        cudaCheck(cudaStreamWaitEvent(st->down, st->up_done[s], 0));
    if (p->convert) {
        size_t total = (size_t)d->rows * w;
        stage_widen_kernel<<<grid_for(total, STAGE_THREADS), STAGE_THREADS, 0, st->down>>>(
            stage_wide(st, s), (const floatX*)src, w, d->pitch, total);
        launchCheck();
        cudaCheck(cudaMemcpyAsync(host, st->wide[s], total * sizeof(float), cudaMemcpyDeviceToHost, st->down));
    } else if (d->rows == 1) {
        cudaCheck(cudaMemcpyAsync(host, src, w * p->elem, cudaMemcpyDeviceToHost, st->down));
    } else {
        cudaCheck(cudaMemcpy2DAsync(host, w * p->wire, src, d->pitch * p->elem, w * p->elem, d->rows,
                                    cudaMemcpyDeviceToHost, st->down));
    }
    cudaCheck(cudaEventRecord(st->down_done[s], st->down));
}

static void stage_upload(Staging* st, const StagePlan* p, size_t S, size_t k) {
    int s = (int)(k % STAGE_BUFFERS);
    size_t w, col0 = stage_piece(p, S, k, &w);
    const StageSide* u = &p->up;
    const char* host = st->host[s] + u->host_row * w * p->wire;
    char* dst = u->dev + col0 * p->elem;
    if (p->convert) {
        size_t total = (size_t)u->rows * w;
        cudaCheck(cudaMemcpyAsync(stage_wide(st, s), host, total * sizeof(float), cudaMemcpyHostToDevice, st->up));
        stage_narrow_kernel<<<grid_for(total, STAGE_THREADS), STAGE_THREADS, 0, st->up>>>((floatX*)dst, st->wide[s], w,
                                                                                          u->pitch, total);
        launchCheck();
    } else if (u->rows == 1) {
        cudaCheck(cudaMemcpyAsync(dst, host, w * p->elem, cudaMemcpyHostToDevice, st->up));
    } else {
        cudaCheck(cudaMemcpy2DAsync(dst, u->pitch * p->elem, host, w * p->wire, w * p->elem, u->rows,
                                    cudaMemcpyHostToDevice, st->up));
    }
    cudaCheck(cudaEventRecord(st->up_done[s], st->up));
}
#endif

// The MPI engine's piece size: LLMC_MPI_STAGE_BYTES (bytes per host buffer; the same on every rank), or 0: not
// cut into pieces (the CPU target's MPI works on the buffers themselves; the GPU target's copies each buffer whole,
// mpi_run_host_copy, the default until the cut into pieces path has run on a GPU)
static size_t stage_bytes_setting(void) {
    const char* v = getenv("LLMC_MPI_STAGE_BYTES");
    if (v == NULL) return 0;
    char* end;
    long long bytes = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || bytes < 1 || bytes > (1ll << 30))
        fatal("LLMC_MPI_STAGE_BYTES must be a number of bytes from 1 to 2^30, not '%s'", v);
    return (size_t)bytes;
}

// The host buffers, grown to hold `bytes` each (an operation whose single column of every row needs more than
// the configured piece); created on the first staged operation, freed by comm_finalize.
static Staging* staging_reserve(Staging* st, size_t bytes) {
    if (st != NULL && st->cap >= bytes) return st;
    if (st != NULL) {
        staging_destroy(st);
        free(st);
    }
    st = (Staging*)calloc_check(sizeof(Staging));
    staging_create(st, bytes);
    return st;
}

static void staging_free(Staging* st) {
    if (st == NULL) return;
    staging_destroy(st);
    free(st);
}
