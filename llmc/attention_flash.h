/*
 * attention_flash.h: causal self-attention on tensor cores, FlashAttention-2 style, for head size 64 and
 * 16-bit activations (bf16 or fp16 operands, fp32 accumulation). GPU only; attention.h holds the CPU
 * reference and the classic (materialized T x T) path, and selects this one for `--attention flash`.
 *
 *   qkv  (B,T,3C): q of head h at columns h*64.., k at C + h*64.., v at 2C + h*64.. (read in place)
 *   out  (B,T,C):  softmax(scale q k^T) v per head, causal, written in place (no permute kernels)
 *   lse  (B,NH,T): natural-log logsumexp of each scaled score row, fp32, the only thing backward needs
 *                  besides qkv and out. No (B,NH,T,T) buffer exists anywhere.
 *
 * Algorithm (FlashAttention-2). Forward, one block of 4 warps per (b, h, tile of 64 queries); each warp
 * owns 16 query rows. The block walks the key tiles 0..qt (tiles above the diagonal are skipped), with K
 * and V double-buffered in shared memory by cp.async (the next tile loads while this one computes):
 *   S = Q K^T (16 x 64 per warp, fp32 in registers), scaled by scale*log2(e) so exp2 can be used;
 *   the diagonal tile masks key u > query t (this also masks u >= T for every real row, since t < T);
 *   online softmax per row: m_new = max(m, rowmax S), corr = 2^(m - m_new), l = l*corr + rowsum 2^(S-m_new),
 *   O = O*corr + P V with P = 2^(S - m_new) rounded to 16 bits. At the end O /= l and
 *   lse = (m + log2 l) * ln 2. l is kept as a per-thread partial sum (each row's 64 keys are spread over
 *   the 4 lanes of a quad) and summed over the quad once at the end; corr is the same on all 4 lanes.
 * Backward, deterministic (no atomics), three kernels:
 *   a. D = rowsum(dO * O) per (b, h, t), fp32 (one warp per row);
 *   b. dK, dV: one block per (b, h, tile of 64 keys), each warp 16 keys, K and V fragments in registers;
 *      walks query tiles qt = kt..last (Q, dO, lse, D double-buffered): S^T = K Q^T, dP^T = V dO^T,
 *      P^T = 2^(S^T*scale*log2e - lse*log2e) (0 where t < u or t >= T), dS^T = P^T * (dP^T - D),
 *      dV += P^T dO, dK += dS^T Q; at the end dK *= scale;
 *   c. dQ: one block per (b, h, tile of 64 queries), walks key tiles 0..qt: S = Q K^T, dP = dO V^T,
 *      P, dS as above (row-wise), dQ += dS K; at the end dQ *= scale.
 *   Each output element is written by exactly one thread once: bit-identical run to run. Splitting dQ
 *   from dK/dV recomputes S and dP twice (7 tile products instead of 5), the price of no atomics.
 *
 * Tiling: 64 x 64 tiles of 16-bit elements, rows padded from 64 to 72 elements (144 bytes) in shared
 * memory. ldmatrix reads 8 rows of 16 bytes per 8x8 matrix; row r starts at 36*r 32-bit words, i.e. bank
 * 4r mod 32, so the 8 rows of one matrix cover all 32 banks once: no bank conflicts, for the plain and the
 * .trans form alike. Tiles past T are zero-filled (cp.async with src-size 0), so padded keys score 0 and
 * padded values contribute 0 * 0; padded rows are masked or never stored.
 *
 * Fragment layouts of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (PTX ISA), lane l, g = l/4,
 * c = l%4; each 32-bit register holds 2 consecutive elements, the lower index in the low half:
 * (registers; PTX numbers the elements a0..a7, b0..b3 instead):
 *   A (16x16, row-major)  reg0 = A[g][2c..2c+1]  reg1 = A[g+8][2c..]  reg2 = A[g][2c+8..]  reg3 = A[g+8][2c+8..]
 *   B (16x8, k x n)       reg0 = B[2c..2c+1][g]  reg1 = B[2c+8..2c+9][g]          (two k values of column g)
 *   C (16x8, fp32)        c0,c1 = C[g][2c..2c+1]   c2,c3 = C[g+8][2c..2c+1]
 * ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i; register i of lane l receives matrix i's
 * row l/4, elements 2(l%4), 2(l%4)+1. With .trans it receives elements (2(l%4), l/4) and (2(l%4)+1, l/4).
 * So, for a 16-bit tile X in shared memory, row-major:
 *   A fragment of X[r0..r0+15][k0..k0+15]: lane l points at row r0 + l%16, column k0 + (l/16)*8
 *      (matrices: rows 0-7/cols 0-7 -> a0, rows 8-15/cols 0-7 -> a1, rows 0-7/cols 8-15 -> a2, ... -> a3).
 *   B fragments with B = X^T (B[k][n] = X[n][k], e.g. K in S = Q K^T): plain ldmatrix, lane l points at
 *      row n0 + l%8 + (l/16)*8, column k0 + ((l/8)%2)*8; registers 0,1 = (b0,b1) of n-tile n0..n0+7,
 *      registers 2,3 = (b0,b1) of n-tile n0+8..n0+15.
 *   B fragments with B = X (B[k][n] = X[k][n], e.g. V in O = P V): ldmatrix.trans, lane l points at row
 *      k0 + l%8 + ((l/8)%2)*8, column n0 + (l/16)*8; registers 0,1 = (b0,b1) of n-tile n0..n0+7,
 *      registers 2,3 = (b0,b1) of n-tile n0+8..n0+15.
 *   An accumulator C of 16 x 64 (8 n-tiles s[0..7]) becomes the A operand of the next product over its 64
 *   columns without leaving registers: for k-step j (columns 16j..16j+15)
 *      a0 = pack(s[2j][0], s[2j][1])  a1 = pack(s[2j][2], s[2j][3])  a2 = pack(s[2j+1][0], s[2j+1][1])
 *      a3 = pack(s[2j+1][2], s[2j+1][3]).
 * Needs sm_80 or newer (cp.async, bf16 mma).
 */
#pragma once

#define FLASH_HS 64          // head size this path supports
#define FLASH_TILE 64        // queries or keys per tile
#define FLASH_LDS 72         // padded shared-memory row, in 16-bit elements (144 bytes)
#define FLASH_THREADS 128    // 4 warps, 16 rows each
#define FLASH_TILE_ELEMS (FLASH_TILE * FLASH_LDS)

// ----------------------------------------------------------------------------------------------------
// The index maps of the layouts above, shared by the kernels and by the host emulation of ldmatrix and
// mma that checks them without a GPU (dev/cuda/attention_flash_layout.cpp, run by `make test`).
#ifdef __CUDACC__
#define FLASH_HD __host__ __device__
#else
#define FLASH_HD
#endif
// the (row, column) within a 16 x 16 block of a shared tile whose 8 elements lane l hands to ldmatrix.x4:
// A operand (rows = M, columns = K)
FLASH_HD static inline int flash_a_row(int lane) { return lane % 16; }
FLASH_HD static inline int flash_a_col(int lane) { return (lane / 16) * 8; }
// B = X^T: rows of X = n (two n-tiles of 8), columns of X = k (plain ldmatrix)
FLASH_HD static inline int flash_bt_row(int lane) { return lane % 8 + (lane / 16) * 8; }
FLASH_HD static inline int flash_bt_col(int lane) { return ((lane / 8) % 2) * 8; }
// B = X: rows of X = k, columns of X = n (two n-tiles of 8; ldmatrix.trans)
FLASH_HD static inline int flash_b_row(int lane) { return lane % 8 + ((lane / 8) % 2) * 8; }
FLASH_HD static inline int flash_b_col(int lane) { return (lane / 16) * 8; }
// accumulator element e (0..3) of n-tile nt in lane l: row and column within the 16 x 64 warp tile
FLASH_HD static inline int flash_acc_row(int lane, int e) { return lane / 4 + (e >= 2 ? 8 : 0); }
FLASH_HD static inline int flash_acc_col(int lane, int nt, int e) { return 8 * nt + 2 * (lane % 4) + (e & 1); }
// accumulator -> A operand of k-step ks: register r takes elements (e, e+1) of n-tile flash_acc_to_a_ntile
FLASH_HD static inline int flash_acc_to_a_ntile(int ks, int r) { return 2 * ks + r / 2; }
FLASH_HD static inline int flash_acc_to_a_elem(int r) { return (r % 2) * 2; }

#ifndef LLMC_CPU
#include <type_traits>
#include "device.h"

// ----------------------------------------------------------------------------------------------------
// the PTX building blocks

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src-size 0 reads nothing, but the
// address must still be a legal one, so callers pass a clamped row)
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

// d (16x8 fp32) += a (16x16) . b (16x8), 16-bit operands of type Tp
template <typename Tp>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same<Tp, __nv_bfloat16>::value) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        static_assert(std::is_same<Tp, __half>::value, "flash attention takes bf16 or fp16");
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// two floats -> one register of two 16-bit values, lo in the low half (the lower column index)
template <typename Tp>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if constexpr (std::is_same<Tp, __nv_bfloat16>::value) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&r, &v, 4);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&r, &v, 4);
    }
    return r;
}

template <typename Tp>
__device__ __forceinline__ float2 unpack2(uint32_t r) {
    if constexpr (std::is_same<Tp, __nv_bfloat16>::value) {
        __nv_bfloat162 v;
        memcpy(&v, &r, 4);
        return __bfloat1622float2(v);
    } else {
        __half2 v;
        memcpy(&v, &r, 4);
        return __half22float2(v);
    }
}

// A fragments of rows [row0, row0+16) x all 64 channels of a shared tile: frag[k-step][4]
__device__ __forceinline__ void load_a_frags(uint32_t frag[4][4], const void* tile, int row0) {
    int lane = threadIdx.x % 32;
    const char* base = (const char*)tile + ((row0 + flash_a_row(lane)) * FLASH_LDS + flash_a_col(lane)) * 2;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) ldsm_x4(frag[ks], base + ks * 16 * 2);
}

// acc (16 x 64, 8 n-tiles) += A (16 x 64, frags over 4 k-steps) . X^T, X a shared tile [64 rows][64]
// (the "row times row" product: S = Q K^T, dP = dO V^T and their transposes)
template <typename Tp>
__device__ __forceinline__ void mma_a_xt(float acc[8][4], const uint32_t a[4][4], const Tp* X) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int np = 0; np < 4; np++) {
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t b[4];
            ldsm_x4(b, X + (16 * np + flash_bt_row(lane)) * FLASH_LDS + 16 * ks + flash_bt_col(lane));
            mma_16816<Tp>(acc[2 * np], a[ks], b[0], b[1]);
            mma_16816<Tp>(acc[2 * np + 1], a[ks], b[2], b[3]);
        }
    }
}

// acc (16 x 64) += P (16 x 64, an fp32 accumulator rounded to Tp) . X, X a shared tile [64 rows (k)][64 (n)]
template <typename Tp>
__device__ __forceinline__ void mma_p_x(float acc[8][4], const float p[8][4], const Tp* X) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        uint32_t a[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float* src = p[flash_acc_to_a_ntile(ks, r)] + flash_acc_to_a_elem(r);
            a[r] = pack2<Tp>(src[0], src[1]);
        }
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t b[4];
            ldsm_x4_trans(b, X + (16 * ks + flash_b_row(lane)) * FLASH_LDS + 16 * np + flash_b_col(lane));
            mma_16816<Tp>(acc[2 * np], a, b[0], b[1]);
            mma_16816<Tp>(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// rows [row0, row0+64) of one head's 64 channels (row stride `stride` elements) -> tile, asynchronously;
// rows past T are zero. Every thread of the block takes part (4 chunks of 16 bytes each).
template <typename Tp>
__device__ __forceinline__ void load_tile_async(Tp* tile, const Tp* src, int row0, int T, size_t stride) {
    for (int i = threadIdx.x; i < FLASH_TILE * 8; i += FLASH_THREADS) {
        int r = i / 8, col = (i % 8) * 8;
        bool valid = row0 + r < T;
        cp_async_16(tile + r * FLASH_LDS + col, src + (size_t)(valid ? row0 + r : 0) * stride + col, valid);
    }
}

// the 16-bit tile x (16 x 64 fp32 accumulator, times mul) -> rows row_lo and row_lo + 8 of dst (stride)
template <typename Tp>
__device__ __forceinline__ void store_rows(Tp* dst, size_t stride, const float x[8][4], float mul_lo, float mul_hi,
                                           int row_lo, int T) {
    int lane = threadIdx.x % 32;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        int col = flash_acc_col(lane, nt, 0);
        if (row_lo < T) *(uint32_t*)(dst + (size_t)row_lo * stride + col) = pack2<Tp>(x[nt][0] * mul_lo, x[nt][1] * mul_lo);
        if (row_lo + 8 < T) *(uint32_t*)(dst + (size_t)(row_lo + 8) * stride + col) = pack2<Tp>(x[nt][2] * mul_hi, x[nt][3] * mul_hi);
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_LN2 0.6931471805599453f

// ----------------------------------------------------------------------------------------------------
// forward. grid (ceil(T/64), B*NH), block 128, static shared memory 5 tiles (46080 bytes)

template <typename Tp>
__global__ void __launch_bounds__(FLASH_THREADS) flash_tc_forward_kernel(Tp* out, float* lse, const Tp* qkv, int T, int C,
                                                                         int NH, float scale_log2) {
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
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        mma_a_xt<Tp>(s, qf, Ks[kt & 1]);  // S = Q K^T

        // scale into log2 units, mask the diagonal tile (key u > query t), new row maxima
        int k0 = kt * FLASH_TILE;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[nt][e] * scale_log2;
                if (kt == qt && k0 + flash_acc_col(lane, nt, e) > q0 + warp * 16 + flash_acc_row(lane, e)) v = -INFINITY;
                s[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        // finite: key k0 <= every row of this tile is never masked, and tile 0 always has key 0
        mx[0] = quad_max(mx[0]), mx[1] = quad_max(mx[1]);
        float corr[2] = {exp2f(m[0] - mx[0]), exp2f(m[1] - mx[1])};  // 0 on the first tile (m = -inf)
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float p = exp2f(s[nt][e] - mx[e >> 1]);  // masked: exp2(-inf) = 0
                s[nt][e] = p;
                rs[e >> 1] += p;
            }
#pragma unroll
        for (int i = 0; i < 2; i++) l[i] = l[i] * corr[i] + rs[i], m[i] = mx[i];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) o[nt][0] *= corr[0], o[nt][1] *= corr[0], o[nt][2] *= corr[1], o[nt][3] *= corr[1];
        mma_p_x<Tp>(o, s, Vs[kt & 1]);  // O += P V
    }

    l[0] = quad_sum(l[0]), l[1] = quad_sum(l[1]);
    store_rows<Tp>(out + (size_t)b * T * C + (size_t)h * FLASH_HS, (size_t)C, o, 1.0f / l[0], 1.0f / l[1], row_lo, T);
    if (c == 0) {
        if (row_lo < T) lse[(size_t)bh * T + row_lo] = (m[0] + log2f(l[0])) * FLASH_LN2;
        if (row_hi < T) lse[(size_t)bh * T + row_hi] = (m[1] + log2f(l[1])) * FLASH_LN2;
    }
}

// ----------------------------------------------------------------------------------------------------
// backward

// a. D[(b*NH + h)*T + t] = dout[b,t,h,:] . out[b,t,h,:] in fp32; one warp per (b, t, h), 2 channels a lane
template <typename Tp>
__global__ void flash_tc_backward_dot_kernel(float* D, const Tp* dout, const Tp* out, int B, int T, int C, int NH) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + t)*NH + h
    int lane = threadIdx.x % 32;
    if (row >= B * T * NH) return;
    int h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
    size_t off = (size_t)bt * C + (size_t)h * FLASH_HS + 2 * lane;
    float2 d = unpack2<Tp>(*(const uint32_t*)(dout + off)), o = unpack2<Tp>(*(const uint32_t*)(out + off));
    float s = d.x * o.x + d.y * o.y;
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffff, s, k);
    if (lane == 0) D[((size_t)b * NH + h) * T + t] = s;
}

// the backward kernels' dynamic shared memory: 6 tiles + 2 x 2 x 64 floats
static const int FLASH_TC_BWD_SMEM = 6 * FLASH_TILE_ELEMS * 2 + 4 * FLASH_TILE * (int)sizeof(float);  // 56320 bytes

// lse (times log2 e) and D of rows [row0, row0+64) -> shared, plain loads (0 past T: those P are masked)
__device__ __forceinline__ void load_row_stats(float* lse_s, float* D_s, const float* lse, const float* D, int row0, int T) {
    int i = threadIdx.x;
    if (i < 64) lse_s[i] = row0 + i < T ? lse[row0 + i] * FLASH_LOG2E : 0.0f;
    else if (i < 128) D_s[i - 64] = row0 + i - 64 < T ? D[row0 + i - 64] : 0.0f;
}

// b. dK, dV. grid (ceil(T/64) key tiles, B*NH), block 128
template <typename Tp>
__global__ void __launch_bounds__(FLASH_THREADS) flash_tc_backward_dkdv_kernel(Tp* dqkv, const Tp* qkv, const Tp* dout,
                                                                               const float* lse, const float* D, int T, int C,
                                                                               int NH, float scale, float scale_log2) {
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
        for (int e = 0; e < 4; e++) dk[nt][e] = 0.0f, dv[nt][e] = 0.0f;

    for (int qt = kt; qt < ntiles; qt++) {
        int buf = (qt - kt) & 1, q0 = qt * FLASH_TILE;
        cp_async_wait_all();
        __syncthreads();  // query tile qt has landed, and the other buffer is no longer read
        if (qt == kt) load_a_frags(kf, Ks, warp * 16), load_a_frags(vf, Vs, warp * 16);
        if (qt + 1 < ntiles) {
            load_tile_async(Qs + (buf ^ 1) * FLASH_TILE_ELEMS, base, q0 + FLASH_TILE, T, stride);
            load_tile_async(dOs + (buf ^ 1) * FLASH_TILE_ELEMS, dbase, q0 + FLASH_TILE, T, (size_t)C);
            cp_async_commit();
            load_row_stats(lse_s + (buf ^ 1) * FLASH_TILE, D_s + (buf ^ 1) * FLASH_TILE, lse_bh, D_bh, q0 + FLASH_TILE, T);
        }
        const Tp* Qb = Qs + buf * FLASH_TILE_ELEMS;
        const Tp* dOb = dOs + buf * FLASH_TILE_ELEMS;
        const float* lse_b = lse_s + buf * FLASH_TILE;
        const float* D_b = D_s + buf * FLASH_TILE;

        float st[8][4], dpt[8][4];  // S^T and dP^T: this warp's 16 keys x the tile's 64 queries
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[nt][e] = 0.0f, dpt[nt][e] = 0.0f;
        mma_a_xt<Tp>(st, kf, Qb);    // S^T = K Q^T
        mma_a_xt<Tp>(dpt, vf, dOb);  // dP^T = V dO^T
        bool edge = qt == kt || q0 + FLASH_TILE > T;  // the diagonal or the sequence tail
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = flash_acc_col(lane, nt, e), t = q0 + i, u = k0 + warp * 16 + flash_acc_row(lane, e);
                float p = exp2f(st[nt][e] * scale_log2 - lse_b[i]);
                if (edge && (t < u || t >= T)) p = 0.0f;
                st[nt][e] = p;                              // P^T
                dpt[nt][e] = p * (dpt[nt][e] - D_b[i]);     // dS^T (scale applied at the end)
            }
        mma_p_x<Tp>(dv, st, dOb);  // dV += P^T dO
        mma_p_x<Tp>(dk, dpt, Qb);  // dK += dS^T Q
    }

    Tp* row0 = dqkv + (size_t)b * T * stride + (size_t)h * FLASH_HS;
    store_rows<Tp>(row0 + C, stride, dk, scale, scale, key_lo, T);
    store_rows<Tp>(row0 + 2 * C, stride, dv, 1.0f, 1.0f, key_lo, T);
}

// c. dQ. grid (ceil(T/64) query tiles, B*NH), block 128
template <typename Tp>
__global__ void __launch_bounds__(FLASH_THREADS) flash_tc_backward_dq_kernel(Tp* dqkv, const Tp* qkv, const Tp* dout,
                                                                             const float* lse, const float* D, int T, int C,
                                                                             int NH, float scale, float scale_log2) {
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
        __syncthreads();
        if (kt == 0) {
            load_a_frags(qf, Qs, warp * 16), load_a_frags(df, dOs, warp * 16);
            lse_r[0] = lse_s[warp * 16 + g], lse_r[1] = lse_s[warp * 16 + g + 8];
            D_r[0] = D_s[warp * 16 + g], D_r[1] = D_s[warp * 16 + g + 8];
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
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f, dp[nt][e] = 0.0f;
        mma_a_xt<Tp>(s, qf, Kb);   // S = Q K^T
        mma_a_xt<Tp>(dp, df, Vb);  // dP = dO V^T
        int k0 = kt * FLASH_TILE;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int u = k0 + flash_acc_col(lane, nt, e), t = q0 + warp * 16 + flash_acc_row(lane, e);
                float p = exp2f(s[nt][e] * scale_log2 - lse_r[e >> 1]);
                if (kt == qt && u > t) p = 0.0f;  // rows t >= T are never stored
                s[nt][e] = p * (dp[nt][e] - D_r[e >> 1]);  // dS (scale applied at the end)
            }
        mma_p_x<Tp>(dq, s, Kb);  // dQ += dS K
    }
    store_rows<Tp>(dqkv + (size_t)b * T * stride + (size_t)h * FLASH_HS, stride, dq, scale, scale, row_lo, T);
}

// ----------------------------------------------------------------------------------------------------
// launchers (Tp = __nv_bfloat16 or __half)

static void flash_check_shape(int C, int NH) {
    if (NH <= 0 || C % NH != 0 || C / NH != FLASH_HS)
        fatal("--attention flash needs head size %d (channels %d / heads %d)", FLASH_HS, C, NH);
}

// out (B,T,C) =, lse (B,NH,T) =, from qkv (B,T,3C)
template <typename Tp>
static void flash_tc_attention_forward(Tp* out, float* lse, const Tp* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
    flash_check_shape(C, NH);
    float scale = 1.0f / sqrtf((float)FLASH_HS);
    dim3 grid((T + FLASH_TILE - 1) / FLASH_TILE, B * NH);
    flash_tc_forward_kernel<Tp><<<grid, FLASH_THREADS, 0, stream>>>(out, lse, qkv, T, C, NH, scale * FLASH_LOG2E);
    cudaCheck(cudaGetLastError());
}

// dqkv (B,T,3C) = (every element written); D: scratch of B*NH floats * T
template <typename Tp>
static void flash_tc_attention_backward(Tp* dqkv, float* D, const Tp* dout, const Tp* qkv, const Tp* out, const float* lse,
                                        int B, int T, int C, int NH, cudaStream_t stream) {
    flash_check_shape(C, NH);
    static bool smem_set = false;  // opt in to more than 48 KiB of dynamic shared memory, once per type
    if (!smem_set) {
        cudaCheck(cudaFuncSetAttribute(flash_tc_backward_dkdv_kernel<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize, FLASH_TC_BWD_SMEM));
        cudaCheck(cudaFuncSetAttribute(flash_tc_backward_dq_kernel<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize, FLASH_TC_BWD_SMEM));
        smem_set = true;
    }
    float scale = 1.0f / sqrtf((float)FLASH_HS);
    int rows = B * T * NH;
    flash_tc_backward_dot_kernel<Tp><<<(rows + 7) / 8, 256, 0, stream>>>(D, dout, out, B, T, C, NH);
    cudaCheck(cudaGetLastError());
    dim3 grid((T + FLASH_TILE - 1) / FLASH_TILE, B * NH);
    flash_tc_backward_dkdv_kernel<Tp><<<grid, FLASH_THREADS, FLASH_TC_BWD_SMEM, stream>>>(dqkv, qkv, dout, lse, D, T, C, NH,
                                                                                        scale, scale * FLASH_LOG2E);
    cudaCheck(cudaGetLastError());
    flash_tc_backward_dq_kernel<Tp><<<grid, FLASH_THREADS, FLASH_TC_BWD_SMEM, stream>>>(dqkv, qkv, dout, lse, D, T, C, NH,
                                                                                      scale, scale * FLASH_LOG2E);
    cudaCheck(cudaGetLastError());
}
#endif  // LLMC_CPU
