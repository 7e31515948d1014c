/*
 * gelu_forward: out = GELU(inp) with the tanh approximation (GPT-2's), elementwise over (B,T,4C).
 * Memory-bound: one read and one write of 4 bytes per element; the tanh costs a few dozen
 * instructions, which the memory system hides as long as enough loads are in flight.
 *
 * versions
 *   1  the project's kernel (llmc/gelu.h): one thread per element.
 *   2  float4: one thread per 4 elements, 16-byte loads and stores.
 *   3  float4 with streaming cache hints (__ldcs / __stcs: the data is used once here) and two float4
 *      per thread for more loads in flight.
 *   4  the trainer's kernel with --fused-kernels 1 (llmc/gelu.h gelu_forward_vec_kernel): one thread per
 *      16 bytes (Pack128: 4 floats here, 8 bf16 in the BF16 trainer).
 * The formula is the one of llmc/gelu.h (gelu_value), so the versions differ only in data movement.
 *
 * CPU reference: gelu_forward_cpu. Tolerance 1e-6 abs + 1e-5 rel (device and host tanhf may differ by
 * an ulp or two).
 */
#include "common.cuh"
#include "../../llmc/gelu.h"

__device__ static inline float4 gelu4(float4 x) {
    return make_float4(gelu_value(x.x), gelu_value(x.y), gelu_value(x.z), gelu_value(x.w));
}

__global__ void gelu_forward_float4_kernel(float* out, const float* inp, size_t n) {
    size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 3 < n) {
        *(float4*)(out + i) = gelu4(*(const float4*)(inp + i));
    } else {
        for (; i < n; i++) out[i] = gelu_value(inp[i]);
    }
}

__global__ void gelu_forward_stream_kernel(float* out, const float* inp, size_t n) {
    size_t n4 = n / 4;
    size_t i = 2 * ((size_t)blockIdx.x * blockDim.x) + threadIdx.x, j = i + blockDim.x;
    const float4* in4 = (const float4*)inp;
    float4* o4 = (float4*)out;
    if (j < n4) {
        float4 x0 = __ldcs(in4 + i), x1 = __ldcs(in4 + j);
        __stcs(o4 + i, gelu4(x0));
        __stcs(o4 + j, gelu4(x1));
    } else if (i < n4) {
        __stcs(o4 + i, gelu4(__ldcs(in4 + i)));
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {
        size_t k = 4 * n4 + threadIdx.x;
        out[k] = gelu_value(inp[k]);
    }
}

static const int NV = 4;
static const char* version_names[NV + 1] = {"", "one thread per element (llmc)", "float4: one thread per 4 elements",
                                            "float4 x2 per thread, streaming hints",
                                            "Pack128 per thread (--fused-kernels)"};

static void run_version(int v, float* out, const float* inp, size_t n) {
    const int block = 256;
    switch (v) {
        case 1: gelu_forward(out, inp, n, 0); break;
        case 2: gelu_forward_float4_kernel<<<grid_for((n + 3) / 4, block), block, 0, main_stream>>>(out, inp, n); break;
        case 3: {
            size_t blocks = (n / 4 + 2 * block - 1) / (2 * block);
            gelu_forward_stream_kernel<<<(int)(blocks > 0 ? blocks : 1), block, 0, main_stream>>>(out, inp, n);
            break;
        }
        case 4:  // the trainer's kernel under --fused-kernels 1, launched as the trainer launches it
            if (!gelu_vec_ok(1, out, inp, NULL, n)) fatal("version 4 needs n %% 4 == 0 and 16-byte aligned buffers");
            gelu_forward_vec_kernel<<<grid_for(n / Pack128::size, GELU_THREADS), GELU_THREADS, 0, main_stream>>>(out, inp, n);
            break;
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = 8, T = 1024, C = 768;
    size_t n = (size_t)B * T * 4 * C;
    printf("gelu_forward: B=%d T=%d 4C=%d (n=%zu)\n", B, T, 4 * C, n);
    bench_init();

    float* inp = make_random_uniform(n, 3, -4.0f, 4.0f);
    float* ref = (float*)malloc_check(n * sizeof(float));
    gelu_forward_cpu(ref, inp, n);

    float *d_inp = dev_upload(inp, n), *d_out = dev_alloc<float>(n);
    const double bytes = 2.0 * n * sizeof(float);
    check_and_time_versions("gelu_forward", "out", NV, version_names, selected, d_out, ref, n, 1e-6, 1e-5, bytes,
                            [&](int v) { run_version(v, d_out, d_inp, n); });
    cudaCheck(cudaFree(d_inp));
    cudaCheck(cudaFree(d_out));
    free(inp), free(ref);
    return finish();
}
