/*
 * global_norm.h: the L2 norm of all gradients together, sqrt(sum g^2), as clip_grad_norm_ computes it.
 * sum_squares() is the part a sharded optimizer computes per rank before summing across ranks.
 *
 * Sums are taken per fixed chunk and the chunks added in order (in double on the host), so the result
 * does not depend on the number of threads or blocks that ran.
 */
#pragma once

#include "device.h"

#define NORM_CHUNK 65536

static double sum_squares_cpu(const float* x, size_t n) {
    size_t chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double* partial = (double*)malloc_check(chunks * sizeof(double));
#pragma omp parallel for
    for (size_t c = 0; c < chunks; c++) {
        size_t end = (c + 1) * NORM_CHUNK < n ? (c + 1) * NORM_CHUNK : n;
        double s = 0.0;
        for (size_t i = c * NORM_CHUNK; i < end; i++) s += (double)x[i] * x[i];
        partial[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < chunks; c++) total += partial[c];
    free(partial);
    return total;
}

#ifndef LLMC_CPU
#define NORM_BLOCKS 1024
// every block sums a grid-strided share of squares into partial[blockIdx.x]
__global__ void sum_squares_kernel(float* partial, const floatX* x, size_t n) {
    __shared__ float s_warp[32];
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = floatX_to_float(x[i]);
        s += v * v;
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < blockDim.x / 32; w++) total += s_warp[w];
        partial[blockIdx.x] = total;
    }
}
static Scratch norm_scratch = {NULL, 0};
#endif

// sums[i] = sum of x[i]^2 over n[i] elements, in double, for k tensors at once: on the GPU one kernel
// per tensor writes its blocks' partial sums and a single copy brings them all to the host (one
// synchronization per optimizer step, not one per tensor)
static void sum_squares_many(const floatX* const* x, const size_t* n, int k, double* sums) {
#ifdef LLMC_CPU
    for (int i = 0; i < k; i++) sums[i] = sum_squares_cpu(x[i], n[i]);
#else
    int* blocks = (int*)malloc_check(k * sizeof(int));
    size_t total_blocks = 0;
    for (int i = 0; i < k; i++) {
        size_t b = (n[i] + 255) / 256;
        blocks[i] = b < NORM_BLOCKS ? (b > 0 ? (int)b : 1) : NORM_BLOCKS;
        total_blocks += blocks[i];
    }
    float* partial = (float*)scratch_get(&norm_scratch, total_blocks * sizeof(float));
    size_t offset = 0;
    for (int i = 0; i < k; i++) {
        sum_squares_kernel<<<blocks[i], 256, 0, main_stream>>>(partial + offset, x[i], n[i]);
        offset += blocks[i];
    }
    launchCheck();
    float* host = (float*)malloc_check(total_blocks * sizeof(float));
    copy_to_host(host, partial, total_blocks * sizeof(float));
    offset = 0;
    for (int i = 0; i < k; i++) {
        double total = 0.0;
        for (int j = 0; j < blocks[i]; j++) total += host[offset + j];
        sums[i] = total;
        offset += blocks[i];
    }
    free(host);
    free(blocks);
#endif
}

// sum of x^2, in double
static double sum_squares(const floatX* x, size_t n) {
    double s;
    sum_squares_many(&x, &n, 1, &s);
    return s;
}

static float global_norm(const floatX* x, size_t n) { return (float)sqrt(sum_squares(x, n)); }
