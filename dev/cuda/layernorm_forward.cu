/*
 * layernorm_forward: out = (x - mean) * rstd * weight + bias over each row of C channels (N = B*T rows),
 * keeping mean and rstd (N floats each) for the backward pass. Memory-bound: each row is read and
 * written once in the ideal case (2 * N * C * 4 bytes).
 *
 * versions
 *   1  naive: one thread per row, three passes over the row (mean, variance, output). Neighbouring
 *      threads read addresses C floats apart, so nothing is coalesced.
 *   2  the project's kernel (llmc/layernorm.h): one warp per row, coalesced, still three passes over
 *      global memory (the second and third mostly hit L1/L2).
 *   3  one warp per row with the row held in registers: each lane loads its float4s once (C/128 of
 *      them, 6 at C = 768), mean and variance (two-pass, as the reference) come from registers, weight
 *      and bias through the read-only path, out written with float4 streaming stores. One read of x.
 *      Needs C % 4 == 0 and C <= 1024 (compiled for up to 8 float4 per lane).
 *   4  the trainer's kernel with --fused-kernels 1 (llmc/layernorm.h residual_layernorm_forward_kernel
 *      without a residual): one warp per row, Pack128 loads (4 floats here, 8 bf16 in the BF16
 *      trainer), three passes over the row (the second and third from L1/L2). Any C % 4 == 0.
 *
 * CPU reference: layernorm_forward_cpu (llmc/layernorm.h). Tolerance 1e-5 abs + 1e-4 rel on out,
 * mean and rstd.
 */
#include "common.cuh"
#include "../../llmc/layernorm.h"

__global__ void layernorm_forward_naive_kernel(float* out, float* mean, float* rstd, const float* inp,
                                               const float* weight, const float* bias, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const float* x = inp + (size_t)row * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float s = 1.0f / sqrtf(v / C + LAYERNORM_EPS);
    float* o = out + (size_t)row * C;
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[row] = m;
    rstd[row] = s;
}

// VPL = float4s per lane; lane owns float4 indices lane, lane + 32, ..., up to C/4
template <int VPL>
__global__ void layernorm_forward_reg_kernel(float* out, float* mean, float* rstd, const float* inp,
                                             const float* weight, const float* bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    int C4 = C / 4;
    const float4* x4 = (const float4*)(inp + (size_t)row * C);
    float4 x[VPL];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        int i = lane + 32 * k;
        x[k] = i < C4 ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        sum += (x[k].x + x[k].y) + (x[k].z + x[k].w);
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        if (lane + 32 * k < C4) {
            float a = x[k].x - m, b = x[k].y - m, c = x[k].z - m, d = x[k].w - m;
            var += (a * a + b * b) + (c * c + d * d);
        }
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    const float4* w4 = (const float4*)weight;
    const float4* b4 = (const float4*)bias;
    float4* o4 = (float4*)(out + (size_t)row * C);
#pragma unroll
    for (int k = 0; k < VPL; k++) {
        int i = lane + 32 * k;
        if (i < C4) {
            float4 w = __ldg(w4 + i), b = __ldg(b4 + i), y;
            y.x = (x[k].x - m) * s * w.x + b.x;
            y.y = (x[k].y - m) * s * w.y + b.y;
            y.z = (x[k].z - m) * s * w.z + b.z;
            y.w = (x[k].w - m) * s * w.w + b.w;
            __stcs(o4 + i, y);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <int VPL>
static void launch_reg(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N, int C) {
    layernorm_forward_reg_kernel<VPL><<<ceil_div(N, 8), 256, 0, main_stream>>>(out, mean, rstd, inp, w, b, N, C);
}

static const int NV = 4;
static const char* version_names[NV + 1] = {"", "naive: one thread per row", "warp per row, 3 passes (llmc)",
                                            "warp per row, row in registers, float4",
                                            "warp per row, Pack128 (--fused-kernels)"};

static void run_version(int v, float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N, int C) {
    switch (v) {
        case 1: layernorm_forward_naive_kernel<<<ceil_div(N, 128), 128, 0, main_stream>>>(out, mean, rstd, inp, w, b, N, C); break;
        case 2: layernorm_forward(out, mean, rstd, inp, w, b, N, C, 0); break;
        case 3:
            if (C % 4 != 0 || C > 1024) fatal("version 3 needs C %% 4 == 0 and C <= 1024");
            switch (ceil_div(C, 128)) {
                case 1: launch_reg<1>(out, mean, rstd, inp, w, b, N, C); break;
                case 2: launch_reg<2>(out, mean, rstd, inp, w, b, N, C); break;
                case 3: launch_reg<3>(out, mean, rstd, inp, w, b, N, C); break;
                case 4: launch_reg<4>(out, mean, rstd, inp, w, b, N, C); break;
                case 5: launch_reg<5>(out, mean, rstd, inp, w, b, N, C); break;
                case 6: launch_reg<6>(out, mean, rstd, inp, w, b, N, C); break;
                case 7: launch_reg<7>(out, mean, rstd, inp, w, b, N, C); break;
                default: launch_reg<8>(out, mean, rstd, inp, w, b, N, C); break;
            }
            break;
        case 4:
            if (!layernorm_fused_ok(out, inp, w, b, NULL, C)) fatal("version 4 needs C %% 4 == 0 and aligned buffers");
            residual_layernorm_forward_kernel<<<ceil_div(N, LN_THREADS / 32), LN_THREADS, 0, main_stream>>>(NULL, out, mean, rstd, inp,
                                                                                                             NULL, w, b, N, C);
            break;
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = 8, T = 1024, C = 768, N = B * T;
    size_t n = (size_t)N * C;
    printf("layernorm_forward: B=%d T=%d C=%d\n", B, T, C);
    bench_init();

    float* inp = make_random_normal(n, 21, 1.0f);
    for (int r = 0; r < N; r++)  // give rows different means and scales, as real activations have
        for (int c = 0; c < C; c++) inp[(size_t)r * C + c] = inp[(size_t)r * C + c] * (0.5f + (r % 7)) + 0.1f * (r % 5);
    float* w = make_random_uniform(C, 22, 0.5f, 1.5f);
    float* b = make_random_uniform(C, 23, -0.5f, 0.5f);
    float *out_ref = (float*)malloc_check(n * sizeof(float)), *mean_ref = (float*)malloc_check(N * sizeof(float)),
          *rstd_ref = (float*)malloc_check(N * sizeof(float));
    layernorm_forward_cpu(out_ref, mean_ref, rstd_ref, inp, w, b, N, C);

    float *d_inp = dev_upload(inp, n), *d_w = dev_upload(w, C), *d_b = dev_upload(b, C);
    float *d_out = dev_alloc<float>(n), *d_mean = dev_alloc<float>(N), *d_rstd = dev_alloc<float>(N);
    const double bytes = 2.0 * n * sizeof(float) + 2.0 * N * sizeof(float);
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        cudaCheck(cudaMemset(d_out, 0xff, n * sizeof(float)));
        cudaCheck(cudaMemset(d_mean, 0xff, N * sizeof(float)));
        cudaCheck(cudaMemset(d_rstd, 0xff, N * sizeof(float)));
        run_version(v, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C);
        check_close("out", d_out, out_ref, n, 1e-5, 1e-4);
        check_close("mean", d_mean, mean_ref, N, 1e-5, 1e-4);
        check_close("rstd", d_rstd, rstd_ref, N, 1e-5, 1e-4);
        float ms = benchmark_ms([&] { run_version(v, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C); });
        print_bandwidth("layernorm_forward", ms, bytes);
    }
    cudaCheck(cudaFree(d_inp)), cudaCheck(cudaFree(d_w)), cudaCheck(cudaFree(d_b));
    cudaCheck(cudaFree(d_out)), cudaCheck(cudaFree(d_mean)), cudaCheck(cudaFree(d_rstd));
    free(inp), free(w), free(b), free(out_ref), free(mean_ref), free(rstd_ref);
    return finish();
}
