/*
 * classifier.h: fused softmax + cross-entropy + its gradient, one pass per row of logits.
 *
 *   logits (B*T, Vp): only the first V columns are real tokens; the padded columns V..Vp-1 take no
 *   part in the softmax and get zero gradient.
 *   losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]
 *   if dloss != 0, the logits are overwritten in place by their gradient:
 *       dlogits[n, i] = (softmax(logits[n, :V])_i - [i == target[n]]) * dloss   (i < V), 0 (i >= V)
 *   where dloss = 1 / (B * T * grad_accum_steps) is the weight of one position in the mean loss.
 *
 * The probabilities are never stored: a first read of the row finds the max and the sum of
 * exponentials, a second read writes the gradient. With dloss == 0 the logits are left untouched
 * (evaluation).
 */
#pragma once

#include "device.h"

// ----------------------------------------------------------------------------------------------------
// CPU reference

static void classifier_forward_backward_cpu(float* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* x = logits + (size_t)n * Vp;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++) maxv = x[i] > maxv ? x[i] : maxv;
        float sum = 0.0f;
        for (int i = 0; i < V; i++) sum += expf(x[i] - maxv);
        losses[n] = logf(sum) + maxv - x[targets[n]];
        if (dloss != 0.0f) {
            float inv = 1.0f / sum;
            for (int i = 0; i < V; i++) {
                float p = expf(x[i] - maxv) * inv;
                x[i] = (p - (i == targets[n] ? 1.0f : 0.0f)) * dloss;
            }
            for (int i = V; i < Vp; i++) x[i] = 0.0f;
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// one block per row; an online max/sum per thread, merged across the block
__global__ void classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    __shared__ float s_max[32], s_sum[32];
    int n = blockIdx.x;
    floatX* x = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float v = floatX_to_float(x[i]);
        float m_new = fmaxf(m, v);
        s = s * expf(m - m_new) + expf(v - m_new);
        m = m_new;
    }
    // merge (m, s) across the warp, then across warps
    for (int offset = 16; offset > 0; offset >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffff, m, offset), s2 = __shfl_xor_sync(0xffffffff, s, offset);
        float m_new = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * expf(m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - m_new));
        m = m_new;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = s;
    }
    __syncthreads();
    float maxv = -INFINITY;
    for (int w = 0; w < warps; w++) maxv = fmaxf(maxv, s_max[w]);
    float sum = 0.0f;
    for (int w = 0; w < warps; w++) sum += s_max[w] == -INFINITY ? 0.0f : s_sum[w] * expf(s_max[w] - maxv);
    int target = targets[n];
    float target_logit = floatX_to_float(x[target]);
    __syncthreads();  // everyone has read x[target] before it is overwritten
    if (threadIdx.x == 0) losses[n] = logf(sum) + maxv - target_logit;
    if (dloss == 0.0f) return;
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float g = 0.0f;
        if (i < V) g = (expf(floatX_to_float(x[i]) - maxv) * inv - (i == target ? 1.0f : 0.0f)) * dloss;
        x[i] = float_to_floatX(g);
    }
}
#endif

// ----------------------------------------------------------------------------------------------------
// launcher

static void classifier_forward_backward(floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
#ifdef LLMC_CPU
    classifier_forward_backward_cpu(logits, losses, targets, dloss, N, V, Vp);
#else
    classifier_kernel<<<N, 512, 0, main_stream>>>(logits, losses, targets, dloss, N, V, Vp);
    launchCheck();
#endif
}
