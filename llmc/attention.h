/*
 * attention.h: causal multi-head self-attention, the clear first version (speed comes later).
 *
 *   inp  qkv (B,T,3C): for each position, q | k | v, each C = NH heads of hs = C/NH channels
 *   att      (B,NH,T,T): softmax(q k^T / sqrt(hs)) with the causal mask (zeros above the diagonal),
 *            kept for the backward pass
 *   out      (B,T,C):   att . v, heads concatenated back
 *
 * backward, for one head and query row t (d = gradient):
 *   datt[t,u] = dout[t] . v[u]                  dv[u] += att[t,u] * dout[t]
 *   dpre[t,u] = att[t,u] * (datt[t,u] - sum_u' att[t,u'] datt[t,u']) / sqrt(hs)   (softmax backward)
 *   dq[t]    += sum_u dpre[t,u] k[u]            dk[u] += dpre[t,u] q[t]
 *   dqkv is overwritten (=).
 *
 * CPU: parallel over (batch, head), each thread owning its head's slices, so sums have a fixed order
 * (and do not depend on the thread count). With OpenBLAS (--cpu-matmul blas, the default where linked)
 * the products are cblas_sgemm calls on each head's slices in place (q, k, v are rows of 3C, their
 * gradients too), one thread each, by blocks of ATTENTION_CPU_ROWS query rows: a block's queries see
 * only the keys up to its last row, so the products skip most of the masked upper triangle. The causal
 * softmax and its backward are vectorized loops between them. Otherwise, the reference: plain loops, a
 * dot product at a time. GPU: heads are split out to (B,NH,T,hs), the two products per direction are
 * strided-batched cuBLAS calls over B*NH matrices, with the causal softmax (and its backward) as a
 * warp-per-row kernel. The full (T,T) matrix is materialized.
 *
 * `--attention flash` selects instead the tensor-core flash attention of attention_flash.h (GPU, BF16 and
 * FP16 builds, head size 64): it reads q, k, v in place from qkv, writes out (B,T,C) and keeps only the
 * logsumexp lse (B,NH,T) in fp32 for backward, which recomputes the probabilities tile by tile; no
 * (B,NH,T,T) buffer and no head split/merge. The FP32 build and the CPU target keep the reference path
 * above and refuse the flag with an error (they have no 16-bit tensor-core path to fall back from).
 */
#pragma once

#include "device.h"           // floatX, Scratch, launches
#include "matmul.h"           // matmul_init, cublas_handle (the batched products of classic attention);
                              // cblas_sgemm on the CPU
#include "attention_flash.h"  // attention_forward_flash, attention_backward_flash
#ifdef LLMC_CPU
#include <omp.h>  // omp_get_thread_num: each thread's block of the OpenBLAS backward's scratch
#endif

// the errors for configurations the flash path cannot run: not a 16-bit GPU build (bytes = element size
// the run or plan uses; for_plan: only planning, so the CPU target may plan a GPU run), or head size != 64
static void attention_flash_validate(int C, int NH, size_t bytes, int for_plan) {
#ifdef LLMC_CPU
    if (!for_plan)
        fatal("--attention flash runs only on the GPU (BF16 or FP16 builds); the CPU target computes attention the "
              "classic way: drop the flag");
#endif
    if (bytes != 2)
        fatal("--attention flash needs 16-bit activations (a BF16 or FP16 build%s); FP32 computes attention the "
              "classic way", for_plan ? ", or --precision bf16|fp16 with --plan" : "");
    if (!flash_head_size_ok(C, NH))
        fatal("--attention flash needs head size 64 (every GPT-2 size has it), got %d channels / %d heads = %g", C, NH,
              (double)C / NH);
}

// --attention as the run (or plan) takes it: a choice given on the command line as given (it is validated
// where the model is built); the default, ATTENTION_AUTO, flash wherever it can run: 16-bit activations
// (`bytes` = the element size of the run or plan), head size 64 and a micro-batch of B sequences whose
// grid fits, on the GPU target with a GPU of compute capability 8.0 or newer, or in a plan of a GPU run;
// classic elsewhere (FP32, other head sizes, older GPUs, the CPU target's own runs).
static int attention_choice(int given, int B, int T, int C, int NH, size_t bytes, int for_plan) {
    if (given != ATTENTION_AUTO) return given;
    if (bytes != 2 || !flash_head_size_ok(C, NH) || !flash_grid_fits(B, T, NH)) return 0;
#ifdef LLMC_CPU
    return for_plan;
#else
    return for_plan || flash_device_capability() >= 80;
#endif
}

// ----------------------------------------------------------------------------------------------------
// CPU reference

static void attention_forward_cpu(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    s *= scale;
                    a[u] = s;
                    if (s > maxv) maxv = s;
                }
                float sum = 0.0f;
                for (int u = 0; u <= t; u++) {
                    a[u] = expf(a[u] - maxv);
                    sum += a[u];
                }
                for (int u = 0; u <= t; u++) a[u] /= sum;
                for (int u = t + 1; u < T; u++) a[u] = 0.0f;
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int u = 0; u <= t; u++) {
                    const float* v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += a[u] * v[i];
                }
            }
        }
    }
}

static void attention_backward_cpu(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                                   int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* datt = (float*)malloc_check((size_t)T * sizeof(float));
            for (int t = 0; t < T; t++)  // this thread owns head h of batch b in dqkv: clear it first
                for (int part = 0; part < 3; part++)
                    memset(dqkv + ((size_t)b * T + t) * 3 * C + part * C + h * hs, 0, hs * sizeof(float));
            for (int t = 0; t < T; t++) {
                const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                const float* d = dout + ((size_t)b * T + t) * C + h * hs;
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float dot = 0.0f;
                for (int u = 0; u <= t; u++) {
                    const float* v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
                    float* dv = dqkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += d[i] * v[i];
                        dv[i] += a[u] * d[i];
                    }
                    datt[u] = s;
                    dot += a[u] * s;
                }
                for (int u = 0; u <= t; u++) {
                    float dpre = a[u] * (datt[u] - dot) * scale;
                    const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    float* dk = dqkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
            free(datt);
        }
    }
}

// The same two functions through OpenBLAS (see the top of the file). Per (batch, head), for each block
// of query rows [t0, t0 + rows) and its keys [0, cols), cols = t0 + rows:
//   forward   att[t0.., :cols] = scale q k^T;  causal softmax in place (zeros above the diagonal);
//             out[t0..] = att[t0.., :cols] v
//   backward  datt = dout[t0..] v^T;  dv += att[t0.., :cols]^T dout[t0..];  dpre = softmax backward of datt
//             (in place);  dq[t0..] = dpre k;  dk += dpre^T q[t0..]
// OpenBLAS runs each call on the calling thread (it does not start threads of its own inside an OpenMP
// parallel region), so each head's sums have one order whatever the thread count.
#if defined(LLMC_CPU) && defined(LLMC_BLAS)
#define ATTENTION_CPU_ROWS 64

static void attention_forward_blas(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* q = qkv + (size_t)b * T * 3 * C + h * hs;  // this head's rows of q, k, v: stride 3C
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* a = att + ((size_t)b * NH + h) * T * T;
            float* o = out + (size_t)b * T * C + h * hs;  // stride C
            for (int t0 = 0; t0 < T; t0 += ATTENTION_CPU_ROWS) {
                int rows = T - t0 < ATTENTION_CPU_ROWS ? T - t0 : ATTENTION_CPU_ROWS, cols = t0 + rows;
                float* ab = a + (size_t)t0 * T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, q + (size_t)t0 * 3 * C,
                            3 * C, k, 3 * C, 0.0f, ab, T);
                for (int r = 0; r < rows; r++) {  // row t: softmax over keys 0..t
                    int t = t0 + r;
                    float* __restrict p = ab + (size_t)r * T;
                    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
                    for (int u = 0; u <= t; u++) maxv = p[u] > maxv ? p[u] : maxv;
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int u = 0; u <= t; u++) {
                        p[u] = expf_cpu(p[u] - maxv);
                        sum += p[u];
                    }
                    float inv = 1.0f / sum;
#pragma omp simd
                    for (int u = 0; u <= t; u++) p[u] *= inv;
                    for (int u = t + 1; u < T; u++) p[u] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, ab, T, v, 3 * C, 0.0f,
                            o + (size_t)t0 * C, C);
            }
        }
    }
}

// scratch: attention_cpu_scratch_bytes (a block of datt rows per thread)
static void attention_backward_blas(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                                    int C, int NH, float* scratch) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* datt = scratch + (size_t)omp_get_thread_num() * ATTENTION_CPU_ROWS * T;  // (rows, cols), stride T
            const float* q = qkv + (size_t)b * T * 3 * C + h * hs;  // stride 3C
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* dq = dqkv + (size_t)b * T * 3 * C + h * hs;  // stride 3C
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const float* d = dout + (size_t)b * T * C + h * hs;  // stride C
            const float* a = att + ((size_t)b * NH + h) * T * T;
            for (int t = 0; t < T; t++) {  // dk and dv add up over the blocks: this thread's head, cleared first
                memset(dk + (size_t)t * 3 * C, 0, hs * sizeof(float));
                memset(dv + (size_t)t * 3 * C, 0, hs * sizeof(float));
            }
            for (int t0 = 0; t0 < T; t0 += ATTENTION_CPU_ROWS) {
                int rows = T - t0 < ATTENTION_CPU_ROWS ? T - t0 : ATTENTION_CPU_ROWS, cols = t0 + rows;
                const float* ab = a + (size_t)t0 * T;
                const float* db = d + (size_t)t0 * C;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0f, db, C, v, 3 * C,
                            0.0f, datt, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0f, ab, T, db, C,
                            1.0f, dv, 3 * C);
                for (int r = 0; r < rows; r++) {  // row t: dpre = scale * a * (datt - sum_u a datt), zero past t
                    int t = t0 + r;
                    const float* __restrict p = ab + (size_t)r * T;
                    float* __restrict g = datt + (size_t)r * T;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int u = 0; u <= t; u++) dot += p[u] * g[u];
#pragma omp simd
                    for (int u = 0; u <= t; u++) g[u] = scale * p[u] * (g[u] - dot);
                    for (int u = t + 1; u < cols; u++) g[u] = 0.0f;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, datt, T, k, 3 * C, 0.0f,
                            dq + (size_t)t0 * 3 * C, 3 * C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0f, datt, T,
                            q + (size_t)t0 * 3 * C, 3 * C, 1.0f, dk, 3 * C);
            }
        }
    }
}
#else
static void attention_forward_blas(float*, float*, const float*, int, int, int, int) {
    fatal("internal: the CPU BLAS path in a build without a BLAS");
}
static void attention_backward_blas(float*, const float*, const float*, const float*, int, int, int, int, float*) {
    fatal("internal: the CPU BLAS path in a build without a BLAS");
}
#endif

// Whether the CPU target computes attention through OpenBLAS: `kernels` is the run's choice
// (--cpu-matmul); NULL, from a caller that passes none, takes the default (OpenBLAS where linked).
static int attention_cpu_blas(const KernelChoice* kernels) {
    return cpu_blas_linked && (kernels == NULL || kernels->cpu_blas);
}

// The CPU target's attention scratch: a block of ATTENTION_CPU_ROWS rows of datt (T floats each) per
// OpenMP thread for the OpenBLAS backward; the reference loops need none. (The memory plan counts it.)
static size_t attention_cpu_scratch_bytes(int T, const KernelChoice* kernels) {
#if defined(LLMC_CPU) && defined(LLMC_BLAS)
    if (attention_cpu_blas(kernels)) return (size_t)omp_get_max_threads() * ATTENTION_CPU_ROWS * T * sizeof(float);
#endif
    (void)T; (void)kernels;
    return 0;
}

// ----------------------------------------------------------------------------------------------------
// CUDA kernels

#ifndef LLMC_CPU
// Moves heads between the (B,T,...) row layout and (B,NH,T,hs). Element idx of the (B,NH,T,hs) tensor
// lives in the row layout at the offset returned here (rows of `row_stride`, head h at offset + h*hs).
__device__ static inline size_t head_row_offset(size_t idx, int T, int NH, int hs, int row_stride, int offset) {
    int i = idx % hs;
    int t = (idx / hs) % T;
    int h = (idx / ((size_t)hs * T)) % NH;
    size_t b = idx / ((size_t)hs * T * NH);
    return (b * T + t) * row_stride + offset + h * hs + i;
}

// threads per block of the four kernels below: one element per thread (split, merge), one warp per row
// (softmax, ATTENTION_THREADS / 32 rows per block)
#define ATTENTION_THREADS 256

// dst (B,NH,T,hs) <- src rows
__global__ void __launch_bounds__(ATTENTION_THREADS) heads_split_kernel(floatX* dst, const floatX* src, int B, int T,
                                                                        int NH, int hs, int row_stride, int offset) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)B * NH * T * hs) dst[idx] = src[head_row_offset(idx, T, NH, hs, row_stride, offset)];
}

// the inverse: dst rows <- src (B,NH,T,hs)
__global__ void __launch_bounds__(ATTENTION_THREADS) heads_merge_kernel(floatX* dst, const floatX* src, int B, int T,
                                                                        int NH, int hs, int row_stride, int offset) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)B * NH * T * hs) dst[head_row_offset(idx, T, NH, hs, row_stride, offset)] = src[idx];
}

// one warp per row of (B*NH*T, T): att = causal softmax(scale * preatt), zeros above the diagonal
__global__ void __launch_bounds__(ATTENTION_THREADS) causal_softmax_kernel(floatX* att, const floatX* preatt, int rows,
                                                                           int T, float scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const floatX* x = preatt + (size_t)row * T;
    floatX* y = att + (size_t)row * T;
    float maxv = -INFINITY;
    for (int u = lane; u <= t; u += 32) maxv = fmaxf(maxv, scale * floatX_to_float(x[u]));
    maxv = warp_max(maxv);
    float sum = 0.0f;
    for (int u = lane; u <= t; u += 32) sum += expf(scale * floatX_to_float(x[u]) - maxv);
    float inv = 1.0f / warp_sum(sum);
    for (int u = lane; u < T; u += 32)
        y[u] = float_to_floatX(u <= t ? expf(scale * floatX_to_float(x[u]) - maxv) * inv : 0.0f);
}

// one warp per row, in place on datt: dpre = scale * att * (datt - sum(att * datt))
__global__ void __launch_bounds__(ATTENTION_THREADS) causal_softmax_backward_kernel(floatX* datt, const floatX* att,
                                                                                    int rows, int T, float scale) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const floatX* a = att + (size_t)row * T;
    floatX* d = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += 32) dot += floatX_to_float(a[u]) * floatX_to_float(d[u]);
    dot = warp_sum(dot);
    for (int u = lane; u < T; u += 32) {
        float v = u <= t ? scale * floatX_to_float(a[u]) * (floatX_to_float(d[u]) - dot) : 0.0f;
        d[u] = float_to_floatX(v);
    }
}

// column-major strided-batched C (m,n) = op(A) . op(B) over `batch` matrices
static void batched_matmul(floatX* c, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a, bool trans_b,
                           int lda, long long stride_a, int ldb, long long stride_b, int ldc, long long stride_c,
                           int batch) {
    matmul_init();
    const float alpha = 1.0f, beta = 0.0f;
    cublasCheck(cublasGemmStridedBatchedEx(cublas_handle, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_FLOATX, lda,
                                           stride_a, b, CUDA_FLOATX, ldb, stride_b, &beta, c, CUDA_FLOATX, ldc,
                                           stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
#endif

// ----------------------------------------------------------------------------------------------------
// launchers

// `scratch`, GPU: q, k, v, y (and in backward their gradients) as (B,NH,T,hs), plus one (B,NH,T,T)
// matrix; CPU: attention_cpu_scratch_bytes. `kernels` (CPU): OpenBLAS or the reference loops, see
// attention_cpu_blas (the GPU ignores it).
static void attention_forward(floatX* out, floatX* att, const floatX* qkv, int B, int T, int C, int NH,
                              Scratch* scratch, const KernelChoice* kernels = NULL) {
#ifdef LLMC_CPU
    (void)scratch;
    if (attention_cpu_blas(kernels)) attention_forward_blas(out, att, qkv, B, T, C, NH);
    else attention_forward_cpu(out, att, qkv, B, T, C, NH);
#else
    (void)kernels;
    int hs = C / NH;
    size_t btc = (size_t)B * T * C;
    floatX* q = (floatX*)scratch_get(scratch, (8 * btc + (size_t)B * NH * T * T) * sizeof(floatX));
    floatX *k = q + btc, *v = k + btc, *y = v + btc, *preatt = q + 8 * btc;
    const int block = ATTENTION_THREADS;
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(q, qkv, B, T, NH, hs, 3 * C, 0);
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(k, qkv, B, T, NH, hs, 3 * C, C);
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(v, qkv, B, T, NH, hs, 3 * C, 2 * C);
    launchCheck();
    long long s_head = (long long)T * hs, s_att = (long long)T * T;
    // preatt (Tq,Tk) row-major = column-major (Tk,Tq) = k (Tk,hs) . q^T (hs,Tq)
    batched_matmul(preatt, k, q, T, T, hs, true, false, hs, s_head, hs, s_head, T, s_att, B * NH);
    causal_softmax_kernel<<<ceil_div(B * NH * T, block / 32), block, 0, main_stream>>>(
        att, preatt, B * NH * T, T, 1.0f / sqrtf((float)hs));
    launchCheck();
    // y^T (hs,Tq) = v^T (hs,Tk) . att^T (Tk,Tq)
    batched_matmul(y, v, att, hs, T, T, false, false, hs, s_head, T, s_att, hs, s_head, B * NH);
    heads_merge_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(out, y, B, T, NH, hs, C, 0);
    launchCheck();
#endif
}

static void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* att, int B, int T,
                               int C, int NH, Scratch* scratch, const KernelChoice* kernels = NULL) {
#ifdef LLMC_CPU
    if (attention_cpu_blas(kernels))
        attention_backward_blas(dqkv, dout, qkv, att, B, T, C, NH,
                                (float*)scratch_get(scratch, attention_cpu_scratch_bytes(T, kernels)));
    else attention_backward_cpu(dqkv, dout, qkv, att, B, T, C, NH);
#else
    (void)kernels;
    int hs = C / NH;
    size_t btc = (size_t)B * T * C;
    floatX* q = (floatX*)scratch_get(scratch, (8 * btc + (size_t)B * NH * T * T) * sizeof(floatX));
    floatX *k = q + btc, *v = k + btc, *dy = v + 2 * btc, *dq = dy + btc, *dk = dq + btc, *dv = dk + btc;
    floatX* datt = q + 8 * btc;
    const int block = ATTENTION_THREADS;
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(q, qkv, B, T, NH, hs, 3 * C, 0);
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(k, qkv, B, T, NH, hs, 3 * C, C);
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(v, qkv, B, T, NH, hs, 3 * C, 2 * C);
    heads_split_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(dy, dout, B, T, NH, hs, C, 0);
    launchCheck();
    long long s_head = (long long)T * hs, s_att = (long long)T * T;
    // datt^T (Tk,Tq) = v (Tk,hs) . dy^T (hs,Tq)
    batched_matmul(datt, v, dy, T, T, hs, true, false, hs, s_head, hs, s_head, T, s_att, B * NH);
    // dv^T (hs,Tk) = dy^T (hs,Tq) . att (Tq,Tk)
    batched_matmul(dv, dy, att, hs, T, T, false, true, hs, s_head, T, s_att, hs, s_head, B * NH);
    causal_softmax_backward_kernel<<<ceil_div(B * NH * T, block / 32), block, 0, main_stream>>>(
        datt, att, B * NH * T, T, 1.0f / sqrtf((float)hs));
    launchCheck();
    // dq^T (hs,Tq) = k^T (hs,Tk) . dpre^T (Tk,Tq)
    batched_matmul(dq, k, datt, hs, T, T, false, false, hs, s_head, T, s_att, hs, s_head, B * NH);
    // dk^T (hs,Tk) = q^T (hs,Tq) . dpre (Tq,Tk)
    batched_matmul(dk, q, datt, hs, T, T, false, true, hs, s_head, T, s_att, hs, s_head, B * NH);
    heads_merge_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(dqkv, dq, B, T, NH, hs, 3 * C, 0);
    heads_merge_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(dqkv, dk, B, T, NH, hs, 3 * C, C);
    heads_merge_kernel<<<grid_for(btc, block), block, 0, main_stream>>>(dqkv, dv, B, T, NH, hs, 3 * C, 2 * C);
    launchCheck();
#endif
}

// --attention flash: out (B,T,C) =, lse (B,NH,T) = (fp32 logsumexp of each scaled score row)
static void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
#if defined(LLMC_CPU) || !(defined(ENABLE_BF16) || defined(ENABLE_FP16))
    (void)out; (void)lse; (void)qkv; (void)B; (void)T;
    attention_flash_validate(C, NH, sizeof(floatX), 0);  // always an error here
#else
    flash_tc_attention_forward(out, lse, qkv, B, T, C, NH, main_stream);
#endif
}

// --attention flash: dqkv (B,T,3C) = (overwritten), from dout (B,T,C), qkv, the forward's out and lse;
// `scratch` holds D = rowsum(dout * out), (B,NH,T) floats
static void attention_backward_flash(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, int B, int T, int C, int NH, Scratch* scratch) {
#if defined(LLMC_CPU) || !(defined(ENABLE_BF16) || defined(ENABLE_FP16))
    (void)dqkv; (void)dout; (void)qkv; (void)out; (void)lse; (void)B; (void)T; (void)scratch;
    attention_flash_validate(C, NH, sizeof(floatX), 0);  // always an error here
#else
    float* D = (float*)scratch_get(scratch, (size_t)B * NH * T * sizeof(float));
    flash_tc_attention_backward(dqkv, D, dout, qkv, out, lse, B, T, C, NH, main_stream);
#endif
}
