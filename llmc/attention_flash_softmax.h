/*
 * attention_flash_softmax.h: the element-wise arithmetic of the flash attention kernels on one warp's
 * 16 x 64 fp32 accumulator tile (layout: attention_flash_mma.h), host and device alike: the causal mask,
 * the online softmax of the forward, the logsumexp, and the backward's P and dS.
 *
 * The kernels call these between their tile products; dev/cuda/attention_flash_emulate.cpp calls the same
 * functions lane by lane on the host, with ldmatrix and mma emulated, and compares the whole forward and
 * backward with a float64 reference, so the masks at tile boundaries, T not a multiple of 64, the -inf
 * handling, the scale factors and the lse round trip are checked without a GPU. Each function sees only
 * one lane's registers; the row reductions over the 4 lanes of a quad happen between the calls.
 *
 * Units: scores are kept in log2 units, S * scale * log2(e), so exp2 replaces exp; lse is stored in
 * natural-log units (what the CPU reference and the backward's callers expect) and the backward reads it
 * back multiplied by log2(e) (lse2).
 */
#pragma once

#include <math.h>
#include "attention_flash_mma.h"  // fragment maps, tile sizes

// forward, step 1 of a key tile: s (this lane's part of S = Q K^T) -> scores in log2 units, the causal
// mask on the diagonal tile (key u = k0 + column > query t = row0 + row: -inf), and mx[i] = the maximum
// of m[i] (the running maximum of row i, i = 0: row g, 1: row g + 8) and this lane's entries of row i.
// On the diagonal the mask also covers every key u >= T of a real row (t < T), so tiles past T need no
// separate test. Between this and step 2 the caller takes mx over the quad.
static FLASH_HD void flash_fwd_scores(float s[8][4], float mx[2], const float m[2], int lane, int row0, int k0,
                                            bool diagonal, float scale_log2) {
    mx[0] = m[0];
    mx[1] = m[1];
    FLASH_UNROLL for (int nt = 0; nt < 8; nt++)
        FLASH_UNROLL for (int e = 0; e < 4; e++) {
            float v = s[nt][e] * scale_log2;
            if (diagonal && k0 + flash_acc_col(lane, nt, e) > row0 + flash_acc_row(lane, e)) v = -INFINITY;
            s[nt][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
}

// forward, step 2 (mx now the row maxima over the quad, always finite: key k0 <= every row of the tile
// is never masked, and tile 0 always holds key 0): s -> P = 2^(s - mx) (0 where masked), the running
// sums l (this lane's partial sums; the quad's are added at the end) and the output rows o rescaled by
// corr = 2^(m - mx) (0 on the first tile, where m = -inf and l = o = 0), then m = mx.
static FLASH_HD void flash_fwd_online_softmax(float s[8][4], float o[8][4], float m[2], float l[2], const float mx[2]) {
    float corr[2] = {exp2f(m[0] - mx[0]), exp2f(m[1] - mx[1])};
    float rs[2] = {0.0f, 0.0f};
    FLASH_UNROLL for (int nt = 0; nt < 8; nt++)
        FLASH_UNROLL for (int e = 0; e < 4; e++) {
            float p = exp2f(s[nt][e] - mx[e >> 1]);  // masked: exp2(-inf) = 0
            s[nt][e] = p;
            rs[e >> 1] += p;
        }
    FLASH_UNROLL for (int i = 0; i < 2; i++) {
        l[i] = l[i] * corr[i] + rs[i];
        m[i] = mx[i];
    }
    for (int nt = 0; nt < 8; nt++) {
        o[nt][0] *= corr[0];
        o[nt][1] *= corr[0];
        o[nt][2] *= corr[1];
        o[nt][3] *= corr[1];
    }
}

// forward, the end: natural-log logsumexp of a scaled score row from its maximum m (log2 units) and its
// sum l over the quad (l >= 1: the maximum's own term)
static FLASH_HD float flash_lse(float m, float l) { return (m + log2f(l)) * FLASH_LN2; }

// backward, dK/dV kernel: st = S^T (K Q^T) and dpt = dP^T (V dO^T) of this warp's 16 keys (key0 + row)
// x the tile's 64 queries (q0 + column) -> st = P^T = 2^(S^T scale log2e - lse2[column]) and
// dpt = scale dS^T = P^T * (scale dP^T - Ds[column]), Ds = scale D. P is 0 where the query precedes the key
// (t < u) or lies past the sequence (t >= T, whose lse2 and D are 0); `edge` says the tile may hold such
// pairs (the diagonal tile or the last query tile). The softmax scale goes into dS here, before dS is
// rounded to 16 bits for dK = dS^T Q, not onto dK at the end: unscaled, dS is 1/scale = 8x larger than its
// share of dK, and in fp16 under a loss scale it overflowed first (dev/cuda/attention_backward.cu checks
// it). As scale dP - Ds it is one fused multiply-add, as the subtraction was; and scale is a power of two
// (1/sqrt(64)), so bf16 gives the same bits as scaling dK at the end did.
static FLASH_HD void flash_bwd_ds_t(float st[8][4], float dpt[8][4], const float* lse2, const float* Ds, int lane,
                                           int key0, int q0, int T, bool edge, float scale, float scale_log2) {
    FLASH_UNROLL for (int nt = 0; nt < 8; nt++)
        FLASH_UNROLL for (int e = 0; e < 4; e++) {
            int i = flash_acc_col(lane, nt, e), t = q0 + i, u = key0 + flash_acc_row(lane, e);
            float p = exp2f(st[nt][e] * scale_log2 - lse2[i]);
            if (edge && (t < u || t >= T)) p = 0.0f;
            st[nt][e] = p;
            dpt[nt][e] = p * fmaf(dpt[nt][e], scale, -Ds[i]);
        }
}

// backward, dQ kernel: s = S (Q K^T) and dp = dP (dO V^T) of this warp's 16 queries (row0 + row, lse2 and
// Ds = scale D of rows g and g + 8) x the tile's 64 keys (k0 + column) -> s = scale dS = P * (scale dP - Ds),
// with P = 0 above the diagonal on the diagonal tile (rows t >= T are computed but never stored); the
// softmax scale is applied before the rounding to 16 bits, as in flash_bwd_ds_t.
static FLASH_HD void flash_bwd_ds(float s[8][4], const float dp[8][4], const float lse2[2], const float Ds[2], int lane,
                                         int row0, int k0, bool diagonal, float scale, float scale_log2) {
    FLASH_UNROLL for (int nt = 0; nt < 8; nt++)
        FLASH_UNROLL for (int e = 0; e < 4; e++) {
            int u = k0 + flash_acc_col(lane, nt, e), t = row0 + flash_acc_row(lane, e);
            float p = exp2f(s[nt][e] * scale_log2 - lse2[e >> 1]);
            if (diagonal && u > t) p = 0.0f;
            s[nt][e] = p * fmaf(dp[nt][e], scale, -Ds[e >> 1]);
        }
}
