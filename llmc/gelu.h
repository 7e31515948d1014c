/*
 * gelu.h: GELU with the tanh approximation, as GPT-2 uses.
 *
 *   forward:  y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)
 *   backward: dx = dy * [0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) s (1 + 3 * 0.044715 x^2)],  u = s (x + 0.044715 x^3)
 *             (=: overwritten; dinp may alias dout, each element reads its own dy first)
 * With --fused-kernels 1 the GPU kernels move 16 bytes per load and store (Pack128); each element is the
 * same function of the same inputs, so the results are bit-identical to the scalar kernels.
 */
#pragma once

#include "device.h"  // floatX, launches

#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

#ifdef LLMC_CPU
#define GELU_FN static inline
#else
#define GELU_FN __host__ __device__ static inline
#endif

GELU_FN float gelu_value(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

GELU_FN float gelu_derivative(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

// ----------------------------------------------------------------------------------------------------
// CPU reference

// The CPU loops compute the same function in a form that vectorizes: 0.5 (1 + tanh u) = sigmoid(2u) =
// 1 / (1 + exp(-2u)), with expf_cpu (llmc/common.h) for exp (tanhf is a call, which keeps a loop scalar).
// With e = exp(-2u) and s = 1 / (1 + e):  gelu(x) = x s,  and as 1 - tanh^2 u = 4 e s^2,
// gelu'(x) = s + 2 x (e s) s GELU_SCALE (1 + 3 * 0.044715 x^2)  (e s = 1 - s <= 1: no overflow where e is
// large). Equal to gelu_value and gelu_derivative up to float rounding, and without their cancellation
// in 1 + tanh u for negative x.
static inline float gelu_value_cpu(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf_cpu(-2.0f * u));
}
static inline float gelu_derivative_cpu(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float e = expf_cpu(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    return s + 2.0f * x * (e * s) * s * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

// parallel over fixed blocks of elements (static schedule), the loop inside vectorized
static void gelu_forward_cpu(float* __restrict out, const float* __restrict inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gelu_value_cpu(inp[i]);
}

// dinp may be dout (in place): each element reads its own dout first, so no __restrict on those two
static void gelu_backward_cpu(float* dinp, const float* __restrict inp, const float* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * gelu_derivative_cpu(inp[i]);
}

// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// threads per block of the four kernels
#define GELU_THREADS 256

__global__ void __launch_bounds__(GELU_THREADS) gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float_to_floatX(gelu_value(floatX_to_float(inp[i])));
}
__global__ void __launch_bounds__(GELU_THREADS) gelu_backward_kernel(floatX* dinp, const floatX* inp,
                                                                     const floatX* dout, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinp[i] = float_to_floatX(floatX_to_float(dout[i]) * gelu_derivative(floatX_to_float(inp[i])));
}

// --fused-kernels: one thread per 16 bytes (n % Pack128::size == 0, aligned pointers; the launcher checks)
__global__ void __launch_bounds__(GELU_THREADS) gelu_forward_vec_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * Pack128::size;
    if (i >= n) return;
    Pack128 x = load128(inp + i), y;
    for (int k = 0; k < Pack128::size; k++) y.v[k] = float_to_floatX(gelu_value(floatX_to_float(x.v[k])));
    store128(out + i, y);
}
__global__ void __launch_bounds__(GELU_THREADS) gelu_backward_vec_kernel(floatX* dinp, const floatX* inp,
                                                                         const floatX* dout, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * Pack128::size;
    if (i >= n) return;
    Pack128 x = load128(inp + i), d = load128(dout + i), dx;
    for (int k = 0; k < Pack128::size; k++)
        dx.v[k] = float_to_floatX(floatX_to_float(d.v[k]) * gelu_derivative(floatX_to_float(x.v[k])));
    store128(dinp + i, dx);
}
// the 16-byte kernels run with --fused-kernels (`fused`) where the buffers allow them
static bool gelu_vec_ok(int fused, const void* a, const void* b, const void* c, size_t n) {
    return fused && n % Pack128::size == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}
#endif

// ----------------------------------------------------------------------------------------------------
// launchers; `fused`: the run's --fused-kernels (KernelChoice.fused), which the CPU loops do not need

static void gelu_forward(floatX* out, const floatX* inp, size_t n, int fused) {
#ifdef LLMC_CPU
    (void)fused;
    gelu_forward_cpu(out, inp, n);
#else
    if (gelu_vec_ok(fused, out, inp, NULL, n))
        gelu_forward_vec_kernel<<<grid_for(n / Pack128::size, GELU_THREADS), GELU_THREADS, 0, main_stream>>>(
            out, inp, n);
    else
        gelu_forward_kernel<<<grid_for(n, GELU_THREADS), GELU_THREADS, 0, main_stream>>>(out, inp, n);
    launchCheck();
#endif
}

static void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, int fused) {
#ifdef LLMC_CPU
    (void)fused;
    gelu_backward_cpu(dinp, inp, dout, n);
#else
    if (gelu_vec_ok(fused, dinp, inp, dout, n))
        gelu_backward_vec_kernel<<<grid_for(n / Pack128::size, GELU_THREADS), GELU_THREADS, 0, main_stream>>>(
            dinp, inp, dout, n);
    else
        gelu_backward_kernel<<<grid_for(n, GELU_THREADS), GELU_THREADS, 0, main_stream>>>(dinp, inp, dout, n);
    launchCheck();
#endif
}
