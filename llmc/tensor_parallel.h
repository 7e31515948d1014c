/*
 * tensor_parallel.h: Megatron-style tensor parallelism over the T ranks of a TP group.
 *
 * Every transformer block is split so that each rank does 1/T of its matmuls. A column-parallel layer
 * computes some of the outputs from the whole, replicated input; the row-parallel layer after it reads
 * those outputs as they are and produces a partial sum of the whole output:
 *
 *              column-parallel                         row-parallel
 *   x (B,T,C) ──f──► [ W_1 | W_2 | .. | W_T ] ──► y_r ──► [ W_1 ; W_2 ; .. ; W_T ] ──► z_r ──g──► z + bias
 *   replicated       each rank: its columns      local    each rank: its rows          partial   replicated
 *                    of the output                        of the input
 *
 *   attention: x = ln1 ──f──► qkv (rank r: heads [r*NH/T, (r+1)*NH/T), their q, k, v rows and biases)
 *              ──► attention on the local heads ──► attproj ──g──► + attprojb ──► + residual
 *   MLP:       x = ln2 ──f──► fc (rank r: 4C/T hidden units) ──► GELU (local) ──► fcproj ──g──► + fcprojb
 *
 * Megatron names the two communications f and g; each is the other's mirror image:
 *   f  forward: identity (x is already on every rank)
 *      backward: all-reduce of dx, since each rank's dx holds only the part that flowed through its
 *      columns                                                                     -> tp_f_backward
 *   g  forward: all-reduce of the partial outputs z_r (the bias is added once, after the sum)
 *      backward: identity (dz is the same on every rank; each rank's row block needs all of it)
 *                                                                                  -> tp_g_forward
 * So a block costs one all-reduce in forward and one in backward, per attention and per MLP. The
 * identity halves are no code at all; the model calls tp_g_forward in row_parallel_forward and
 * tp_f_backward after each column-parallel layer's backward (qkv, fc, and the classifier).
 *
 * The tied wte is vocab-parallel: rank r owns rows [r*Vp/T, (r+1)*Vp/T).
 *   embedding: each rank looks up the ids in its rows (zero for the others) and rank 0 adds wpe: a
 *              g, whose sum has exactly one nonzero term per element (vocab_parallel_embedding_*)
 *   classifier: column-parallel over the vocabulary (logits only for its rows, the lnf input gets an
 *              f), and the cross-entropy is computed without gathering the logits: the row max, the
 *              sum of exponentials and the target logit are reduced across the group, and dlogits
 *              stay local (vocab_parallel_cross_entropy).
 * LayerNorms, wpe and the row-parallel biases are replicated: every rank computes the same gradients
 * for them, so they need no reduction.
 *
 * This file holds f and g, the rules that split each llm.c tensor (used to read and write the
 * single-file checkpoint slice by slice), the vocab-parallel embedding and cross-entropy, and the bias
 * add of a row-parallel layer. The model calls them from gpt2_forward / gpt2_backward in train_gpt.cu,
 * next to "TP:" comments.
 */
#pragma once

#include "model_file.h"  // GPT2Config, FileTensor
#include "comm.h"        // Comm: the TP group's all-reduce and all-gather
#include "encoder.h"     // the embedding that the vocabulary-parallel one splits
#include "run/trace.h"   // spans for f and g

// ----------------------------------------------------------------------------------------------------
// f and g (see above): the two all-reduces of a block, each a no-op on a group of one

static void tp_sum(Comm* comm, Tracer* tr, const char* name, floatX* x, size_t n) {
    if (comm->tp_group.size == 1) return;
    double t0 = trace_now_us(tr);
    comm_all_reduce(comm, &comm->tp_group, x, n, DT_FLOATX, REDUCE_SUM);
    comm_join_for_kernels(comm, &comm->tp_group);
    trace_add(tr, "tp", name, -1, t0);
}

// f's backward: dinp (n) of a column-parallel layer, this rank's part -> the sum over the group
static void tp_f_backward(Comm* comm, Tracer* tr, floatX* dinp, size_t n) { tp_sum(comm, tr, "f (backward)", dinp, n); }

// g's forward: out (n) of a row-parallel layer, this rank's partial sum -> the whole sum
static void tp_g_forward(Comm* comm, Tracer* tr, floatX* out, size_t n) { tp_sum(comm, tr, "g (forward)", out, n); }

// ----------------------------------------------------------------------------------------------------
// How each file tensor is split. Weights are stored as PyTorch's Linear stores them, (out, in), so a
// column-parallel layer (each rank computes some of the outputs) cuts its weight's rows, and a
// row-parallel layer (each rank reads some of the inputs) cuts its weight's columns:
//   SPLIT_NONE    replicated: wpe, LayerNorms, and the row-parallel biases (added once, after the sum)
//   SPLIT_COLUMN  column-parallel: qkvw, qkvb (q, k and v each cut by heads), fcw, fcb (by hidden units)
//   SPLIT_ROW     row-parallel: attprojw, fcprojw
//   SPLIT_VOCAB   the vocab-parallel embedding: rows of wte

typedef enum { SPLIT_NONE, SPLIT_COLUMN, SPLIT_ROW, SPLIT_VOCAB } TpSplit;

static TpSplit tp_split(int kind) {
    switch (kind) {
        case WTE: return SPLIT_VOCAB;
        case QKVW: case QKVB: case FCW: case FCB: return SPLIT_COLUMN;
        case ATTPROJW: case FCPROJW: return SPLIT_ROW;
        default: return SPLIT_NONE;
    }
}

// A (rows, cols) tensor and how it is split: by rows, in `blocks` equal blocks that are each cut T
// ways (qkv has q, k and v blocks), or by columns, or not at all.
typedef struct {
    size_t rows, cols;  // the whole tensor (one layer's part for per-layer tensors)
    TpSplit split;
    int blocks;
} TensorShape;

static int cuts_rows(TpSplit s) { return s == SPLIT_COLUMN || s == SPLIT_VOCAB; }

static TensorShape file_tensor_shape(const GPT2Config* c, int kind) {
    TensorShape s = {.split = tp_split(kind), .blocks = kind == QKVW || kind == QKVB ? 3 : 1};
    file_tensor_dims(c, kind, &s.rows, &s.cols);
    return s;
}

// this rank's (rows, cols) of the tensor
static TensorShape local_shape(TensorShape s, int tp) {
    if (cuts_rows(s.split)) s.rows /= tp;
    if (s.split == SPLIT_ROW) s.cols /= tp;
    return s;
}

// position in the whole tensor of local element (lr, lc) of rank r
static size_t whole_index(TensorShape whole, int tp, int r, size_t lr, size_t lc) {
    TensorShape local = local_shape(whole, tp);
    size_t fr = lr, fc = lc;
    if (cuts_rows(whole.split)) {
        size_t per_block = local.rows / whole.blocks;  // local rows of one block
        fr = (lr / per_block) * (whole.rows / whole.blocks) + (size_t)r * per_block + lr % per_block;
    } else if (whole.split == SPLIT_ROW) {
        fc = (size_t)r * local.cols + lc;
    }
    return fr * whole.cols + fc;
}

// A run of consecutive local elements that are also consecutive in the file.
typedef struct {
    size_t local, file, count;
} Run;

// The runs of local elements [lo, hi) of a tensor whose whole starts at file offset `file_base`.
// Returns their number; `out` needs room for (hi - lo) / local cols + 2 runs.
static size_t tensor_runs(TensorShape whole, int tp, int r, size_t file_base, size_t lo, size_t hi, Run* out) {
    TensorShape local = local_shape(whole, tp);
    size_t n = 0;
    for (size_t pos = lo; pos < hi;) {
        size_t lr = pos / local.cols, lc = pos % local.cols;
        size_t len = local.cols - lc < hi - pos ? local.cols - lc : hi - pos;
        size_t file = file_base + whole_index(whole, tp, r, lr, lc);
        if (n > 0 && out[n - 1].file + out[n - 1].count == file && out[n - 1].local + out[n - 1].count == pos)
            out[n - 1].count += len;
        else out[n++] = (Run){.local = pos, .file = file, .count = len};
        pos += len;
    }
    return n;
}

// ----------------------------------------------------------------------------------------------------
// this rank's rows of the padded vocabulary Vp: ids [start, start + rows), Vp/T each, in rank order of the
// TP group. The vocab-parallel embedding and cross-entropy below both take their slice from here.
typedef struct {
    int start, rows;
} VocabSlice;

static VocabSlice vocab_slice(const Comm* comm, int Vp) {
    int rows = Vp / comm->tp_group.size;
    return (VocabSlice){.start = comm->tp_group.rank * rows, .rows = rows};
}

// ----------------------------------------------------------------------------------------------------
// vocab-parallel cross-entropy, in three passes with two reductions across the TP group in between:
//   1. m_local = max of the row's real logits (global id < V) on this rank      -> all-reduce max
//   2. s_local = sum exp(x - m), t_local = the target's logit if this rank has it -> all-reduce sum
//   3. loss = log(s) + m - t; dlogits = (exp(x - m) / s - [i == target]) * dloss, 0 for padded ids
// logits (N, Vl) hold ids [start, start + Vl) of the padded vocabulary.

static void vocab_ce_max_cpu(float* m, const float* logits, int N, int Vl, int start, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = logits + (size_t)n * Vl;
        float mx = -INFINITY;
        for (int i = 0; i < Vl && start + i < V; i++) mx = x[i] > mx ? x[i] : mx;
        m[n] = mx;
    }
}

// st: (N, 2) = [sum of exponentials, target logit]
static void vocab_ce_sum_cpu(float* st, const float* logits, const float* m, const int* targets, int N, int Vl,
                             int start, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = logits + (size_t)n * Vl;
        float s = 0.0f;
        for (int i = 0; i < Vl && start + i < V; i++) s += expf(x[i] - m[n]);
        int t = targets[n] - start;
        st[2 * n] = s;
        st[2 * n + 1] = t >= 0 && t < Vl ? x[t] : 0.0f;
    }
}

static void vocab_ce_finish_cpu(float* logits, float* losses, const float* m, const float* st, const int* targets,
                                float dloss, int N, int Vl, int start, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        losses[n] = logf(st[2 * n]) + m[n] - st[2 * n + 1];
        if (dloss == 0.0f) continue;
        float* x = logits + (size_t)n * Vl;
        float inv = 1.0f / st[2 * n];
        for (int i = 0; i < Vl; i++) {
            int id = start + i;
            x[i] = id < V ? (expf(x[i] - m[n]) * inv - (id == targets[n] ? 1.0f : 0.0f)) * dloss : 0.0f;
        }
    }
}

#ifndef LLMC_CPU
// one block of VOCAB_CE_THREADS per row for each pass
#define VOCAB_CE_THREADS 256
__global__ void __launch_bounds__(VOCAB_CE_THREADS) vocab_ce_max_kernel(float* m, const floatX* logits, int Vl,
                                                                        int start, int V) {
    __shared__ float s_warp[32];
    const floatX* x = logits + (size_t)blockIdx.x * Vl;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < Vl && start + i < V; i += blockDim.x) mx = fmaxf(mx, floatX_to_float(x[i]));
    mx = warp_max(mx);
    if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < blockDim.x / 32; w++) mx = fmaxf(mx, s_warp[w]);
        m[blockIdx.x] = mx;
    }
}
__global__ void __launch_bounds__(VOCAB_CE_THREADS) vocab_ce_sum_kernel(float* st, const floatX* logits, const float* m,
                                                                        const int* targets, int Vl, int start, int V) {
    __shared__ float s_warp[32];
    int n = blockIdx.x;
    const floatX* x = logits + (size_t)n * Vl;
    float s = 0.0f;
    for (int i = threadIdx.x; i < Vl && start + i < V; i += blockDim.x) s += expf(floatX_to_float(x[i]) - m[n]);
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < blockDim.x / 32; w++) s += s_warp[w];
        int t = targets[n] - start;
        st[2 * n] = s;
        st[2 * n + 1] = t >= 0 && t < Vl ? floatX_to_float(x[t]) : 0.0f;
    }
}
__global__ void __launch_bounds__(VOCAB_CE_THREADS) vocab_ce_finish_kernel(
    floatX* logits, float* losses, const float* m, const float* st, const int* targets, float dloss, int Vl, int start,
    int V) {
    int n = blockIdx.x;
    if (threadIdx.x == 0) losses[n] = logf(st[2 * n]) + m[n] - st[2 * n + 1];
    if (dloss == 0.0f) return;
    floatX* x = logits + (size_t)n * Vl;
    float inv = 1.0f / st[2 * n];
    for (int i = threadIdx.x; i < Vl; i += blockDim.x) {
        int id = start + i;
        float g = id < V ? (expf(floatX_to_float(x[i]) - m[n]) * inv - (id == targets[n] ? 1.0f : 0.0f)) * dloss : 0.0f;
        x[i] = float_to_floatX(g);
    }
}
#endif

// the vocab-parallel classifier_forward_backward (see classifier.h); collective over the TP group.
// logits (N, Vp/T): this rank's rows of the padded vocabulary Vp (V real ids, the rest excluded).
// `scratch` holds each row's max (N), then its sum of exponentials and target logit (N, 2)
static void vocab_parallel_cross_entropy(Comm* comm, floatX* logits, float* losses, const int* targets, float dloss,
                                         int N, int V, int Vp, Scratch* scratch) {
    VocabSlice slice = vocab_slice(comm, Vp);
    int Vl = slice.rows, start = slice.start;
    float* m = (float*)scratch_get(scratch, 3 * (size_t)N * sizeof(float));
    float* st = m + N;
#ifdef LLMC_CPU
    vocab_ce_max_cpu(m, logits, N, Vl, start, V);
#else
    vocab_ce_max_kernel<<<N, VOCAB_CE_THREADS, 0, main_stream>>>(m, logits, Vl, start, V);
    launchCheck();
#endif
    comm_all_reduce(comm, &comm->tp_group, m, N, DT_FLOAT, REDUCE_MAX);
    comm_join_for_kernels(comm, &comm->tp_group);
#ifdef LLMC_CPU
    vocab_ce_sum_cpu(st, logits, m, targets, N, Vl, start, V);
#else
    vocab_ce_sum_kernel<<<N, VOCAB_CE_THREADS, 0, main_stream>>>(st, logits, m, targets, Vl, start, V);
    launchCheck();
#endif
    comm_all_reduce(comm, &comm->tp_group, st, 2 * (size_t)N, DT_FLOAT, REDUCE_SUM);
    comm_join_for_kernels(comm, &comm->tp_group);
#ifdef LLMC_CPU
    vocab_ce_finish_cpu(logits, losses, m, st, targets, dloss, N, Vl, start, V);
#else
    vocab_ce_finish_kernel<<<N, VOCAB_CE_THREADS, 0, main_stream>>>(logits, losses, m, st, targets, dloss,
                                                                    Vl, start, V);
    launchCheck();
#endif
}

// ----------------------------------------------------------------------------------------------------
// vocab-parallel embedding (llmc/encoder.h restricted to this rank's rows of wte), collective over the
// TP group; with one rank it is the plain embedding

// out (B,T,C) = wte[inp] + wpe[t]: a g over the ranks' lookups (inp: ids on the device)
static void vocab_parallel_embedding_forward(Comm* comm, Tracer* tr, floatX* out, const int* inp, const floatX* wte,
                                             const floatX* wpe, int B, int T, int C, int Vp) {
    VocabSlice slice = vocab_slice(comm, Vp);
    // wpe once, on rank 0
    encoder_forward(out, inp, wte, slice.start == 0 ? wpe : NULL, B, T, C, slice.start, slice.rows);
    tp_g_forward(comm, tr, out, (size_t)B * T * C);
}

// dwte (+=) for the ids in our rows only, dwpe (+=) the same on every rank: g's backward needs no
// communication, dout is replicated (inp_host: the same ids on the host; scratch, staging, fused: encoder_backward's)
static void vocab_parallel_embedding_backward(Comm* comm, floatX* dwte, floatX* dwpe, const floatX* dout,
                                              const int* inp, const int* inp_host, int B, int T, int C, int Vp,
                                              Scratch* scratch, HostStaging* staging, int fused) {
    VocabSlice slice = vocab_slice(comm, Vp);
    encoder_backward(dwte, dwpe, dout, inp, inp_host, B, T, C, slice.start, slice.rows, scratch, staging, fused);
}

// One position's logits for sampling: this rank's Vp/tp vocabulary rows (mine, on the device) all-gathered
// over the TP group, and the V real ones as floats on the host (logits). gathered (Vp, device) and row
// (Vp, host) are the caller's scratch.
static void vocab_parallel_logits_row(Comm* comm, const floatX* mine, int Vp, int V, floatX* gathered, floatX* row,
                                      float* logits) {
    int Vpl = Vp / comm->tp;
    device_copy(gathered + (size_t)comm->tp_rank * Vpl, mine, Vpl * sizeof(floatX));
    comm_all_gather(comm, &comm->tp_group, gathered, Vpl, DT_FLOATX);
    comm_join(comm);
    copy_to_host(row, gathered, Vp * sizeof(floatX));
    for (int i = 0; i < V; i++) logits[i] = floatX_to_float(row[i]);
}

// ----------------------------------------------------------------------------------------------------
// out (N, C) = a + b + bias (C): the residual add of a row-parallel layer, whose bias is added once,
// after the all-reduce of the partial outputs b

static void residual_bias_forward_cpu(float* out, const float* a, const float* b, const float* bias, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = a[(size_t)n * C + c] + (b[(size_t)n * C + c] + bias[c]);
}

#ifndef LLMC_CPU
#define RESIDUAL_BIAS_THREADS 256  // threads per block, one element each
__global__ void __launch_bounds__(RESIDUAL_BIAS_THREADS) residual_bias_forward_kernel(
    floatX* out, const floatX* a, const floatX* b, const floatX* bias, int N, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    float v = floatX_to_float(b[i]) + floatX_to_float(bias[i % C]);
    // b + bias rounded, as a matmul output would be
    out[i] = float_to_floatX(floatX_to_float(a[i]) + floatX_to_float(float_to_floatX(v)));
}
#endif

static void residual_bias_forward(floatX* out, const floatX* a, const floatX* b, const floatX* bias, int N, int C) {
#ifdef LLMC_CPU
    residual_bias_forward_cpu(out, a, b, bias, N, C);
#else
    const int block = RESIDUAL_BIAS_THREADS;
    residual_bias_forward_kernel<<<grid_for((size_t)N * C, block), block, 0, main_stream>>>(out, a, b, bias, N, C);
    launchCheck();
#endif
}
// Checks that the model splits over tp ranks (whole heads, whole hidden units, whole vocabulary rows).
static void validate_tp(const GPT2Config* c, int tp) {
    if (c->NH % tp != 0) fatal("--tp %d: the %d attention heads do not split evenly", tp, c->NH);
    if ((4 * c->C) % tp != 0) fatal("--tp %d: the MLP's 4C=%d hidden units do not split evenly", tp, 4 * c->C);
    if (c->Vp % tp != 0) fatal("--tp %d: the padded vocabulary Vp=%d does not split evenly", tp, c->Vp);
}
