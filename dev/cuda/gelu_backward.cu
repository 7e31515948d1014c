/*
 * gelu_backward: dinp = dout * GELU'(inp), elementwise over (B,T,4C) (tanh approximation, GPT-2's).
 * Memory-bound: two reads and one write of 4 bytes per element.
 *
 * versions
 *   1  the project's kernel (llmc/gelu.h): one thread per element.
 *   2  float4: one thread per 4 elements, 16-byte loads and stores.
 *   3  float4 with streaming cache hints (__ldcs / __stcs) and two float4 per thread.
 *   4  the trainer's kernel with --fused-kernels 1 (llmc/gelu.h gelu_backward_vec_kernel): one thread per
 *      16 bytes (Pack128), in place like the others.
 * All use gelu_derivative from llmc/gelu.h. As in the project, dinp may alias dout (each element reads
 * its own dout before writing), which all three versions respect.
 *
 * CPU reference: gelu_backward_cpu. Tolerance 1e-6 abs + 1e-5 rel.
 */
#include "common.cuh"
#include "../../llmc/gelu.h"

__device__ static inline float4 gelu_bwd4(float4 x, float4 d) {
    return make_float4(d.x * gelu_derivative(x.x), d.y * gelu_derivative(x.y), d.z * gelu_derivative(x.z),
                       d.w * gelu_derivative(x.w));
}

__global__ void gelu_backward_float4_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
    size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 3 < n) {
        *(float4*)(dinp + i) = gelu_bwd4(*(const float4*)(inp + i), *(const float4*)(dout + i));
    } else {
        for (; i < n; i++) dinp[i] = dout[i] * gelu_derivative(inp[i]);
    }
}

__global__ void gelu_backward_stream_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
    size_t n4 = n / 4;
    size_t i = 2 * ((size_t)blockIdx.x * blockDim.x) + threadIdx.x, j = i + blockDim.x;
    const float4* x4 = (const float4*)inp;
    const float4* d4 = (const float4*)dout;
    float4* o4 = (float4*)dinp;
    if (j < n4) {
        float4 x0 = __ldcs(x4 + i), d0 = __ldcs(d4 + i), x1 = __ldcs(x4 + j), d1 = __ldcs(d4 + j);
        __stcs(o4 + i, gelu_bwd4(x0, d0));
        __stcs(o4 + j, gelu_bwd4(x1, d1));
    } else if (i < n4) {
        __stcs(o4 + i, gelu_bwd4(__ldcs(x4 + i), __ldcs(d4 + i)));
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {
        size_t k = 4 * n4 + threadIdx.x;
        dinp[k] = dout[k] * gelu_derivative(inp[k]);
    }
}

static const int NV = 4;
static const char* version_names[NV + 1] = {"", "one thread per element (llmc)", "float4: one thread per 4 elements",
                                            "float4 x2 per thread, streaming hints",
                                            "Pack128 per thread (--fused-kernels)"};

static void run_version(int v, float* dinp, const float* inp, const float* dout, size_t n) {
    const int block = 256;
    switch (v) {
        case 1: gelu_backward(dinp, inp, dout, n, 0); break;
        case 2:
            gelu_backward_float4_kernel<<<grid_for((n + 3) / 4, block), block, 0, main_stream>>>(dinp, inp, dout, n);
            break;
        case 3: {
            size_t blocks = (n / 4 + 2 * block - 1) / (2 * block);
            gelu_backward_stream_kernel<<<(int)(blocks > 0 ? blocks : 1), block, 0, main_stream>>>(dinp, inp, dout, n);
            break;
        }
        case 4:  // the trainer's kernel under --fused-kernels 1, launched as the trainer launches it
            if (!gelu_vec_ok(1, dinp, inp, dout, n)) fatal("version 4 needs n %% 4 == 0 and 16-byte aligned buffers");
            gelu_backward_vec_kernel<<<grid_for(n / Pack128::size, GELU_THREADS), GELU_THREADS, 0, main_stream>>>(dinp, inp, dout, n);
            break;
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = 8, T = 1024, C = 768;
    size_t n = (size_t)B * T * 4 * C;
    printf("gelu_backward: B=%d T=%d 4C=%d (n=%zu)\n", B, T, 4 * C, n);
    bench_init();

    float* inp = make_random_uniform(n, 4, -4.0f, 4.0f);
    float* dout = make_random_uniform(n, 5, -1.0f, 1.0f);
    float* ref = (float*)malloc_check(n * sizeof(float));
    gelu_backward_cpu(ref, inp, dout, n);

    float *d_inp = dev_upload(inp, n), *d_dout = dev_upload(dout, n), *d_dinp = dev_alloc<float>(n);
    const double bytes = 3.0 * n * sizeof(float);
    check_and_time_versions("gelu_backward", "dinp", NV, version_names, selected, d_dinp, ref, n, 1e-6, 1e-5, bytes,
                            [&](int v) { run_version(v, d_dinp, d_inp, d_dout, n); });
    cudaCheck(cudaFree(d_inp));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dinp));
    free(inp), free(dout), free(ref);
    return finish();
}
