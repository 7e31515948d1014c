/*
 * matmul.h: the linear layer, where almost all the flops are.
 *
 *   forward:  out (N,OC) = inp (N,IC) . weight(OC,IC)^T + bias (OC)         (bias may be NULL)
 *   backward: dinp (N,IC)    = dout (N,OC) . weight (OC,IC)                  (=  : overwritten)
 *             dweight (OC,IC) += dout^T (OC,N) . inp (N,IC)                  (+= : gradient accumulation)
 *             dbias (OC)      += column sums of dout
 *   (matmul_backward_input makes dinp, matmul_backward_weight dweight and dbias: the pipeline's ZB-H1
 *   schedule runs the second later; matmul_backward is the two in a row)
 *
 * GPU: cuBLASLt (bias fused as an epilogue in forward; fp32 accumulation; true FP32, no TF32, in the
 * FP32 build). CPU (--cpu-matmul, KernelChoice.cpu_blas): OpenBLAS's cblas_sgemm, the CPU's analog of
 * cuBLAS, where the build found it (toolchain.mk: Debian's OpenMP build, which runs on the trainer's own
 * OpenMP threads); the three products are its transpose flags on the row-major operands, no copies.
 * OpenBLAS splits a product among threads by blocks of outputs and sums each output in an order fixed by
 * its kernel, so a build gives the same bits run after run at one thread count (the tests that compare
 * two runs bit for bit rely on this, with OMP_NUM_THREADS the same in both), not across thread counts or
 * CPUs of another instruction set. Beside it, the reference: one register-blocked GEMM, C (M,N) (+)= A
 * (M,K) . B (K,N) with all matrices row-major, tiles of 6x16 outputs held in registers and parallel over
 * tiles with OpenMP. Every output is one dot product summed in index order, so its results do not depend
 * on the thread count. The three products above map onto it after transposing one operand into a
 * scratch buffer. The two agree to fp32 rounding of sums in another order (test_gpt checks it).
 * With --fused-kernels 1 the GPU keeps each shape's cuBLASLt plan (descriptor, layouts, algorithm) instead
 * of making it per call, and lets cuBLASLt's epilogues do what otherwise takes a pass over memory of its own:
 *   bias gradient      dbias = column sums of dout, read while the dweight product reads dout (BGRADB)
 *   GELU after fc      matmul_forward_gelu:  pre = inp . weight^T + bias, out = gelu(pre), one pass (GELU_AUX_BIAS)
 *   residual add       matmul_forward_residual: the residual stream read as the product's C (beta = 1)
 * (Not GELU's backward: cuBLASLt's DGELU_BGRAD epilogue ran on an H200 as a pass of its own after the
 * product, slower than the 16-byte kernels: matmul_backward_gelu_input.)
 * An epilogue writes its bias gradient (it cannot add), so it lands in scratch and residual_forward adds it.
 * Where cuBLASLt has no algorithm for an epilogue, the same launcher takes the separate kernels instead.
 */
#pragma once

#include "device.h"    // floatX, Scratch, the cuBLAS(Lt) handles
#include "gelu.h"      // gelu_forward, gelu_backward (when cuBLASLt offers no epilogue)
#include "residual.h"  // residual_forward (the same)
#if defined(LLMC_CPU) && defined(LLMC_BLAS)
#include <cblas.h>  // OpenBLAS's (toolchain.mk puts its folder first on the include path)
#endif

// ----------------------------------------------------------------------------------------------------
// CPU reference

#define GEMM_MR 6   // rows of C per register tile
#define GEMM_NR 16  // columns of C per register tile: two vectors of 8 floats
// 8 floats as one value (a GCC/Clang vector extension): the 6x2 accumulators of a tile then live in 12
// AVX registers, which is what makes this loop fast without intrinsics
typedef float float8 __attribute__((vector_size(32)));

// C (M,N) = A (M,K) . B (K,N), or C += A . B when accumulate; all row-major
static void gemm_cpu(float* Cm, const float* A, const float* Bm, int M, int N, int K, int accumulate) {
    int n_tiles = ceil_div(N, GEMM_NR);
    int m_tiles = ceil_div(M, GEMM_MR);
    // outer loop over column panels: the (K x 16) panel of B stays in cache while all rows stream by
#pragma omp parallel for schedule(static)
    for (int nt = 0; nt < n_tiles; nt++) {
        int n0 = nt * GEMM_NR;
        int nw = N - n0 < GEMM_NR ? N - n0 : GEMM_NR;
        for (int mt = 0; mt < m_tiles; mt++) {
            int m0 = mt * GEMM_MR;
            int mh = M - m0 < GEMM_MR ? M - m0 : GEMM_MR;
            float acc[GEMM_MR][GEMM_NR] = {};
            if (mh == GEMM_MR && nw == GEMM_NR) {  // full tile: the hot path
                float8 v[GEMM_MR][2] = {};
                for (int k = 0; k < K; k++) {
                    float8 b0, b1;
                    memcpy(&b0, Bm + (size_t)k * N + n0, sizeof(b0));
                    memcpy(&b1, Bm + (size_t)k * N + n0 + 8, sizeof(b1));
                    for (int i = 0; i < GEMM_MR; i++) {
                        float a = A[(size_t)(m0 + i) * K + k];
                        v[i][0] += a * b0;
                        v[i][1] += a * b1;
                    }
                }
                memcpy(acc, v, sizeof(acc));
            } else {  // ragged edge tile, the same sums in the same order
                for (int k = 0; k < K; k++) {
                    const float* b = Bm + (size_t)k * N + n0;
                    for (int i = 0; i < mh; i++) {
                        float a = A[(size_t)(m0 + i) * K + k];
                        for (int j = 0; j < nw; j++) acc[i][j] += a * b[j];
                    }
                }
            }
            for (int i = 0; i < mh; i++) {
                float* c = Cm + (size_t)(m0 + i) * N + n0;
                for (int j = 0; j < nw; j++) c[j] = accumulate ? c[j] + acc[i][j] : acc[i][j];
            }
        }
    }
}

// dst (cols, rows) = src (rows, cols)^T
static void transpose_cpu(float* dst, const float* src, int rows, int cols) {
#pragma omp parallel for
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

// out (N, OC) += bias (OC), broadcast over the rows
static void bias_add_cpu(float* out, const float* bias, int N, int OC) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

// `scratch` holds the transposed operand
static void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                               int OC, Scratch* scratch) {
    float* wT = (float*)scratch_get(scratch, (size_t)IC * OC * sizeof(float));
    transpose_cpu(wT, weight, OC, IC);  // (IC, OC)
    gemm_cpu(out, inp, wT, N, OC, IC, 0);
    if (bias != NULL) bias_add_cpu(out, bias, N, OC);
}

// dbias (OC) += column sums of dout (N, OC), each summed in row order (so not dependent on the thread
// count). Blocks of 64 columns run in parallel, each streaming through dout row by row; the inner loop
// vectorizes (`omp simd`: its 64 sums are independent, no reordering).
#define BIAS_CPU_COLUMNS 64
static void bias_backward_cpu(float* __restrict dbias, const float* __restrict dout, int N, int OC) {
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += BIAS_CPU_COLUMNS) {
        int w = OC - o0 < BIAS_CPU_COLUMNS ? OC - o0 : BIAS_CPU_COLUMNS;
        float sum[BIAS_CPU_COLUMNS] = {};
        for (int n = 0; n < N; n++) {
            const float* d = dout + (size_t)n * OC + o0;
#pragma omp simd
            for (int j = 0; j < w; j++) sum[j] += d[j];
        }
        for (int j = 0; j < w; j++) dbias[o0 + j] += sum[j];
    }
}

// A linear layer's backward in its two halves: the input's gradient (what the layer below waits for) and
// the weight's and bias's (what only the optimizer waits for; ZB-H1 defers it)
static void matmul_backward_input_cpu(float* dinp, const float* dout, const float* weight, int N, int IC, int OC) {
    gemm_cpu(dinp, dout, weight, N, IC, OC, 0);  // (N,OC) . (OC,IC)
}
static void matmul_backward_weight_cpu(float* dweight, float* dbias, const float* dout, const float* inp, int N, int IC,
                                       int OC, Scratch* scratch) {
    float* doutT = (float*)scratch_get(scratch, (size_t)N * OC * sizeof(float));
    transpose_cpu(doutT, dout, N, OC);  // (OC, N)
    gemm_cpu(dweight, doutT, inp, OC, IC, N, 1);  // (OC,N) . (N,IC)
    if (dbias != NULL) bias_backward_cpu(dbias, dout, N, OC);
}

// The same two layers through OpenBLAS. Row-major cblas_sgemm reads a transposed operand in place
// (CblasTrans), so no scratch: forward is inp . weight^T, dinp is dout . weight, dweight += dout^T . inp
// (beta = 1). The bias adds and sums stay the loops above (a pass over the output either way).
#if defined(LLMC_CPU) && defined(LLMC_BLAS)
static const int cpu_blas_linked = 1;
static void matmul_forward_blas(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                                int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
    if (bias != NULL) bias_add_cpu(out, bias, N, OC);
}
static void matmul_backward_input_blas(float* dinp, const float* dout, const float* weight, int N, int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
}
static void matmul_backward_weight_blas(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                                        int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias != NULL) bias_backward_cpu(dbias, dout, N, OC);
}
#else
static const int cpu_blas_linked = 0;  // (KernelChoice.cpu_blas is refused at the command line: see train_gpt.cu)
static void matmul_forward_blas(float*, const float*, const float*, const float*, int, int, int) {
    fatal("internal: the CPU BLAS path in a build without a BLAS");
}
static void matmul_backward_input_blas(float*, const float*, const float*, int, int, int) {
    fatal("internal: the CPU BLAS path in a build without a BLAS");
}
static void matmul_backward_weight_blas(float*, float*, const float*, const float*, int, int, int) {
    fatal("internal: the CPU BLAS path in a build without a BLAS");
}
#endif

// CPU target: OpenBLAS or the reference, as the run chose (--cpu-matmul)
static void matmul_forward_host(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                                int OC, Scratch* scratch, const KernelChoice* k) {
    if (k->cpu_blas) matmul_forward_blas(out, inp, weight, bias, N, IC, OC);
    else matmul_forward_cpu(out, inp, weight, bias, N, IC, OC, scratch);
}
static void matmul_backward_input_host(float* dinp, const float* dout, const float* weight, int N, int IC, int OC,
                                       const KernelChoice* k) {
    if (k->cpu_blas) matmul_backward_input_blas(dinp, dout, weight, N, IC, OC);
    else matmul_backward_input_cpu(dinp, dout, weight, N, IC, OC);
}
static void matmul_backward_weight_host(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                                        int IC, int OC, Scratch* scratch, const KernelChoice* k) {
    if (k->cpu_blas) matmul_backward_weight_blas(dweight, dbias, dout, inp, N, IC, OC);
    else matmul_backward_weight_cpu(dweight, dbias, dout, inp, N, IC, OC, scratch);
}

// ----------------------------------------------------------------------------------------------------
// GPU: cuBLASLt

#ifndef LLMC_CPU
// The library handles and their workspace are made once per process on first use and shared by every
// model in it: they belong to the device and the library, not to a run's settings.
static cublasLtHandle_t cublaslt_handle = NULL;
static cublasHandle_t cublas_handle = NULL;  // for the strided-batched products of attention
static void* cublaslt_workspace = NULL;
static const size_t CUBLASLT_WORKSPACE_BYTES = 32 << 20;

static void matmul_init(void) {
    if (cublaslt_handle != NULL) return;
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cublasCheck(cublasCreate(&cublas_handle));
    cublasCheck(cublasSetStream(cublas_handle, main_stream));
    cublasCheck(cublasSetMathMode(cublas_handle, CUBLAS_DEFAULT_MATH));  // with COMPUTE_32F: no TF32
    cublaslt_workspace = device_malloc(CUBLASLT_WORKSPACE_BYTES);
}

// the largest power of two (up to 256) that divides the address
static uint32_t pointer_alignment(const void* p) {
    uint32_t align = 256;
    while (align > 1 && ((uintptr_t)p % align) != 0) align /= 2;
    return align;
}

// What cuBLASLt does after the product, in the column-major terms of matmul_cublaslt below (D is m x n):
typedef enum {
    EPI_NONE,           // D = op(A) op(B) [+ D]
    EPI_BIAS,           // D = op(A) op(B) + bias (m), broadcast over the n columns
    EPI_GELU_AUX_BIAS,  // aux = op(A) op(B) + bias (m); D = gelu(aux)       (aux: m x n, like D)
    EPI_BGRADB,         // D = op(A) op(B) [+ D]; vec (n) = sums of op(B) over its k rows
} Epilogue;

// Everything cuBLASLt needs for one product shape: the descriptor (transposes, epilogue), the three
// layouts and the algorithm its heuristic chose for the stated pointer alignments. `usable` is 0 where
// cuBLASLt offers no algorithm (only an epilogue beyond the bias may be refused; the launchers then
// take the separate kernels).
typedef struct {
    int m, n, k, trans_a, trans_b;
    Epilogue epilogue;
    uint32_t align[5];  // of a, b, d, vec (the bias or bias gradient), aux
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int usable;
} MatmulPlan;

// points the descriptor at this call's bias (or bias gradient) vector and GELU input
static void matmul_plan_point(MatmulPlan* p, const void* vec, const void* aux) {
    if (p->epilogue != EPI_NONE)
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
    if (p->epilogue == EPI_GELU_AUX_BIAS)
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
}

static void matmul_plan_create(MatmulPlan* p, const void* vec, const void* aux) {
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_a = p->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    const cublasLtEpilogue_t lt_epilogue[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                              CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_BGRADB};
    cublasLtEpilogue_t epilogue = lt_epilogue[p->epilogue];
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (p->epilogue != EPI_NONE) {  // the vector is of the output's type (a bias gradient can be no other)
        cudaDataType_t vec_type = CUDA_FLOATX;
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vec_type, sizeof(vec_type)));
    }
    if (p->epilogue == EPI_GELU_AUX_BIAS) {  // the GELU input: m x n like D
        int64_t aux_ld = p->m;
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    matmul_plan_point(p, vec, aux);  // the heuristic reads the alignment of these pointers
    int m = p->m, n = p->n, k = p->k;
    cublasCheck(
        cublasLtMatrixLayoutCreate(&p->la, CUDA_FLOATX, p->trans_a ? k : m, p->trans_a ? m : k, p->trans_a ? k : m));
    cublasCheck(
        cublasLtMatrixLayoutCreate(&p->lb, CUDA_FLOATX, p->trans_b ? n : k, p->trans_b ? k : n, p->trans_b ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, CUDA_FLOATX, m, n, m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &CUBLASLT_WORKSPACE_BYTES, sizeof(CUBLASLT_WORKSPACE_BYTES)));
    // heuristics assume 256-byte aligned pointers unless told otherwise; ours may be less (a layer's slice
    // of an activation buffer, a short sampling batch), so state the real alignment of each
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t aligns[4] = {p->align[0], p->align[1], p->align[2], p->align[2]};
    for (int i = 0; i < 4; i++)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &aligns[i], sizeof(aligns[i])));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, p->desc, p->la, p->lb, p->ld, p->ld, pref,
                                                           1, &heuristic, &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    p->usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->usable) p->algo = heuristic.algo;
    else if (p->epilogue == EPI_NONE || p->epilogue == EPI_BIAS) {  // the products every run needs
        cublasCheck(status);
        fatal("cuBLASLt found no algorithm for m=%d n=%d k=%d trans=%d%d bias=%d", m, n, k, p->trans_a, p->trans_b,
              p->epilogue == EPI_BIAS);
    }
}

static void matmul_plan_destroy(MatmulPlan* p) {
    cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
}

// --fused-kernels: plans are made once per shape and kept (a training step has about fifteen shapes and
// epilogues; the table is generous, and a shape beyond it simply gets a plan made for the call as before).
// A cache of what cuBLASLt chose for a shape on this device, process-wide: any caller with the same shape
// may reuse it.
#define MATMUL_PLAN_CACHE 64
static MatmulPlan matmul_plan_cache[MATMUL_PLAN_CACHE];
static int matmul_plan_cached = 0;
static MatmulPlan* matmul_plan_lookup(const MatmulPlan* key, const void* vec, const void* aux) {
    for (int i = 0; i < matmul_plan_cached; i++) {
        MatmulPlan* p = &matmul_plan_cache[i];
        if (p->m == key->m && p->n == key->n && p->k == key->k && p->trans_a == key->trans_a &&
            p->trans_b == key->trans_b && p->epilogue == key->epilogue &&
            !memcmp(p->align, key->align, sizeof(p->align))) {
            if (p->usable) matmul_plan_point(p, vec, aux);
            return p;
        }
    }
    if (matmul_plan_cached == MATMUL_PLAN_CACHE) return NULL;
    MatmulPlan* p = &matmul_plan_cache[matmul_plan_cached++];
    *p = *key;
    matmul_plan_create(p, vec, aux);
    return p;
}

// Column-major D (m,n) = op(A) (m,k) . op(B) (k,n) [+ D if accumulate] [+ addend (m,n), a matrix like D],
// then the epilogue with its vector `vec` and GELU input `aux` (see Epilogue). A row-major matrix seen
// column-major is its transpose, which is how the row-major products above map onto this call (see
// matmul_forward / matmul_backward). `cached_plan` (--fused-kernels): keep the plan in the cache above for
// the next call of this shape, else make it for this call only. Returns false, having done nothing, where
// cuBLASLt has no algorithm for the epilogue.
static bool matmul_cublaslt(floatX* d, const floatX* a, const floatX* b, int m, int n, int k, bool trans_a,
                            bool trans_b, bool accumulate, int cached_plan, Epilogue epilogue = EPI_NONE,
                            const void* vec = NULL, const void* aux = NULL, const floatX* addend = NULL) {
    matmul_init();
    const floatX* c = addend != NULL ? addend : d;  // cuBLASLt's C, added with beta = 1 (C and D may differ)
    uint32_t align_cd = pointer_alignment(c) < pointer_alignment(d) ? pointer_alignment(c) : pointer_alignment(d);
    MatmulPlan key = {.m = m, .n = n, .k = k, .trans_a = trans_a, .trans_b = trans_b, .epilogue = epilogue,
                      .align = {pointer_alignment(a), pointer_alignment(b), align_cd, pointer_alignment(vec),
                                pointer_alignment(aux)}};
    MatmulPlan* plan = cached_plan ? matmul_plan_lookup(&key, vec, aux) : NULL;
    if (plan == NULL) {  // made for this call only
        plan = &key;
        matmul_plan_create(plan, vec, aux);
    }
    bool ran = plan->usable;
    if (ran) {
        const float alpha = 1.0f, beta = accumulate || addend != NULL ? 1.0f : 0.0f;
        cublasCheck(cublasLtMatmul(cublaslt_handle, plan->desc, &alpha, a, plan->la, b, plan->lb, &beta, c, plan->ld, d,
                                   plan->ld, &plan->algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, main_stream));
    }
    if (plan == &key) matmul_plan_destroy(plan);
    return ran;
}

// dbias (OC) += column sums of dout (N, OC): blocks of 32 columns x BIAS_ROW_LANES row-lanes, partial sums
// per block row, then one thread per column adds them up (fixed order, no atomics).
#define BIAS_CHUNKS 64
#define BIAS_ROW_LANES 8
#define BIAS_FINISH_THREADS 256  // bias_backward_finish_kernel's block (a thread per column)
__global__ void __launch_bounds__(32 * BIAS_ROW_LANES) bias_backward_partial_kernel(float* partial, const floatX* dout,
                                                                                    int N, int OC) {
    __shared__ float s[BIAS_ROW_LANES][32];
    int o = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (o < OC)
        for (int n = blockIdx.y * BIAS_ROW_LANES + threadIdx.y; n < N; n += gridDim.y * BIAS_ROW_LANES)
            sum += floatX_to_float(dout[(size_t)n * OC + o]);
    s[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        for (int i = 1; i < BIAS_ROW_LANES; i++) sum += s[i][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + o] = sum;
    }
}
__global__ void __launch_bounds__(BIAS_FINISH_THREADS) bias_backward_finish_kernel(floatX* dbias, const float* partial,
                                                                                   int chunks, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float sum = 0.0f;
    for (int i = 0; i < chunks; i++) sum += partial[(size_t)i * OC + o];
    dbias[o] = float_to_floatX(floatX_to_float(dbias[o]) + sum);
}
// --fused-kernels: the same sums with 16-byte loads. A block of 32 lanes x BIAS_ROW_LANES row-lanes covers
// 32 packs (32 * Pack128::size columns, 256 in bf16); BIAS_VEC_CHUNKS chunks of rows, each summed into one
// partial row, which bias_backward_finish_kernel adds up in order. Needs OC % Pack128::size == 0.
#define BIAS_VEC_CHUNKS 128
// the vector kernels' end: each thread's sums of its Pack128::size columns (sum) added over the block's
// row-lanes in row-lane order, through the block's shared `s`, into the block's partial row (blockIdx.y)
__device__ inline void bias_partial_row_write(float* partial, float (*s)[32 * Pack128::size], float* sum, int pack,
                                              bool active, int OC) {
    const int P = Pack128::size;
    for (int k = 0; k < P; k++) s[threadIdx.y][threadIdx.x * P + k] = sum[k];
    __syncthreads();
    if (threadIdx.y == 0 && active) {
        for (int i = 1; i < BIAS_ROW_LANES; i++)
            for (int k = 0; k < P; k++) sum[k] += s[i][threadIdx.x * P + k];
        for (int k = 0; k < P; k++) partial[(size_t)blockIdx.y * OC + (size_t)pack * P + k] = sum[k];
    }
}
__global__ void __launch_bounds__(32 * BIAS_ROW_LANES) bias_backward_partial_vec_kernel(
    float* partial, const floatX* dout, int N, int OC) {
    const int P = Pack128::size;
    __shared__ float s[BIAS_ROW_LANES][32 * Pack128::size];
    int pack = blockIdx.x * 32 + threadIdx.x;  // this thread's columns: pack * P .. pack * P + P - 1
    bool active = pack * P < OC;
    float sum[Pack128::size];
    for (int k = 0; k < P; k++) sum[k] = 0.0f;
    if (active) {
        for (int n = blockIdx.y * BIAS_ROW_LANES + threadIdx.y; n < N; n += gridDim.y * BIAS_ROW_LANES) {
            Pack128 d = load128(dout + (size_t)n * OC + (size_t)pack * P);
            for (int k = 0; k < P; k++) sum[k] += floatX_to_float(d.v[k]);
        }
    }
    bias_partial_row_write(partial, s, sum, pack, active, OC);
}

// --fused-kernels, fc's backward through GELU (matmul_backward_gelu_input): gelu_backward_vec_kernel and
// the kernel above in one pass, so dinp is not read back. Each thread's 16 bytes of a row of dinp = dout *
// GELU'(inp) are written, then added to its sums as rounded, rows in the kernel above's order: the partial
// rows are the bits the two kernels give. dinp may alias dout (each element read before it is written).
// Same grid, block and partial rows; needs OC % Pack128::size == 0 and 16-byte aligned buffers.
__global__ void __launch_bounds__(32 * BIAS_ROW_LANES) gelu_bias_backward_partial_kernel(
    floatX* dinp, float* partial, const floatX* inp, const floatX* dout, int N, int OC) {
    const int P = Pack128::size;
    __shared__ float s[BIAS_ROW_LANES][32 * Pack128::size];
    int pack = blockIdx.x * 32 + threadIdx.x;
    bool active = pack * P < OC;
    float sum[Pack128::size];
    for (int k = 0; k < P; k++) sum[k] = 0.0f;
    if (active) {
#pragma unroll 4
        for (int n = blockIdx.y * BIAS_ROW_LANES + threadIdx.y; n < N; n += gridDim.y * BIAS_ROW_LANES) {
            size_t i = (size_t)n * OC + (size_t)pack * P;
            Pack128 x = load128(inp + i), d = load128(dout + i), dx;
            for (int k = 0; k < P; k++) {
                dx.v[k] = float_to_floatX(floatX_to_float(d.v[k]) * gelu_derivative(floatX_to_float(x.v[k])));
                sum[k] += floatX_to_float(dx.v[k]);
            }
            store128(dinp + i, dx);
        }
    }
    bias_partial_row_write(partial, s, sum, pack, active, OC);
}

// dbias (OC) += the sums of `chunks` partial rows (OC floats each), in order: the kernels above end here
static void bias_backward_finish(floatX* dbias, const float* partial, int chunks, int OC) {
    bias_backward_finish_kernel<<<ceil_div(OC, BIAS_FINISH_THREADS), BIAS_FINISH_THREADS, 0, main_stream>>>(
        dbias, partial, chunks, OC);
    launchCheck();
}

// dbias (OC) += column sums of dout (N, OC) by the kernels above; `scratch` holds the partial sums
static void bias_backward_gpu(floatX* dbias, const floatX* dout, int N, int OC, Scratch* scratch, int fused) {
    bool vec = fused && OC % Pack128::size == 0 && aligned16(dout);
    int chunks = vec ? BIAS_VEC_CHUNKS : BIAS_CHUNKS;
    float* partial = (float*)scratch_get(scratch, (size_t)chunks * OC * sizeof(float));
    dim3 block(32, BIAS_ROW_LANES);
    if (vec)
        bias_backward_partial_vec_kernel<<<dim3(ceil_div(OC / Pack128::size, 32), chunks), block, 0, main_stream>>>(
            partial, dout, N, OC);
    else bias_backward_partial_kernel<<<dim3(ceil_div(OC, 32), chunks), block, 0, main_stream>>>(partial, dout, N, OC);
    launchCheck();
    bias_backward_finish(dbias, partial, chunks, OC);
}

// dinp (N, OC) = dout * GELU'(inp) and dbias (OC) += column sums of dinp: with --fused-kernels (`fused`) and
// 16-byte rows in one pass (the kernel above, then the same finish), else gelu_backward then bias_backward_gpu
static void gelu_bias_backward_gpu(floatX* dinp, floatX* dbias, const floatX* inp, const floatX* dout, int N, int OC,
                                   Scratch* scratch, int fused) {
    if (!(fused && OC % Pack128::size == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout))) {
        gelu_backward(dinp, inp, dout, (size_t)N * OC, fused);
        bias_backward_gpu(dbias, dinp, N, OC, scratch, fused);
        return;
    }
    float* partial = (float*)scratch_get(scratch, (size_t)BIAS_VEC_CHUNKS * OC * sizeof(float));
    dim3 grid(ceil_div(OC / Pack128::size, 32), BIAS_VEC_CHUNKS), block(32, BIAS_ROW_LANES);
    gelu_bias_backward_partial_kernel<<<grid, block, 0, main_stream>>>(dinp, partial, inp, dout, N, OC);
    launchCheck();
    bias_backward_finish(dbias, partial, BIAS_VEC_CHUNKS, OC);
}

// dbias (OC) += grad (OC): the bias gradient an epilogue wrote (it cannot add), added to the accumulated one
static void bias_accumulate(floatX* dbias, const floatX* grad, int OC) {
    residual_forward(dbias, dbias, grad, (size_t)OC);
}

// the weight and bias gradients of matmul_backward: dweight^T (IC,OC) += inp^T (IC,N) . dout (N,OC), and
// dbias += column sums of dout, with --fused-kernels read by the same product (BGRADB)
static void matmul_backward_weight_gpu(floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp, int N,
                                       int IC, int OC, Scratch* scratch, int fused) {
    if (dbias != NULL && fused) {
        floatX* grad = (floatX*)scratch_get(scratch, (size_t)OC * sizeof(floatX));
        if (matmul_cublaslt(dweight, inp, dout, IC, OC, N, false, true, true, fused, EPI_BGRADB, grad)) {
            bias_accumulate(dbias, grad, OC);
            return;
        }
    }
    matmul_cublaslt(dweight, inp, dout, IC, OC, N, false, true, true, fused);
    if (dbias != NULL) bias_backward_gpu(dbias, dout, N, OC, scratch, fused);
}
#endif

// ----------------------------------------------------------------------------------------------------
// launchers

// `scratch`: the CPU reference's transposed operand (OpenBLAS and the GPU path need none); `kernels`: the
// run's choice (llmc/device.h): on the CPU --cpu-matmul, on the GPU --fused-kernels (cached cuBLASLt plans
// and their epilogues)
static void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int IC,
                           int OC, Scratch* scratch, const KernelChoice* kernels) {
#ifdef LLMC_CPU
    matmul_forward_host(out, inp, weight, bias, N, IC, OC, scratch, kernels);
#else
    (void)scratch;
    int fused = kernels->fused;
    // column-major: out^T (OC,N) = weight (stored (IC,OC), transposed) . inp^T (IC,N)
    matmul_cublaslt(out, weight, inp, OC, N, IC, true, false, false, fused, bias != NULL ? EPI_BIAS : EPI_NONE, bias);
#endif
}

// A linear layer's backward is two products, named apart because the pipeline's ZB-H1 schedule runs them
// apart: the input's gradient dinp (N,IC) = dout (N,OC) . weight (OC,IC), which the layer below (and the
// previous stage) waits for, and the weight's, dweight (OC,IC) += dout^T . inp, with dbias (OC) += column
// sums of dout, which only the optimizer waits for. `scratch`: the CPU reference's transposed operand; on
// the GPU the bias gradient's partial sums.
static void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* weight, int N, int IC, int OC,
                                  const KernelChoice* kernels) {
#ifdef LLMC_CPU
    matmul_backward_input_host(dinp, dout, weight, N, IC, OC, kernels);
#else
    // dinp^T (IC,N) = weight^T (IC,OC) . dout^T (OC,N)
    matmul_cublaslt(dinp, weight, dout, IC, N, OC, false, false, false, kernels->fused);
#endif
}
static void matmul_backward_weight(floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp, int N, int IC,
                                   int OC, Scratch* scratch, const KernelChoice* kernels) {
#ifdef LLMC_CPU
    matmul_backward_weight_host(dweight, dbias, dout, inp, N, IC, OC, scratch, kernels);
#else
    matmul_backward_weight_gpu(dweight, dbias, dout, inp, N, IC, OC, scratch, kernels->fused);
#endif
}
static void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp,
                            const floatX* weight, int N, int IC, int OC, Scratch* scratch,
                            const KernelChoice* kernels) {
    matmul_backward_input(dinp, dout, weight, N, IC, OC, kernels);
    matmul_backward_weight(dweight, dbias, dout, inp, N, IC, OC, scratch, kernels);
}

// A projection into the residual stream: out (N,OC) = residual + inp . weight^T + bias. With --fused-kernels
// on the GPU one product, which reads residual as cuBLASLt's C (beta = 1) and adds the bias in its
// epilogue, rounding once; otherwise the product into `proj` (N,OC) and the residual kernel's add.
static void matmul_forward_residual(floatX* out, const floatX* residual, floatX* proj, const floatX* inp,
                                    const floatX* weight, const floatX* bias, int N, int IC, int OC, Scratch* scratch,
                                    const KernelChoice* kernels) {
#ifndef LLMC_CPU
    if (kernels->fused) {
        matmul_cublaslt(out, weight, inp, OC, N, IC, true, false, false, kernels->fused,
                        bias != NULL ? EPI_BIAS : EPI_NONE, bias, NULL, residual);
        return;
    }
#endif
    matmul_forward(proj, inp, weight, bias, N, IC, OC, scratch, kernels);
    residual_forward(out, residual, proj, (size_t)N * OC);
}

// A linear layer followed by GELU (the MLP's fc): pre (N,OC) = inp . weight^T + bias, out = gelu(pre).
// Both are kept: backward needs pre for GELU's derivative and out for the next layer's weight gradient.
// `gelu_epilogue`: on the GPU, GELU in the product's epilogue (one pass instead of three); it computes
// GELU from the unrounded sum, so its out may differ from gelu_forward(pre) in the last bit, and a run
// that recomputes out (--recompute) must not use it.
static void matmul_forward_gelu(floatX* out, floatX* pre, const floatX* inp, const floatX* weight, const floatX* bias,
                                int N, int IC, int OC, Scratch* scratch, const KernelChoice* kernels,
                                int gelu_epilogue) {
    int fused = kernels->fused;
#ifndef LLMC_CPU
    // the GELU input's leading dimension must be a multiple of 8 (cuBLASLt)
    if (gelu_epilogue && bias != NULL && OC % 8 == 0 &&
        matmul_cublaslt(out, weight, inp, OC, N, IC, true, false, false, fused, EPI_GELU_AUX_BIAS, bias, pre))
        return;
#endif
    (void)gelu_epilogue;
    matmul_forward(pre, inp, weight, bias, N, IC, OC, scratch, kernels);
    gelu_forward(out, pre, (size_t)N * OC, fused);
}

// The input half of the backward of a linear layer whose input was gelu(pre) (the MLP's fcproj, after
// matmul_forward_gelu), carried on through GELU: dpre (N,IC) = (dout . weight) * gelu'(pre), and
// dbias_pre (IC) += column sums of dpre, the bias gradient of the layer that made pre (so that layer's
// matmul_backward_weight gets no dbias). The weight half is matmul_backward_weight, as for any linear layer.
// cuBLASLt's DGELU_BGRAD epilogue would do GELU's part and the bias gradient in the dinp product, but on an
// H200 (GPT-2 124M, B=16, BF16; Nsight Compute) it ran as a kernel of its own after the product, 334 µs a
// call, where --fused-kernels' 16-byte GELU-backward and bias-gradient kernels took about 90 and 45
// (dev/cuda, the same GPU; on an H100 in training 100 and 44 + 7): so our own kernels, on both paths, and
// with --fused-kernels the two in one pass (gelu_bias_backward_gpu).
static void matmul_backward_gelu_input(floatX* dpre, floatX* dbias_pre, const floatX* dout, const floatX* pre,
                                       const floatX* weight, int N, int IC, int OC, Scratch* scratch,
                                       const KernelChoice* kernels) {
#ifdef LLMC_CPU
    (void)scratch;
    matmul_backward_input_host(dpre, dout, weight, N, IC, OC, kernels);
    gelu_backward_cpu(dpre, pre, dpre, (size_t)N * IC);
    bias_backward_cpu(dbias_pre, dpre, N, IC);
#else
    matmul_backward_input(dpre, dout, weight, N, IC, OC, kernels);
    gelu_bias_backward_gpu(dpre, dbias_pre, pre, dpre, N, IC, scratch, kernels->fused);
#endif
}
