/*
 * adamw.h: the AdamW update with PyTorch's semantics (torch.optim.AdamW), one element at a time.
 *
 *   g  = grad * grad_scale                      (grad_scale folds in gradient clipping)
 *   p  = p * (1 - lr * weight_decay)            (decoupled weight decay, before the moments)
 *   m  = beta1 m + (1 - beta1) g
 *   v  = beta2 v + (1 - beta2) g^2
 *   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *
 * master, m, v are float. In the FP32 build the parameters themselves are the master copy; in the BF16
 * and FP16 builds `param_copy` receives the updated master weight rounded to 16 bits: to nearest, or
 * (BF16, a.stochastic) stochastically: up or down with probabilities given by the distance, so that
 * updates smaller than bf16's spacing still move the parameters on average. The random bits are a hash
 * of the element's index in the parameter buffer and the step, so a run (and its resume) is repeatable.
 */
#pragma once

#include "device.h"  // floatX, launches, stochastic rounding helpers

// The optimizer's settings for a run (--lr, --beta1, --beta2, --eps, --weight-decay, --grad-clip): lr is
// the peak rate the learning-rate schedule scales (llmc/run/lr_schedule.h); grad_clip the largest global
// gradient norm (0: no clipping)
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} OptimizerConfig;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // multiplies every gradient (clip_grad_norm_'s coefficient, or 1)
    int t;             // step number, starting at 1 (bias correction)
    int stochastic;    // BF16: round the parameter copy stochastically
    size_t index_base; // the buffer index of element 0 (the seed of its random bits)
} AdamWArgs;

// One tensor's part of an optimizer step; adamw_update_ranges takes up to ADAMW_BATCH at once (one
// launch on the GPU: see adamw_batch_kernel)
#ifndef ADAMW_BATCH  // (a test may give a smaller batch, to run more launches)
#define ADAMW_BATCH 56
#endif
typedef struct {
    float* master;
    floatX* param_copy;  // NULL: the master is the parameter (FP32)
    const floatX* grad;
    float *m, *v;
    size_t n, index_base;  // elements; the buffer index of element 0 (AdamWArgs.index_base)
    float weight_decay;    // AdamWArgs.weight_decay for this tensor (0: biases, LayerNorms)
    int first_block;       // the range's blocks in its launch start here (set by adamw_update_ranges)
} AdamWRange;

#ifdef LLMC_CPU
#define ADAMW_FN static inline
#else
#define ADAMW_FN __host__ __device__ static inline
#endif

ADAMW_FN float adamw_element(float* master, float* m, float* v, float grad, AdamWArgs a, float bc1, float bc2_sqrt) {
    float g = grad * a.grad_scale;
    float p = *master * (1.0f - a.lr * a.weight_decay);
    float mm = a.beta1 * *m + (1.0f - a.beta1) * g;
    float vv = a.beta2 * *v + (1.0f - a.beta2) * g * g;
    p -= (a.lr / bc1) * mm / (sqrtf(vv) / bc2_sqrt + a.eps);
    *m = mm;
    *v = vv;
    *master = p;
    return p;
}

// Parallel over fixed blocks of elements (static schedule), the loop inside vectorized: the four arrays
// are distinct buffers (__restrict), and each element is adamw_element of its own values, so the result
// does not depend on the thread count or the vector width. (On the CPU floatX is float and the master is
// the parameter: param_copy is NULL.)
static void adamw_cpu(float* __restrict master, floatX* __restrict param_copy, const floatX* __restrict grad,
                      float* __restrict m, float* __restrict v, size_t n, AdamWArgs a) {
    float bc1 = 1.0f - powf(a.beta1, (float)a.t), bc2_sqrt = sqrtf(1.0f - powf(a.beta2, (float)a.t));
    if (param_copy == NULL) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++)
            adamw_element(master + i, m + i, v + i, floatX_to_float(grad[i]), a, bc1, bc2_sqrt);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float p = adamw_element(master + i, m + i, v + i, floatX_to_float(grad[i]), a, bc1, bc2_sqrt);
        param_copy[i] = float_to_floatX(p);
    }
}

#ifndef LLMC_CPU
// 32 random bits from (index, step): a few rounds of multiply-xorshift
__device__ static inline uint32_t rounding_bits(size_t index, int t) {
    uint32_t x = (uint32_t)index ^ ((uint32_t)(index >> 32) * 0x85ebca6bu) ^ ((uint32_t)t * 0x9E3779B9u);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// float -> floatX: to nearest, or (BF16) stochastically: add 16 random bits below bf16's last kept bit,
// then drop them
__device__ static inline floatX round_param(float p, size_t index, int t, int stochastic) {
#if defined(ENABLE_BF16)
    if (stochastic) {
        uint32_t u = __float_as_uint(p);
        if ((u & 0x7f800000u) != 0x7f800000u) u += rounding_bits(index, t) & 0xffffu;  // inf and NaN stay
        __nv_bfloat16_raw raw;
        raw.x = (unsigned short)(u >> 16);
        return __nv_bfloat16(raw);
    }
#endif
    (void)index; (void)t; (void)stochastic;
    return float_to_floatX(p);
}

// threads per block of both kernels (one element per thread)
#define ADAMW_THREADS 256
__global__ void __launch_bounds__(ADAMW_THREADS) adamw_kernel(float* master, floatX* param_copy, const floatX* grad,
                                                              float* m, float* v, size_t n, AdamWArgs a, float bc1,
                                                              float bc2_sqrt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p = adamw_element(master + i, m + i, v + i, floatX_to_float(grad[i]), a, bc1, bc2_sqrt);
    if (param_copy != NULL) param_copy[i] = round_param(p, a.index_base + i, a.t, a.stochastic);
}

// Many tensors' updates in one launch (the optimizer step: one range per tensor this rank owns). A
// range's blocks update its elements exactly as its own launch would (the same bits); the ranges travel
// as the kernel's parameter (read in place; __grid_constant__: never written) under the 4 KiB a launch's
// parameters may take: ADAMW_BATCH per launch, so GPT-2 124M's 148 tensors take 3 launches instead of 148.
typedef struct {
    int k;
    AdamWRange r[ADAMW_BATCH];
} AdamWBatch;

// verdict (NULL: none): the optimizer step's verdict on the device, computed after backward without the
// host (llmc/step_outputs.h): verdict[0] != 0 skips the step (parameters and state untouched), verdict[1]
// replaces a.grad_scale.
static_assert(sizeof(AdamWBatch) + sizeof(AdamWArgs) + 2 * sizeof(float) + sizeof(float*) <= 4096,
              "adamw_batch_kernel's parameters exceed the 4 KiB of a launch: lower ADAMW_BATCH");
__global__ void __launch_bounds__(ADAMW_THREADS) adamw_batch_kernel(
    const __grid_constant__ AdamWBatch batch, AdamWArgs a, float bc1, float bc2_sqrt, const float* verdict) {
    if (verdict != NULL) {
        if (verdict[0] != 0.0f) return;
        a.grad_scale = verdict[1];
    }
    const AdamWRange* r = &batch.r[range_of_block(batch.r, batch.k)];
    size_t i = (size_t)(blockIdx.x - r->first_block) * blockDim.x + threadIdx.x;
    if (i >= r->n) return;
    a.weight_decay = r->weight_decay;
    float p = adamw_element(r->master + i, r->m + i, r->v + i, floatX_to_float(r->grad[i]), a, bc1, bc2_sqrt);
    if (r->param_copy != NULL) r->param_copy[i] = round_param(p, r->index_base + i, a.t, a.stochastic);
}

// param_copy = round(master), as the update of step t rounded it (used after loading the master weights)
__global__ void __launch_bounds__(ADAMW_THREADS) round_params_kernel(floatX* param_copy, const float* master, size_t n,
                                                                     size_t index_base, int t, int stochastic) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) param_copy[i] = round_param(master[i], index_base + i, t, stochastic);
}
#endif

static void round_params(floatX* param_copy, const float* master, size_t n, size_t index_base, int t, int stochastic) {
#ifdef LLMC_CPU
    (void)param_copy; (void)master; (void)n; (void)index_base; (void)t; (void)stochastic;  // fp32: no copy
#else
    round_params_kernel<<<grid_for(n, ADAMW_THREADS), ADAMW_THREADS, 0, main_stream>>>(param_copy, master, n,
                                                                                       index_base, t, stochastic);
    launchCheck();
#endif
}

static void adamw_update(float* master, floatX* param_copy, const floatX* grad, float* m, float* v, size_t n,
                         AdamWArgs a) {
#ifdef LLMC_CPU
    adamw_cpu(master, param_copy, grad, m, v, n, a);
#else
    float bc1 = 1.0f - powf(a.beta1, (float)a.t), bc2_sqrt = sqrtf(1.0f - powf(a.beta2, (float)a.t));
    adamw_kernel<<<grid_for(n, ADAMW_THREADS), ADAMW_THREADS, 0, main_stream>>>(master, param_copy, grad, m, v, n, a,
                                                                                bc1, bc2_sqrt);
    launchCheck();
#endif
}

// AdamW step a.t on k ranges (each with its own weight decay and index base; a's are ignored): a launch
// per range (adamw_kernel, the default, which has run on a GPU), or (`batched`, --fused-kernels 1, not yet
// run on a GPU) one per ADAMW_BATCH ranges; the same bits either way. `verdict` (batched on the GPU only;
// NULL: none): the skip flag and gradient factor on the device (adamw_batch_kernel), read by the launches.
static void adamw_update_ranges(AdamWRange* r, int k, AdamWArgs a, int batched, const float* verdict) {
#ifdef LLMC_CPU
    batched = 0;  // (the CPU loops over the ranges)
#endif
    check_internal(verdict == NULL || batched, "a gradient factor on the device without the batched AdamW");
    if (!batched) {
        for (int j = 0; j < k; j++) {
            a.weight_decay = r[j].weight_decay;
            a.index_base = r[j].index_base;
            adamw_update(r[j].master, r[j].param_copy, r[j].grad, r[j].m, r[j].v, r[j].n, a);
        }
        return;
    }
#ifndef LLMC_CPU
    float bc1 = 1.0f - powf(a.beta1, (float)a.t), bc2_sqrt = sqrtf(1.0f - powf(a.beta2, (float)a.t));
    AdamWBatch batch;
    for (int first = 0; first < k; first += ADAMW_BATCH) {
        batch.k = k - first < ADAMW_BATCH ? k - first : ADAMW_BATCH;
        int grid = 0;
        for (int j = 0; j < batch.k; j++) {
            batch.r[j] = r[first + j];
            batch.r[j].first_block = grid;
            grid += grid_for(batch.r[j].n, ADAMW_THREADS);
        }
        adamw_batch_kernel<<<grid, ADAMW_THREADS, 0, main_stream>>>(batch, a, bc1, bc2_sqrt, verdict);
    }
    launchCheck();
#endif
}

