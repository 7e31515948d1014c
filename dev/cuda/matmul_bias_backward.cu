/*
 * matmul_bias_backward: dbias (OC) += column sums of dout (N, OC), the bias gradient of a linear layer
 * (N = B*T rows). Memory-bound: one read of dout, N * OC * 4 bytes.
 *
 * versions
 *   1  naive: one thread per column, looping over all N rows. Neighbouring threads read neighbouring
 *      columns, so loads are coalesced, but there are only OC threads (768 to 3072): far too few to
 *      keep the memory system busy.
 *   2  the project's kernels (llmc/matmul.h): blocks of 32 columns x 8 row-lanes, 64 chunks of rows
 *      each summed into a partial row, then one thread per column adds the 64 partials in order.
 *   3  version 2 with float4: blocks of 32 threads x 8 row-lanes cover 128 columns, 16-byte loads, and
 *      128 row chunks so that even OC = 768 gives 768 blocks. Deterministic, like version 2.
 *   4  the trainer's kernels with --fused-kernels 1 (llmc/matmul.h): bias_backward_partial_vec_kernel with
 *      Pack128 loads (4 floats here, 8 bf16 in the BF16 trainer), 128 row chunks, the same finishing
 *      kernel as version 2.
 * Versions 3 and 4 need OC % 4 == 0.
 *
 * CPU reference: a plain loop summing each column in double (llmc's bias_backward_cpu sums in float).
 * dbias starts from random values. With --fused-kernels the trainer takes qkv's, attproj's and fcproj's sums
 * from cuBLASLt's BGRADB epilogue of the weight-gradient product instead (llmc/matmul.h), where cuBLASLt
 * offers it, and fc's from version 4.
 * Tolerance 1e-3 abs + 1e-4 rel (sums of 8192 values of size ~1, in float on the GPU).
 * Checked and timed for the OC of GPT-2 124M's linear layers: 768 (attproj, fcproj), 2304 (qkv),
 * 3072 (fc).
 */
#include "common.cuh"
#include "../../llmc/matmul.h"

#define MB3_CHUNKS 128

static void bias_backward_double(float* dbias, const float* dout, int N, int OC) {
#pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        double s = 0.0;
        for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
        dbias[o] += (float)s;
    }
}

__global__ void bias_backward_naive_kernel(float* dbias, const float* dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float s = 0.0f;
    for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
    dbias[o] += s;
}

// grid (OC/128, MB3_CHUNKS), block (32, 8): thread (x, y) sums columns 4*(blockIdx.x*32 + x) .. +3 over
// rows blockIdx.y*8 + y, stepping by MB3_CHUNKS*8
__global__ void bias_backward_float4_partial_kernel(float* partial, const float* dout, int N, int OC) {
    __shared__ float4 s[8][32];
    int c4 = blockIdx.x * 32 + threadIdx.x;  // float4 column index
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c4 < OC / 4) {
        for (int n = blockIdx.y * 8 + threadIdx.y; n < N; n += gridDim.y * 8) {
            float4 d = *(const float4*)(dout + (size_t)n * OC + 4 * c4);
            sum.x += d.x, sum.y += d.y, sum.z += d.z, sum.w += d.w;
        }
    }
    s[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c4 < OC / 4) {
        for (int i = 1; i < 8; i++) {
            float4 t = s[i][threadIdx.x];
            sum.x += t.x, sum.y += t.y, sum.z += t.z, sum.w += t.w;
        }
        *(float4*)(partial + (size_t)blockIdx.y * OC + 4 * c4) = sum;
    }
}

__global__ void bias_backward_float4_finish_kernel(float* dbias, const float* partial, int chunks, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float s = 0.0f;
    for (int i = 0; i < chunks; i++) s += partial[(size_t)i * OC + o];
    dbias[o] += s;
}

static const int NV = 4;
static const char* version_names[NV + 1] = {"", "naive: one thread per column", "32x8 blocks, 64 row chunks (llmc)",
                                            "float4: 128 row chunks", "Pack128, 128 row chunks (--fused-kernels)"};

static void run_version(int v, float* dbias, float* partial, const float* dout, int N, int OC) {
    const dim3 lanes(32, BIAS_ROW_LANES);  // the llmc kernels' blocks, as the trainer launches them
    const int finish = BIAS_FINISH_THREADS;
    switch (v) {
        case 1: bias_backward_naive_kernel<<<ceil_div(OC, 128), 128, 0, main_stream>>>(dbias, dout, N, OC); break;
        case 2:
            bias_backward_partial_kernel<<<dim3(ceil_div(OC, 32), BIAS_CHUNKS), lanes, 0, main_stream>>>(partial, dout, N, OC);
            cudaCheck(cudaGetLastError());
            bias_backward_finish_kernel<<<ceil_div(OC, finish), finish, 0, main_stream>>>(dbias, partial, BIAS_CHUNKS, OC);
            break;
        case 3:
            bias_backward_float4_partial_kernel<<<dim3(ceil_div(OC / 4, 32), MB3_CHUNKS), dim3(32, 8), 0, main_stream>>>(partial, dout, N, OC);
            cudaCheck(cudaGetLastError());
            bias_backward_float4_finish_kernel<<<ceil_div(OC, 256), 256, 0, main_stream>>>(dbias, partial, MB3_CHUNKS, OC);
            break;
        case 4:
            if (OC % Pack128::size != 0 || !aligned16(dout)) fatal("version 4 needs OC %% 4 == 0 and an aligned dout");
            bias_backward_partial_vec_kernel<<<dim3(ceil_div(OC / Pack128::size, 32), BIAS_VEC_CHUNKS), lanes, 0, main_stream>>>(
                partial, dout, N, OC);
            cudaCheck(cudaGetLastError());
            bias_backward_finish_kernel<<<ceil_div(OC, finish), finish, 0, main_stream>>>(dbias, partial, BIAS_VEC_CHUNKS, OC);
            break;
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = 8, T = 1024, N = B * T;
    const int OCs[3] = {768, 2304, 3072};
    printf("matmul_bias_backward: N=B*T=%d\n", N);
    bench_init();
    int max_chunks = BIAS_CHUNKS > MB3_CHUNKS ? BIAS_CHUNKS : MB3_CHUNKS;
    if (BIAS_VEC_CHUNKS > max_chunks) max_chunks = BIAS_VEC_CHUNKS;
    for (int k = 0; k < 3; k++) {
        int OC = OCs[k];
        size_t n = (size_t)N * OC;
        printf("OC=%d\n", OC);
        if (OC % 4 != 0) fatal("version 3 needs OC %% 4 == 0");
        float* dout = make_random_normal(n, 91 + k, 1.0f);
        float* dbias0 = make_random_uniform(OC, 95 + k, -1.0f, 1.0f);
        float* ref = host_copy(dbias0, OC);
        bias_backward_double(ref, dout, N, OC);
        float* d_dout = dev_upload(dout, n);
        float* d_dbias = dev_alloc<float>(OC);
        float* d_partial = dev_alloc<float>((size_t)max_chunks * OC);
        for (int v = 1; v <= NV; v++) {
            if (!version_selected(selected, v)) continue;
            printf("version %d: %s\n", v, version_names[v]);
            dev_set(d_dbias, dbias0, OC);
            run_version(v, d_dbias, d_partial, d_dout, N, OC);
            check_close("dbias", d_dbias, ref, OC, 1e-3, 1e-4);
            float ms = benchmark_ms([&] { run_version(v, d_dbias, d_partial, d_dout, N, OC); });
            print_bandwidth("matmul_bias_backward", ms, (double)n * sizeof(float));
        }
        cudaCheck(cudaFree(d_dout)), cudaCheck(cudaFree(d_dbias)), cudaCheck(cudaFree(d_partial));
        free(dout), free(dbias0), free(ref);
    }
    return finish();
}
