/*
 * gelu_bias_backward: the MLP's backward through GELU, after fcproj's input gradient (llmc/matmul.h
 * matmul_backward_gelu_input):
 *   dinp (N, OC) = dout * GELU'(inp)             (in place over dout in the trainer)
 *   dbias (OC)  += column sums of dinp            (fc's bias gradient, of the values as rounded)
 * Memory-bound: dout and inp read, dinp written: 3 * N * OC * 4 bytes at least (here, fp32).
 *
 * versions
 *   1  the two --fused-kernels kernels one after the other, as the trainer ran them before version 2 (and
 *      still does where rows are not 16-byte): gelu_backward's gelu_backward_vec_kernel (llmc/gelu.h), then
 *      bias_backward_gpu's bias_backward_partial_vec_kernel and finish (llmc/matmul.h), reading dinp back.
 *   2  the trainer's kernel with --fused-kernels 1 (llmc/matmul.h gelu_bias_backward_gpu): one pass, each
 *      thread's 16 bytes of dinp written and added to its column sums in version 1's row order, then the
 *      same finishing kernel. Its dinp and dbias must be version 1's bits exactly: that is checked too,
 *      and once more in place (dinp = dout, as the trainer calls it). On an H100: the same bits, 0.117 ms
 *      against version 1's 0.155.
 * Both need OC % 4 == 0 here (16-byte rows).
 *
 * CPU reference: gelu_backward_cpu, then the columns of its result summed in double; dbias starts from
 * random values. The inputs are gelu_backward.cu's (inp uniform in [-4, 4], dout in [-1, 1]), and so are
 * the tolerances: dinp 1e-6 abs + 1e-5 rel (the same float formula, whose tanh may differ in the last bits;
 * the error grows with |dout|); dbias 1e-3 abs + 1e-4 rel (matmul_bias_backward.cu's: sums of N = 8192
 * values of size ~1 in float on the GPU).
 * Checked and timed at fc's shape in GPT-2 124M (B=8, T=1024, 4C = 3072); checked at N=1000, OC=776, where
 * the last block of columns is partly idle.
 */
#include "common.cuh"
#include "../../llmc/matmul.h"

static const int NV = 2;
static const char* version_names[NV + 1] = {"", "GELU's backward, then the bias gradient reading dinp back",
                                            "one pass (llmc --fused-kernels)"};

static Scratch trainer_scratch = {NULL, 0};  // the launchers' partial rows (the trainer's model owns one)

// each version through the trainer's launchers with --fused-kernels 1 (llmc/gelu.h, llmc/matmul.h)
static void run_version(int v, float* dinp, float* dbias, const float* inp, const float* dout, int N, int OC) {
    if (OC % Pack128::size != 0) fatal("both versions need OC %% 4 == 0");
    if (v == 1) {
        gelu_backward(dinp, inp, dout, (size_t)N * OC, 1);
        bias_backward_gpu(dbias, dinp, N, OC, &trainer_scratch, 1);
    } else {
        gelu_bias_backward_gpu(dinp, dbias, inp, dout, N, OC, &trainer_scratch, 1);
    }
    cudaCheck(cudaGetLastError());
}

static void run_shape(int selected, int N, int OC, bool timed, uint64_t seed) {
    size_t n = (size_t)N * OC;
    printf("N=%d OC=%d%s\n", N, OC, timed ? "" : " (checked, not timed)");
    float* inp = make_random_uniform(n, seed, -4.0f, 4.0f);
    float* dout = make_random_uniform(n, seed + 1, -1.0f, 1.0f);
    float* dbias0 = make_random_uniform(OC, seed + 2, -1.0f, 1.0f);
    float* dinp_ref = (float*)malloc_check(n * sizeof(float));
    gelu_backward_cpu(dinp_ref, inp, dout, n);
    float* dbias_ref = host_copy(dbias0, OC);
    for (int o = 0; o < OC; o++) {
        double s = 0.0;
        for (int i = 0; i < N; i++) s += dinp_ref[(size_t)i * OC + o];
        dbias_ref[o] += (float)s;
    }
    float *d_inp = dev_upload(inp, n), *d_dout = dev_upload(dout, n), *d_dinp = dev_alloc<float>(n);
    float* d_dbias = dev_alloc<float>(OC);
    float *v1_dinp = NULL, *v1_dbias = NULL;  // version 1's results, which version 2 must equal bit for bit
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        cudaCheck(cudaMemset(d_dinp, 0, n * sizeof(float)));
        dev_set(d_dbias, dbias0, OC);
        run_version(v, d_dinp, d_dbias, d_inp, d_dout, N, OC);
        check_close("dinp", d_dinp, dinp_ref, n, 1e-6, 1e-5);
        check_close("dbias", d_dbias, dbias_ref, OC, 1e-3, 1e-4);
        if (v == 1) {
            v1_dinp = (float*)malloc_check(n * sizeof(float)), v1_dbias = (float*)malloc_check(OC * sizeof(float));
            dev_download(v1_dinp, d_dinp, n), dev_download(v1_dbias, d_dbias, OC);
        } else if (v1_dinp != NULL) {
            check_close("dinp=v1", d_dinp, v1_dinp, n, 0.0, 0.0);
            check_close("dbias=v1", d_dbias, v1_dbias, OC, 0.0, 0.0);
            printf("  in place (dinp = dout):\n");
            cudaCheck(cudaMemcpy(d_dinp, d_dout, n * sizeof(float), cudaMemcpyDeviceToDevice));
            dev_set(d_dbias, dbias0, OC);
            run_version(v, d_dinp, d_dbias, d_inp, d_dinp, N, OC);
            check_close("dinp=v1", d_dinp, v1_dinp, n, 0.0, 0.0);
            check_close("dbias=v1", d_dbias, v1_dbias, OC, 0.0, 0.0);
        }
        if (timed)
            print_bandwidth("gelu_bias_backward", benchmark_ms([&] { run_version(v, d_dinp, d_dbias, d_inp, d_dout, N, OC); }),
                            3.0 * n * sizeof(float));
    }
    cudaCheck(cudaFree(d_inp)), cudaCheck(cudaFree(d_dout)), cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_dbias));
    free(inp), free(dout), free(dbias0), free(dinp_ref), free(dbias_ref), free(v1_dinp), free(v1_dbias);
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    printf("gelu_bias_backward\n");
    bench_init();
    run_shape(selected, 8 * 1024, 3072, true, 61);
    run_shape(selected, 1000, 776, false, 71);
    scratch_free(&trainer_scratch);
    return finish();
}
