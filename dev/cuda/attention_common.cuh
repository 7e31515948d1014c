/*
 * attention_common.cuh: what the flash attention files share: the host reference of the logsumexp of
 * every causal score row, lse[(b*NH + h)*T + t], which the flash kernels save in forward and use in
 * backward (llmc/attention.h's CPU reference keeps the probabilities instead).
 */
#pragma once

#include "common.cuh"
#include "../../llmc/attention.h"

static void attention_lse_cpu(float* lse, const float* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* s = (float*)malloc_check((size_t)T * sizeof(float));
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float maxv = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    float dot = 0.0f;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    s[u] = dot * scale;
                    if (s[u] > maxv) maxv = s[u];
                }
                double sum = 0.0;
                for (int u = 0; u <= t; u++) sum += exp((double)s[u] - maxv);
                lse[((size_t)b * NH + h) * T + t] = maxv + (float)log(sum);
            }
            free(s);
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// the tensor-core flash kernels (llmc/attention_flash.h) take 16-bit data. The inputs of both files are
// rounded to bf16 on the host first (round_to_bf16), so the fp32 reference, the fp32 versions and the
// 16-bit versions all see the same numbers (every such value is also exact in fp16 unless it is below
// 2^-17 in magnitude), and the checks measure only the rounding inside the kernels.
#include "../../llmc/attention_flash.h"

static void round_to_bf16(float* x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = __bfloat162float(__float2bfloat16(x[i]));
}

template <typename Tp>
__global__ void float_to_16bit_kernel(Tp* dst, const float* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (Tp)src[i];
}
template <typename Tp>
__global__ void float_from_16bit_kernel(float* dst, const Tp* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = (float)src[i];
}
template <typename Tp>
static void to_16bit(Tp* dst, const float* src, size_t n) {
    float_to_16bit_kernel<Tp><<<(unsigned)((n + 255) / 256), 256, 0, main_stream>>>(dst, src, n);
    cudaCheck(cudaGetLastError());
}
template <typename Tp>
static void from_16bit(float* dst, const Tp* src, size_t n) {
    float_from_16bit_kernel<Tp><<<(unsigned)((n + 255) / 256), 256, 0, main_stream>>>(dst, src, n);
    cudaCheck(cudaGetLastError());
}

// the odd shapes every version is checked on (T not a multiple of the 64-row tile, one head, many heads)
struct AttentionShape { int B, T, NH; };
static const AttentionShape odd_shapes[] = {{1, 37, 1}, {3, 100, 12}, {2, 200, 4}, {1, 64, 2}, {2, 129, 3}};
