/*
 * global_norm.h: the L2 norm of all gradients together, sqrt(sum g^2), as clip_grad_norm_ computes it.
 * global_norm() and sum_squares() take one whole buffer (the tests use them); the optimizer sums the
 * ranges it owns through NormParts below, before the trainer sums across ranks.
 *
 * Sums are taken per fixed chunk and the chunks added in order (in double on the host), so the result
 * does not depend on the number of threads or blocks that ran.
 *
 * NormParts is the optimizer step's use: the gradient ranges a rank sums every step are fixed when the
 * model is built, so the list and every buffer its sum needs are allocated once, and a step allocates
 * nothing. Each range adds to one of two sums (the trainer keeps tensors split by tensor parallelism
 * apart from replicated ones, which it reduces over different groups).
 */
#pragma once

#include "device.h"  // floatX, Scratch, launches

#define NORM_CHUNK 65536

static size_t norm_chunks(size_t n) { return (n + NORM_CHUNK - 1) / NORM_CHUNK; }

// partial: (norm_chunks(n)) the chunks' sums. Chunks in parallel (static schedule); a chunk's sum is
// taken in vector lanes (`omp simd`, an order fixed by the build and the chunk, not the thread count).
static double sum_squares_cpu_into(const float* __restrict x, size_t n, double* __restrict partial) {
    size_t chunks = norm_chunks(n);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t end = (c + 1) * NORM_CHUNK < n ? (c + 1) * NORM_CHUNK : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = c * NORM_CHUNK; i < end; i++) s += (double)x[i] * x[i];
        partial[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < chunks; c++) total += partial[c];
    return total;
}

static double sum_squares_cpu(const float* x, size_t n) {
    double* partial = (double*)malloc_check(norm_chunks(n) * sizeof(double));
    double total = sum_squares_cpu_into(x, n, partial);
    free(partial);
    return total;
}

#ifndef LLMC_CPU
#define NORM_BLOCKS 1024
#define NORM_THREADS 256  // threads per block; norm_blocks: a block per NORM_THREADS elements, at most NORM_BLOCKS
// Block `block` of `blocks` sums its grid-strided share of x[i]^2 (n elements); the total is on thread 0.
// s_warp: the block's shared memory for the warps' sums (32 floats).
__device__ inline float block_sum_squares(float* s_warp, const floatX* x, size_t n, int block, int blocks) {
    float s = 0.0f;
    for (size_t i = (size_t)block * blockDim.x + threadIdx.x; i < n; i += (size_t)blocks * blockDim.x) {
        float v = floatX_to_float(x[i]);
        s += v * v;
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = s;
    __syncthreads();
    float total = 0.0f;
    if (threadIdx.x == 0)
        for (int w = 0; w < blockDim.x / 32; w++) total += s_warp[w];
    return total;
}

// every block sums a grid-strided share of squares into partial[blockIdx.x] (a launch per range: the
// default, the kernel that has run on a GPU)
__global__ void __launch_bounds__(NORM_THREADS) sum_squares_kernel(float* partial, const floatX* x, size_t n) {
    __shared__ float s_warp[32];
    float total = block_sum_squares(s_warp, x, n, blockIdx.x, gridDim.x);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// --fused-kernels 1 (in training on an H200 and an H100; dev/cuda/global_norm.cu version 3 holds its group
// sums to the host path's bits): many ranges in one launch, each summed by its blocks exactly as its own
// launch of `blocks` blocks would sum it (so the partial sums, and the norm, are the same bits as with a
// launch per range). The ranges
// travel as the kernel's parameter (read in place; __grid_constant__: never written), under the
// 4 KiB a launch's parameters may take: NORM_BATCH ranges per launch, all of GPT-2 124M's 148 in one.
#ifndef NORM_BATCH  // (a test may give a smaller batch, to run several launches)
#define NORM_BATCH 160
#endif
typedef struct {
    const floatX* x;
    size_t n;
    int first_block, blocks;  // this range's blocks in the launch: [first_block, first_block + blocks)
} NormRange;
typedef struct {
    int k;  // ranges
    NormRange r[NORM_BATCH];
} NormBatch;

static_assert(sizeof(float*) + sizeof(NormBatch) <= 4096,
              "sum_squares_batch_kernel's parameters exceed the 4 KiB of a launch: lower NORM_BATCH");
__global__ void __launch_bounds__(NORM_THREADS) sum_squares_batch_kernel(float* partial,
                                                                         const __grid_constant__ NormBatch batch) {
    __shared__ float s_warp[32];
    const NormRange* r = &batch.r[range_of_block(batch.r, batch.k)];
    float total = block_sum_squares(s_warp, r->x, r->n, blockIdx.x - r->first_block, r->blocks);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}
static int norm_blocks(size_t n) {
    size_t b = (n + NORM_THREADS - 1) / NORM_THREADS;
    return b < NORM_BLOCKS ? (b > 0 ? (int)b : 1) : NORM_BLOCKS;
}

// the launches of sum_squares_gpu: returns the device buffer of the blocks' partial sums (*total of them)
static float* sum_squares_partials(const floatX* const* x, const size_t* n, const int* blocks, int k, Scratch* scratch,
                                   int batched, size_t* total) {
    size_t total_blocks = 0;
    for (int i = 0; i < k; i++) total_blocks += blocks[i];
    float* partial = (float*)scratch_get(scratch, total_blocks * sizeof(float));
    NormBatch batch;
    size_t offset = 0;
    for (int i = 0; i < k && !batched; offset += blocks[i++])
        sum_squares_kernel<<<blocks[i], NORM_THREADS, 0, main_stream>>>(partial + offset, x[i], n[i]);
    for (int first = 0; first < k && batched; first += NORM_BATCH) {
        batch.k = k - first < NORM_BATCH ? k - first : NORM_BATCH;
        int grid = 0;
        for (int j = 0; j < batch.k; j++) {
            batch.r[j] =
                (NormRange){.x = x[first + j], .n = n[first + j], .first_block = grid, .blocks = blocks[first + j]};
            grid += blocks[first + j];
        }
        sum_squares_batch_kernel<<<grid, NORM_THREADS, 0, main_stream>>>(partial + offset, batch);
        offset += grid;
    }
    launchCheck();
    *total = total_blocks;
    return partial;
}

// sums[i] = sum of x[i]^2 over n[i] elements, in double, for k tensors at once: the ranges' blocks write
// their partial sums into `scratch` (range i's blocks[i] after range i-1's), in a launch per range or
// (`batched`) one per NORM_BATCH ranges, the same bits either way, and a single copy brings them all to
// host (total blocks floats), so a step synchronizes once
static void sum_squares_gpu(const floatX* const* x, const size_t* n, const int* blocks, int k, float* host,
                            double* sums, Scratch* scratch, int batched) {
    size_t total_blocks;
    float* partial = sum_squares_partials(x, n, blocks, k, scratch, batched, &total_blocks);
    copy_to_host(host, partial, total_blocks * sizeof(float));
    size_t offset = 0;
    for (int i = 0; i < k; i++) {
        double total = 0.0;
        for (int j = 0; j < blocks[i]; j++) total += host[offset + j];
        sums[i] = total;
        offset += blocks[i];
    }
}

// --fused-kernels (the optimizer step without a wait, llmc/step_outputs.h): sums[g] = the sum of squares of
// the ranges of group g (g = 0, 1) from the ranges' block partials, range i's in partial[first[i] ..
// first[i + 1]): each range's partials added in double in order, then the ranges in order, the additions
// norm_parts_sum makes on the host, and rounded once to float (what the sums across ranks carry).
// range_sum: (n) doubles of dynamic shared memory.
#define NORM_GROUP_THREADS 256
#define NORM_GROUP_MAX_RANGES 6144  // 48 KiB of doubles, the dynamic shared memory a launch may take without opting in
__global__ void __launch_bounds__(NORM_GROUP_THREADS) norm_group_sums_kernel(
    float* sums, const float* partial, const int* first, const int* group, int n) {
    extern __shared__ double range_sum[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double s = 0.0;
        for (int j = first[i]; j < first[i + 1]; j++) s += partial[j];
        range_sum[i] = s;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    double g[2] = {0.0, 0.0};
    for (int i = 0; i < n; i++) g[group[i]] += range_sum[i];
    sums[0] = (float)g[0];
    sums[1] = (float)g[1];
}
#endif

// sum of x^2, in double (`scratch`: the GPU's partial sums)
static double sum_squares(const floatX* x, size_t n, Scratch* scratch) {
#ifdef LLMC_CPU
    (void)scratch;
    return sum_squares_cpu(x, n);
#else
    int blocks = norm_blocks(n);
    float host[NORM_BLOCKS];
    double s;
    sum_squares_gpu(&x, &n, &blocks, 1, host, &s, scratch, 0);
    return s;
#endif
}

static float global_norm(const floatX* x, size_t n, Scratch* scratch) {
    return (float)sqrt(sum_squares(x, n, scratch));
}

// ----------------------------------------------------------------------------------------------------
// a fixed list of ranges, summed every step without allocating

typedef struct {
    int n, cap;
    const floatX** x;  // (cap) first element of each range
    size_t* len;       // (cap) its elements
    int* group;        // (cap) the sum it adds to: 0 or 1
    double* sums;      // (cap) each range's sum of squares
    double* chunks;    // CPU: (the most chunks of a range) the chunk sums of the range being summed
    int* blocks;       // GPU: (cap) the blocks that sum each range
    float* host;       // GPU: (every range's blocks) their partial sums, copied to the host in one go
    int* table;        // GPU, norm_parts_sum_on_device: (2n + 1) on the device, each range's first partial
                       // (n + 1, the last one past the end), then each range's group (n); uploaded at the first sum
} NormParts;

static void norm_parts_init(NormParts* p, int cap) {
    memset(p, 0, sizeof(*p));
    p->cap = cap;
    p->x = (const floatX**)calloc_check(cap * sizeof(floatX*));
    p->len = (size_t*)calloc_check(cap * sizeof(size_t));
    p->group = (int*)calloc_check(cap * sizeof(int));
    p->sums = (double*)calloc_check(cap * sizeof(double));
    p->blocks = (int*)calloc_check(cap * sizeof(int));
}

static void norm_parts_add(NormParts* p, const floatX* x, size_t len, int group) {
    check_internal(p->n < p->cap, "more norm ranges than planned");
    p->x[p->n] = x;
    p->len[p->n] = len;
    p->group[p->n++] = group;
}

// after the last norm_parts_add: sizes the work buffers for the ranges added
static void norm_parts_finish(NormParts* p) {
#ifdef LLMC_CPU
    size_t most_chunks = 1;
    for (int i = 0; i < p->n; i++)
        most_chunks = norm_chunks(p->len[i]) > most_chunks ? norm_chunks(p->len[i]) : most_chunks;
    p->chunks = (double*)malloc_check(most_chunks * sizeof(double));
#else
    size_t total_blocks = 1;
    for (int i = 0; i < p->n; i++) total_blocks += (p->blocks[i] = norm_blocks(p->len[i]));
    p->host = (float*)malloc_check(total_blocks * sizeof(float));
#endif
}

// group_sums[g] = the sum of squares of the ranges of group g (g = 0, 1), the ranges added in order
// (`scratch`: the GPU's partial sums, grown on the first step; `batched`: --fused-kernels' batched launches)
static void norm_parts_sum(NormParts* p, double group_sums[2], Scratch* scratch, int batched) {
#ifdef LLMC_CPU
    (void)scratch; (void)batched;
    for (int i = 0; i < p->n; i++) p->sums[i] = sum_squares_cpu_into(p->x[i], p->len[i], p->chunks);
#else
    sum_squares_gpu(p->x, p->len, p->blocks, p->n, p->host, p->sums, scratch, batched);
#endif
    group_sums[0] = group_sums[1] = 0.0;
    for (int i = 0; i < p->n; i++) group_sums[p->group[i]] += p->sums[i];
}

// --fused-kernels on the GPU: norm_parts_sum's group sums, left on the device: sums[g] (float, device) for
// g = 0, 1, from the same partials added in the same order (norm_group_sums_kernel), with no copy and no
// wait. The first call uploads the ranges' table (a copy that waits, once per run).
#ifndef LLMC_CPU
static void norm_parts_sum_on_device(NormParts* p, float* sums, Scratch* scratch) {
    if (p->table == NULL) {
        check_internal(p->n <= NORM_GROUP_MAX_RANGES, "more gradient ranges than norm_group_sums_kernel holds");
        int* host = (int*)malloc_check((2 * p->n + 1) * sizeof(int));
        host[0] = 0;
        for (int i = 0; i < p->n; i++) {
            host[i + 1] = host[i] + p->blocks[i];
            host[p->n + 1 + i] = p->group[i];
        }
        p->table = (int*)device_malloc((2 * p->n + 1) * sizeof(int));
        copy_to_device(p->table, host, (2 * p->n + 1) * sizeof(int));
        free(host);
    }
    size_t total_blocks;
    float* partial = sum_squares_partials(p->x, p->len, p->blocks, p->n, scratch, 1, &total_blocks);
    norm_group_sums_kernel<<<1, NORM_GROUP_THREADS, p->n * sizeof(double), main_stream>>>(sums, partial, p->table,
                                                                                          p->table + p->n + 1, p->n);
    launchCheck();
}
#endif

static void norm_parts_free(NormParts* p) {
#ifndef LLMC_CPU
    device_free(p->table);
#endif
    free(p->x);
    free(p->len);
    free(p->group);
    free(p->sums);
    free(p->blocks);
    free(p->chunks);
    free(p->host);
    memset(p, 0, sizeof(*p));
}
