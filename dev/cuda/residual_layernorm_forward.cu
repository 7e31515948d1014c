/*
 * residual_layernorm_forward: the residual add of a transformer block and the LayerNorm that follows it,
 *   res = a + b                                   (N, C), the residual stream (kept for backward)
 *   out = (res - mean) * rstd * weight + bias      (N, C), with mean and rstd (N floats each)
 * Memory-bound: a and b read, res and out written (4 * N * C * 4 bytes at least, plus mean and rstd).
 *
 * versions
 *   1  the trainer's default: residual_forward (llmc/residual.h) then layernorm_forward (llmc/layernorm.h),
 *      two kernels; the LayerNorm reads res back from memory.
 *   2  the trainer's kernel with --fused-kernels 1 (llmc/layernorm.h residual_layernorm_forward_kernel):
 *      one warp per row, Pack128 loads (4 floats here, 8 bf16 in the BF16 trainer); the lane writes its
 *      part of res and reads it back for the statistics and the output (from L1/L2, not DRAM).
 *      Needs C % 4 == 0 and 16-byte aligned buffers.
 *
 * CPU reference: residual_forward_cpu then layernorm_forward_cpu (what the CPU target runs for both).
 * Tolerance: res 0 (one float add, exact on both sides); out, mean, rstd 1e-5 abs + 1e-4 rel (as
 * layernorm_forward.cu). Checked and timed at GPT-2 124M's training shape (B=16, T=1024, C=768), checked
 * at N=37, C=772 (ragged: C % 128 != 0).
 */
#include "common.cuh"
#include "../../llmc/layernorm.h"

static const int NV = 2;
static const char* version_names[NV + 1] = {"", "residual then layernorm, 2 kernels (llmc)",
                                            "fused one pass, Pack128 (--fused-kernels)"};

static void run_version(int v, float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                        const float* w, const float* bias, int N, int C) {
    switch (v) {
        case 1:
            residual_forward(res, a, b, (size_t)N * C);
            layernorm_forward(out, mean, rstd, res, w, bias, N, C, 0);
            break;
        case 2:
            if (!layernorm_fused_ok(res, out, a, b, w, C) || !aligned16(bias)) fatal("version 2 needs C %% 4 == 0 and aligned buffers");
            residual_layernorm_forward_kernel<<<ceil_div(N, LN_THREADS / 32), LN_THREADS, 0, main_stream>>>(res, out, mean, rstd, a, b,
                                                                                                             w, bias, N, C);
            break;
    }
    cudaCheck(cudaGetLastError());
}

static void run_shape(int selected, int N, int C, bool timed) {
    size_t n = (size_t)N * C;
    printf("N=%d C=%d%s\n", N, C, timed ? "" : " (check only)");
    float* a = make_random_normal(n, 71, 1.0f);
    float* b = make_random_normal(n, 72, 0.5f);
    for (int r = 0; r < N; r++)  // rows with different means and scales, as real activations have
        for (int c = 0; c < C; c++) a[(size_t)r * C + c] = a[(size_t)r * C + c] * (0.5f + (r % 7)) + 0.1f * (r % 5);
    float* w = make_random_uniform(C, 73, 0.5f, 1.5f);
    float* bias = make_random_uniform(C, 74, -0.5f, 0.5f);
    float *res_ref = (float*)malloc_check(n * sizeof(float)), *out_ref = (float*)malloc_check(n * sizeof(float));
    float *mean_ref = (float*)malloc_check(N * sizeof(float)), *rstd_ref = (float*)malloc_check(N * sizeof(float));
    residual_forward_cpu(res_ref, a, b, n);
    layernorm_forward_cpu(out_ref, mean_ref, rstd_ref, res_ref, w, bias, N, C);

    float *d_a = dev_upload(a, n), *d_b = dev_upload(b, n), *d_w = dev_upload(w, C), *d_bias = dev_upload(bias, C);
    float *d_res = dev_alloc<float>(n), *d_out = dev_alloc<float>(n), *d_mean = dev_alloc<float>(N), *d_rstd = dev_alloc<float>(N);
    const double bytes = 4.0 * n * sizeof(float) + 2.0 * N * sizeof(float);
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        cudaCheck(cudaMemset(d_res, 0xff, n * sizeof(float)));
        cudaCheck(cudaMemset(d_out, 0xff, n * sizeof(float)));
        cudaCheck(cudaMemset(d_mean, 0xff, N * sizeof(float)));
        cudaCheck(cudaMemset(d_rstd, 0xff, N * sizeof(float)));
        run_version(v, d_res, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C);
        check_close("res", d_res, res_ref, n, 0.0, 0.0);
        check_close("out", d_out, out_ref, n, 1e-5, 1e-4);
        check_close("mean", d_mean, mean_ref, N, 1e-5, 1e-4);
        check_close("rstd", d_rstd, rstd_ref, N, 1e-5, 1e-4);
        if (!timed) continue;
        float ms = benchmark_ms([&] { run_version(v, d_res, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C); });
        print_bandwidth("residual_layernorm_forward", ms, bytes);
    }
    cudaCheck(cudaFree(d_a)), cudaCheck(cudaFree(d_b)), cudaCheck(cudaFree(d_w)), cudaCheck(cudaFree(d_bias));
    cudaCheck(cudaFree(d_res)), cudaCheck(cudaFree(d_out)), cudaCheck(cudaFree(d_mean)), cudaCheck(cudaFree(d_rstd));
    free(a), free(b), free(w), free(bias), free(res_ref), free(out_ref), free(mean_ref), free(rstd_ref);
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    printf("residual_layernorm_forward\n");
    bench_init();
    run_shape(selected, 16 * 1024, 768, true);  // GPT-2 124M, B=16 T=1024
    run_shape(selected, 37, 772, false);
    return finish();
}
