/*
 * attention_flash_forward.h: the forward kernel of the tensor-core flash attention (the algorithm is
 * described atop attention_flash.h, the layouts in attention_flash_mma.h, the online softmax in
 * attention_flash_softmax.h): one block of 4 warps per (b, h, tile of 64 queries), each warp 16 query
 * rows, walking the key tiles 0..qt with K and V double-buffered by cp.async. GPU only.
 */
#pragma once

#include "attention_flash_softmax.h"  // the tile arithmetic (and, through it, the mma maps)

#ifndef LLMC_CPU
// grid (ceil(T/64), B*NH), block 128, static shared memory 5 tiles (46080 bytes, under the 48 KiB that
// needs no opt-in)
template <typename Tp>
__global__ void __launch_bounds__(FLASH_THREADS) flash_tc_forward_kernel(Tp* out, float* lse, const Tp* qkv, int T,
                                                                         int C, int NH, float scale_log2) {
    __shared__ __align__(16) Tp Qs[FLASH_TILE_ELEMS];
    __shared__ __align__(16) Tp Ks[2][FLASH_TILE_ELEMS];
    __shared__ __align__(16) Tp Vs[2][FLASH_TILE_ELEMS];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    int ntiles = (T + FLASH_TILE - 1) / FLASH_TILE;
    int qt = ntiles - 1 - blockIdx.x;  // the last query tiles see the most keys: start them first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    size_t stride = 3 * (size_t)C;
    const Tp* base = qkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    int q0 = qt * FLASH_TILE;
    int row_lo = q0 + warp * 16 + g, row_hi = row_lo + 8;  // the two query rows of this lane

    load_tile_async(Qs, base, q0, T, stride);
    load_tile_async(Ks[0], base + C, 0, T, stride);
    load_tile_async(Vs[0], base + 2 * C, 0, T, stride);
    cp_async_commit();

    uint32_t qf[4][4];
    float o[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        cp_async_wait_all();
        __syncthreads();  // tile kt has landed for everyone, and everyone is done with tile kt-1
        if (kt == 0) load_a_frags(qf, Qs, warp * 16);
        if (kt < qt) {  // prefetch tile kt+1 into the buffer tile kt-1 used
            load_tile_async(Ks[(kt + 1) & 1], base + C, (kt + 1) * FLASH_TILE, T, stride);
            load_tile_async(Vs[(kt + 1) & 1], base + 2 * C, (kt + 1) * FLASH_TILE, T, stride);
            cp_async_commit();
        }
        float s[8][4], mx[2];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        mma_a_xt<Tp>(s, qf, Ks[kt & 1]);  // S = Q K^T
        flash_fwd_scores(s, mx, m, lane, q0 + warp * 16, kt * FLASH_TILE, kt == qt, scale_log2);
        mx[0] = quad_max(mx[0]);
        mx[1] = quad_max(mx[1]);
        flash_fwd_online_softmax(s, o, m, l, mx);  // s = P now
        mma_p_x<Tp>(o, s, Vs[kt & 1]);            // O += P V
    }

    l[0] = quad_sum(l[0]);
    l[1] = quad_sum(l[1]);
    store_rows<Tp>(out + (size_t)b * T * C + (size_t)h * FLASH_HS, (size_t)C, o, 1.0f / l[0], 1.0f / l[1], row_lo, T);
    if (c == 0) {
        if (row_lo < T) lse[(size_t)bh * T + row_lo] = flash_lse(m[0], l[0]);
        if (row_hi < T) lse[(size_t)bh * T + row_hi] = flash_lse(m[1], l[1]);
    }
}
#endif  // LLMC_CPU
