/*
 * encoder.h: token + position embedding.
 *
 *   forward:  out[b,t,:] = wte[inp[b,t], :] + wpe[t, :]
 *   backward: dwte[inp[b,t], :] += dout[b,t,:];  dwpe[t, :] += dout[b,t,:]
 *
 * The backward is a scatter-add: many positions may hold the same token. Both targets keep it
 * deterministic (bit-identical runs, which checkpoint resume relies on): the CPU version gives each
 * thread whole columns (channels), so sums run in a fixed order; the GPU version groups the positions by
 * token on the host (the token ids are there anyway), then one block per distinct token sums its
 * positions in order. dwpe is a per-(t, c) loop over b.
 *
 * Text is skewed: at GPT-2 124M, B=16, T=1024 on the bundled data the commonest token fills 3,000 to 4,700
 * of the 16,384 positions, and its block, one thread per channel adding those rows one after the other,
 * took 1.45 ms of an H200's 36 ms step (Nsight Compute; the floor of the whole scatter is 8 µs).
 * dev/cuda/encoder_backward.cu's version 4 (chunks of at most 64 positions, a block each) is the
 * candidate, checked on the emulation and to be timed on a GPU before it replaces this kernel.
 *
 * With tensor parallelism (vocab-parallel embedding) a rank holds rows [vocab_start, vocab_start +
 * vocab_rows) of wte only: ids outside contribute zero in forward and get no gradient in backward, and
 * wpe may be NULL in forward (added by one rank only). Without TP: vocab_start 0, vocab_rows Vp.
 */
#pragma once

#include "device.h"  // floatX, Scratch, HostStaging, launches

// ----------------------------------------------------------------------------------------------------
// CPU reference

// out (B,T,C), inp (B,T) token ids, wte (vocab_rows,C), wpe (maxT,C) or NULL
static void encoder_forward_cpu(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C,
                                int vocab_start, int vocab_rows) {
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        int row = inp[bt] - vocab_start;
        float* o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            float w = row >= 0 && row < vocab_rows ? wte[(size_t)row * C + c] : 0.0f;
            o[c] = wpe ? w + wpe[(size_t)(bt % T) * C + c] : w;
        }
    }
}

// Each thread owns blocks of ENCODER_CPU_COLUMNS channels of dwte and dwpe (no races; static schedule),
// and streams through the positions in order, adding contiguous pieces of rows (so each sum has the
// fixed order of the positions, and the inner loop vectorizes).
#define ENCODER_CPU_COLUMNS 32
static void encoder_backward_cpu(float* __restrict dwte, float* __restrict dwpe, const float* __restrict dout, const int* __restrict inp,
                                 int B, int T, int C, int vocab_start, int vocab_rows) {
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += ENCODER_CPU_COLUMNS) {
        int w = C - c0 < ENCODER_CPU_COLUMNS ? C - c0 : ENCODER_CPU_COLUMNS;
        for (int bt = 0; bt < B * T; bt++) {
            const float* d = dout + (size_t)bt * C + c0;
            int row = inp[bt] - vocab_start;
            float* dp = dwpe + (size_t)(bt % T) * C + c0;
#pragma omp simd
            for (int j = 0; j < w; j++) dp[j] += d[j];
            if (row < 0 || row >= vocab_rows) continue;
            float* dt = dwte + (size_t)row * C + c0;
#pragma omp simd
            for (int j = 0; j < w; j++) dt[j] += d[j];
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// host side of the GPU backward (plain C++, so the CPU target's tests cover it too)

// host side: group positions 0..BT-1 by token id (stable, so each group is in increasing position),
// keeping only ids in [vocab_start, vocab_start + vocab_rows), stored as rows relative to vocab_start;
// buf holds [row (n_unique) | start (n_unique + 1) | positions (n)]; returns n_unique, and n in *n_kept
static int group_positions_by_token(int* buf, const int* inp, int BT, int vocab_start, int vocab_rows, int* n_kept) {
    // sorting (token << 32 | position) keys groups by token with positions ascending inside a group
    long long* keys = (long long*)malloc_check(BT * sizeof(long long));
    int n = 0;
    for (int i = 0; i < BT; i++)
        if (inp[i] >= vocab_start && inp[i] < vocab_start + vocab_rows) keys[n++] = ((long long)(inp[i] - vocab_start) << 32) | i;
    *n_kept = n;
    BT = n;
    qsort(keys, BT, sizeof(long long), [](const void* a, const void* b) {
        long long x = *(const long long*)a, y = *(const long long*)b;
        return x < y ? -1 : x > y;
    });
    int n_unique = 0;
    for (int i = 0; i < BT; i++)
        if (i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32)) n_unique++;
    int *token = buf, *start = buf + n_unique, *positions = buf + 2 * n_unique + 1;
    int u = -1;
    for (int i = 0; i < BT; i++) {
        if (i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32)) {
            u++;
            token[u] = (int)(keys[i] >> 32);
            start[u] = i;
        }
        positions[i] = (int)(keys[i] & 0xffffffff);
    }
    start[n_unique] = BT;
    free(keys);
    return n_unique;
}
// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// threads per block of the three kernels (one element per thread, or a block striding over a row's C)
#define ENCODER_THREADS 256

__global__ void __launch_bounds__(ENCODER_THREADS) encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte,
                                                                          const floatX* wpe, int B, int T, int C, int vocab_start,
                                                                          int vocab_rows) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    int c = idx % C;
    int bt = idx / C;
    int t = bt % T;
    int row = inp[bt] - vocab_start;
    float w = row >= 0 && row < vocab_rows ? floatX_to_float(wte[(size_t)row * C + c]) : 0.0f;
    out[idx] = float_to_floatX(wpe ? w + floatX_to_float(wpe[(size_t)t * C + c]) : w);
}

// one block per distinct token u: dwte[token[u]] += dout rows positions[start[u] .. start[u+1]), in order
__global__ void __launch_bounds__(ENCODER_THREADS) encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* token,
                                                                               const int* start, const int* positions, int C) {
    int u = blockIdx.x;
    floatX* row = dwte + (size_t)token[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int i = start[u]; i < start[u + 1]; i++) sum += floatX_to_float(dout[(size_t)positions[i] * C + c]);
        row[c] = float_to_floatX(floatX_to_float(row[c]) + sum);
    }
}

// one thread per (t, c): sum over the batch in order
__global__ void __launch_bounds__(ENCODER_THREADS) encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += floatX_to_float(dout[(size_t)b * T * C + idx]);
    dwpe[idx] = float_to_floatX(floatX_to_float(dwpe[idx]) + sum);
}
#endif

// ----------------------------------------------------------------------------------------------------
// launchers: the one signature the model calls on both targets

static void encoder_forward(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                            int vocab_start, int vocab_rows) {
#ifdef LLMC_CPU
    encoder_forward_cpu(out, inp, wte, wpe, B, T, C, vocab_start, vocab_rows);
#else
    const int block = ENCODER_THREADS;
    encoder_forward_kernel<<<grid_for((size_t)B * T * C, block), block, 0, main_stream>>>(out, inp, wte, wpe, B, T, C, vocab_start, vocab_rows);
    launchCheck();
#endif
}

// inp: token ids on the device; inp_host: the same ids on the host (the GPU groups positions there, in
// `staging`'s buffer, pinned with `fused`, and `scratch` takes the grouping to the device; the CPU loop needs neither);
// `fused`: the run's --fused-kernels (KernelChoice.fused), which copies the grouping without waiting
static void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp, const int* inp_host, int B,
                             int T, int C, int vocab_start, int vocab_rows, Scratch* scratch, HostStaging* staging, int fused) {
#ifdef LLMC_CPU
    (void)inp_host, (void)scratch, (void)staging, (void)fused;
    encoder_backward_cpu(dwte, dwpe, dout, inp, B, T, C, vocab_start, vocab_rows);
#else
    const int block = ENCODER_THREADS;
    int BT = B * T, n_kept = 0;
    // (waits for the previous call's copy from the buffer, if it has not run yet)
    int* host = (int*)host_staging_get(staging, (3 * (size_t)BT + 1) * sizeof(int), fused);
    int n_unique = group_positions_by_token(host, inp_host, BT, vocab_start, vocab_rows, &n_kept);
    int* dev = (int*)scratch_get(scratch, (3 * (size_t)BT + 1) * sizeof(int));
    size_t bytes = (2 * (size_t)n_unique + 1 + n_kept) * sizeof(int);
    // --fused-kernels: no wait; the copy reads the pinned `host` when the stream gets to it (after the
    // previous micro-step's kernels that read `dev`: one stream), and the next call waits for it
    host_staging_upload(staging, dev, bytes, fused);
    if (n_unique > 0)
        encoder_backward_wte_kernel<<<n_unique, block, 0, main_stream>>>(dwte, dout, dev, dev + n_unique, dev + 2 * n_unique + 1, C);
    launchCheck();
    encoder_backward_wpe_kernel<<<grid_for((size_t)T * C, block), block, 0, main_stream>>>(dwpe, dout, B, T, C);
    launchCheck();
#endif
}
