/*
 * attention_flash_backward.h: the three backward kernels of the tensor-core flash attention (the
 * algorithm is described atop attention_flash.h, the layouts in attention_flash_mma.h, the P and dS
 * arithmetic in attention_flash_softmax.h): a. D = rowsum(dO * O); b. dK, dV per key tile walking the
 * query tiles; c. dQ per query tile walking the key tiles. Deterministic: no atomics, each output element
 * written by exactly one thread once. GPU only.
 */
#pragma once

#include "attention_flash_softmax.h"  // the tile arithmetic (and, through it, the mma maps)

#ifndef LLMC_CPU
// a. D[(b*NH + h)*T + t] = scale (dout[b,t,h,:] . out[b,t,h,:]) in fp32 (times the softmax scale, which the
// kernels below put into dS: flash_bwd_ds_t); one warp per (b, t, h), 2 channels a lane, FLASH_DOT_THREADS /
// 32 rows per block
#define FLASH_DOT_THREADS 256
template <typename Tp>
__global__ void __launch_bounds__(FLASH_DOT_THREADS) flash_tc_backward_dot_kernel(
    float* D, const Tp* dout, const Tp* out, int B, int T, int C, int NH, float scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + t)*NH + h
    int lane = threadIdx.x % 32;
    if (row >= B * T * NH) return;  // the whole warp: row is per warp
    int h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
    size_t off = (size_t)bt * C + (size_t)h * FLASH_HS + 2 * lane;
    float2 d = unpack2<Tp>(*(const uint32_t*)(dout + off)), o = unpack2<Tp>(*(const uint32_t*)(out + off));
    float s = d.x * o.x + d.y * o.y;
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffff, s, k);
    if (lane == 0) D[((size_t)b * NH + h) * T + t] = scale * s;
}

// the backward kernels' dynamic shared memory: 6 tiles + 2 x 2 x 64 floats (opt-in above 48 KiB)
static const int FLASH_TC_BWD_SMEM = 6 * FLASH_TILE_ELEMS * 2 + 4 * FLASH_TILE * (int)sizeof(float);  // 56320 bytes

// lse (times log2 e) and D of rows [row0, row0+64) -> shared, plain loads (0 past T: those P are masked)
__device__ __forceinline__ void load_row_stats(float* lse_s, float* D_s, const float* lse, const float* D,
                                               int row0, int T) {
    int i = threadIdx.x;
    if (i < 64) lse_s[i] = row0 + i < T ? lse[row0 + i] * FLASH_LOG2E : 0.0f;
    else if (i < 128) D_s[i - 64] = row0 + i - 64 < T ? D[row0 + i - 64] : 0.0f;
}

// b. dK, dV. grid (ceil(T/64) key tiles, B*NH), block 128. This warp's K and V fragments (kf, vf) are
// loaded from shared memory again for every query tile instead of living in registers: 32 registers
// fewer, so the kernel fits 168 without spilling and three blocks share an SM instead of two (the
// __launch_bounds__ minimum; make -C dev/cuda report shows both), for 8 more ldmatrix per 128 mma.
template <typename Tp>
__global__ void __launch_bounds__(FLASH_THREADS, 3) flash_tc_backward_dkdv_kernel(
    Tp* dqkv, const Tp* qkv, const Tp* dout, const float* lse, const float* D, int T, int C, int NH, float scale,
    float scale_log2) {
    extern __shared__ __align__(16) unsigned char flash_smem[];
    Tp* Ks = (Tp*)flash_smem;
    Tp* Vs = Ks + FLASH_TILE_ELEMS;
    Tp* Qs = Vs + FLASH_TILE_ELEMS;      // [2] buffers
    Tp* dOs = Qs + 2 * FLASH_TILE_ELEMS;  // [2]
    float* lse_s = (float*)(dOs + 2 * FLASH_TILE_ELEMS);  // [2][64], times log2 e
    float* D_s = lse_s + 2 * FLASH_TILE;                  // [2][64]
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int ntiles = (T + FLASH_TILE - 1) / FLASH_TILE;
    int kt = blockIdx.x;  // key tile 0 sees every query tile: the longest blocks start first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const Tp* base = qkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    const Tp* dbase = dout + (size_t)b * T * C + (size_t)h * FLASH_HS;
    const float* lse_bh = lse + (size_t)bh * T;
    const float* D_bh = D + (size_t)bh * T;
    int k0 = kt * FLASH_TILE;
    int key_lo = k0 + warp * 16 + lane / 4;  // this lane's key rows: key_lo and key_lo + 8

    load_tile_async(Ks, base + C, k0, T, stride);
    load_tile_async(Vs, base + 2 * C, k0, T, stride);
    load_tile_async(Qs, base, k0, T, stride);
    load_tile_async(dOs, dbase, k0, T, (size_t)C);
    cp_async_commit();
    load_row_stats(lse_s, D_s, lse_bh, D_bh, k0, T);

    uint32_t kf[4][4], vf[4][4];
    float dk[8][4], dv[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            dk[nt][e] = 0.0f;
            dv[nt][e] = 0.0f;
        }

    for (int qt = kt; qt < ntiles; qt++) {
        int buf = (qt - kt) & 1, q0 = qt * FLASH_TILE;
        cp_async_wait_all();
        __syncthreads();  // query tile qt has landed, and the other buffer is no longer read
        if (qt + 1 < ntiles) {
            load_tile_async(Qs + (buf ^ 1) * FLASH_TILE_ELEMS, base, q0 + FLASH_TILE, T, stride);
            load_tile_async(dOs + (buf ^ 1) * FLASH_TILE_ELEMS, dbase, q0 + FLASH_TILE, T, (size_t)C);
            cp_async_commit();
            load_row_stats(lse_s + (buf ^ 1) * FLASH_TILE, D_s + (buf ^ 1) * FLASH_TILE, lse_bh, D_bh,
                           q0 + FLASH_TILE, T);
        }
        const Tp* Qb = Qs + buf * FLASH_TILE_ELEMS;
        const Tp* dOb = dOs + buf * FLASH_TILE_ELEMS;

        float st[8][4], dpt[8][4];  // S^T and dP^T: this warp's 16 keys x the tile's 64 queries
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                st[nt][e] = 0.0f;
                dpt[nt][e] = 0.0f;
            }
        load_a_frags(kf, Ks, warp * 16);
        mma_a_xt<Tp>(st, kf, Qb);    // S^T = K Q^T
        load_a_frags(vf, Vs, warp * 16);
        mma_a_xt<Tp>(dpt, vf, dOb);  // dP^T = V dO^T
        bool edge = qt == kt || q0 + FLASH_TILE > T;  // the diagonal or the sequence tail
        flash_bwd_ds_t(st, dpt, lse_s + buf * FLASH_TILE, D_s + buf * FLASH_TILE, lane, k0 + warp * 16, q0, T, edge,
                       scale, scale_log2);
        mma_p_x<Tp>(dv, st, dOb);  // dV += P^T dO
        mma_p_x<Tp>(dk, dpt, Qb);  // dK += scale dS^T Q
    }

    Tp* row0 = dqkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    store_rows<Tp>(row0 + C, stride, dk, 1.0f, 1.0f, key_lo, T);
    store_rows<Tp>(row0 + 2 * C, stride, dv, 1.0f, 1.0f, key_lo, T);
}

// c. dQ. grid (ceil(T/64) query tiles, B*NH), block 128
template <typename Tp>
__global__ void __launch_bounds__(FLASH_THREADS) flash_tc_backward_dq_kernel(
    Tp* dqkv, const Tp* qkv, const Tp* dout, const float* lse, const float* D, int T, int C, int NH, float scale,
    float scale_log2) {
    extern __shared__ __align__(16) unsigned char flash_smem[];
    Tp* Qs = (Tp*)flash_smem;
    Tp* dOs = Qs + FLASH_TILE_ELEMS;
    Tp* Ks = dOs + FLASH_TILE_ELEMS;     // [2] buffers
    Tp* Vs = Ks + 2 * FLASH_TILE_ELEMS;  // [2]
    float* lse_s = (float*)(Vs + 2 * FLASH_TILE_ELEMS);  // [64], times log2 e
    float* D_s = lse_s + FLASH_TILE;                     // [64]
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    int ntiles = (T + FLASH_TILE - 1) / FLASH_TILE;
    int qt = ntiles - 1 - blockIdx.x;  // the last query tile sees every key tile: start it first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const Tp* base = qkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    const Tp* dbase = dout + (size_t)b * T * C + (size_t)h * FLASH_HS;
    int q0 = qt * FLASH_TILE;
    int row_lo = q0 + warp * 16 + g;  // this lane's query rows: row_lo and row_lo + 8

    load_tile_async(Qs, base, q0, T, stride);
    load_tile_async(dOs, dbase, q0, T, (size_t)C);
    load_tile_async(Ks, base + C, 0, T, stride);
    load_tile_async(Vs, base + 2 * C, 0, T, stride);
    cp_async_commit();
    load_row_stats(lse_s, D_s, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T);

    uint32_t qf[4][4], df[4][4];
    float lse_r[2], D_r[2], dq[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        int buf = kt & 1;
        cp_async_wait_all();
        __syncthreads();  // key tile kt has landed, and the other buffer is no longer read
        if (kt == 0) {
            load_a_frags(qf, Qs, warp * 16);
            load_a_frags(df, dOs, warp * 16);
            lse_r[0] = lse_s[warp * 16 + g];
            lse_r[1] = lse_s[warp * 16 + g + 8];
            D_r[0] = D_s[warp * 16 + g];
            D_r[1] = D_s[warp * 16 + g + 8];
        }
        if (kt < qt) {
            load_tile_async(Ks + (buf ^ 1) * FLASH_TILE_ELEMS, base + C, (kt + 1) * FLASH_TILE, T, stride);
            load_tile_async(Vs + (buf ^ 1) * FLASH_TILE_ELEMS, base + 2 * C, (kt + 1) * FLASH_TILE, T, stride);
            cp_async_commit();
        }
        const Tp* Kb = Ks + buf * FLASH_TILE_ELEMS;
        const Tp* Vb = Vs + buf * FLASH_TILE_ELEMS;
        float s[8][4], dp[8][4];  // this warp's 16 queries x the tile's 64 keys
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nt][e] = 0.0f;
                dp[nt][e] = 0.0f;
            }
        mma_a_xt<Tp>(s, qf, Kb);   // S = Q K^T
        mma_a_xt<Tp>(dp, df, Vb);  // dP = dO V^T
        // s = scale dS
        flash_bwd_ds(s, dp, lse_r, D_r, lane, q0 + warp * 16, kt * FLASH_TILE, kt == qt, scale, scale_log2);
        mma_p_x<Tp>(dq, s, Kb);  // dQ += scale dS K
    }
    store_rows<Tp>(dqkv + (size_t)b * T * stride + (size_t)h * FLASH_HS, stride, dq, 1.0f, 1.0f, row_lo, T);
}
#endif  // LLMC_CPU
