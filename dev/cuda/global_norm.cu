/*
 * global_norm: the sum of squares of all gradients (the square of the L2 norm that gradient clipping
 * needs), over n floats. Memory-bound: one read of 4 bytes per element.
 *
 * versions
 *   1  the project's code (llmc/global_norm.h): 1024 blocks each sum a grid-strided share into a float
 *      partial, the 1024 partials are copied to the host and added there in double. The time includes
 *      that synchronous copy.
 *   2  float4 loads, the same 1024 float partials, then a second one-block kernel adds the partials in
 *      a fixed order in double on the device; the result stays on the device (one double, read after
 *      the timing), so the step needs no synchronization. Deterministic.
 *   3  the trainer's --fused-kernels step (llmc/global_norm.h norm_parts_sum_on_device): the parameters
 *      as 148 tensors of uneven sizes in two groups (as the replicated and the TP-split ones), one batched
 *      launch of block partials, then norm_group_sums_kernel adds them in double, per range and then per
 *      group, on the device (two floats; no copy, no wait). Besides the reference, each group's sum must
 *      equal the host path's (norm_parts_sum: the same partials copied over and added in double in the
 *      same order) rounded to float, bit for bit.
 *
 * CPU reference: sum_squares_cpu (llmc/global_norm.h, in double). Tolerance 1e-5 relative (the GPU
 * sums in float inside each block).
 */
#include "common.cuh"
#include "../../llmc/global_norm.h"

#define GN2_BLOCKS 1024
#define GN2_THREADS 256

__global__ void __launch_bounds__(GN2_THREADS) sum_squares_float4_kernel(float* partial, const float* x, size_t n) {
    __shared__ float s_warp[GN2_THREADS / 32];
    size_t n4 = n / 4;
    const float4* x4 = (const float4*)x;
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = x4[i];
        s += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
    }
    if (blockIdx.x == 0 && threadIdx.x < n % 4) {
        float v = x[4 * n4 + threadIdx.x];
        s += v * v;
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < GN2_THREADS / 32; w++) total += s_warp[w];
        partial[blockIdx.x] = total;
    }
}

// one block of 32 threads: lane l adds partials l, l+32, ... in double, then a fixed shuffle tree
__global__ void sum_partials_kernel(double* out, const float* partial, int count) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += 32) s += (double)partial[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
    if (threadIdx.x == 0) *out = s;
}

static const int NV = 3;
static const char* version_names[NV + 1] = {"", "float partials summed on the host (llmc)",
                                            "float4: partials summed in double on device",
                                            "148 tensors in two groups, group sums on the device (llmc step)"};

// version 3: the n floats at x as 148 ranges of uneven sizes (0.5, 1, 1.5 x the mean), alternately in
// group 0 and 1; ref[g] = the CPU reference's sum of squares of group g
static const int RANGES = 148;
static void norm_ranges(NormParts* parts, const float* d_x, const float* x, size_t n, double ref[2]) {
    norm_parts_init(parts, RANGES);
    ref[0] = ref[1] = 0.0;
    size_t start = 0, avg = n / RANGES;
    for (int j = 0; j < RANGES; j++) {
        size_t len = j == RANGES - 1 ? n - start : avg / 2 + avg * (j % 3) / 2;
        norm_parts_add(parts, d_x + start, len, j % 2);
        ref[j % 2] += sum_squares_cpu(x + start, len);
        start += len;
    }
    norm_parts_finish(parts);
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const size_t n = 124475904;  // GPT-2 124M parameters (vocabulary padded to 50304)
    printf("global_norm: %zu floats\n", n);
    bench_init();

    float* x = make_random_uniform(n, 81, -1.0f, 1.0f);
    double ref = sum_squares_cpu(x, n);
    float* d_x = dev_upload(x, n);
    float* d_partial = dev_alloc<float>(GN2_BLOCKS);
    double* d_result = dev_alloc<double>(1);
    const double bytes = (double)n * sizeof(float);
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        if (v == 1) {
            double got = 0.0;
            Scratch scratch = {NULL, 0};  // the launcher's partial sums (the trainer's model owns one)
            auto run = [&] { got = sum_squares(d_x, n, &scratch); };
            run();
            check_scalar("sum_sq", got, ref, 1e-5);
            float ms = benchmark_ms(run);
            print_bandwidth("global_norm", ms, bytes);
            scratch_free(&scratch);
        } else if (v == 3) {
            NormParts parts;
            double ref_groups[2], host_groups[2];
            norm_ranges(&parts, d_x, x, n, ref_groups);
            Scratch scratch = {NULL, 0};
            float* d_sums = dev_alloc<float>(2);
            norm_parts_sum(&parts, host_groups, &scratch, 1);  // the host path, for its bits
            auto run = [&] { norm_parts_sum_on_device(&parts, d_sums, &scratch); };
            run();
            float got[2];
            dev_download(got, d_sums, 2);
            for (int g = 0; g < 2; g++) {
                char what[64];
                snprintf(what, sizeof(what), "group %d sum_sq", g);
                check_scalar(what, got[g], ref_groups[g], 1e-5);
                snprintf(what, sizeof(what), "group %d = host path's, rounded", g);
                check_scalar(what, got[g], (float)host_groups[g], 0.0);
            }
            float ms = benchmark_ms(run);
            print_bandwidth("global_norm", ms, bytes);
            cudaCheck(cudaFree(d_sums));
            scratch_free(&scratch);
            norm_parts_free(&parts);
        } else {
            auto run = [&] {
                sum_squares_float4_kernel<<<GN2_BLOCKS, GN2_THREADS, 0, main_stream>>>(d_partial, d_x, n);
                cudaCheck(cudaGetLastError());
                sum_partials_kernel<<<1, 32, 0, main_stream>>>(d_result, d_partial, GN2_BLOCKS);
                cudaCheck(cudaGetLastError());
            };
            cudaCheck(cudaMemset(d_result, 0xff, sizeof(double)));
            run();
            double got = 0.0;
            cudaCheck(cudaDeviceSynchronize());
            dev_download(&got, d_result, 1);
            check_scalar("sum_sq", got, ref, 1e-5);
            float ms = benchmark_ms(run);
            print_bandwidth("global_norm", ms, bytes);
        }
    }
    cudaCheck(cudaFree(d_x)), cudaCheck(cudaFree(d_partial)), cudaCheck(cudaFree(d_result));
    free(x);
    return finish();
}
