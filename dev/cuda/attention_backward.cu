/*
 * attention_backward: causal multi-head self-attention, backward.
 *
 *   inputs  qkv (B,T,3C), dout (B,T,C), and what the forward kept: att (B,NH,T,T) for version 1, or
 *           out (B,T,C) and the logsumexp lse (B,NH,T) of each score row for the flash version
 *   output  dqkv (B,T,3C), overwritten (=)
 *
 * With S = scale * Q K^T (scale = 1/sqrt(HS)), P = softmax(S) row-wise under the causal mask, O = P V:
 *   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D) with D_i = sum_j P_ij dP_ij = dO_i . O_i,
 *   dQ = scale * dS K,   dK = scale * dS^T Q.
 *
 * versions
 *   1  the project's kernel (llmc/attention.h): cuBLAS strided-batched products over the materialized
 *      (B,NH,T,T) att matrix, with a softmax-backward kernel between them. att is the forward's output
 *      (computed on the CPU here and uploaded, outside the timing).
 *   2  flash attention backward, deterministic (no atomics): P is recomputed tile by tile from Q, K and
 *      lse, exp(S - lse), so no T x T matrix is stored. Three kernels:
 *        a. D = rowsum(dO * O) per (b, h, t): one warp per row.
 *        b. dK, dV: one block of 256 threads per (batch, head, tile of 64 keys). K and V tiles stay in
 *           shared memory; the block walks the query tiles at or below the diagonal, loading Q, dO, lse
 *           and D for each, recomputes the 64 x 64 blocks P^T and dP^T (each thread a 4 x 4 register
 *           block: keys ty*4.., queries tx+16c), writes P^T to shared memory and accumulates dV += P^T dO,
 *           then overwrites it with dS^T and accumulates dK += dS^T Q; each thread owns a 4 x 4 block of
 *           dK and dV (keys ty*4.., channels tx*4..) in registers for the whole walk.
 *        c. dQ: one block per (batch, head, tile of 64 queries) walks the key tiles up to the diagonal,
 *           recomputing P and dP the same way and accumulating dQ += dS K.
 *      Splitting dQ from dK/dV costs recomputing S and dP twice (7 tile products instead of 5) but every
 *      output is owned by exactly one thread, so the result is bit-identical run to run, as the
 *      project requires of all its kernels. Shared memory: five 64 x 68 float tiles + lse and D, 85.5 KiB
 *      per block (opt-in above 48 KiB). Needs HS = 64 (every GPT-2 size); any T.
 *
 *   3  flash attention backward on tensor cores, bf16 (llmc/attention_flash.h, the trainer's
 *      `--attention flash`): the same three kernels as version 2 (D, then dK/dV per key tile walking the
 *      query tiles, then dQ per query tile walking the key tiles: deterministic, no atomics), with every
 *      tile product on mma.sync m16n8k16 (bf16 operands, fp32 accumulation) fed by ldmatrix (.trans for
 *      the products whose B operand is a tile taken as is: P^T dO, dS^T Q, dS K). 4 warps of 16 rows;
 *      the walked tiles are double-buffered by cp.async. Layouts: see atop llmc/attention_flash_mma.h.
 *      Checked also for determinism: a second run must give the same bits.
 *   4  the same with fp16 operands.
 *
 * CPU reference: attention_backward_cpu (llmc/attention.h), fed by attention_forward_cpu. The flash
 * version gets out from attention_forward_cpu and lse recomputed on the host (attention_lse_cpu), so
 * this file tests the backward on its own. Checked at odd shapes (attention_common.cuh: T = 37, 64, 100,
 * 129, 200, B 1..3, NH 1..12) and at GPT-2 124M shapes. Inputs are rounded to bf16 first (so out, lse
 * and every version see the same numbers). Tolerances on dqkv:
 *   versions 1-2: 1e-4 abs + 1e-3 rel (fp32 throughout).
 *   version 3 (bf16): 3e-2 abs + 3e-2 rel. The 16-bit versions take out rounded to bf16/fp16 (as the
 *      trainer stores it), and round P, dS to bf16 (relative 2^-9 each) before the products dV = P^T dO,
 *      dK = dS^T Q, dQ = dS K, whose sums run over up to T terms; D = rowsum(dO * O) sees out's rounding
 *      (2^-9 relative of |O|, times |dO| ~ 1..4 summed over 64 channels in random directions). Elements
 *      of dqkv are O(1) for N(0,1) inputs, so bf16 leaves about 1e-2 absolute; 3e-2 leaves room for
 *      the long sums of the first keys (sum_t P_tu ~ ln T). Layout or mask bugs give errors of order 1.
 *   version 4 (fp16, 4x finer rounding): 1e-2 abs + 1e-2 rel.
 *
 * Benchmark: TFLOP/s counting 5 causal T x T x HS products, 5 * B * NH * T^2 * HS (the usual convention,
 * 2.5 x the forward), for both versions.
 */
#include "attention_common.cuh"

#define FA_HS 64
#define FA_TILE 64             // queries or keys per tile
#define FA_LD (FA_HS + 4)      // padded shared-memory row, floats

// ----------------------------------------------------------------------------------------------------
// flash backward kernels

// a. D[(b*NH + h)*T + t] = dout[b,t,h,:] . out[b,t,h,:]; one warp per (b, t, h), 8 warps per block
__global__ void flash_backward_dot_kernel(float* D, const float* dout, const float* out, int B, int T, int C, int NH) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + t)*NH + h
    int lane = threadIdx.x % 32;
    if (row >= B * T * NH) return;
    int h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
    const float* d = dout + (size_t)bt * C + (size_t)h * FA_HS;
    const float* o = out + (size_t)bt * C + (size_t)h * FA_HS;
    float s = 0.0f;
    for (int i = lane; i < FA_HS; i += 32) s += d[i] * o[i];
    s = warp_sum(s);
    if (lane == 0) D[((size_t)b * NH + h) * T + t] = s;
}

// rows [row0, row0 + 64) of one head's 64 channels (row stride `stride`) -> tile [64][FA_LD]; rows
// past T are zero. All 256 threads take part.
__device__ static inline void load_tile_64(float* tile, const float* src, int row0, int T, size_t stride) {
    for (int idx = threadIdx.x; idx < 64 * (FA_HS / 4); idx += blockDim.x) {
        int r = idx / (FA_HS / 4), d = 4 * (idx % (FA_HS / 4));
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < T) x = *(const float4*)(src + (size_t)(row0 + r) * stride + d);
        *(float4*)(tile + r * FA_LD + d) = x;
    }
}

// lse and D of rows [row0, row0 + 64) -> shared (0 past T, where P is forced to 0 anyway)
__device__ static inline void load_rows_stats(float* lse_s, float* D_s, const float* lse, const float* D, int row0, int T) {
    int i = threadIdx.x;
    if (i < 64) lse_s[i] = row0 + i < T ? lse[row0 + i] : 0.0f;
    else if (i < 128) D_s[i - 64] = row0 + i - 64 < T ? D[row0 + i - 64] : 0.0f;
}

__device__ static inline float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// acc[a][0..3] += sum_j A[(ty*4 + a)*FA_LD + j] * Bm[j*FA_LD + tx*4 + 0..3], j = 0..63
// (a 64 x 64 by 64 x 64 product from shared memory, each thread its 4 x 4 block of the result)
__device__ static inline void tile_matmul_acc(float acc[4][4], const float* A, const float* Bm, int ty, int tx) {
#pragma unroll 4
    for (int j = 0; j < 64; j += 4) {
        float4 af[4], bf[4];
#pragma unroll
        for (int a = 0; a < 4; a++) af[a] = *(const float4*)(A + (ty * 4 + a) * FA_LD + j);
#pragma unroll
        for (int c = 0; c < 4; c++) bf[c] = *(const float4*)(Bm + (j + c) * FA_LD + tx * 4);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            acc[a][0] += af[a].x * bf[0].x + af[a].y * bf[1].x + af[a].z * bf[2].x + af[a].w * bf[3].x;
            acc[a][1] += af[a].x * bf[0].y + af[a].y * bf[1].y + af[a].z * bf[2].y + af[a].w * bf[3].y;
            acc[a][2] += af[a].x * bf[0].z + af[a].y * bf[1].z + af[a].z * bf[2].z + af[a].w * bf[3].z;
            acc[a][3] += af[a].x * bf[0].w + af[a].y * bf[1].w + af[a].z * bf[2].w + af[a].w * bf[3].w;
        }
    }
}

// x[a][c] = X[(ty*4 + a)] . Y[(tx + 16c)] and y[a][c] = Z[(ty*4 + a)] . W[(tx + 16c)] over the 64 channels:
// two 64 x 64 "row times row" products at once (S and dP share their loop)
__device__ static inline void tile_rowdot2(float x[4][4], float y[4][4], const float* X, const float* Y, const float* Z,
                                           const float* W, int ty, int tx) {
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) x[a][c] = 0.0f, y[a][c] = 0.0f;
#pragma unroll 2
    for (int d = 0; d < FA_HS; d += 4) {
        float4 xf[4], yf[4], zf[4], wf[4];
#pragma unroll
        for (int a = 0; a < 4; a++) {
            xf[a] = *(const float4*)(X + (ty * 4 + a) * FA_LD + d);
            zf[a] = *(const float4*)(Z + (ty * 4 + a) * FA_LD + d);
        }
#pragma unroll
        for (int c = 0; c < 4; c++) {
            yf[c] = *(const float4*)(Y + (tx + 16 * c) * FA_LD + d);
            wf[c] = *(const float4*)(W + (tx + 16 * c) * FA_LD + d);
        }
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                x[a][c] += dot4(xf[a], yf[c]);
                y[a][c] += dot4(zf[a], wf[c]);
            }
    }
}

static const size_t FLASH_BWD_SMEM = (5 * 64 * FA_LD + 2 * 64) * sizeof(float);  // 87552 bytes

// b. dK, dV. grid (T/64 key tiles, B*NH), block 256
__global__ void __launch_bounds__(256, 2) flash_backward_dkdv_kernel(float* dqkv, const float* qkv, const float* dout,
                                                                  const float* lse, const float* D, int B, int T, int C,
                                                                  int NH, float scale) {
    extern __shared__ float4 smem4[];
    float* Ks = (float*)smem4;
    float* Vs = Ks + 64 * FA_LD;
    float* Qs = Vs + 64 * FA_LD;
    float* dOs = Qs + 64 * FA_LD;
    float* Ps = dOs + 64 * FA_LD;  // P^T then dS^T of the current pair of tiles, [key][query]
    float* lse_s = Ps + 64 * FA_LD;
    float* D_s = lse_s + 64;
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int ntiles = (T + FA_TILE - 1) / FA_TILE;
    int kt = blockIdx.x;  // key tile 0 sees every query tile: the longest blocks start first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FA_HS;
    const float* dbase = dout + (size_t)b * T * C + (size_t)h * FA_HS;
    int k0 = kt * FA_TILE;

    load_tile_64(Ks, base + C, k0, T, stride);
    load_tile_64(Vs, base + 2 * C, k0, T, stride);
    float dk[4][4], dv[4][4];  // keys ty*4 + a, channels tx*4 + e
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[a][e] = 0.0f, dv[a][e] = 0.0f;

    for (int qt = kt; qt < ntiles; qt++) {
        int q0 = qt * FA_TILE;
        __syncthreads();  // the previous query tile is no longer read
        load_tile_64(Qs, base, q0, T, stride);
        load_tile_64(dOs, dbase, q0, T, (size_t)C);
        load_rows_stats(lse_s, D_s, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T);
        __syncthreads();

        // s = K_j . Q_i (-> P^T), g = V_j . dO_i (-> dP^T), keys j = ty*4 + a, queries i = tx + 16c
        float s[4][4], g[4][4];
        tile_rowdot2(s, g, Ks, Qs, Vs, dOs, ty, tx);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int u = k0 + ty * 4 + a;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int i = tx + 16 * c, t = q0 + i;
                float p = (t < T && u <= t) ? expf(scale * s[a][c] - lse_s[i]) : 0.0f;
                s[a][c] = p;
                g[a][c] = p * (g[a][c] - D_s[i]);  // dS^T
                Ps[(ty * 4 + a) * FA_LD + i] = p;
            }
        }
        __syncthreads();
        tile_matmul_acc(dv, Ps, dOs, ty, tx);  // dV += P^T dO
        __syncthreads();
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) Ps[(ty * 4 + a) * FA_LD + tx + 16 * c] = g[a][c];
        __syncthreads();
        tile_matmul_acc(dk, Ps, Qs, ty, tx);  // dK += dS^T Q (times scale at the end)
    }

#pragma unroll
    for (int a = 0; a < 4; a++) {
        int u = k0 + ty * 4 + a;
        if (u < T) {
            float* row = dqkv + ((size_t)b * T + u) * stride + (size_t)h * FA_HS + tx * 4;
            *(float4*)(row + C) = make_float4(dk[a][0] * scale, dk[a][1] * scale, dk[a][2] * scale, dk[a][3] * scale);
            *(float4*)(row + 2 * C) = make_float4(dv[a][0], dv[a][1], dv[a][2], dv[a][3]);
        }
    }
}

// c. dQ. grid (T/64 query tiles, B*NH), block 256
__global__ void __launch_bounds__(256) flash_backward_dq_kernel(float* dqkv, const float* qkv, const float* dout,
                                                                const float* lse, const float* D, int B, int T, int C,
                                                                int NH, float scale) {
    extern __shared__ float4 smem4[];
    float* Qs = (float*)smem4;
    float* dOs = Qs + 64 * FA_LD;
    float* Ks = dOs + 64 * FA_LD;
    float* Vs = Ks + 64 * FA_LD;
    float* dSs = Vs + 64 * FA_LD;  // dS of the current pair of tiles, [query][key]
    float* lse_s = dSs + 64 * FA_LD;
    float* D_s = lse_s + 64;
    int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    int ntiles = (T + FA_TILE - 1) / FA_TILE;
    int qt = ntiles - 1 - blockIdx.x;  // the last query tile sees every key tile: start it first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const float* base = qkv + (size_t)b * T * stride + (size_t)h * FA_HS;
    const float* dbase = dout + (size_t)b * T * C + (size_t)h * FA_HS;
    int q0 = qt * FA_TILE;

    load_tile_64(Qs, base, q0, T, stride);
    load_tile_64(dOs, dbase, q0, T, (size_t)C);
    load_rows_stats(lse_s, D_s, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T);
    float dq[4][4];  // queries ty*4 + a, channels tx*4 + e
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int e = 0; e < 4; e++) dq[a][e] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * FA_TILE;
        __syncthreads();  // the previous key tile and dS are no longer read
        load_tile_64(Ks, base + C, k0, T, stride);
        load_tile_64(Vs, base + 2 * C, k0, T, stride);
        __syncthreads();

        // s = Q_i . K_j, g = dO_i . V_j, queries i = ty*4 + a, keys j = tx + 16c
        float s[4][4], g[4][4];
        tile_rowdot2(s, g, Qs, Ks, dOs, Vs, ty, tx);
#pragma unroll
        for (int a = 0; a < 4; a++) {
            int i = ty * 4 + a, t = q0 + i;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int u = k0 + tx + 16 * c;
                float p = (t < T && u <= t) ? expf(scale * s[a][c] - lse_s[i]) : 0.0f;
                dSs[i * FA_LD + tx + 16 * c] = p * (g[a][c] - D_s[i]);
            }
        }
        __syncthreads();
        tile_matmul_acc(dq, dSs, Ks, ty, tx);  // dQ += dS K
    }

#pragma unroll
    for (int a = 0; a < 4; a++) {
        int t = q0 + ty * 4 + a;
        if (t < T) {
            float* row = dqkv + ((size_t)b * T + t) * stride + (size_t)h * FA_HS + tx * 4;
            *(float4*)row = make_float4(dq[a][0] * scale, dq[a][1] * scale, dq[a][2] * scale, dq[a][3] * scale);
        }
    }
}

// D: scratch of B*NH*T floats
static void flash_attention_backward(float* dqkv, float* D, const float* dout, const float* qkv, const float* out,
                                     const float* lse, int B, int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)(C / NH));
    int rows = B * T * NH;
    flash_backward_dot_kernel<<<ceil_div(rows, 8), 256, 0, main_stream>>>(D, dout, out, B, T, C, NH);
    cudaCheck(cudaGetLastError());
    dim3 grid(ceil_div(T, FA_TILE), B * NH);
    flash_backward_dkdv_kernel<<<grid, 256, FLASH_BWD_SMEM, main_stream>>>(dqkv, qkv, dout, lse, D, B, T, C, NH, scale);
    cudaCheck(cudaGetLastError());
    flash_backward_dq_kernel<<<grid, 256, FLASH_BWD_SMEM, main_stream>>>(dqkv, qkv, dout, lse, D, B, T, C, NH, scale);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------------------------------

static const int NV = 4;
static const char* version_names[NV + 1] = {"", "cuBLAS over stored att (llmc)", "flash, recompute from lse",
                                            "flash, tensor cores (mma.sync bf16)", "flash, tensor cores (mma.sync fp16)"};

// versions 3 and 4: 16-bit copies of the inputs, one run of the tensor-core backward into d_dqkv (floats)
template <typename Tp>
static void run_tc_backward(float* d_dqkv, float* d_D, Tp* qkv16, Tp* dout16, Tp* out16, Tp* dqkv16, const float* d_lse,
                            int B, int T, int C, int NH) {
    size_t n_qkv = (size_t)B * T * 3 * C;
    cudaCheck(cudaMemset(dqkv16, 0xff, n_qkv * sizeof(Tp)));  // NaN: unwritten outputs fail the check
    flash_tc_attention_backward(dqkv16, d_D, dout16, qkv16, out16, d_lse, B, T, C, NH, main_stream);
    from_16bit(d_dqkv, dqkv16, n_qkv);
}

// fp16 as the trainer runs it, under a loss scale: backward gets dout times the scale S. The one operand
// at risk is dS = P (dP - D), which the kernels round to fp16 for dK = dS^T Q and dQ = dS K: it is large
// where dP = dO V^T is (large values) while dQ and dK stay small (small queries and keys), so this check
// takes Q and K times 1/4 and V times 16 (fp16-exact factors). S is the largest power of two that keeps
// dout and the reference dqkv 4x inside fp16's range (65504), so every value the kernels store fits, and
// every operand they round on the way must fit too. Compared with S times the reference at the unscaled
// tolerance, relative, and S times it absolute.
static void check_fp16_loss_scaled(const float* qkv_in, const float* dout_in, int B, int T, int C, int NH, double tol) {
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    float* qkv = host_copy(qkv_in, n_qkv);
    for (size_t i = 0; i < n_qkv; i++) qkv[i] *= i % (3 * C) < (size_t)2 * C ? 0.25f : 16.0f;
    float *out = (float*)malloc_check(n_out * sizeof(float)), *att = (float*)malloc_check((size_t)B * NH * T * T * sizeof(float));
    float *lse = (float*)malloc_check(n_lse * sizeof(float)), *ref = (float*)malloc_check(n_qkv * sizeof(float));
    attention_forward_cpu(out, att, qkv, B, T, C, NH);
    attention_lse_cpu(lse, qkv, B, T, C, NH);
    attention_backward_cpu(ref, dout_in, qkv, att, B, T, C, NH);
    float amax = 0.0f;
    for (size_t i = 0; i < n_out; i++) amax = fmaxf(amax, fabsf(dout_in[i]));
    for (size_t i = 0; i < n_qkv; i++) amax = fmaxf(amax, fabsf(ref[i]));
    float S = 1.0f;
    while (2.0f * S * amax <= 65504.0f / 4) S *= 2.0f;
    float* dout = host_copy(dout_in, n_out);
    for (size_t i = 0; i < n_out; i++) dout[i] *= S;
    for (size_t i = 0; i < n_qkv; i++) ref[i] *= S;
    __half *qkv16 = dev_alloc<__half>(n_qkv), *dout16 = dev_alloc<__half>(n_out), *out16 = dev_alloc<__half>(n_out);
    __half* dqkv16 = dev_alloc<__half>(n_qkv);
    float *d_qkv = dev_upload(qkv, n_qkv), *d_dout = dev_upload(dout, n_out), *d_out = dev_upload(out, n_out);
    float *d_lse = dev_upload(lse, n_lse), *d_D = dev_alloc<float>(n_lse), *d_dqkv = dev_alloc<float>(n_qkv);
    to_16bit(qkv16, d_qkv, n_qkv);
    to_16bit(dout16, d_dout, n_out);
    to_16bit(out16, d_out, n_out);
    run_tc_backward(d_dqkv, d_D, qkv16, dout16, out16, dqkv16, d_lse, B, T, C, NH);
    char what[64];
    snprintf(what, sizeof(what), "dqkv, loss scale %.0f", S);
    check_close(what, d_dqkv, ref, n_qkv, tol * S, tol);
    float* dev_ptrs[] = {d_qkv, d_dout, d_out, d_lse, d_D, d_dqkv};
    for (float* p : dev_ptrs) cudaCheck(cudaFree(p));
    __half* dev16[] = {qkv16, dout16, out16, dqkv16};
    for (__half* p : dev16) cudaCheck(cudaFree(p));
    free(qkv), free(out), free(att), free(lse), free(ref), free(dout);
}

template <typename Tp>
static void check_tc_version(int v, float* d_dqkv, const float* d_qkv, const float* d_dout, const float* d_out_f,
                             const float* dqkv_ref, const float* lse, int B, int T, int C, int NH, bool bench) {
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    Tp *qkv16 = dev_alloc<Tp>(n_qkv), *dout16 = dev_alloc<Tp>(n_out), *out16 = dev_alloc<Tp>(n_out), *dqkv16 = dev_alloc<Tp>(n_qkv);
    to_16bit(qkv16, d_qkv, n_qkv);
    to_16bit(dout16, d_dout, n_out);
    to_16bit(out16, d_out_f, n_out);
    float *d_lse = dev_upload(lse, n_lse), *d_D = dev_alloc<float>(n_lse);
    run_tc_backward(d_dqkv, d_D, qkv16, dout16, out16, dqkv16, d_lse, B, T, C, NH);
    double tol = v == 3 ? 3e-2 : 1e-2;  // justified atop this file
    check_close("dqkv", d_dqkv, dqkv_ref, n_qkv, tol, tol);
    // determinism: a second run must reproduce the first bit for bit
    float* first = (float*)malloc_check(n_qkv * sizeof(float));
    dev_download(first, d_dqkv, n_qkv);
    run_tc_backward(d_dqkv, d_D, qkv16, dout16, out16, dqkv16, d_lse, B, T, C, NH);
    check_close("rerun", d_dqkv, first, n_qkv, 0.0, 0.0);
    free(first);
    if (bench) {
        double flops = 5.0 * B * NH * (double)T * T * (C / NH);
        float ms = benchmark_ms([&] { flash_tc_attention_backward(dqkv16, d_D, dout16, qkv16, out16, d_lse, B, T, C, NH, main_stream); }, 20, 2);
        print_flops("attention_backward", ms, flops);
    }
    cudaCheck(cudaFree(qkv16));
    cudaCheck(cudaFree(dout16));
    cudaCheck(cudaFree(out16));
    cudaCheck(cudaFree(dqkv16));
    cudaCheck(cudaFree(d_lse));
    cudaCheck(cudaFree(d_D));
}

static void run_shape(int selected, int B, int T, int C, int NH, bool bench) {
    int hs = C / NH;
    printf("shape B=%d T=%d C=%d NH=%d (HS=%d)%s\n", B, T, C, NH, hs, bench ? "" : ": check only");
    if (hs != FA_HS || C % NH != 0) fatal("these kernels need HS = %d", FA_HS);
    size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_att = (size_t)B * NH * T * T, n_lse = (size_t)B * NH * T;
    float* qkv = make_random_normal(n_qkv, 11, 1.0f);
    float* dout = make_random_normal(n_out, 12, 1.0f);
    round_to_bf16(qkv, n_qkv);
    round_to_bf16(dout, n_out);
    float* out = (float*)malloc_check(n_out * sizeof(float));
    float* att = (float*)malloc_check(n_att * sizeof(float));
    float* lse = (float*)malloc_check(n_lse * sizeof(float));
    float* dqkv_ref = (float*)malloc_check(n_qkv * sizeof(float));
    double t0 = wall_seconds();
    attention_forward_cpu(out, att, qkv, B, T, C, NH);
    attention_lse_cpu(lse, qkv, B, T, C, NH);
    attention_backward_cpu(dqkv_ref, dout, qkv, att, B, T, C, NH);
    printf("  CPU reference: %.1f s\n", wall_seconds() - t0);

    float *d_qkv = dev_upload(qkv, n_qkv), *d_dout = dev_upload(dout, n_out);
    float* d_dqkv = dev_alloc<float>(n_qkv);
    double flops = 5.0 * B * NH * (double)T * T * hs;
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        cudaCheck(cudaMemset(d_dqkv, 0xff, n_qkv * sizeof(float)));  // NaN: unwritten outputs fail the check
        if (v == 1) {
            float* d_att = dev_upload(att, n_att);
            Scratch scratch = {NULL, 0};  // the launcher's q, k, v, ... (the trainer's model owns one)
            attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH, &scratch);
            cudaCheck(cudaGetLastError());
            check_close("dqkv", d_dqkv, dqkv_ref, n_qkv, 1e-4, 1e-3);
            if (bench) {
                float ms = benchmark_ms([&] { attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH, &scratch); }, 20, 2);
                print_flops("attention_backward", ms, flops);
            }
            cudaCheck(cudaFree(d_att));
            scratch_free(&scratch);
        } else if (v >= 3) {
            float* d_out_f = dev_upload(out, n_out);
            if (v == 3) check_tc_version<__nv_bfloat16>(v, d_dqkv, d_qkv, d_dout, d_out_f, dqkv_ref, lse, B, T, C, NH, bench);
            else {
                check_tc_version<__half>(v, d_dqkv, d_qkv, d_dout, d_out_f, dqkv_ref, lse, B, T, C, NH, bench);
                check_fp16_loss_scaled(qkv, dout, B, T, C, NH, 1e-2);  // version 4's tolerance (atop this file)
            }
            cudaCheck(cudaFree(d_out_f));
        } else {
            float *d_out = dev_upload(out, n_out), *d_lse = dev_upload(lse, n_lse), *d_D = dev_alloc<float>(n_lse);
            flash_attention_backward(d_dqkv, d_D, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
            check_close("dqkv", d_dqkv, dqkv_ref, n_qkv, 1e-4, 1e-3);
            if (bench) {
                float ms = benchmark_ms([&] { flash_attention_backward(d_dqkv, d_D, d_dout, d_qkv, d_out, d_lse, B, T, C, NH); }, 20, 2);
                print_flops("attention_backward", ms, flops);
            }
            cudaCheck(cudaFree(d_out));
            cudaCheck(cudaFree(d_lse));
            cudaCheck(cudaFree(d_D));
        }
    }
    cudaCheck(cudaFree(d_qkv));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dqkv));
    free(qkv), free(dout), free(out), free(att), free(lse), free(dqkv_ref);
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    printf("attention_backward\n");
    bench_init();
    cudaCheck(cudaFuncSetAttribute(flash_backward_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FLASH_BWD_SMEM));
    cudaCheck(cudaFuncSetAttribute(flash_backward_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)FLASH_BWD_SMEM));
    for (const AttentionShape& s : odd_shapes) run_shape(selected, s.B, s.T, 64 * s.NH, s.NH, false);
    if (!EMULATED)
    run_shape(selected, 8, 1024, 768, 12, true);  // GPT-2 124M
    return finish();
}
