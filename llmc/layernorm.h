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
 */
#pragma once

#include "device.h"

static const float LAYERNORM_EPS = 1e-5f;

// ----------------------------------------------------------------------------------------------------
// CPU reference

// out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C)
static void layernorm_forward_cpu(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                  const float* bias, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        float s = 1.0f / sqrtf(v + LAYERNORM_EPS);
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

static void layernorm_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float g_mean = 0.0f, gn_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - mean[n]) * rstd[n];
            float g = d[c] * weight[c];
            g_mean += g;
            gn_mean += g * norm;
        }
        g_mean /= C;
        gn_mean /= C;
        float* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - mean[n]) * rstd[n];
            float g = d[c] * weight[c];
            dx[c] += (g - g_mean - norm * gn_mean) * rstd[n];
        }
    }
#pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f, db = 0.0f;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * C + c];
            dw += d * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            db += d;
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// one warp per row
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
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
__global__ void layernorm_backward_dinp_kernel(floatX* dinp, const floatX* dout, const floatX* inp, const floatX* weight,
                                               const float* mean, const float* rstd, int N, int C) {
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

// Column sums for dweight and dbias, in two steps: blocks of (32 channels x 8 row-lanes) each sum a
// strided subset of rows into partial[chunk] (float), then one thread per channel adds the chunks.
#define LN_CHUNKS 64
__global__ void layernorm_backward_partial_kernel(float* partial, const floatX* dout, const floatX* inp,
                                                  const float* mean, const float* rstd, int N, int C) {
    __shared__ float sw[8][32], sb[8][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        for (int n = blockIdx.y * 8 + threadIdx.y; n < N; n += gridDim.y * 8) {
            float d = floatX_to_float(dout[(size_t)n * C + c]);
            dw += d * (floatX_to_float(inp[(size_t)n * C + c]) - mean[n]) * rstd[n];
            db += d;
        }
    }
    sw[threadIdx.y][threadIdx.x] = dw;
    sb[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int i = 1; i < 8; i++) {
            dw += sw[i][threadIdx.x];
            db += sb[i][threadIdx.x];
        }
        partial[(size_t)blockIdx.y * 2 * C + c] = dw;
        partial[(size_t)blockIdx.y * 2 * C + C + c] = db;
    }
}

__global__ void layernorm_backward_finish_kernel(floatX* dweight, floatX* dbias, const float* partial, int chunks, int C) {
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
static Scratch layernorm_scratch = {NULL, 0};
#endif

// ----------------------------------------------------------------------------------------------------
// launchers

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C) {
#ifdef LLMC_CPU
    layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, N, C);
#else
    const int block = 256, rows_per_block = block / 32;
    layernorm_forward_kernel<<<ceil_div(N, rows_per_block), block, 0, main_stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    launchCheck();
#endif
}

static void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                               const floatX* weight, const float* mean, const float* rstd, int N, int C) {
#ifdef LLMC_CPU
    layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
#else
    const int block = 256, rows_per_block = block / 32;
    layernorm_backward_dinp_kernel<<<ceil_div(N, rows_per_block), block, 0, main_stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    launchCheck();
    float* partial = (float*)scratch_get(&layernorm_scratch, (size_t)LN_CHUNKS * 2 * C * sizeof(float));
    layernorm_backward_partial_kernel<<<dim3(ceil_div(C, 32), LN_CHUNKS), dim3(32, 8), 0, main_stream>>>(partial, dout, inp, mean, rstd, N, C);
    launchCheck();
    layernorm_backward_finish_kernel<<<ceil_div(C, 256), 256, 0, main_stream>>>(dweight, dbias, partial, LN_CHUNKS, C);
    launchCheck();
#endif
}
