/*
 * residual_forward: out = a + b, elementwise over (B,T,C). Purely memory-bound: 2 reads + 1 write of 4
 * bytes per element, no reuse, so the only goal is to reach DRAM bandwidth.
 *
 * versions
 *   1  the project's kernel (llmc/residual.h): one thread per element, 4-byte loads and stores.
 *   2  float4: one thread per 4 elements, 16-byte loads and stores, a quarter of the instructions and
 *      of the memory transactions' bookkeeping.
 *   3  float4 with streaming cache hints (__ldcs / __stcs: evict-first, the data is touched once) and
 *      two float4 per thread, so each thread has two independent loads in flight.
 * Versions 2 and 3 need n % 4 == 0 and 16-byte aligned pointers (cudaMalloc gives 256); the tail is
 * still handled element by element in case n is not a multiple of 4.
 *
 * CPU reference: residual_forward_cpu (llmc/residual.h). Check: exact up to rounding (the sum of two
 * floats is correctly rounded on both sides), tolerance 1e-6 abs.
 */
#include "common.cuh"
#include "../../llmc/residual.h"

__global__ void residual_forward_float4_kernel(float* out, const float* a, const float* b, size_t n) {
    size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 3 < n) {
        float4 x = *(const float4*)(a + i), y = *(const float4*)(b + i);
        *(float4*)(out + i) = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else {
        for (; i < n; i++) out[i] = a[i] + b[i];
    }
}

__global__ void residual_forward_stream_kernel(float* out, const float* a, const float* b, size_t n) {
    size_t n4 = n / 4;
    size_t i = 2 * ((size_t)blockIdx.x * blockDim.x) + threadIdx.x;  // float4 index; the block covers 2*blockDim
    const float4* a4 = (const float4*)a;
    const float4* b4 = (const float4*)b;
    float4* o4 = (float4*)out;
    size_t j = i + blockDim.x;
    if (j < n4) {
        float4 x0 = __ldcs(a4 + i), y0 = __ldcs(b4 + i), x1 = __ldcs(a4 + j), y1 = __ldcs(b4 + j);
        __stcs(o4 + i, make_float4(x0.x + y0.x, x0.y + y0.y, x0.z + y0.z, x0.w + y0.w));
        __stcs(o4 + j, make_float4(x1.x + y1.x, x1.y + y1.y, x1.z + y1.z, x1.w + y1.w));
    } else if (i < n4) {
        float4 x0 = __ldcs(a4 + i), y0 = __ldcs(b4 + i);
        __stcs(o4 + i, make_float4(x0.x + y0.x, x0.y + y0.y, x0.z + y0.z, x0.w + y0.w));
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {  // tail
        size_t k = 4 * n4 + threadIdx.x;
        out[k] = a[k] + b[k];
    }
}

static const int NV = 3;
static const char* version_names[NV + 1] = {"", "one thread per element (llmc)", "float4: one thread per 4 elements",
                                            "float4 x2 per thread, streaming hints"};

static void run_version(int v, float* out, const float* a, const float* b, size_t n) {
    const int block = 256;
    switch (v) {
        case 1: residual_forward(out, a, b, n); break;
        case 2:
            residual_forward_float4_kernel<<<grid_for((n + 3) / 4, block), block, 0, main_stream>>>(out, a, b, n);
            break;
        case 3: {
            size_t blocks = (n / 4 + 2 * block - 1) / (2 * block);
            residual_forward_stream_kernel<<<(int)(blocks > 0 ? blocks : 1), block, 0, main_stream>>>(out, a, b, n);
            break;
        }
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = 8, T = 1024, C = 768;
    size_t n = (size_t)B * T * C;
    printf("residual_forward: B=%d T=%d C=%d (n=%zu)\n", B, T, C, n);
    bench_init();

    float* a = make_random_uniform(n, 1, -1.0f, 1.0f);
    float* b = make_random_uniform(n, 2, -1.0f, 1.0f);
    float* ref = (float*)malloc_check(n * sizeof(float));
    residual_forward_cpu(ref, a, b, n);

    float *d_a = dev_upload(a, n), *d_b = dev_upload(b, n), *d_out = dev_alloc<float>(n);
    const double bytes = 3.0 * n * sizeof(float);
    check_and_time_versions("residual_forward", "out", NV, version_names, selected, d_out, ref, n, 1e-6, 1e-6, bytes,
                            [&](int v) { run_version(v, d_out, d_a, d_b, n); });
    cudaCheck(cudaFree(d_a));
    cudaCheck(cudaFree(d_b));
    cudaCheck(cudaFree(d_out));
    free(a), free(b), free(ref);
    return finish();
}
