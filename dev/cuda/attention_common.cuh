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
