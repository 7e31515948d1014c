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
 * exponentials, a second read writes the gradient (the CPU loop keeps the exponentials in place of the
 * logits in between, so as to compute them once). With dloss == 0 the logits are left untouched
 * (evaluation).
 * loss_mean() reduces the per-position losses to their mean where they are (one float on the device), so
 * that a training step with --fused-kernels 1 brings its micro-steps' losses to the host in one copy at
 * its end instead of one copy (and one wait) per micro-step (llmc/step_outputs.h).
 * With --fused-kernels 1 the GPU kernel reads and writes 16 bytes at a time (Pack128) and folds a whole
 * pack into the running (max, sum) with one rescale; Vp % Pack128::size == 0 and aligned logits are
 * needed (Vp is a multiple of 128; the launcher checks and otherwise uses the scalar kernel).
 */
#pragma once

#include <float.h>

#include "device.h"  // floatX, launches

// ----------------------------------------------------------------------------------------------------
// CPU reference

// One row per iteration, rows spread over the threads (static schedule; each row's sums are one thread's,
// in an order fixed by the build, so runs repeat bit for bit at any thread count). Inside a row the loops
// are written to vectorize (`omp simd`: the max and the sum are taken in vector lanes, then the lanes
// combined) and exp is expf_cpu (llmc/common.h), a loop-friendly expf: the exponentials are computed
// once, kept in place of the logits, and the gradient pass only scales them.
static void classifier_forward_backward_cpu(float* logits, float* losses, const int* targets, float dloss, int N, int V,
                                            int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* __restrict x = logits + (size_t)n * Vp;
        int target = targets[n];
        float target_logit = x[target];
        float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
        for (int i = 0; i < V; i++) maxv = x[i] > maxv ? x[i] : maxv;
        float sum = 0.0f;
        if (dloss == 0.0f) {  // evaluation: the logits stay as they are
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; i++) sum += expf_cpu(x[i] - maxv);
        } else {
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; i++) {
                float e = expf_cpu(x[i] - maxv);
                x[i] = e;
                sum += e;
            }
            // dlogits = (softmax - onehot(target)) * dloss, softmax = e / sum
            float inv = 1.0f / sum;
#pragma omp simd
            for (int i = 0; i < V; i++) x[i] = x[i] * inv * dloss;
            x[target] -= dloss;
            for (int i = V; i < Vp; i++) x[i] = 0.0f;
        }
        losses[n] = logf(sum) + maxv - target_logit;
    }
}

// *out = mean of losses (N): summed in double in index order, what the host did with a copy of them
static void loss_mean_cpu(float* out, const float* losses, int N) {
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    *out = (float)(sum / N);
}

// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// one block of CLASSIFIER_SCALAR_THREADS per row; an online max/sum per thread, merged across the block
#define CLASSIFIER_SCALAR_THREADS 512
__global__ void __launch_bounds__(CLASSIFIER_SCALAR_THREADS) classifier_kernel(
    floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
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

// --fused-kernels: one block per row, 16-byte loads. Pass 1 reads the row once (online max and sum,
// one pack at a time); pass 2 reads it again (from L2 mostly) and writes the gradient in place. Written for
// few instructions per element (the kernel reads 3.3 GB per step at GPT-2 124M, and at 8 bf16 a pack the
// arithmetic must keep up with that): exp(x - m) as 2^(x log2e - m log2e), one FMA and one ex2; the packs
// wholly inside the vocabulary without per-element bounds checks (the one pack holding its end, and the
// padding up to Vp, apart); the running maximum starts at -FLT_MAX, not -inf, so the online merge needs
// no special case (2^(-FLT_MAX - m) is 0).
#define CLASSIFIER_THREADS 1024
#define CLASSIFIER_LOG2E 1.4426950408889634f
// (m, s) <- the pair for the union of both sets, where s = sum of 2^((x - m) log2e) over a set with max m
__device__ static inline void classifier_merge2(float& m, float& s, float m2, float s2) {
    float m_new = fmaxf(m, m2);
    s = s * exp2f((m - m_new) * CLASSIFIER_LOG2E) + s2 * exp2f((m2 - m_new) * CLASSIFIER_LOG2E);
    m = m_new;
}
__global__ void __launch_bounds__(CLASSIFIER_THREADS) classifier_vec_kernel(
    floatX* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    __shared__ float s_max[32], s_sum[32];
    const int P = Pack128::size;
    int n = blockIdx.x;
    floatX* x = logits + (size_t)n * Vp;
    int target = targets[n];
    float target_logit = floatX_to_float(x[target]);  // read before any thread overwrites the row
    int full = V / P * P;                              // [0, full): packs of real tokens only
    float m = -FLT_MAX, s = 0.0f;
    for (int i = threadIdx.x * P; i < full; i += blockDim.x * P) {
        Pack128 p = load128(x + i);
        float v[Pack128::size], pm = -FLT_MAX, ps = 0.0f;
        for (int k = 0; k < P; k++) {
            v[k] = floatX_to_float(p.v[k]);
            pm = fmaxf(pm, v[k]);
        }
        float pm_l2e = pm * CLASSIFIER_LOG2E;
        for (int k = 0; k < P; k++) ps += exp2f(fmaf(v[k], CLASSIFIER_LOG2E, -pm_l2e));
        classifier_merge2(m, s, pm, ps);
    }
    if (threadIdx.x == 0)  // the last V - full real tokens, which share a pack with padding
        for (int i = full; i < V; i++) classifier_merge2(m, s, floatX_to_float(x[i]), 1.0f);
    for (int offset = 16; offset > 0; offset >>= 1)
        classifier_merge2(m, s, __shfl_xor_sync(0xffffffff, m, offset), __shfl_xor_sync(0xffffffff, s, offset));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = s;
    }
    __syncthreads();  // also: every thread has read x[target]
    float maxv = -FLT_MAX, sum = 0.0f;
    for (int w = 0; w < warps; w++) classifier_merge2(maxv, sum, s_max[w], s_sum[w]);
    if (threadIdx.x == 0) losses[n] = logf(sum) + maxv - target_logit;
    if (dloss == 0.0f) return;
    // grad = (softmax - onehot(target)) * dloss = 2^(x log2e - (maxv log2e + log2 sum)) * dloss - [target] * dloss
    float shift = fmaf(maxv, CLASSIFIER_LOG2E, log2f(sum));
    for (int i = threadIdx.x * P; i < full; i += blockDim.x * P) {
        Pack128 p = load128(x + i), g;
        for (int k = 0; k < P; k++) {
            float grad = exp2f(fmaf(floatX_to_float(p.v[k]), CLASSIFIER_LOG2E, -shift)) * dloss;
            g.v[k] = float_to_floatX(i + k == target ? grad - dloss : grad);
        }
        store128(x + i, g);
    }
    for (int i = full + threadIdx.x; i < Vp; i += blockDim.x) {  // the end of the vocabulary, then the padding (0)
        float grad = i < V ? exp2f(fmaf(floatX_to_float(x[i]), CLASSIFIER_LOG2E, -shift)) * dloss : 0.0f;
        x[i] = float_to_floatX(i == target ? grad - dloss : grad);
    }
}
#endif

#ifndef LLMC_CPU
// one block: each thread sums a strided subset in double, then a tree in shared memory (a fixed order)
#define LOSS_MEAN_THREADS 1024
__global__ void __launch_bounds__(LOSS_MEAN_THREADS) loss_mean_kernel(float* out, const float* losses, int N) {
    __shared__ double partial[LOSS_MEAN_THREADS];
    double sum = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) sum += losses[i];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = (float)(partial[0] / N);
}
#endif

// ----------------------------------------------------------------------------------------------------
// launchers

// out: one float in device memory
static void loss_mean(float* out, const float* losses, int N) {
#ifdef LLMC_CPU
    loss_mean_cpu(out, losses, N);
#else
    loss_mean_kernel<<<1, LOSS_MEAN_THREADS, 0, main_stream>>>(out, losses, N);
    launchCheck();
#endif
}

// `fused`: the run's --fused-kernels (KernelChoice.fused): the 16-byte kernel where the shapes allow it
static void classifier_forward_backward(floatX* logits, float* losses, const int* targets, float dloss, int N, int V,
                                        int Vp, int fused) {
#ifdef LLMC_CPU
    (void)fused;
    classifier_forward_backward_cpu(logits, losses, targets, dloss, N, V, Vp);
#else
    if (fused && Vp % Pack128::size == 0 && aligned16(logits))
        classifier_vec_kernel<<<N, CLASSIFIER_THREADS, 0, main_stream>>>(logits, losses, targets, dloss, N, V, Vp);
    else
        classifier_kernel<<<N, CLASSIFIER_SCALAR_THREADS, 0, main_stream>>>(logits, losses, targets, dloss, N, V, Vp);
    launchCheck();
#endif
}
