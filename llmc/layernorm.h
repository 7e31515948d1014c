/*
 * layernorm.h: LayerNorm over the last dimension (eps 1e-5, biased variance, as torch.nn.LayerNorm).
 *
 *   forward:  mean = avg(x), rstd = 1/sqrt(var(x) + eps), out = (x - mean) * rstd * w + b
 *             mean and rstd (float) are kept for the backward pass.
 *   backward: with n = (x - mean) * rstd and g = dout * w:
 *             dx += rstd * (g - avg(g) - n * avg(g * n))       (+= : the residual stream's gradient)
 *             dw += sum over rows of dout * n,  db += sum over rows of dout
 *
 * The CPU backward runs two passes, one parallel over rows (dx) and one over channels (dw, db), so that
 * every sum has a fixed order. The GPU version does the same with a warp per row and a column reduction.
 *
 * With --fused-kernels 1 (llmc/device.h) the GPU uses instead:
 *   - residual_layernorm_forward: res = a + b and out = layernorm(res) in one kernel (a warp per row,
 *     16-byte loads), which also serves plain layernorm_forward (b = NULL);
 *   - one backward kernel that computes dx and, per block, partial sums of dw and db in fp32 shared
 *     memory (each warp its own copy, so no atomics), followed by a kernel that adds the blocks'
 *     partials in a fixed order: deterministic, and dout and x are read from DRAM once.
 * Their CPU reference is the same loops (residual_forward_cpu, then layernorm_forward_cpu).
 */
#pragma once

#include "device.h"    // floatX, Scratch, launches
#include "residual.h"  // residual_forward (the unfused path)

static const float LAYERNORM_EPS = 1e-5f;

// ----------------------------------------------------------------------------------------------------
// CPU reference

// out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C). Rows in parallel (static schedule);
// within a row the sums are taken in vector lanes (`omp simd`: an order fixed by the build, the same at
// any thread count) and the loops vectorize (__restrict: the buffers are distinct).
static void layernorm_forward_cpu(float* __restrict out, float* __restrict mean, float* __restrict rstd,
                                  const float* __restrict inp, const float* __restrict weight,
                                  const float* __restrict bias, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f;
#pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        float s = 1.0f / sqrtf(v + LAYERNORM_EPS);
        float* o = out + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

// Two passes, each with sums in a fixed order: rows in parallel for dx (the row's two means in vector
// lanes), then blocks of LN_CPU_COLUMNS channels in parallel for dw and db, each block streaming through
// the rows in order with a contiguous inner loop (each channel's sums in row order).
#define LN_CPU_COLUMNS 32
static void layernorm_backward_cpu(float* __restrict dinp, float* __restrict dweight, float* __restrict dbias,
                                   const float* __restrict dout, const float* __restrict inp,
                                   const float* __restrict weight, const float* __restrict mean,
                                   const float* __restrict rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float g_mean = 0.0f, gn_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gn_mean)
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            float g = d[c] * weight[c];
            g_mean += g;
            gn_mean += g * norm;
        }
        g_mean /= C;
        gn_mean /= C;
        float* dx = dinp + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            float g = d[c] * weight[c];
            dx[c] += (g - g_mean - norm * gn_mean) * s;
        }
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += LN_CPU_COLUMNS) {
        int w = C - c0 < LN_CPU_COLUMNS ? C - c0 : LN_CPU_COLUMNS;
        float dw[LN_CPU_COLUMNS] = {}, db[LN_CPU_COLUMNS] = {};
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C + c0;
            const float* d = dout + (size_t)n * C + c0;
            float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int j = 0; j < w; j++) {
                dw[j] += d[j] * (x[j] - m) * s;
                db[j] += d[j];
            }
        }
        for (int j = 0; j < w; j++) {
            dweight[c0 + j] += dw[j];
            dbias[c0 + j] += db[j];
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// threads per block of the kernels below but the partial sums (LN_ROW_LANES) and the fused backward
// (LNB_WARPS): one warp per row, LN_THREADS / 32 rows per block, or one thread per channel (finish)
#define LN_THREADS 256

// one warp per row
__global__ void __launch_bounds__(LN_THREADS) layernorm_forward_kernel(
    floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += floatX_to_float(x[c]);
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float diff = floatX_to_float(x[c]) - m;
        var += diff * diff;
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    floatX* o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float n = (floatX_to_float(x[c]) - m) * s;
        o[c] = float_to_floatX(n * floatX_to_float(weight[c]) + floatX_to_float(bias[c]));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// one warp per row: dinp += rstd * (g - mean(g) - norm * mean(g * norm))
__global__ void __launch_bounds__(LN_THREADS) layernorm_backward_dinp_kernel(
    floatX* dinp, const floatX* dout, const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
    int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    const floatX* d = dout + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float g_sum = 0.0f, gn_sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float norm = (floatX_to_float(x[c]) - m) * s;
        float g = floatX_to_float(d[c]) * floatX_to_float(weight[c]);
        g_sum += g;
        gn_sum += g * norm;
    }
    float g_mean = warp_sum(g_sum) / C;
    float gn_mean = warp_sum(gn_sum) / C;
    floatX* dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float norm = (floatX_to_float(x[c]) - m) * s;
        float g = floatX_to_float(d[c]) * floatX_to_float(weight[c]);
        dx[c] = float_to_floatX(floatX_to_float(dx[c]) + (g - g_mean - norm * gn_mean) * s);
    }
}

// Column sums for dweight and dbias, in two steps: blocks of (32 channels x LN_ROW_LANES row-lanes) each
// sum a strided subset of rows into partial[chunk] (float), then one thread per channel adds the chunks.
#define LN_CHUNKS 64
#define LN_ROW_LANES 8
__global__ void __launch_bounds__(32 * LN_ROW_LANES) layernorm_backward_partial_kernel(
    float* partial, const floatX* dout, const floatX* inp, const float* mean, const float* rstd, int N, int C) {
    __shared__ float sw[LN_ROW_LANES][32], sb[LN_ROW_LANES][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int n = blockIdx.y * LN_ROW_LANES + threadIdx.y; n < N; n += gridDim.y * LN_ROW_LANES) {
            float d = floatX_to_float(dout[(size_t)n * C + c]);
            dw += d * (floatX_to_float(inp[(size_t)n * C + c]) - mean[n]) * rstd[n];
            db += d;
        }
    }
    sw[threadIdx.y][threadIdx.x] = dw;
    sb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int i = 1; i < LN_ROW_LANES; i++) {
            dw += sw[i][threadIdx.x];
            db += sb[i][threadIdx.x];
        }
        partial[(size_t)blockIdx.y * 2 * C + c] = dw;
        partial[(size_t)blockIdx.y * 2 * C + C + c] = db;
    }
}

__global__ void __launch_bounds__(LN_THREADS) layernorm_backward_finish_kernel(
    floatX* dweight, floatX* dbias, const float* partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int i = 0; i < chunks; i++) {
        dw += partial[(size_t)i * 2 * C + c];
        db += partial[(size_t)i * 2 * C + C + c];
    }
    dweight[c] = float_to_floatX(floatX_to_float(dweight[c]) + dw);
    dbias[c] = float_to_floatX(floatX_to_float(dbias[c]) + db);
}

// --fused-kernels: the same sums, 32 consecutive of the 2C columns of the partial rows (dweight's C, then
// dbias's C) per block, the rows split between its LNF_WARPS warps (warp w: rows w, w + LNF_WARPS, ...),
// whose sums are added in warp order. The kernel above gives each column one thread adding the 512 rows
// in turn, on 3 blocks at C = 768: ~21 µs a call, 25 calls per step (Nsight Compute, H200 and H100);
// dev/cuda/layernorm_backward.cu on an H100: the whole backward 0.106 ms with this finish, 0.120 with that.
#define LNF_WARPS 8
__global__ void __launch_bounds__(32 * LNF_WARPS) layernorm_backward_finish_warps_kernel(
    floatX* dweight, floatX* dbias, const float* partial, int chunks, int C) {
    __shared__ float warp_sums[LNF_WARPS][32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int j = blockIdx.x * 32 + lane;  // the column: dweight[j] for j < C, else dbias[j - C]
    float s = 0.0f;
    if (j < 2 * C) {
#pragma unroll 4
        for (int i = warp; i < chunks; i += LNF_WARPS) s += partial[(size_t)i * 2 * C + j];
    }
    warp_sums[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && j < 2 * C) {
        float total = 0.0f;
        for (int w = 0; w < LNF_WARPS; w++) total += warp_sums[w][lane];
        floatX* out = j < C ? dweight + j : dbias + (j - C);
        *out = float_to_floatX(floatX_to_float(*out) + total);
    }
}

// --fused-kernels: one warp per row, 16-byte loads. With b != NULL: res = a + b (rounded to floatX,
// written), then out = layernorm(res); with b == NULL the row is a and res is not touched. The statistics
// are taken over the rounded residual, exactly what a separate layernorm_forward would read back.
// Needs C % Pack128::size == 0 and 16-byte aligned pointers (the launcher checks).
__global__ void __launch_bounds__(LN_THREADS) residual_layernorm_forward_kernel(
    floatX* res, floatX* out, float* mean, float* rstd, const floatX* a, const floatX* b, const floatX* weight,
    const floatX* bias, int N, int C) {
    const int V = Pack128::size;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    const floatX* x = (b != NULL ? res : a) + base;  // the residual row (each lane rereads what it wrote)
    float sum = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        Pack128 r = load128(a + base + c);
        if (b != NULL) {
            Pack128 pb = load128(b + base + c);
            for (int k = 0; k < V; k++) r.v[k] = float_to_floatX(floatX_to_float(r.v[k]) + floatX_to_float(pb.v[k]));
            store128(res + base + c, r);
        }
        for (int k = 0; k < V; k++) sum += floatX_to_float(r.v[k]);
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        Pack128 r = load128(x + c);
        for (int k = 0; k < V; k++) {
            float diff = floatX_to_float(r.v[k]) - m;
            var += diff * diff;
        }
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    for (int c = lane * V; c < C; c += 32 * V) {
        Pack128 r = load128(x + c), w = load128(weight + c), bb = load128(bias + c), o;
        for (int k = 0; k < V; k++) {
            float n = (floatX_to_float(r.v[k]) - m) * s;
            o.v[k] = float_to_floatX(n * floatX_to_float(w.v[k]) + floatX_to_float(bb.v[k]));
        }
        store128(out + base + c, o);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// --fused-kernels backward, one pass: a warp per row (rows strided over the grid) adds dx into dinp and
// accumulates dout * norm and dout for its lane's channels into its own fp32 copy in shared memory; at
// the end the block adds its warps' copies (warp 0 first) into one partial row of 2C floats (dw | db).
// Shared layout per warp: channel c + k of pack c/V at [k * C/V + c/V], so that for a fixed k the 32
// lanes touch 32 consecutive floats (no bank conflicts). Needs C % V == 0 and aligned pointers.
#define LNB_WARPS 4
#define LNB_BLOCKS 512  // partial rows (fixed, so the order of the sums does not depend on the GPU)
__global__ void __launch_bounds__(32 * LNB_WARPS) layernorm_backward_fused_kernel(
    floatX* dinp, float* partial, const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
    const float* rstd, int N, int C) {
    extern __shared__ float ln_shared[];  // [LNB_WARPS][2][C]
    const int V = Pack128::size;
    int CP = C / V;  // packs per row
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* acc_dw = ln_shared + (size_t)warp * 2 * C;
    float* acc_db = acc_dw + C;
    for (int i = lane; i < 2 * C; i += 32) acc_dw[i] = 0.0f;
    __syncwarp();
    for (int row = blockIdx.x * LNB_WARPS + warp; row < N; row += gridDim.x * LNB_WARPS) {
        size_t base = (size_t)row * C;
        float m = mean[row], s = rstd[row];
        float g_sum = 0.0f, gn_sum = 0.0f;
        for (int c = lane * V; c < C; c += 32 * V) {
            Pack128 d = load128(dout + base + c), x = load128(inp + base + c), w = load128(weight + c);
            for (int k = 0; k < V; k++) {
                float norm = (floatX_to_float(x.v[k]) - m) * s;
                float g = floatX_to_float(d.v[k]) * floatX_to_float(w.v[k]);
                g_sum += g;
                gn_sum += g * norm;
            }
        }
        float g_mean = warp_sum(g_sum) / C, gn_mean = warp_sum(gn_sum) / C;
        for (int c = lane * V; c < C; c += 32 * V) {  // the second read of the row comes from L1/L2
            Pack128 d = load128(dout + base + c), x = load128(inp + base + c), w = load128(weight + c);
            Pack128 dx = load128(dinp + base + c);
            int p = c / V;
            for (int k = 0; k < V; k++) {
                float dk = floatX_to_float(d.v[k]);
                float norm = (floatX_to_float(x.v[k]) - m) * s;
                float g = dk * floatX_to_float(w.v[k]);
                dx.v[k] = float_to_floatX(floatX_to_float(dx.v[k]) + (g - g_mean - norm * gn_mean) * s);
                acc_dw[k * CP + p] += dk * norm;
                acc_db[k * CP + p] += dk;
            }
            store128(dinp + base + c, dx);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {  // i = channel (i < C: dw, else db)
        int which = i < C ? 0 : 1, ch = i - which * C;
        int slot = which * C + (ch % V) * CP + ch / V;
        float sum = 0.0f;
        for (int w = 0; w < LNB_WARPS; w++) sum += ln_shared[(size_t)w * 2 * C + slot];
        partial[(size_t)blockIdx.x * 2 * C + i] = sum;
    }
}

// the largest dynamic shared memory one block may have on this GPU (0 until asked): a property of the
// device, asked once per process and shared by every model in it (not a setting of the run)
static int layernorm_smem_optin = 0;
static bool layernorm_fused_ok(const void* p0, const void* p1, const void* p2, const void* p3, const void* p4, int C) {
    return C % Pack128::size == 0 && aligned16(p0) && aligned16(p1) && aligned16(p2) && aligned16(p3) && aligned16(p4);
}
#endif

// ----------------------------------------------------------------------------------------------------
// launchers; `fused`: the run's --fused-kernels (KernelChoice.fused), which the CPU loops do not need

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, int fused) {
#ifdef LLMC_CPU
    (void)fused;
    layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, N, C);
#else
    const int block = LN_THREADS, rows_per_block = block / 32;
    if (fused && layernorm_fused_ok(out, inp, weight, bias, NULL, C))
        residual_layernorm_forward_kernel<<<ceil_div(N, rows_per_block), block, 0, main_stream>>>(
            NULL, out, mean, rstd, inp, NULL, weight, bias, N, C);
    else
        layernorm_forward_kernel<<<ceil_div(N, rows_per_block), block, 0, main_stream>>>(out, mean, rstd, inp, weight,
                                                                                         bias, N, C);
    launchCheck();
#endif
}

// res (N,C) = a + b, then out = layernorm(res) (with mean, rstd): the residual add of a block and the
// LayerNorm that follows it. One kernel with --fused-kernels on the GPU, else the two separate launchers.
static void residual_layernorm_forward(floatX* res, floatX* out, float* mean, float* rstd, const floatX* a,
                                       const floatX* b, const floatX* weight, const floatX* bias, int N, int C,
                                       int fused) {
#ifndef LLMC_CPU
    if (fused && layernorm_fused_ok(res, out, a, b, weight, C) && aligned16(bias)) {
        const int block = LN_THREADS, rows_per_block = block / 32;
        residual_layernorm_forward_kernel<<<ceil_div(N, rows_per_block), block, 0, main_stream>>>(
            res, out, mean, rstd, a, b, weight, bias, N, C);
        launchCheck();
        return;
    }
#endif
    residual_forward(res, a, b, (size_t)N * C);
    layernorm_forward(out, mean, rstd, res, weight, bias, N, C, fused);
}

// `scratch`: on the GPU the per-block partial sums of dweight and dbias (the CPU loop needs none)
static void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                               const floatX* weight, const float* mean, const float* rstd, int N, int C,
                               Scratch* scratch, int fused) {
#ifdef LLMC_CPU
    (void)scratch; (void)fused;
    layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
#else
    if (fused && layernorm_fused_ok(dinp, dout, inp, weight, NULL, C)) {
        size_t smem = (size_t)LNB_WARPS * 2 * C * sizeof(float);
        if (layernorm_smem_optin == 0) {
            int dev = 0;
            cudaCheck(cudaGetDevice(&dev));
            cudaCheck(cudaDeviceGetAttribute(&layernorm_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        }
        if (smem <= (size_t)layernorm_smem_optin) {
            if (smem > 48 * 1024)
                cudaCheck(cudaFuncSetAttribute(layernorm_backward_fused_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            int blocks = ceil_div(N, LNB_WARPS) < LNB_BLOCKS ? ceil_div(N, LNB_WARPS) : LNB_BLOCKS;
            float* partial = (float*)scratch_get(scratch, (size_t)LNB_BLOCKS * 2 * C * sizeof(float));
            layernorm_backward_fused_kernel<<<blocks, 32 * LNB_WARPS, smem, main_stream>>>(dinp, partial, dout, inp,
                                                                                           weight, mean, rstd, N, C);
            launchCheck();
            layernorm_backward_finish_warps_kernel<<<ceil_div(2 * C, 32), 32 * LNF_WARPS, 0, main_stream>>>(
                dweight, dbias, partial, blocks, C);
            launchCheck();
            return;
        }
    }
    const int block = LN_THREADS, rows_per_block = block / 32;
    layernorm_backward_dinp_kernel<<<ceil_div(N, rows_per_block), block, 0, main_stream>>>(dinp, dout, inp, weight,
                                                                                           mean, rstd, N, C);
    launchCheck();
    float* partial = (float*)scratch_get(scratch, (size_t)LN_CHUNKS * 2 * C * sizeof(float));
    dim3 partial_grid(ceil_div(C, 32), LN_CHUNKS), partial_block(32, LN_ROW_LANES);
    layernorm_backward_partial_kernel<<<partial_grid, partial_block, 0, main_stream>>>(partial, dout, inp, mean, rstd,
                                                                                       N, C);
    launchCheck();
    layernorm_backward_finish_kernel<<<ceil_div(C, LN_THREADS), LN_THREADS, 0, main_stream>>>(dweight, dbias, partial,
                                                                                              LN_CHUNKS, C);
    launchCheck();
#endif
}
