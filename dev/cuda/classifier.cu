/*
 * classifier: fused softmax + cross-entropy + gradient over the logits (B*T, Vp), in place.
 *   losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]
 *   logits[n, i] <- (softmax(logits[n, :V])_i - [i == target]) * dloss  for i < V, 0 for V <= i < Vp
 * The probabilities are never stored. Memory-bound: at least one read and one write of the logits
 * (2 * N * Vp * 4 bytes; 3.3 GB at B*T = 8192, Vp = 50304); a second read of the row may come from L2.
 *
 * versions
 *   1  the project's kernel (llmc/classifier.h): one block of 512 threads per row, an online max/sum
 *      per thread over 4-byte loads, merged across the block; a second pass writes the gradient.
 *   2  the same scheme with float4 loads and stores (rows of Vp floats are 16-byte aligned when
 *      Vp % 4 == 0): the online max/sum folds 4 values per step (one rescale per float4 instead of
 *      per element), and the gradient pass reads and writes float4 with the last columns handled per
 *      element. 1024 threads per row.
 *   3  the trainer's kernel with --fused-kernels 1 (llmc/classifier.h classifier_vec_kernel): Pack128
 *      loads and stores (4 floats here, 8 bf16 in the BF16 trainer), each pack folded into the running
 *      (max, sum) with one rescale, lanes beyond V masked inside the pack; 1024 threads per row.
 *
 * CPU reference: classifier_forward_backward_cpu (llmc/classifier.h), dloss = 1/(B*T) as in training.
 * Tolerance: losses 1e-4 abs + 1e-5 rel; dlogits 1e-4 * dloss abs + 1e-4 rel (a gradient entry is at
 * most dloss in size).
 */
#include "common.cuh"
#include "../../llmc/classifier.h"

#define CLS2_THREADS 1024

// merge two (max, sum of exp(x - max)) pairs
__device__ static inline void online_merge(float& m, float& s, float m2, float s2) {
    float m_new = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - m_new));
    m = m_new;
}

__global__ void __launch_bounds__(CLS2_THREADS) classifier_float4_kernel(float* logits, float* losses, const int* targets,
                                                                         float dloss, int N, int V, int Vp) {
    __shared__ float s_max[32], s_sum[32];
    __shared__ float s_target;
    int n = blockIdx.x;
    float* x = logits + (size_t)n * Vp;
    const float4* x4 = (const float4*)x;
    int V4 = V / 4;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V4; i += blockDim.x) {
        float4 v = x4[i];
        float mv = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
        float m_new = fmaxf(m, mv);
        s = s * expf(m - m_new) + expf(v.x - m_new) + expf(v.y - m_new) + expf(v.z - m_new) + expf(v.w - m_new);
        m = m_new;
    }
    for (int i = 4 * V4 + threadIdx.x; i < V; i += blockDim.x) online_merge(m, s, x[i], 1.0f);  // V % 4 tail
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffff, m, off), s2 = __shfl_xor_sync(0xffffffff, s, off);
        online_merge(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) s_max[warp] = m, s_sum[warp] = s;
    int target = targets[n];
    if (threadIdx.x == 0) s_target = x[target];
    __syncthreads();  // also: x[target] is read before anything is overwritten
    float maxv = -INFINITY, sum = 0.0f;
    for (int w = 0; w < warps; w++) online_merge(maxv, sum, s_max[w], s_sum[w]);
    if (threadIdx.x == 0) losses[n] = logf(sum) + maxv - s_target;
    if (dloss == 0.0f) return;
    float inv = 1.0f / sum;
    float4* o4 = (float4*)x;
    for (int i = threadIdx.x; i < Vp / 4; i += blockDim.x) {
        float4 v = o4[i];
        int c = 4 * i;
        float g[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            g[k] = c + k < V ? (expf(g[k] - maxv) * inv - (c + k == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        o4[i] = make_float4(g[0], g[1], g[2], g[3]);
    }
}

static const int NV = 3;
static const char* version_names[NV + 1] = {"", "block of 512 per row, online softmax (llmc)",
                                            "float4: block of 1024 per row",
                                            "Pack128, block of 1024 per row (--fused-kernels)"};

static void run_version(int v, float* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp) {
    switch (v) {
        case 1: classifier_forward_backward(logits, losses, targets, dloss, N, V, Vp, 0); break;
        case 2: classifier_float4_kernel<<<N, CLS2_THREADS, 0, main_stream>>>(logits, losses, targets, dloss, N, V, Vp); break;
        case 3:
            if (Vp % Pack128::size != 0 || !aligned16(logits)) fatal("version 3 needs Vp %% 4 == 0 and aligned logits");
            classifier_vec_kernel<<<N, CLASSIFIER_THREADS, 0, main_stream>>>(logits, losses, targets, dloss, N, V, Vp);
            break;
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    int selected = parse_version(argc, argv, NV, version_names);
    const int B = EMULATED ? 1 : 8, T = 1024, V = 50257, Vp = 50304, N = B * T;
    size_t n = (size_t)N * Vp;
    printf("classifier: B=%d T=%d V=%d (padded %d)\n", B, T, V, Vp);
    if (Vp % 4 != 0) fatal("version 2 needs Vp %% 4 == 0");
    bench_init();

    float* logits = make_random_uniform(n, 61, -4.0f, 4.0f);
    int* targets = make_random_ints(N, 62, V);
    float dloss = 1.0f / (B * T);
    float* grad_ref = host_copy(logits, n);
    float* loss_ref = (float*)malloc_check(N * sizeof(float));
    classifier_forward_backward_cpu(grad_ref, loss_ref, targets, dloss, N, V, Vp);

    float* d_logits = dev_alloc<float>(n);
    float* d_losses = dev_alloc<float>(N);
    int* d_targets = dev_upload(targets, N);
    const double bytes = 2.0 * n * sizeof(float);
    for (int v = 1; v <= NV; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, version_names[v]);
        dev_set(d_logits, logits, n);
        cudaCheck(cudaMemset(d_losses, 0xff, N * sizeof(float)));
        run_version(v, d_logits, d_losses, d_targets, dloss, N, V, Vp);
        check_close("losses", d_losses, loss_ref, N, 1e-4, 1e-5);
        check_close("dlogits", d_logits, grad_ref, n, 1e-4 * dloss, 1e-4);
        // timed in place: after the first call the row holds gradients, which is as good a workload
        float ms = benchmark_ms([&] { run_version(v, d_logits, d_losses, d_targets, dloss, N, V, Vp); }, 20, 2);
        print_bandwidth("classifier", ms, bytes);
    }
    cudaCheck(cudaFree(d_logits)), cudaCheck(cudaFree(d_losses)), cudaCheck(cudaFree(d_targets));
    free(logits), free(targets), free(grad_ref), free(loss_ref);
    return finish();
}
