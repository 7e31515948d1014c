/*
 * layernorm_backward: with norm = (x - mean) * rstd and g = dout * weight, per row of C channels,
 *   dinp    += rstd * (g - avg(g) - norm * avg(g * norm))      (+=: the residual stream's gradient)
 *   dweight += sum over rows of dout * norm,   dbias += sum over rows of dout
 * Memory-bound: dout and inp read, dinp read and written (4 * N * C * 4 bytes at least).
 *
 * versions
 *   1  the project's kernels (llmc/layernorm.h): a warp per row for dinp, then a separate column-sum
 *      kernel for dweight/dbias that reads dout and inp a second time, and a finishing kernel over 64
 *      partial rows. Deterministic.
 *   2  fused: one pass. A warp per row computes dinp with the row (dout, inp: C/128 float4 per lane)
 *      in registers, and keeps running dweight/dbias sums for its lane's channels in registers across
 *      all the rows it visits (grid-strided over rows). At the end the 8 warps of a block add their
 *      sums into shared memory one warp after the other (fixed order), the block writes one partial
 *      row of 2C floats, and a finishing kernel adds the 256 partial rows in order. dout and inp are
 *      read once; still deterministic, no atomics. Needs C % 4 == 0 and C <= 1024.
 *
 *   3  the trainer's kernels with --fused-kernels 1 (llmc/layernorm.h): the same one-pass idea for any C
 *      that is a multiple of the 16-byte pack (Pack128: 4 floats here, 8 bf16 in the BF16 trainer).
 *      4 warps per block; each warp keeps its dweight/dbias sums in its own fp32 copy in shared memory
 *      (32*C bytes per block, opted in above 48 KiB), the block adds its warps' copies in order into
 *      one of 512 partial rows, and a finishing kernel adds those: 8 warps per 32 columns, each warp a
 *      strided eighth of the rows, the warps' sums in warp order. Before, the trainer finished with
 *      version 1's kernel (one thread per column) over the 512 rows: ~21 us a call on an H200 and an H100
 *      (Nsight Compute, in training); on an H100 this version took 0.106 ms at the timed shape, and 0.120
 *      with that finish. The row is read twice (the second time from L1/L2). Deterministic, no atomics.
 * Checked at GPT-2 124M's training shape (B=16, T=1024, C=768; timed there), and, check only, at
 * N=37, C=772 (ragged) and N=2000, C=1600 (GPT-2 1.5B's width; version 2 does not go that wide).
 *
 * CPU reference: layernorm_backward_cpu (llmc/layernorm.h), with dinp, dweight, dbias starting from
 * random values (they accumulate). Tolerance: dinp 1e-4 abs + 1e-4 rel; dweight and dbias are sums over
 * up to N = 16384 rows summed in float in a different order on the CPU: 1e-3 abs + 1e-3 rel.
 */
#include "common.cuh"
#include "../../llmc/layernorm.h"

#define LN2_BLOCKS 256   // partial rows of version 2 (fixed, so the sum order does not depend on the GPU)
#define LN2_WARPS 8

template <int VPL>
__global__ void __launch_bounds__(32 * LN2_WARPS) layernorm_backward_fused_kernel(
    float* dinp, float* partial, const float* dout, const float* inp, const float* weight, const float* mean,
    const float* rstd, int N, int C) {
    extern __shared__ float sh[];  // [2C]: dweight | dbias of this block
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int C4 = C / 4;
    const float4* w4 = (const float4*)weight;
    float4 dw[VPL], db[VPL];
#pragma unroll
    for (int k = 0; k < VPL; k++) dw[k] = db[k] = make_float4(0.f, 0.f, 0.f, 0.f);

    for (int row = blockIdx.x * LN2_WARPS + warp; row < N; row += gridDim.x * LN2_WARPS) {
        const float4* d4 = (const float4*)(dout + (size_t)row * C);
        const float4* x4 = (const float4*)(inp + (size_t)row * C);
        float4* dx4 = (float4*)(dinp + (size_t)row * C);
        float m = mean[row], s = rstd[row];
        float4 d[VPL], nrm[VPL], g[VPL];
        float g_sum = 0.0f, gn_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < VPL; k++) {
            int i = lane + 32 * k;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f), w = x;
            d[k] = x;
            if (i < C4) d[k] = d4[i], x = x4[i], w = __ldg(w4 + i);
            nrm[k] = make_float4((x.x - m) * s, (x.y - m) * s, (x.z - m) * s, (x.w - m) * s);
            g[k] = make_float4(d[k].x * w.x, d[k].y * w.y, d[k].z * w.z, d[k].w * w.w);
            g_sum += (g[k].x + g[k].y) + (g[k].z + g[k].w);
            gn_sum += (g[k].x * nrm[k].x + g[k].y * nrm[k].y) + (g[k].z * nrm[k].z + g[k].w * nrm[k].w);
        }
        float g_mean = warp_sum(g_sum) / C, gn_mean = warp_sum(gn_sum) / C;
#pragma unroll
        for (int k = 0; k < VPL; k++) {
            int i = lane + 32 * k;
            if (i < C4) {
                float4 dx = dx4[i];
                dx.x += (g[k].x - g_mean - nrm[k].x * gn_mean) * s;
                dx.y += (g[k].y - g_mean - nrm[k].y * gn_mean) * s;
                dx.z += (g[k].z - g_mean - nrm[k].z * gn_mean) * s;
                dx.w += (g[k].w - g_mean - nrm[k].w * gn_mean) * s;
                dx4[i] = dx;
                dw[k].x += d[k].x * nrm[k].x, dw[k].y += d[k].y * nrm[k].y, dw[k].z += d[k].z * nrm[k].z, dw[k].w += d[k].w * nrm[k].w;
                db[k].x += d[k].x, db[k].y += d[k].y, db[k].z += d[k].z, db[k].w += d[k].w;
            }
        }
    }

    // block sum, warp after warp (fixed order)
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) sh[c] = 0.0f;
    for (int w = 0; w < LN2_WARPS; w++) {
        __syncthreads();
        if (warp == w) {
#pragma unroll
            for (int k = 0; k < VPL; k++) {
                int i = lane + 32 * k;
                if (i < C4) {
                    float* pw = sh + 4 * i;
                    float* pb = sh + C + 4 * i;
                    pw[0] += dw[k].x, pw[1] += dw[k].y, pw[2] += dw[k].z, pw[3] += dw[k].w;
                    pb[0] += db[k].x, pb[1] += db[k].y, pb[2] += db[k].z, pb[3] += db[k].w;
                }
            }
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) partial[(size_t)blockIdx.x * 2 * C + c] = sh[c];
}

// dweight[c] += sum of partial[i][c], dbias[c] += sum of partial[i][C + c], i in order
__global__ void layernorm_backward_fused_finish_kernel(float* dweight, float* dbias, const float* partial, int blocks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int i = 0; i < blocks; i++) {
        dw += partial[(size_t)i * 2 * C + c];
        db += partial[(size_t)i * 2 * C + C + c];
    }
    dweight[c] += dw;
    dbias[c] += db;
}

template <int VPL>
static void launch_fused(float* dinp, float* partial, const float* dout, const float* inp, const float* w,
                         const float* mean, const float* rstd, int N, int C) {
    int blocks = min(LN2_BLOCKS, ceil_div(N, LN2_WARPS));
    layernorm_backward_fused_kernel<VPL><<<blocks, 32 * LN2_WARPS, 2 * C * sizeof(float), main_stream>>>(
        dinp, partial, dout, inp, w, mean, rstd, N, C);
}

static Scratch trainer_scratch = {NULL, 0};  // the trainer's launcher's partial sums (its model owns one)

static const int NV = 3;
static const char* version_names[NV + 1] = {"", "3 kernels, inputs read twice (llmc)",
                                            "fused one pass, sums in registers",
                                            "fused one pass, sums in shared (--fused-kernels)"};

// runs version v; false when it cannot run at this shape (then there is nothing to check)
static bool run_version(int v, float* dinp, float* dw, float* db, float* partial, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
    switch (v) {
        case 1: layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, &trainer_scratch, 0); break;
        case 3:  // the trainer's kernels under --fused-kernels 1
            if (!layernorm_fused_ok(dinp, dout, inp, w, NULL, C)) fatal("version 3 needs C %% 4 == 0 and aligned buffers");
            layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, &trainer_scratch, 1);
            break;
        case 2: {
            if (C % 4 != 0 || C > 1024) {
                printf("  (version 2 skipped: needs C %% 4 == 0 and C <= 1024)\n");
                return false;
            }
            switch (ceil_div(C, 128)) {
                case 1: launch_fused<1>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                case 2: launch_fused<2>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                case 3: launch_fused<3>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                case 4: launch_fused<4>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                case 5: launch_fused<5>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                case 6: launch_fused<6>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                case 7: launch_fused<7>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
                default: launch_fused<8>(dinp, partial, dout, inp, w, mean, rstd, N, C); break;
            }
            cudaCheck(cudaGetLastError());
            int blocks = min(LN2_BLOCKS, ceil_div(N, LN2_WARPS));
            layernorm_backward_fused_finish_kernel<<<ceil_div(C, 256), 256, 0, main_stream>>>(dw, db, partial, blocks, C);
            break;
        }
    }
    cudaCheck(cudaGetLastError());
    return true;
}

// Checks every selected version at (N, C) against the CPU reference; times them if `timed`.
static void run_shape(int selected, int N, int C, bool timed) {
    size_t n = (size_t)N * C;
    printf("N=%d C=%d%s\n", N, C, timed ? "" : " (check only)");
    float* inp = make_random_normal(n, 31, 1.0f);
    float* w = make_random_uniform(C, 32, 0.5f, 1.5f);
    float* b = make_random_uniform(C, 33, -0.5f, 0.5f);
    float* dout = make_random_normal(n, 34, 1.0f);
    float* dinp0 = make_random_uniform(n, 35, -1.0f, 1.0f);
    float* dw0 = make_random_uniform(C, 36, -1.0f, 1.0f);
    float* db0 = make_random_uniform(C, 37, -1.0f, 1.0f);
    float *out = (float*)malloc_check(n * sizeof(float)), *mean = (float*)malloc_check(N * sizeof(float)),
          *rstd = (float*)malloc_check(N * sizeof(float));
    layernorm_forward_cpu(out, mean, rstd, inp, w, b, N, C);
    float *dinp_ref = host_copy(dinp0, n), *dw_ref = host_copy(dw0, C), *db_ref = host_copy(db0, C);
    layernorm_backward_cpu(dinp_ref, dw_ref, db_ref, dout, inp, w, mean, rstd, N, C);

    float *d_inp = dev_upload(inp, n), *d_w = dev_upload(w, C), *d_dout = dev_upload(dout, n);
    float *d_mean = dev_upload(mean, N), *d_rstd = dev_upload(rstd, N);
    float *d_dinp = dev_alloc<float>(n), *d_dw = dev_alloc<float>(C), *d_db = dev_alloc<float>(C);
    float* d_partial = dev_alloc<float>((size_t)LN2_BLOCKS * 2 * C);
    const double bytes = 4.0 * n * sizeof(float) + 2.0 * N * sizeof(float);
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        dev_set(d_dinp, dinp0, n), dev_set(d_dw, dw0, C), dev_set(d_db, db0, C);
        if (!run_version(v, d_dinp, d_dw, d_db, d_partial, d_dout, d_inp, d_w, d_mean, d_rstd, N, C)) continue;
        check_close("dinp", d_dinp, dinp_ref, n, 1e-4, 1e-4);
        check_close("dweight", d_dw, dw_ref, C, 1e-3, 1e-3);
        check_close("dbias", d_db, db_ref, C, 1e-3, 1e-3);
        if (!timed) continue;
        float ms = benchmark_ms([&] { run_version(v, d_dinp, d_dw, d_db, d_partial, d_dout, d_inp, d_w, d_mean, d_rstd, N, C); });
        print_bandwidth("layernorm_backward", ms, bytes);
    }
    cudaCheck(cudaFree(d_inp)), cudaCheck(cudaFree(d_w)), cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_mean)), cudaCheck(cudaFree(d_rstd)), cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_dw)), cudaCheck(cudaFree(d_db)), cudaCheck(cudaFree(d_partial));
    scratch_free(&trainer_scratch);
    free(inp), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0), free(out), free(mean), free(rstd);
    free(dinp_ref), free(dw_ref), free(db_ref);
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    printf("layernorm_backward\n");
    bench_init();
    run_shape(selected, 16 * 1024, 768, true);  // GPT-2 124M, B=16 T=1024
    run_shape(selected, 37, 772, false);        // odd: fewer rows than warps of one grid, C % 128 != 0
    run_shape(selected, 2000, 1600, false);     // GPT-2 1.5B's C: the fused kernel needs > 48 KiB shared
    return finish();
}
