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
 * build `param_copy` receives the rounded update of the float master weights (round to nearest).
 */
#pragma once

#include "device.h"

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;  // multiplies every gradient (clip_grad_norm_'s coefficient, or 1)
    int t;             // step number, starting at 1 (bias correction)
} AdamWArgs;

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

static void adamw_cpu(float* master, floatX* param_copy, const floatX* grad, float* m, float* v, size_t n, AdamWArgs a) {
    float bc1 = 1.0f - powf(a.beta1, (float)a.t), bc2_sqrt = sqrtf(1.0f - powf(a.beta2, (float)a.t));
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float p = adamw_element(master + i, m + i, v + i, floatX_to_float(grad[i]), a, bc1, bc2_sqrt);
        if (param_copy != NULL) param_copy[i] = float_to_floatX(p);
    }
}

#ifndef LLMC_CPU
__global__ void adamw_kernel(float* master, floatX* param_copy, const floatX* grad, float* m, float* v, size_t n,
                             AdamWArgs a, float bc1, float bc2_sqrt) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p = adamw_element(master + i, m + i, v + i, floatX_to_float(grad[i]), a, bc1, bc2_sqrt);
    if (param_copy != NULL) param_copy[i] = float_to_floatX(p);
}
#endif

static void adamw_update(float* master, floatX* param_copy, const floatX* grad, float* m, float* v, size_t n, AdamWArgs a) {
#ifdef LLMC_CPU
    adamw_cpu(master, param_copy, grad, m, v, n, a);
#else
    float bc1 = 1.0f - powf(a.beta1, (float)a.t), bc2_sqrt = sqrtf(1.0f - powf(a.beta2, (float)a.t));
    adamw_kernel<<<grid_for(n, 256), 256, 0, main_stream>>>(master, param_copy, grad, m, v, n, a, bc1, bc2_sqrt);
    launchCheck();
#endif
}
