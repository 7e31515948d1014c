/*
 * encoder_forward: out[b,t,:] = wte[inp[b,t], :] + wpe[t, :] (token + position embedding), (B,T,C).
 * Memory-bound gather: one wte row and one wpe row read per position, one row written.
 *
 * versions
 *   1  the project's kernel (llmc/encoder.h): one thread per output element; handles the
 *      vocab-parallel case (ids outside this rank's rows give zero), as all versions here do.
 *   2  float4: one thread per 4 channels, 16-byte loads of wte and wpe and 16-byte stores.
 *   3  float4, one warp per position: the token id is read once per row by lane 0 and broadcast, wte
 *      and wpe through the read-only path, out written with streaming stores.
 * Versions 2 and 3 need C % 4 == 0.
 *
 * CPU reference: encoder_forward_cpu (llmc/encoder.h), vocab_start 0, vocab_rows Vp. Exact up to the
 * rounding of one addition: tolerance 1e-6.
 * Bytes counted: out written, the B*T wte rows read, wpe (T rows, the rest hits L2) and the ids.
 */
#include "common.cuh"
#include "../../llmc/encoder.h"

__global__ void encoder_forward_float4_kernel(float* out, const int* inp, const float* wte, const float* wpe, int B,
                                              int T, int C, int vocab_start, int vocab_rows) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // float4 index in out
    int C4 = C / 4;
    if (idx >= (size_t)B * T * C4) return;
    int bt = (int)(idx / C4), c = 4 * (int)(idx % C4), t = bt % T;
    int row = inp[bt] - vocab_start;
    float4 w = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row >= 0 && row < vocab_rows) w = *(const float4*)(wte + (size_t)row * C + c);
    if (wpe != NULL) {
        float4 p = *(const float4*)(wpe + (size_t)t * C + c);
        w.x += p.x, w.y += p.y, w.z += p.z, w.w += p.w;
    }
    *(float4*)(out + (size_t)bt * C + c) = w;
}

__global__ void encoder_forward_warp_kernel(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                                            int C, int vocab_start, int vocab_rows) {
    int bt = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (bt >= B * T) return;
    int id = 0;
    if (lane == 0) id = inp[bt];
    int row = __shfl_sync(0xffffffff, id, 0) - vocab_start;
    bool has_row = row >= 0 && row < vocab_rows;
    int t = bt % T, C4 = C / 4;
    const float4* w4 = (const float4*)(wte + (size_t)(has_row ? row : 0) * C);
    const float4* p4 = wpe != NULL ? (const float4*)(wpe + (size_t)t * C) : NULL;
    float4* o4 = (float4*)(out + (size_t)bt * C);
    for (int i = lane; i < C4; i += 32) {
        float4 w = has_row ? __ldg(w4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (wpe != NULL) {
            float4 p = __ldg(p4 + i);
            w.x += p.x, w.y += p.y, w.z += p.z, w.w += p.w;
        }
        __stcs(o4 + i, w);
    }
}

static const int NV = 3;
static const char* version_names[NV + 1] = {"", "one thread per element (llmc)", "float4: one thread per 4 channels",
                                            "float4: warp per position, streaming stores"};

static void run_version(int v, float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C, int Vp) {
    switch (v) {
        case 1: encoder_forward(out, inp, wte, wpe, B, T, C, 0, Vp); break;
        case 2:
            encoder_forward_float4_kernel<<<grid_for((size_t)B * T * C / 4, 256), 256, 0, main_stream>>>(out, inp, wte, wpe, B, T, C, 0, Vp);
            break;
        case 3: encoder_forward_warp_kernel<<<ceil_div(B * T, 8), 256, 0, main_stream>>>(out, inp, wte, wpe, B, T, C, 0, Vp); break;
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = 8, T = 1024, C = 768, V = 50257, Vp = 50304;
    size_t n = (size_t)B * T * C;
    printf("encoder_forward: B=%d T=%d C=%d V=%d (padded %d)\n", B, T, C, V, Vp);
    if (C % 4 != 0) fatal("versions 2 and 3 need C %% 4 == 0");
    bench_init();

    int* inp = make_random_ints((size_t)B * T, 41, V);
    float* wte = make_random_normal((size_t)Vp * C, 42, 0.02f);
    float* wpe = make_random_normal((size_t)T * C, 43, 0.01f);
    float* ref = (float*)malloc_check(n * sizeof(float));
    encoder_forward_cpu(ref, inp, wte, wpe, B, T, C, 0, Vp);

    int* d_inp = dev_upload(inp, (size_t)B * T);
    float *d_wte = dev_upload(wte, (size_t)Vp * C), *d_wpe = dev_upload(wpe, (size_t)T * C), *d_out = dev_alloc<float>(n);
    const double bytes = (2.0 * n + (double)T * C) * sizeof(float) + (double)B * T * sizeof(int);
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        cudaCheck(cudaMemset(d_out, 0xff, n * sizeof(float)));
        run_version(v, d_out, d_inp, d_wte, d_wpe, B, T, C, Vp);
        check_close("out", d_out, ref, n, 1e-6, 1e-6);
        float ms = benchmark_ms([&] { run_version(v, d_out, d_inp, d_wte, d_wpe, B, T, C, Vp); });
        print_bandwidth("encoder_forward", ms, bytes);
    }
    cudaCheck(cudaFree(d_inp)), cudaCheck(cudaFree(d_wte)), cudaCheck(cudaFree(d_wpe)), cudaCheck(cudaFree(d_out));
    free(inp), free(wte), free(wpe), free(ref);
    return finish();
}
