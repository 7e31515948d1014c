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
 * took 1.45 ms of an H200's 36 ms step and 1.50 ms of an H100's (Nsight Compute; the floor of the whole
 * scatter is 8 µs). With --fused-kernels a token's positions are cut into chunks of at most 64, a block
 * each, whose warps split the chunk's positions and read 16 bytes of a row per lane; the warps' sums are
 * added in warp order, then a token's chunks in chunk order, so the result is again the same every run
 * (in another order of additions than the plain kernel's). dev/cuda/encoder_backward.cu times the two:
 * on an H100 at B=8, 0.17 ms for the plain kernels, 0.05 ms in chunks (versions 3 and 4, same grouping).
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
static void encoder_backward_cpu(float* __restrict dwte, float* __restrict dwpe, const float* __restrict dout,
                                 const int* __restrict inp, int B, int T, int C, int vocab_start, int vocab_rows) {
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
        if (inp[i] >= vocab_start && inp[i] < vocab_start + vocab_rows)
            keys[n++] = ((long long)(inp[i] - vocab_start) << 32) | i;
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

// --fused-kernels: each token's positions (a grouping of n_unique tokens, `start` as above) cut into
// chunks of at most ENCODER_WTE_CHUNK, in order. Writes to `buf`: chunk_token, chunk_begin, chunk_slot
// (n_chunks each: the chunk's token, its first index into positions, and -1 for a token's only chunk or
// else the row of partial sums it writes), then multi_token (n_multi: the tokens of several chunks) and
// multi_slot (n_multi + 1: their rows of partial sums, multi_slot[m] to multi_slot[m + 1], in chunk
// order). Returns n_chunks; n_multi in *n_multi.
#define ENCODER_WTE_CHUNK 64
static int chunk_positions(int* buf, const int* start, int n_unique, int* n_multi) {
    int n_chunks = 0, multi = 0;
    for (int u = 0; u < n_unique; u++) {
        int count = (start[u + 1] - start[u] + ENCODER_WTE_CHUNK - 1) / ENCODER_WTE_CHUNK;
        n_chunks += count;
        multi += count > 1;
    }
    int *chunk_token = buf, *chunk_begin = buf + n_chunks, *chunk_slot = buf + 2 * n_chunks;
    int *multi_token = buf + 3 * n_chunks, *multi_slot = multi_token + multi;
    int k = 0, m = 0, slot = 0;
    multi_slot[0] = 0;
    for (int u = 0; u < n_unique; u++) {
        int count = (start[u + 1] - start[u] + ENCODER_WTE_CHUNK - 1) / ENCODER_WTE_CHUNK;
        for (int j = 0; j < count; j++, k++) {
            chunk_token[k] = u;
            chunk_begin[k] = start[u] + j * ENCODER_WTE_CHUNK;
            chunk_slot[k] = count > 1 ? slot++ : -1;
        }
        if (count > 1) {
            multi_token[m] = u;
            multi_slot[++m] = slot;
        }
    }
    *n_multi = multi;
    return n_chunks;
}

// The encoder's scratch on the device for B*T = BT positions: the grouping (3 BT + 1 ints), and with
// `fused` the chunks (a chunk per token, and one more per ENCODER_WTE_CHUNK positions: 3 ints each), the
// tokens of several chunks (fewer than BT / ENCODER_WTE_CHUNK: 2 ints each, and one) and their rows of
// partial sums (C floats each: at most 2 per ENCODER_WTE_CHUNK positions, a token of n > CHUNK positions
// having ceil(n / CHUNK) < 2 n / CHUNK chunks). Also the host buffer's size, less the floats.
static size_t encoder_scratch_ints(size_t BT, int fused) {
    size_t ints = 3 * BT + 1, per = BT / ENCODER_WTE_CHUNK + 1;
    return fused ? ints + 3 * (BT + per) + 2 * per + 1 : ints;
}
static size_t encoder_scratch_bytes(size_t BT, int C, int fused) {
    size_t floats = fused ? 2 * (BT / ENCODER_WTE_CHUNK + 1) * (size_t)C : 0;
    return floats * sizeof(float) + encoder_scratch_ints(BT, fused) * sizeof(int);
}
// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// threads per block of the three kernels (one element per thread, or a block striding over a row's C)
#define ENCODER_THREADS 256

__global__ void __launch_bounds__(ENCODER_THREADS) encoder_forward_kernel(
    floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C, int vocab_start,
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
__global__ void __launch_bounds__(ENCODER_THREADS) encoder_backward_wte_kernel(
    floatX* dwte, const floatX* dout, const int* token, const int* start, const int* positions, int C) {
    int u = blockIdx.x;
    floatX* row = dwte + (size_t)token[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int i = start[u]; i < start[u + 1]; i++) sum += floatX_to_float(dout[(size_t)positions[i] * C + c]);
        row[c] = float_to_floatX(floatX_to_float(row[c]) + sum);
    }
}

// --fused-kernels: the same sums, one block per chunk k of at most ENCODER_WTE_CHUNK positions of one
// token (chunk_positions), its positions split between the block's warps (warp w: the chunk's positions
// w, w + ENCODER_WTE_WARPS, ...) and a row read 16 bytes per lane, 32 lanes a tile of TILE channels at a
// time. The warps' sums meet in shared memory and are added in warp order: into the token's row (its only
// chunk) or into the chunk's row of `partial` (C floats), for encoder_backward_wte_combine_kernel. Needs
// C % Pack128::size == 0 and dout 16-byte aligned (the launcher checks).
#define ENCODER_WTE_WARPS 8
typedef struct {  // the grouping and its chunks on the device (group_positions_by_token, chunk_positions)
    const int *token, *start, *positions, *chunk_token, *chunk_begin, *chunk_slot, *multi_token, *multi_slot;
    int n_multi;
} EncoderChunks;
// the views of a grouping of n_unique tokens at `grouping` and of its chunks at `chunks`, as
// group_positions_by_token and chunk_positions lay them out
static EncoderChunks encoder_chunks_view(const int* grouping, int n_unique, const int* chunks, int n_chunks,
                                         int n_multi) {
    EncoderChunks g = {grouping, grouping + n_unique, grouping + 2 * n_unique + 1, chunks, chunks + n_chunks,
                       chunks + 2 * n_chunks, chunks + 3 * n_chunks, chunks + 3 * n_chunks + n_multi, n_multi};
    return g;
}
__global__ void __launch_bounds__(ENCODER_WTE_WARPS * 32) encoder_backward_wte_chunk_kernel(
    floatX* dwte, float* partial, const floatX* dout, EncoderChunks g, int C) {
    constexpr int TILE = 32 * Pack128::size;  // channels per tile (256 in 16-bit builds, 128 in FP32)
    __shared__ float warp_sums[ENCODER_WTE_WARPS][TILE];
    int k = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int u = g.chunk_token[k], begin = g.chunk_begin[k], slot = g.chunk_slot[k];
    int end = min(begin + ENCODER_WTE_CHUNK, g.start[u + 1]);
    floatX* row = dwte + (size_t)g.token[u] * C;
    for (int c0 = 0; c0 < C; c0 += TILE) {
        int c = c0 + lane * Pack128::size;  // this lane's 16 bytes (all inside the row, or all past it)
        float sum[Pack128::size] = {};
        if (c < C) {
#pragma unroll 4
            for (int i = begin + warp; i < end; i += ENCODER_WTE_WARPS) {
                Pack128 d = load128(dout + (size_t)g.positions[i] * C + c);
                for (int e = 0; e < Pack128::size; e++) sum[e] += floatX_to_float(d.v[e]);
            }
        }
        for (int e = 0; e < Pack128::size; e++) warp_sums[warp][lane * Pack128::size + e] = sum[e];
        __syncthreads();
        for (int j = threadIdx.x; j < TILE && c0 + j < C; j += blockDim.x) {
            float s = 0.0f;
            for (int w = 0; w < ENCODER_WTE_WARPS; w++) s += warp_sums[w][j];
            if (slot < 0) row[c0 + j] = float_to_floatX(floatX_to_float(row[c0 + j]) + s);
            else partial[(size_t)slot * C + c0 + j] = s;
        }
        __syncthreads();  // (the next tile overwrites warp_sums)
    }
}

// --fused-kernels: a token of several chunks (blockIdx.y: the m-th), one thread per channel: its chunks'
// sums added in chunk order, then into its row. Launched with at least one row of blocks (so that every
// step launches it), which returns when no token has several chunks.
__global__ void __launch_bounds__(ENCODER_THREADS) encoder_backward_wte_combine_kernel(
    floatX* dwte, const float* partial, EncoderChunks g, int C) {
    int m = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= g.n_multi || c >= C) return;
    float s = 0.0f;
    for (int q = g.multi_slot[m]; q < g.multi_slot[m + 1]; q++) s += partial[(size_t)q * C + c];
    floatX* row = dwte + (size_t)g.token[g.multi_token[m]] * C;
    row[c] = float_to_floatX(floatX_to_float(row[c]) + s);
}

// one thread per (t, c): sum over the batch in order
__global__ void __launch_bounds__(ENCODER_THREADS) encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B,
                                                                               int T, int C) {
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
    encoder_forward_kernel<<<grid_for((size_t)B * T * C, block), block, 0, main_stream>>>(out, inp, wte, wpe, B, T, C,
                                                                                          vocab_start, vocab_rows);
    launchCheck();
#endif
}

// inp: token ids on the device; inp_host: the same ids on the host (the GPU groups positions there, in
// `staging`'s buffer, pinned with `fused`, and `scratch` takes the grouping to the device; the CPU loop needs neither);
// `fused`: the run's --fused-kernels (KernelChoice.fused), which copies the grouping without waiting and
// sums a token's positions in chunks, a block each, warps side by side
static void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp, const int* inp_host, int B,
                             int T, int C, int vocab_start, int vocab_rows, Scratch* scratch, HostStaging* staging,
                             int fused) {
#ifdef LLMC_CPU
    (void)inp_host; (void)scratch; (void)staging; (void)fused;
    encoder_backward_cpu(dwte, dwpe, dout, inp, B, T, C, vocab_start, vocab_rows);
#else
    const int block = ENCODER_THREADS;
    int BT = B * T, n_kept = 0;
    int chunked = fused && C % Pack128::size == 0 && aligned16(dout);  // (the chunk kernel's 16-byte rows)
    // (waits for the previous call's copy from the buffer, if it has not run yet)
    int* host = (int*)host_staging_get(staging, encoder_scratch_ints(BT, chunked) * sizeof(int), fused);
    int n_unique = group_positions_by_token(host, inp_host, BT, vocab_start, vocab_rows, &n_kept);
    int n_grouping = 2 * n_unique + 1 + n_kept, n_chunks = 0, n_multi = 0;
    if (chunked) n_chunks = chunk_positions(host + n_grouping, host + n_unique, n_unique, &n_multi);
    // the device scratch: the chunks' rows of partial sums (floats), then the ints as on the host
    float* partial = (float*)scratch_get(scratch, encoder_scratch_bytes(BT, C, chunked));
    int* dev = (int*)(partial + (chunked ? 2 * (BT / ENCODER_WTE_CHUNK + 1) * (size_t)C : 0));
    size_t bytes = (n_grouping + (chunked ? 3 * (size_t)n_chunks + 2 * n_multi + 1 : 0)) * sizeof(int);
    // --fused-kernels: no wait; the copy reads the pinned `host` when the stream gets to it (after the
    // previous micro-step's kernels that read `dev`: one stream), and the next call waits for it
    host_staging_upload(staging, dev, bytes, fused);
    if (chunked) {
        EncoderChunks g = encoder_chunks_view(dev, n_unique, dev + n_grouping, n_chunks, n_multi);
        if (n_chunks > 0)
            encoder_backward_wte_chunk_kernel<<<n_chunks, ENCODER_WTE_WARPS * 32, 0, main_stream>>>(dwte, partial, dout,
                                                                                                    g, C);
        launchCheck();
        dim3 grid(grid_for(C, block), n_multi > 0 ? n_multi : 1);
        encoder_backward_wte_combine_kernel<<<grid, block, 0, main_stream>>>(dwte, partial, g, C);
    } else if (n_unique > 0) {
        encoder_backward_wte_kernel<<<n_unique, block, 0, main_stream>>>(dwte, dout, dev, dev + n_unique,
                                                                         dev + 2 * n_unique + 1, C);
    }
    launchCheck();
    encoder_backward_wpe_kernel<<<grid_for((size_t)T * C, block), block, 0, main_stream>>>(dwpe, dout, B, T, C);
    launchCheck();
#endif
}
