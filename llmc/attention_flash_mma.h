/*
 * attention_flash_mma.h: the tensor-core building blocks of the flash attention kernels
 * (attention_flash.h): tile sizes, the fragment layouts of mma.sync and ldmatrix written out as index
 * maps, the PTX wrappers, and the warp-level 16 x 64 tile products built from them.
 *
 * The index maps (flash_a_row ... flash_acc_to_a_elem) compile for the host too, so
 * dev/cuda/attention_flash_layout.cpp and attention_flash_emulate.cpp can check them without a GPU;
 * everything else here is GPU-only.
 *
 * Tiling: 64 x 64 tiles of 16-bit elements, rows padded from 64 to 72 elements (144 bytes) in shared
 * memory. ldmatrix reads 8 rows of 16 bytes per 8x8 matrix; row r starts at 36*r 32-bit words, i.e. bank
 * 4r mod 32, so the 8 rows of one matrix cover all 32 banks once: no bank conflicts, for the plain and the
 * .trans form alike (no swizzle, so no inverse map to get wrong). Tiles past T are zero-filled (cp.async
 * with src-size 0), so padded keys score 0 and padded values contribute 0 * 0; padded rows are masked or
 * never stored.
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
 * Needs sm_80 or newer (cp.async, bf16 mma); compiled for an older target the PTX wrappers trap instead
 * (so the rest of the program still builds there) and the launchers refuse with an error first.
 */
#pragma once

#define FLASH_HS 64          // head size this path supports
#define FLASH_TILE 64        // queries or keys per tile
#define FLASH_LDS 72         // padded shared-memory row, in 16-bit elements (144 bytes)
#define FLASH_THREADS 128    // 4 warps, 16 rows each
#define FLASH_TILE_ELEMS (FLASH_TILE * FLASH_LDS)

#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_LN2 0.6931471805599453f

// ----------------------------------------------------------------------------------------------------
// The index maps of the layouts above, shared by the kernels and by the host emulation of ldmatrix and
// mma that checks them without a GPU (dev/cuda/attention_flash_layout.cpp, run by `make test`).
#ifdef __CUDACC__
#define FLASH_HD __host__ __device__ __forceinline__
#else
#define FLASH_HD inline
#endif
#ifdef __CUDA_ARCH__  // the device pass: unroll, so the register arrays stay registers
#define FLASH_UNROLL _Pragma("unroll")
#else
#define FLASH_UNROLL
#endif
// the (row, column) within a 16 x 16 block of a shared tile whose 8 elements lane l hands to ldmatrix.x4:
// A operand (rows = M, columns = K)
static FLASH_HD int flash_a_row(int lane) { return lane % 16; }
static FLASH_HD int flash_a_col(int lane) { return (lane / 16) * 8; }
// B = X^T: rows of X = n (two n-tiles of 8), columns of X = k (plain ldmatrix)
static FLASH_HD int flash_bt_row(int lane) { return lane % 8 + (lane / 16) * 8; }
static FLASH_HD int flash_bt_col(int lane) { return ((lane / 8) % 2) * 8; }
// B = X: rows of X = k, columns of X = n (two n-tiles of 8; ldmatrix.trans)
static FLASH_HD int flash_b_row(int lane) { return lane % 8 + ((lane / 8) % 2) * 8; }
static FLASH_HD int flash_b_col(int lane) { return (lane / 16) * 8; }
// accumulator element e (0..3) of n-tile nt in lane l: row and column within the 16 x 64 warp tile
static FLASH_HD int flash_acc_row(int lane, int e) { return lane / 4 + (e >= 2 ? 8 : 0); }
static FLASH_HD int flash_acc_col(int lane, int nt, int e) { return 8 * nt + 2 * (lane % 4) + (e & 1); }
// accumulator -> A operand of k-step ks: register r takes elements (e, e+1) of n-tile flash_acc_to_a_ntile
static FLASH_HD int flash_acc_to_a_ntile(int ks, int r) { return 2 * ks + r / 2; }
static FLASH_HD int flash_acc_to_a_elem(int r) { return (r % 2) * 2; }

#ifndef LLMC_CPU
#include <type_traits>
#include "device.h"  // floatX, the CUDA headers

// ----------------------------------------------------------------------------------------------------
// the PTX building blocks

// the tensor-core instructions exist from sm_80 on; for an older target (a build for the local GPU)
// the wrappers compile to a trap, and flash_check_launch() refuses such a GPU before any launch. On the
// CPU emulation of dev/emulate/emulate.h (DEV_CUDA_EMULATED) they call its warp-collective versions.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define FLASH_NO_SM80 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src-size 0 reads nothing, but the
// address must still be a legal one, so callers pass a clamped row). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
#ifdef FLASH_NO_SM80
    __trap();
#elif defined(DEV_CUDA_EMULATED)
    emu::cp_async_16(smem, gmem, valid);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
#endif
}
#ifdef FLASH_NO_SM80
__device__ __forceinline__ void cp_async_commit() {}
__device__ __forceinline__ void cp_async_wait_all() {}
#elif defined(DEV_CUDA_EMULATED)  // (the emulation lands some blocks' copies only at the wait)
__device__ __forceinline__ void cp_async_commit() { emu::cp_async_commit(); }
__device__ __forceinline__ void cp_async_wait_all() { emu::cp_async_wait_all(); }
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
#endif

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
#ifdef FLASH_NO_SM80
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#elif defined(DEV_CUDA_EMULATED)
    emu::ldmatrix_x4(r, p, false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
#endif
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
#ifdef FLASH_NO_SM80
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#elif defined(DEV_CUDA_EMULATED)
    emu::ldmatrix_x4(r, p, true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
#endif
}

// d (16x8 fp32) += a (16x16) . b (16x8), 16-bit operands of type Tp
template <typename Tp>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#ifdef FLASH_NO_SM80
    __trap();
#elif defined(DEV_CUDA_EMULATED)
    emu::mma_16816<Tp>(d, a, b0, b1);
#else
    if constexpr (std::is_same<Tp, __nv_bfloat16>::value) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        static_assert(std::is_same<Tp, __half>::value, "flash attention takes bf16 or fp16");
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#endif
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

// ----------------------------------------------------------------------------------------------------
// warp tile products and tile moves

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
// rows past T are zero. Every thread of the block takes part: thread t copies 16 bytes at column
// (t % 8) * 8 of rows t / 8 + 16 j, j = 0..3, so its offsets are worked out once per tile and the four
// copies differ only by constants (the address arithmetic was the largest part of the forward's loop).
template <typename Tp>
__device__ __forceinline__ void load_tile_async(Tp* tile, const Tp* src, int row0, int T, size_t stride) {
    const int rows_per_pass = FLASH_THREADS / 8;  // 16: 8 threads cover a row's 64 channels
    const int r = threadIdx.x / 8, col = (threadIdx.x % 8) * 8;
    Tp* dst = tile + r * FLASH_LDS + col;
    const Tp* from = src + (size_t)(row0 + r) * stride + col;
    const size_t step = (size_t)rows_per_pass * stride;
#pragma unroll
    for (int j = 0; j < FLASH_TILE / rows_per_pass; j++) {
        bool valid = row0 + r + j * rows_per_pass < T;
        // (src: a legal address)
        cp_async_16(dst + j * rows_per_pass * FLASH_LDS, valid ? from + j * step : src, valid);
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
        if (row_lo < T)
            *(uint32_t*)(dst + (size_t)row_lo * stride + col) = pack2<Tp>(x[nt][0] * mul_lo, x[nt][1] * mul_lo);
        if (row_lo + 8 < T)
            *(uint32_t*)(dst + (size_t)(row_lo + 8) * stride + col) = pack2<Tp>(x[nt][2] * mul_hi, x[nt][3] * mul_hi);
    }
}

// max / sum over the 4 lanes of a quad (the lanes that share an accumulator row)
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}
#endif  // LLMC_CPU
