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
 *   a. D = scale * rowsum(dO * O) per (b, h, t), fp32 (one warp per row);
 *   b. dK, dV: one block per (b, h, tile of 64 keys), each warp 16 keys, K and V fragments in registers;
 *      walks query tiles qt = kt..last (Q, dO, lse, D double-buffered): S^T = K Q^T, dP^T = V dO^T,
 *      P^T = 2^(S^T*scale*log2e - lse*log2e) (0 where t < u or t >= T), dS^T = P^T * (scale dP^T - D)
 *      (the softmax scale inside dS, before its 16-bit rounding: see flash_bwd_ds_t), dV += P^T dO,
 *      dK += dS^T Q;
 *   c. dQ: one block per (b, h, tile of 64 queries), walks key tiles 0..qt: S = Q K^T, dP = dO V^T,
 *      P, dS as above (row-wise), dQ += dS K.
 *   Each output element is written by exactly one thread once: bit-identical run to run. Splitting dQ
 *   from dK/dV recomputes S and dP twice (7 tile products instead of 5), the price of no atomics.
 *
 * The parts:
 *   attention_flash_mma.h      tiling, fragment layouts and index maps, PTX wrappers, warp tile products
 *   attention_flash_softmax.h  the element-wise arithmetic (mask, online softmax, lse, P, dS), host too
 *   attention_flash_forward.h  the forward kernel
 *   attention_flash_backward.h the three backward kernels
 *   this file                  the launchers (shape and device checks, grids, shared-memory opt-in)
 * Checked without a GPU by dev/cuda/attention_flash_layout.cpp (index maps) and
 * attention_flash_emulate.cpp (the whole algorithm, lane by lane); on a GPU by dev/cuda/attention_forward
 * (versions 4, 5) and attention_backward (versions 3, 4) against the CPU reference.
 */
#pragma once

#include "attention_flash_mma.h"       // tile sizes, fragment maps, tile products
#include "attention_flash_softmax.h"   // causal mask, online softmax, P and dS
#include "attention_flash_forward.h"   // flash_tc_forward
#include "attention_flash_backward.h"  // the three backward kernels

// the head size is the one this path supports; the grid of a launch fits: B*NH blocks in y, B*T*NH rows in an int
static int flash_head_size_ok(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH == FLASH_HS; }
static int flash_grid_fits(long long B, long long T, long long NH) {
    return B * NH <= 65535 && B * T * NH <= 0x7fffffffLL;
}

#ifndef LLMC_CPU
// ----------------------------------------------------------------------------------------------------
// launchers (Tp = __nv_bfloat16 or __half)

// the compute capability of this rank's GPU, major * 10 + minor (flash needs 80: cp.async, bf16 mma.sync)
static int flash_device_capability(void) {
    int device, major = 0, minor = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor;
}

// what every launch needs: head size 64, a grid that fits and a GPU with the sm_80 instructions (checked
// once per device: a clear error instead of a trap)
static void flash_check_launch(int B, int T, int C, int NH) {
    if (!flash_head_size_ok(C, NH))
        fatal("--attention flash needs head size %d (channels %d / heads %d)", FLASH_HS, C, NH);
    if (!flash_grid_fits(B, T, NH))
        fatal("--attention flash: B*NH = %lld (at most 65535) or B*T*NH = %lld too large", (long long)B * NH,
              (long long)B * T * NH);
    static int checked_device = -1;
    int device;
    cudaCheck(cudaGetDevice(&device));
    if (device == checked_device) return;
    int cc = flash_device_capability();
    if (cc < 80)
        fatal("--attention flash needs a GPU of compute capability 8.0 or newer (cp.async, bf16 mma.sync); "
              "this one is %d.%d", cc / 10, cc % 10);
    checked_device = device;
}

// out (B,T,C) =, lse (B,NH,T) =, from qkv (B,T,3C)
template <typename Tp>
static void flash_tc_attention_forward(Tp* out, float* lse, const Tp* qkv, int B, int T, int C, int NH,
                                       cudaStream_t stream) {
    flash_check_launch(B, T, C, NH);
    float scale = 1.0f / sqrtf((float)FLASH_HS);
    dim3 grid((T + FLASH_TILE - 1) / FLASH_TILE, B * NH);
    flash_tc_forward_kernel<Tp><<<grid, FLASH_THREADS, 0, stream>>>(out, lse, qkv, T, C, NH, scale * FLASH_LOG2E);
    cudaCheck(cudaGetLastError());
}

// dqkv (B,T,3C) = (every element written); D: scratch of B*NH floats * T
template <typename Tp>
static void flash_tc_attention_backward(Tp* dqkv, float* D, const Tp* dout, const Tp* qkv, const Tp* out,
                                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    flash_check_launch(B, T, C, NH);
    static int smem_device = -1;  // opt in to more than 48 KiB of dynamic shared memory, once per type and device
    int device;
    cudaCheck(cudaGetDevice(&device));
    if (device != smem_device) {
        cudaCheck(cudaFuncSetAttribute(flash_tc_backward_dkdv_kernel<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       FLASH_TC_BWD_SMEM));
        cudaCheck(cudaFuncSetAttribute(flash_tc_backward_dq_kernel<Tp>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       FLASH_TC_BWD_SMEM));
        smem_device = device;
    }
    float scale = 1.0f / sqrtf((float)FLASH_HS);
    int rows = B * T * NH;
    const int rows_per_block = FLASH_DOT_THREADS / 32;  // a warp per row
    int dot_blocks = (rows + rows_per_block - 1) / rows_per_block;
    flash_tc_backward_dot_kernel<Tp><<<dot_blocks, FLASH_DOT_THREADS, 0, stream>>>(D, dout, out, B, T, C, NH, scale);
    cudaCheck(cudaGetLastError());
    dim3 grid((T + FLASH_TILE - 1) / FLASH_TILE, B * NH);
    flash_tc_backward_dkdv_kernel<Tp><<<grid, FLASH_THREADS, FLASH_TC_BWD_SMEM, stream>>>(
        dqkv, qkv, dout, lse, D, T, C, NH, scale, scale * FLASH_LOG2E);
    cudaCheck(cudaGetLastError());
    flash_tc_backward_dq_kernel<Tp><<<grid, FLASH_THREADS, FLASH_TC_BWD_SMEM, stream>>>(
        dqkv, qkv, dout, lse, D, T, C, NH, scale, scale * FLASH_LOG2E);
    cudaCheck(cudaGetLastError());
}
#endif  // LLMC_CPU
