/*
 * residual.h: the residual connection, out = a + b, elementwise.
 * Its backward needs no kernel: the gradient flows to both inputs unchanged, which is why the model
 * keeps one running gradient of the residual stream and layers add (+=) into it.
 */
#pragma once

#include "device.h"  // floatX, launches

static void residual_forward_cpu(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

#ifndef LLMC_CPU
#define RESIDUAL_THREADS 256  // threads per block, one element each
__global__ void __launch_bounds__(RESIDUAL_THREADS) residual_forward_kernel(floatX* out, const floatX* a,
                                                                            const floatX* b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float_to_floatX(floatX_to_float(a[i]) + floatX_to_float(b[i]));
}
#endif

static void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n) {
#ifdef LLMC_CPU
    residual_forward_cpu(out, a, b, n);
#else
    residual_forward_kernel<<<grid_for(n, RESIDUAL_THREADS), RESIDUAL_THREADS, 0, main_stream>>>(out, a, b, n);
    launchCheck();
#endif
}
