/*
 * train_gpt.cu: GPT-2 training in one readable file, from one source for two targets.
 *
 *   GPU: nvcc, CUDA kernels, cuBLASLt and NCCL, floatX = bf16 (PRECISION=BF16), fp16 (PRECISION=FP16,
 *        with loss scaling) or float (PRECISION=FP32)
 *   CPU: g++ -x c++ -DLLMC_CPU, the same code with the CPU reference loops and OpenMP, floatX = float
 *
 * What is here, top to bottom:
 *   1. the parameter layout: one flat buffer, and a pointer table into it; which tensors (and which
 *      slices of them) this rank holds
 *   2. the activations: flat buffers, and pointer tables into them (one set per micro-batch in flight)
 *   3. the model: build, initialize or load, forward, backward (with recomputation), the optimizer
 *      update (with ZeRO sharding and loss scaling), and the pipeline step that runs micro-batches
 *      through the stages
 *   4. checkpoints (model + optimizer shards + data position + RNG) and sampling
 *   5. the run's configuration and the memory planner (--plan)
 *   6. the training loop and the command line
 * Every layer's math lives in llmc/<layer>.h, CPU reference and CUDA kernels side by side; each kind of
 * parallelism has its own header (comm, zero, tensor_parallel, pipeline) and "DP:", "TP:", "PP:"
 * comments mark where the model code calls into it.
 *
 * Parameters are laid out in memory layer by layer (wte, wpe, then for each layer its 12 tensors, then
 * lnfw, lnfb), not in the file's tensor-by-tensor order: a layer's parameters and gradients are one
 * contiguous range, which is what the parallel modes slice, communicate and shard. Conversion to the
 * llm.c file order happens only when reading and writing files.
 */
#include "llmc/adamw.h"
#include "llmc/agreement.h"
#include "llmc/attention.h"
#include "llmc/checkpoint.h"
#include "llmc/classifier.h"
#include "llmc/comm.h"
#include "llmc/common.h"
#include "llmc/dataloader.h"
#include "llmc/device.h"
#include "llmc/encoder.h"
#include "llmc/gelu.h"
#include "llmc/global_norm.h"
#include "llmc/layernorm.h"
#include "llmc/logger.h"
#include "llmc/loss_scaler.h"
#include "llmc/matmul.h"
#include "llmc/pipeline.h"
#include "llmc/residual.h"
#include "llmc/stop_signal.h"
#include "llmc/tensor_parallel.h"
#include "llmc/tokenizer.h"
#include "llmc/trace.h"
#include "llmc/bpe.h"
#include "llmc/eval.h"
#include "llmc/zero.h"

#include <signal.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------------------------------
// 1. parameter layout

typedef struct {
    floatX *ln1w, *ln1b;          // (C)
    floatX *qkvw, *qkvb;          // (3C, C), (3C)
    floatX *attprojw, *attprojb;  // (C, C), (C)
    floatX *ln2w, *ln2b;          // (C)
    floatX *fcw, *fcb;            // (4C, C), (4C)
    floatX *fcprojw, *fcprojb;    // (C, 4C), (C)
} LayerWeights;  // the 12 tensors of a block, in file order (llmc/model_file.h): a table of pointers
static_assert(sizeof(LayerWeights) == NUM_LAYER_TENSORS * sizeof(floatX*), "LayerWeights is a table of 12 pointers");

typedef struct {
    floatX* wte;  // (Vp, C) token embedding, tied with the classifier
    floatX* wpe;  // (maxT, C) position embedding
    LayerWeights* layers;  // [L]
    floatX *lnfw, *lnfb;   // (C) final LayerNorm
} Weights;

// One tensor's place in the flat buffer. Offsets are rounded up to 64 elements so every tensor starts
// 128-byte aligned (cuBLASLt's fast paths); the gaps are zero and stay zero. With tensor parallelism a
// rank holds its slice of the split tensors (see llmc/tensor_parallel.h), so numel is the local size.
typedef struct {
    int kind;   // which tensor: a FileTensor (llmc/model_file.h)
    int layer;  // 0..L-1 for per-layer tensors, 0 otherwise
    int bucket; // the communication bucket it belongs to (see below)
    size_t offset, numel;
    TensorShape whole;  // the whole tensor (all TP ranks), and how it is split
    size_t file_base;   // where the whole tensor starts in the file order
    int decay;  // weight decay applies (2-D weights: wte, wpe, qkvw, attprojw, fcw, fcprojw)
} TensorSlot;

// Buckets group the tensors that become final together in backward, and are what data parallelism
// communicates: 0 = embeddings (wte, wpe), 1 + l = layer l, L + 1 = final LayerNorm. Each bucket is
// padded to a multiple of 64 * D elements so that it splits into D aligned chunks (llmc/zero.h).
typedef struct {
    int num_slots;  // 12 L + 4, in memory order
    TensorSlot* slots;
    int num_buckets;  // L + 2
    Bucket* buckets;
    size_t total;  // elements of the flat buffer, gaps included
    int tp, tp_rank;  // the slices held: rank tp_rank of tp
} ParamLayout;

// Where a rank sits in the dp x tp x pp grid, what it owns, and how its optimizer state is sharded.
typedef struct {
    int zero;            // ZeRO stage
    int dp, dp_rank;     // data parallelism
    int tp, tp_rank;     // tensor parallelism: slice tp_rank of the split tensors
    int pp, pp_rank;     // pipeline parallelism: this stage owns layers [l0, l1)
    int l0, l1;
} Placement;

static Placement placement_single(const GPT2Config* c) { return (Placement){.dp = 1, .tp = 1, .pp = 1, .l1 = c->L}; }
static int is_first_stage(const Placement* p) { return p->pp_rank == 0; }
static int is_last_stage(const Placement* p) { return p->pp_rank == p->pp - 1; }

// Which tensors a pipeline stage holds: the first stage the embeddings, the last the final LayerNorm,
// both the tied wte, each its own layers.
static int stage_has(const Placement* p, int kind, int layer) {
    if (kind == WTE) return is_first_stage(p) || is_last_stage(p);
    if (kind == WPE) return is_first_stage(p);
    if (kind == LNFW || kind == LNFB) return is_last_stage(p);
    return layer >= p->l0 && layer < p->l1;
}

// the i-th tensor in memory order (wte, wpe, layer 0's 12 tensors, ..., layer L-1's, lnfw, lnfb), and
// its layer (0 for the tensors that are not per layer)
static int memory_order_tensor(int i, int L, int* layer) {
    int k = i - 2;  // index among the layers' tensors
    *layer = 0;
    if (i < 2) return i == 0 ? WTE : WPE;
    if (k >= NUM_LAYER_TENSORS * L) return k - NUM_LAYER_TENSORS * L == 0 ? LNFW : LNFB;
    *layer = k / NUM_LAYER_TENSORS;
    return LN1W + k % NUM_LAYER_TENSORS;
}

static ParamLayout build_layout(const GPT2Config* c, const Placement* p) {
    ParamLayout lay;
    lay.tp = p->tp;
    lay.tp_rank = p->tp_rank;
    lay.slots = (TensorSlot*)malloc_check((NUM_LAYER_TENSORS * c->L + 4) * sizeof(TensorSlot));
    // every tensor's place in the file order, and the slots of the ones this stage holds
    size_t* file_base = (size_t*)malloc_check(NUM_FILE_TENSORS * c->L * sizeof(size_t));  // [kind][layer]
    size_t file_offset = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++)
        for (int l = 0; l < (tensor_is_per_layer(kind) ? c->L : 1); l++) {
            file_base[kind * c->L + l] = file_offset;
            file_offset += file_tensor_numel(c, kind);
        }
    lay.num_slots = 0;
    for (int i = 0; i < NUM_LAYER_TENSORS * c->L + 4; i++) {  // memory order: wte, wpe, layers, lnfw, lnfb
        int layer, kind = memory_order_tensor(i, c->L, &layer);
        if (!stage_has(p, kind, layer)) continue;
        TensorSlot* s = &lay.slots[lay.num_slots++];
        s->kind = kind;
        s->layer = layer;
        s->bucket = tensor_is_per_layer(kind) ? 1 + layer : kind == WTE || kind == WPE ? 0 : c->L + 1;
        s->whole = file_tensor_shape(c, kind);
        TensorShape local = local_shape(s->whole, p->tp);
        s->numel = local.rows * local.cols;
        s->file_base = file_base[kind * c->L + layer];
        s->decay = tensor_is_matrix(kind);
    }
    lay.num_buckets = c->L + 2;  // buckets of layers on other stages stay empty
    lay.buckets = (Bucket*)calloc_check(lay.num_buckets * sizeof(Bucket));
    size_t offset = 0;
    for (int i = 0; i < lay.num_slots; i++) {
        TensorSlot* s = &lay.slots[i];
        if (i == 0 || s->bucket != lay.slots[i - 1].bucket) {  // a new bucket starts
            offset = round_up(offset, 64 * (size_t)p->dp);
            lay.buckets[s->bucket].offset = offset;
        }
        s->offset = offset;
        offset = round_up(offset + s->numel, 64);
        lay.buckets[s->bucket].size = round_up(offset, 64 * (size_t)p->dp) - lay.buckets[s->bucket].offset;
    }
    lay.total = round_up(offset, 64 * (size_t)p->dp);
    for (int b = 0; b < lay.num_buckets; b++)  // empty buckets sit at the end, owning nothing
        if (lay.buckets[b].size == 0) lay.buckets[b].offset = lay.total;
    free(file_base);
    return lay;
}

// The runs (llmc/tensor_parallel.h) of local elements [lo, hi) of slot i held by TP rank r, in the
// file order. Returns a malloc'ed array and its length in *n.
static Run* slot_runs(const ParamLayout* lay, int i, int r, size_t lo, size_t hi, size_t* n) {
    const TensorSlot* s = &lay->slots[i];
    TensorShape local = local_shape(s->whole, lay->tp);
    Run* runs = (Run*)malloc_check(((hi - lo) / local.cols + 2) * sizeof(Run));
    *n = tensor_runs(s->whole, lay->tp, r, s->file_base, lo, hi, runs);
    return runs;
}

static void free_layout(ParamLayout* lay) {
    free(lay->slots);
    free(lay->buckets);
}

// Pointer table into buffers laid out like the parameters: tensor = bucket_base[its bucket] + its
// offset inside the bucket. Usually bucket_base[b] = base + bucket offset; ZeRO-2 points the gradient
// buckets into a workspace instead.
static Weights point_weights(const GPT2Config* c, const ParamLayout* lay, floatX* const* bucket_base) {
    Weights w;
    memset(&w, 0, sizeof(w));
    w.layers = (LayerWeights*)calloc_check(c->L * sizeof(LayerWeights));  // layers of other stages stay NULL
    for (int i = 0; i < lay->num_slots; i++) {
        const TensorSlot* s = &lay->slots[i];
        floatX* p = bucket_base[s->bucket] + (s->offset - lay->buckets[s->bucket].offset);
        if (s->kind == WTE) w.wte = p;
        else if (s->kind == WPE) w.wpe = p;
        else if (s->kind == LNFW) w.lnfw = p;
        else if (s->kind == LNFB) w.lnfb = p;
        else ((floatX**)&w.layers[s->layer])[s->kind - LN1W] = p;  // LayerWeights is a table in file order
    }
    return w;
}

static Weights point_weights_flat(const GPT2Config* c, const ParamLayout* lay, floatX* base) {
    floatX** bases = (floatX**)malloc_check(lay->num_buckets * sizeof(floatX*));
    for (int b = 0; b < lay->num_buckets; b++) bases[b] = base + lay->buckets[b].offset;
    Weights w = point_weights(c, lay, bases);
    free(bases);
    return w;
}

// memory layout of TP rank r <-> llm.c file order, for float buffers on the host (layout_to_file_order
// writes only rank r's slices of the split tensors)
static void copy_layout_file(const ParamLayout* lay, int r, float* mem, float* file, int to_file) {
    for (int i = 0; i < lay->num_slots; i++) {
        size_t n;
        Run* runs = slot_runs(lay, i, r, 0, lay->slots[i].numel, &n);
        for (size_t k = 0; k < n; k++) {
            float* m = mem + lay->slots[i].offset + runs[k].local;
            if (to_file) memcpy(file + runs[k].file, m, runs[k].count * sizeof(float));
            else memcpy(m, file + runs[k].file, runs[k].count * sizeof(float));
        }
        free(runs);
    }
}
static void layout_to_file_order(const ParamLayout* lay, int r, const float* mem, float* file) {
    copy_layout_file(lay, r, (float*)mem, file, 1);
}
static void file_order_to_layout(const ParamLayout* lay, const float* file, float* mem) {
    memset(mem, 0, lay->total * sizeof(float));
    copy_layout_file(lay, lay->tp_rank, mem, (float*)file, 0);
}

// ----------------------------------------------------------------------------------------------------
// 2. activations

typedef struct {
    floatX* encoded;                        // (B, T, C)
    floatX* ln1;                            // (L, B, T, C)
    float *ln1_mean, *ln1_rstd;             // (L, B, T)
    floatX* qkv;                            // (L, B, T, 3C)
    floatX* atty;                           // (L, B, T, C) attention output, before the projection
    floatX* att;                            // (L, B, NH, T, T) attention probabilities (classic attention only)
    float* lse;                             // (L, B, NH, T) logsumexp of each score row (--attention flash only)
    floatX* residual2;                      // (L, B, T, C) after the attention block
    floatX* ln2;                            // (L, B, T, C)
    float *ln2_mean, *ln2_rstd;             // (L, B, T)
    floatX* fch;                            // (L, B, T, 4C) MLP hidden, before GELU
    floatX* fch_gelu;                       // (L, B, T, 4C) after GELU
    floatX* residual3;                      // (L, B, T, C) after the MLP block = next layer's input
    floatX* lnf;                            // (B, T, C)
    float *lnf_mean, *lnf_rstd;             // (B, T)
    floatX* logits;                         // (B, T, Vp), overwritten in place by dlogits when training
    float* losses;                          // (B, T) per-position cross-entropy
    // workspace, reused inside forward and backward
    floatX* scratch;                        // (B, T, C) a projection's output before the residual add, or a dln
    floatX* dresidual;                      // (B, T, C) gradient of the residual stream
    floatX* dwide;                          // (B, T, 4C) dfch / dqkv
    int *inputs, *targets;                  // (B, T) token ids on the device
    int* host_inputs;                       // (B, T) the same ids on the host (the GPU encoder backward groups them)
    int* host_targets;                      // (B, T) kept for a rematerialized forward
} Activations;

typedef struct {
    void** ptr;
    size_t bytes;
} BufferSpec;

// The layer launchers' scratch (llmc/device.h): buffers a launcher needs only while it runs, grown on first
// use and kept, one per purpose, owned by the model and freed with it. The planner counts them as kernel
// scratch (gpu_kernel_scratch, cpu_kernel_scratch).
typedef struct {
    Scratch matmul;     // CPU: the transposed operand; GPU: the bias gradient's partial sums
    Scratch layernorm;  // GPU: layernorm_backward's partial sums of dweight and dbias
    Scratch attention;  // GPU: classic attention's q, k, v, y and scores, or flash backward's D
    Scratch encoder;    // GPU: encoder_backward's positions grouped by token
    Scratch norm;       // GPU: the gradient norm's per-block partial sums
    Scratch vocab_ce;   // TP: the vocab-parallel cross-entropy's per-row max, sum and target logit
} KernelScratch;

static void kernel_scratch_free(KernelScratch* k) {
    Scratch* all[] = {&k->matmul, &k->layernorm, &k->attention, &k->encoder, &k->norm, &k->vocab_ce};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) scratch_free(all[i]);
}

// Lays out `n` buffers in one allocation (256-byte aligned each); returns the base pointer (NULL when
// built dry, with the buffers' pointers as offsets from it).
static void* allocate_buffers(const BuildMode* mode, BufferSpec* specs, int n, size_t* total_bytes) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += round_up(specs[i].bytes, 256);
    char* base = NULL;
    if (!mode->dry) {
        base = (char*)device_malloc(total);
        device_memset_zero(base, total);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        *specs[i].ptr = base + offset;
        offset += round_up(specs[i].bytes, 256);
    }
    *total_bytes = total;
    return base;
}

// ----------------------------------------------------------------------------------------------------
// 3. the model

typedef struct {
    GPT2Config config;
    ParamLayout layout;
    size_t num_parameters;  // real parameters (padding of Vp included, alignment gaps not)
    BuildMode mode;         // real, or dry for the planner (and the element size it plans for)
    KernelChoice kernels;   // which kernel variants forward and backward launch (llmc/device.h)
    Comm* comm;             // ranks and collectives (a single-rank Comm when not distributed)
    Placement place;        // this rank's grid position, its layers and its slices
    int tp, tp_rank;        // = place.tp, place.tp_rank (used everywhere)
    int first, last;        // this is the first / last pipeline stage (both without pipelining)
    ZeroPlan zero;          // which part of each bucket's optimizer state (and at stage 2, gradients) is ours
    floatX* params_memory;  // (layout.total) what forward and backward read, always whole
    floatX* grads_memory;   // (layout.total) stages 0 and 1; NULL at stage 2
    Zero2Grads zero2;       // stage 2: the gradient shard and the workspace backward writes (llmc/zero.h)
    float* master;          // (zero.shard_total) fp32 master weights in BF16 builds; NULL in FP32 builds,
                            // where the parameters are their own master copy
    float *m, *v;           // (zero.shard_total) AdamW moments
    NormParts norm_parts;   // this rank's owned gradient ranges, as the norm sums them (gpt2_grad_sumsq)
    Weights params, grads;
    Activations* slots;      // (n_slots) one per micro-batch in flight in the pipeline schedule
    Activations work;        // rematerialization: the one full set; slots then hold only stage inputs
    int n_slots, rematerialize;
    int recompute;           // --recompute level: which layer activations backward recomputes (see LayerActs)
    int stochastic_rounding; // BF16: parameter updates rounded stochastically (llmc/adamw.h)
    void* acts_memory;
    KernelScratch kernel_scratch;  // the layer launchers' buffers (allocated by the launchers, on first use)
    int B, T;  // the batch shape activations were allocated for (0: not yet)
    size_t bytes_params, bytes_grads, bytes_optimizer, bytes_activations, bytes_workspace, bytes_comm;
    Tracer* tracer;  // spans for --trace (NULL: off)
    float* host_losses; // (B, T)
    // --fused-kernels in a training step: gpt2_forward leaves its mean loss at loss_dest (device) instead
    // of copying the losses over and waiting; pipeline_step fetches the step's (M) means in one copy
    float* loss_dest;        // NULL: gpt2_forward returns the loss itself
    float* step_losses;      // (step_losses_cap) device
    int step_losses_cap;
} GPT2;

// In fp32 the parameters are their own master weights; in bf16 and fp16 an fp32 copy is kept.
static int master_is_params(const GPT2* model) { return model->mode.elem_bytes == sizeof(float); }

// A one-rank world, for single-process runs, the planner and tests (the caller keeps it).
static Comm comm_single(void) {
    Comm single;
    memset(&single, 0, sizeof(single));
    single.world_size = single.dp = single.tp = single.pp = 1;
    single.world.size = single.dp_group.size = single.tp_group.size = single.pp_group.size = single.emb_group.size = 1;
    return single;
}

// Checks that the model splits over tp ranks (whole heads, whole hidden units, whole vocabulary rows).
static void validate_tp(const GPT2Config* c, int tp) {
    if (c->NH % tp != 0) fatal("--tp %d: the %d attention heads do not split evenly", tp, c->NH);
    if ((4 * c->C) % tp != 0) fatal("--tp %d: the MLP's 4C=%d hidden units do not split evenly", tp, 4 * c->C);
    if (c->Vp % tp != 0) fatal("--tp %d: the padded vocabulary Vp=%d does not split evenly", tp, c->Vp);
}

static void gpt2_init_norm_parts(GPT2* model);

// Allocates the parameters, gradients and optimizer state of one rank: TP rank tp_rank of tp (its
// slices of the split tensors), DP rank dp_rank of dp, sharded per ZeRO stage `zero_stage` (llmc/zero.h).
// `mode`: for real, or dry for the planner (gpt2_build builds for a run); `kernels`: the run's choice of
// kernel variants, which the activations' layout follows too.
static void gpt2_build_as(GPT2* model, const GPT2Config* c, Comm* comm, const Placement* place, const BuildMode* mode,
                          const KernelChoice* kernels) {
    memset(model, 0, sizeof(*model));
    model->mode = *mode;
    model->kernels = *kernels;
    validate_config(c, "model");
    validate_tp(c, place->tp);
    model->config = *c;
    model->comm = comm;
    model->place = *place;
    model->tp = place->tp;
    model->tp_rank = place->tp_rank;
    model->first = is_first_stage(place);
    model->last = is_last_stage(place);
    int zero_stage = place->zero, dp = place->dp, dp_rank = place->dp_rank;
    model->layout = build_layout(c, place);
    model->num_parameters = gpt2_num_parameters(c);
    ParamLayout* lay = &model->layout;
    zero_plan_init(&model->zero, zero_stage, dp, dp_rank, lay->buckets, lay->num_buckets);
    size_t n = lay->total, shard = model->zero.shard_total, fx = mode->elem_bytes;

    model->params_memory = (floatX*)zeroed_device_buffer(mode, n * fx, &model->bytes_params);
    model->params = point_weights_flat(c, lay, model->params_memory);
    if (zero_stage < 2) {
        model->grads_memory = (floatX*)zeroed_device_buffer(mode, n * fx, &model->bytes_grads);
        model->grads = point_weights_flat(c, lay, model->grads_memory);
    } else {  // ZeRO-2: backward writes into the workspace, whose buckets point the gradient tensors
        check_internal(place->pp == 1, "ZeRO-2 with pipeline parallelism");
        zero2_init(&model->zero2, &model->zero, mode, &model->bytes_grads, &model->bytes_comm, &model->bytes_workspace);
        floatX** bases = (floatX**)malloc_check(lay->num_buckets * sizeof(floatX*));
        zero2_bucket_bases(&model->zero2, &model->zero, bases);
        model->grads = point_weights(c, lay, bases);
        free(bases);
    }
    if (!master_is_params(model)) model->master = (float*)zeroed_device_buffer(mode, shard * sizeof(float), &model->bytes_optimizer);
    model->m = (float*)zeroed_device_buffer(mode, shard * sizeof(float), &model->bytes_optimizer);
    model->v = (float*)zeroed_device_buffer(mode, shard * sizeof(float), &model->bytes_optimizer);
    gpt2_init_norm_parts(model);
}

// For real runs and tests: builds for this build's precision, allocating everything.
static void gpt2_build(GPT2* model, const GPT2Config* c, Comm* comm, const Placement* place, const KernelChoice* kernels) {
    gpt2_build_as(model, c, comm, place, &BUILD_FOR_RUN, kernels);
}

static void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    zero2_free(&model->zero2);
    device_free(model->master);
    device_free(model->m);
    device_free(model->v);
    device_free(model->acts_memory);
    kernel_scratch_free(&model->kernel_scratch);
    for (int i = 0; i < model->n_slots; i++) free(model->slots[i].host_inputs), free(model->slots[i].host_targets);
    free(model->work.host_inputs), free(model->work.host_targets);
    free(model->slots);
    free(model->grads.layers);
    free_layout(&model->layout);
    zero_plan_free(&model->zero);
    norm_parts_free(&model->norm_parts);
    free(model->host_losses);
    device_free(model->step_losses);
}

// The fp32 master weights of bucket b's owned range: a shard buffer in BF16 builds, the parameters
// themselves in FP32 builds.
static float* master_of_bucket(GPT2* model, int b) {
    if (master_is_params(model)) return (float*)model->params_memory + owned_start(&model->zero, b);
    return model->master + model->zero.owned_offset[b];
}

// The reduced gradients of bucket b's owned range.
static floatX* grads_of_bucket(GPT2* model, int b) {
    if (model->zero.stage == 2) return model->zero2.shard + model->zero.owned_offset[b];
    return model->grads_memory + owned_start(&model->zero, b);
}

// host buffer in memory layout (layout.total) <-> this rank's shard of it (zero.shard_total)
static void shard_from_layout(const ZeroPlan* z, const float* mem, float* shard) {
    for (int b = 0; b < z->num_buckets; b++)
        memcpy(shard + z->owned_offset[b], mem + owned_start(z, b), owned_size(z, b) * sizeof(float));
}

// parameters from a host float array in file order: the whole floatX copy, and our master shard
static void gpt2_set_parameters(GPT2* model, const float* file_order) {
    float* mem = (float*)malloc_check(model->layout.total * sizeof(float));
    file_order_to_layout(&model->layout, file_order, mem);
    upload_floats(model->params_memory, mem, model->layout.total);
    if (!master_is_params(model)) {
        float* shard = (float*)malloc_check(model->zero.shard_total * sizeof(float));
        shard_from_layout(&model->zero, mem, shard);
        copy_to_device(model->master, shard, model->zero.shard_total * sizeof(float));
        free(shard);
    }
    free(mem);
}

// AdamW moments from host float arrays in file order (resume), into our shard
static void gpt2_set_optimizer_state(GPT2* model, const float* m_file, const float* v_file) {
    float* mem = (float*)malloc_check(model->layout.total * sizeof(float));
    float* shard = (float*)malloc_check(model->zero.shard_total * sizeof(float));
    const float* src[2] = {m_file, v_file};
    float* dst[2] = {model->m, model->v};
    for (int i = 0; i < 2; i++) {
        file_order_to_layout(&model->layout, src[i], mem);
        shard_from_layout(&model->zero, mem, shard);
        copy_to_device(dst[i], shard, model->zero.shard_total * sizeof(float));
    }
    free(mem);
    free(shard);
}

// a buffer laid out like the parameters (floatX or float, whole) -> host float array in file order
static void gpt2_export(const GPT2* model, const void* buffer, int is_floatX, float* file_order) {
    size_t n = model->layout.total;
    float* mem = (float*)malloc_check(n * sizeof(float));
    if (is_floatX) download_floats(mem, (const floatX*)buffer, n);
    else copy_to_host(mem, buffer, n * sizeof(float));
    layout_to_file_order(&model->layout, model->tp_rank, mem, file_order);
    free(mem);
}

// The fp32 master weights, whole, in file order (collective: every rank must call it). The owned
// chunks of the master shards are all-gathered across the DP group (stages 1 and 2), then the TP slices
// across the TP group, then the pipeline stages' tensors are summed across the PP group.
static void gpt2_export_master(GPT2* model, float* file_order) {
    const ZeroPlan* z = &model->zero;
    Comm* comm = model->comm;
    size_t n = model->layout.total;
    float* whole = (float*)device_malloc(n * model->tp * sizeof(float));  // [TP rank 0 | 1 | ...]
    float* mine = whole + (size_t)model->tp_rank * n;
    device_memset_zero(mine, n * sizeof(float));
    for (int b = 0; b < z->num_buckets; b++) {
        float* src = master_of_bucket(model, b);
        device_copy(mine + owned_start(z, b), src, owned_size(z, b) * sizeof(float));
        if (z->stage > 0) comm_all_gather(comm, &comm->dp_group, mine + z->buckets[b].offset, owned_size(z, b), DT_FLOAT);
    }
    comm_join_group(comm, &comm->dp_group);  // the TP all-gather sends what the DP all-gathers wrote
    comm_all_gather(comm, &comm->tp_group, whole, n, DT_FLOAT);
    comm_join(comm);
    float* host = (float*)malloc_check(n * model->tp * sizeof(float));
    copy_to_host(host, whole, n * model->tp * sizeof(float));
    size_t total = model->num_parameters;
    memset(file_order, 0, total * sizeof(float));
    for (int r = 0; r < model->tp; r++) layout_to_file_order(&model->layout, r, host + (size_t)r * n, file_order);
    free(host);
    device_free(whole);
    if (model->place.pp > 1) {  // PP: each stage filled in its own tensors; the sum over stages is the model
        if (model->last && !model->first) memset(file_order, 0, file_tensor_numel(&model->config, WTE) * sizeof(float));  // wte once
        float* dev = (float*)device_malloc(total * sizeof(float));
        copy_to_device(dev, file_order, total * sizeof(float));
        comm_all_reduce(comm, &comm->pp_group, dev, total, DT_FLOAT, REDUCE_SUM);
        comm_join(comm);
        copy_to_host(file_order, dev, total * sizeof(float));
        device_free(dev);
    }
}

// GPT-2 initialization: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0,
// LayerNorm weights 1; padded vocabulary rows 0. Drawn in file order from one seeded generator.
static void gpt2_init_random(GPT2* model, uint64_t seed) {
    const GPT2Config* c = &model->config;
    float* p = (float*)malloc_check(model->num_parameters * sizeof(float));
    Rng rng = {seed};
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++) {
        for (int l = 0; l < (tensor_is_per_layer(kind) ? c->L : 1); l++) {
            size_t n = file_tensor_numel(c, kind);
            int is_ln_weight = tensor_is_layernorm_weight(kind), is_matrix = tensor_is_matrix(kind);
            float std = tensor_is_residual_projection(kind) ? 0.02f / sqrtf(2.0f * c->L) : 0.02f;
            for (size_t i = 0; i < n; i++) {
                float value = is_ln_weight ? 1.0f : is_matrix ? std * rng_normal(&rng) : 0.0f;
                if (kind == WTE && i >= (size_t)c->V * c->C) value = 0.0f;  // padded rows of wte
                p[pos + i] = value;
            }
            pos += n;
        }
    }
    gpt2_set_parameters(model, p);
    free(p);
}

// The activations of this rank's layers for micro-batches of (B, T): n_slots sets for the micro-batches
// a pipeline schedule keeps in flight (1 without pipelining), plus the workspace they share. With
// rematerialization the slots keep only each micro-batch's stage input and ids, and one full set is
// recomputed in backward.
static void gpt2_allocate_activations(GPT2* model, int B, int T, int n_slots, int rematerialize) {
    const GPT2Config* c = &model->config;
    if (T > c->maxT) fatal("sequence length T=%d is longer than the model's maxT=%d", T, c->maxT);
    // with tensor parallelism the split activations hold this rank's heads, hidden units and vocabulary
    size_t L = model->place.l1 - model->place.l0, C = c->C, tp = model->tp, BT = (size_t)B * T;
    size_t Cl = C / tp, NHl = c->NH / tp, Vpl = model->last ? c->Vp / tp : 0, lf = model->last ? 1 : 0;
    size_t fx = model->mode.elem_bytes, f = sizeof(float);
    int n_full = rematerialize ? 1 : n_slots;
    int n_sets = n_full + (rematerialize ? n_slots : 0);
    // Built dry (the planner) nothing is allocated, and of the sets that are alike (a GPipe stage keeps one
    // per micro-batch in flight) one is laid out and the rest counted: --plan for a million micro-batches
    // must not lay out a million sets, or allocate the host copies of their token ids.
    int dry = model->mode.dry, n_laid = dry ? (rematerialize ? 2 : 1) : n_sets;
    size_t set_bytes[2] = {0, 0};  // [input-only set, full set], each buffer rounded as allocate_buffers does
    model->slots = dry ? NULL : (Activations*)calloc_check(n_slots * sizeof(Activations));
    Activations* sets = (Activations*)calloc_check(n_laid * sizeof(Activations));
    BufferSpec* specs = (BufferSpec*)malloc_check((4 + 24 * n_laid) * sizeof(BufferSpec));
    int n = 0;
    Activations shared;
    specs[n++] = (BufferSpec){(void**)&shared.losses, BT * f};
    specs[n++] = (BufferSpec){(void**)&shared.scratch, BT * C * fx};
    specs[n++] = (BufferSpec){(void**)&shared.dresidual, BT * C * fx};
    specs[n++] = (BufferSpec){(void**)&shared.dwide, BT * 4 * Cl * fx};
    for (int i = 0; i < n_laid; i++) {
        Activations* a = &sets[i];
        int full = i < n_full;  // (dry: set 0 is full, set 1 of a rematerializing stage input-only)
        size_t k = full ? 1 : 0;  // a stage-input-only set keeps encoded and the ids
        int flash = model->kernels.flash_attention;
        // per-layer buffers, or one layer's worth for what --recompute recomputes (see LayerActs)
        int R = model->recompute;
        size_t Lall = R < 3 ? L : 1, Lln = R < 2 ? L : 1, Lgelu = R < 1 ? L : 1;
        BufferSpec per[] = {
            {(void**)&a->encoded, BT * C * fx},                  {(void**)&a->ln1, k * Lln * BT * C * fx},
            {(void**)&a->ln1_mean, k * Lall * BT * f},           {(void**)&a->ln1_rstd, k * Lall * BT * f},
            {(void**)&a->qkv, k * Lall * BT * 3 * Cl * fx},      {(void**)&a->atty, k * Lall * BT * Cl * fx},
            {(void**)&a->att, flash ? 0 : k * Lall * B * NHl * T * T * fx},  // flash: no T x T term
            {(void**)&a->lse, flash ? k * Lall * B * NHl * T * f : 0},       {(void**)&a->residual2, k * Lall * BT * C * fx},
            {(void**)&a->ln2, k * Lln * BT * C * fx},            {(void**)&a->ln2_mean, k * Lall * BT * f},
            {(void**)&a->ln2_rstd, k * Lall * BT * f},           {(void**)&a->fch, k * Lall * BT * 4 * Cl * fx},
            {(void**)&a->fch_gelu, k * Lgelu * BT * 4 * Cl * fx}, {(void**)&a->residual3, k * L * BT * C * fx},
            {(void**)&a->lnf, k * lf * BT * C * fx},         {(void**)&a->lnf_mean, k * lf * BT * f},
            {(void**)&a->lnf_rstd, k * lf * BT * f},         {(void**)&a->logits, k * BT * Vpl * fx},
            {(void**)&a->inputs, BT * sizeof(int)},          {(void**)&a->targets, BT * sizeof(int)},
        };
        for (size_t j = 0; j < sizeof(per) / sizeof(per[0]); j++) specs[n++] = per[j], set_bytes[full] += round_up(per[j].bytes, 256);
    }
    model->acts_memory = allocate_buffers(&model->mode, specs, n, &model->bytes_activations);
    free(specs);
    if (dry) {  // the sets not laid out
        model->bytes_activations += (size_t)(n_full - 1) * set_bytes[1] + (size_t)(n_sets - n_full - (n_laid - 1)) * set_bytes[0];
        model->n_slots = 0;  // (no slots to free)
        model->rematerialize = rematerialize, model->B = B, model->T = T;
        free(sets);
        return;
    }
    for (int i = 0; i < n_sets; i++) {
        sets[i].losses = shared.losses, sets[i].scratch = shared.scratch;
        sets[i].dresidual = shared.dresidual, sets[i].dwide = shared.dwide;
        sets[i].host_inputs = (int*)malloc_check(BT * sizeof(int));
        sets[i].host_targets = (int*)malloc_check(BT * sizeof(int));
    }
    if (rematerialize) {
        model->work = sets[0];
        memcpy(model->slots, sets + 1, n_slots * sizeof(Activations));
    } else {
        memcpy(model->slots, sets, n_slots * sizeof(Activations));
    }
    model->n_slots = n_slots;
    model->rematerialize = rematerialize;
    model->B = B;
    model->T = T;
    model->host_losses = (float*)malloc_check(BT * sizeof(float));
    free(sets);
}

// out (N, C) = residual + inp (N, IC) . weight^T + bias: a projection back into the residual stream. With
// TP it is row-parallel: inp and weight hold this rank's IC = (C or 4C)/tp input channels, the partial
// products are summed across the TP group (Megatron's g), and the bias is added once, after the sum.
// scratch (N, C) holds the projection before the add.
static void row_parallel_forward(GPT2* model, floatX* out, const floatX* residual, const floatX* inp, const floatX* weight,
                                 const floatX* bias, floatX* scratch, int N, int IC) {
    int C = model->config.C;
    if (model->tp == 1) {  // (with --fused-kernels one product that reads the residual: scratch unused)
        matmul_forward_residual(out, residual, scratch, inp, weight, bias, N, IC, C, &model->kernel_scratch.matmul, &model->kernels);
        return;
    }
    matmul_forward(scratch, inp, weight, NULL, N, IC, C, &model->kernel_scratch.matmul, &model->kernels);
    tp_g_forward(model->comm, model->tracer, scratch, (size_t)N * C);  // TP: g
    residual_bias_forward(out, residual, scratch, bias, N, C);
}

// One layer's activations (local index li of this stage) inside the activation set a. What --recompute R
// does not keep per layer lives in a single layer-sized buffer that every layer reuses, and backward
// recomputes it just before it needs it (recompute_layer):
//   R = 0  everything is kept
//   R = 1  the GELU output is recomputed from the MLP hidden                   saves (B,T,4C) per layer
//   R = 2  also the two LayerNorm outputs, from their inputs                     saves 2 (B,T,C) more
//   R = 3  only each layer's input and output (the residual stream) are kept; the whole layer is
//          recomputed in backward ("full checkpointing")
// Recomputation repeats the same operations on the same inputs, so the losses do not change in any bit.
typedef struct {
    floatX* input;                 // (B, T, C) the layer's input: the previous layer's output
    floatX* ln1;                   // (B, T, C)
    float *ln1_mean, *ln1_rstd;    // (B, T)
    floatX* qkv;                   // (B, T, 3C/tp)
    floatX* atty;                  // (B, T, C/tp)
    floatX* att;                   // (B, NH/tp, T, T) classic attention
    float* lse;                    // (B, NH/tp, T) --attention flash
    floatX* residual2;             // (B, T, C)
    floatX* ln2;                   // (B, T, C)
    float *ln2_mean, *ln2_rstd;    // (B, T)
    floatX* fch;                   // (B, T, 4C/tp)
    floatX* fch_gelu;              // (B, T, 4C/tp)
    floatX* output;                // (B, T, C) = residual3
    floatX* scratch;               // (B, T, C) workspace shared by every layer (a projection before its residual add)
} LayerActs;

static LayerActs layer_acts(const GPT2* model, const Activations* a, int li, int B, int T) {
    int R = model->recompute, tp = model->tp;
    size_t BT = (size_t)B * T, C = model->config.C, Cl = C / tp, NHl = model->config.NH / tp;
    size_t all = R < 3 ? li : 0, ln = R < 2 ? li : 0, gelu = R < 1 ? li : 0;  // index of the buffer used
    LayerActs la;
    la.input = li == 0 ? a->encoded : a->residual3 + (li - 1) * BT * C;
    la.ln1 = a->ln1 + ln * BT * C;
    la.ln1_mean = a->ln1_mean + all * BT;
    la.ln1_rstd = a->ln1_rstd + all * BT;
    la.qkv = a->qkv + all * BT * 3 * Cl;
    la.atty = a->atty + all * BT * Cl;
    la.att = model->kernels.flash_attention ? NULL : a->att + all * B * NHl * T * T;
    la.lse = model->kernels.flash_attention ? a->lse + all * B * NHl * T : NULL;
    la.residual2 = a->residual2 + all * BT * C;
    la.ln2 = a->ln2 + ln * BT * C;
    la.ln2_mean = a->ln2_mean + all * BT;
    la.ln2_rstd = a->ln2_rstd + all * BT;
    la.fch = a->fch + all * BT * 4 * Cl;
    la.fch_gelu = a->fch_gelu + gelu * BT * 4 * Cl;
    la.output = a->residual3 + li * BT * C;
    la.scratch = a->scratch;
    return la;
}

// forward of one transformer block: la.input -> la.output
static void layer_forward(GPT2* model, const LayerActs* la, const LayerWeights* w, int B, int T) {
    int C = model->config.C, Cl = C / model->tp, NHl = model->config.NH / model->tp;
    size_t BT = (size_t)B * T;
    KernelScratch* ks = &model->kernel_scratch;
    int fused = model->kernels.fused, flash = model->kernels.flash_attention;
    // attention block: residual2 = input + attproj(attention(ln1(input)))
    layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->input, w->ln1w, w->ln1b, BT, C, fused);
    matmul_forward(la->qkv, la->ln1, w->qkvw, w->qkvb, BT, C, 3 * Cl, &ks->matmul, &model->kernels);  // TP: column-parallel, our heads
    if (flash) attention_forward_flash(la->atty, la->lse, la->qkv, B, T, Cl, NHl);
    else attention_forward(la->atty, la->att, la->qkv, B, T, Cl, NHl, &ks->attention);
    if (fused && model->tp == 1) {  // --fused-kernels: the residual add and ln2 in one kernel
        matmul_forward(la->scratch, la->atty, w->attprojw, w->attprojb, BT, Cl, C, &ks->matmul, &model->kernels);
        residual_layernorm_forward(la->residual2, la->ln2, la->ln2_mean, la->ln2_rstd, la->input, la->scratch, w->ln2w,
                                   w->ln2b, BT, C, fused);
    } else {
        row_parallel_forward(model, la->residual2, la->input, la->atty, w->attprojw, w->attprojb, la->scratch, BT, Cl);
        layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->residual2, w->ln2w, w->ln2b, BT, C, fused);
    }
    // MLP block: output = residual2 + fcproj(gelu(fc(ln2(residual2))))
    // fc and GELU (TP: column-parallel, our hidden units); with --fused-kernels GELU in the product's
    // epilogue, unless backward recomputes it (recompute_layer: with the GELU kernel, so forward uses it too)
    int gelu_epilogue = fused && model->recompute == 0 && !model->kernels.separate_gelu;
    matmul_forward_gelu(la->fch_gelu, la->fch, la->ln2, w->fcw, w->fcb, BT, C, 4 * Cl, &ks->matmul, &model->kernels, gelu_epilogue);
    row_parallel_forward(model, la->output, la->residual2, la->fch_gelu, w->fcprojw, w->fcprojb, la->scratch, BT, 4 * Cl);
}

// before a layer's backward: recompute what --recompute did not keep
static void recompute_layer(GPT2* model, const LayerActs* la, const LayerWeights* w, int B, int T) {
    int R = model->recompute, C = model->config.C, Cl = C / model->tp, fused = model->kernels.fused;
    size_t BT = (size_t)B * T;
    if (R == 3) {
        layer_forward(model, la, w, B, T);  // rewrites la->output with the same values
        return;
    }
    if (R >= 2) {
        layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->input, w->ln1w, w->ln1b, BT, C, fused);
        layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->residual2, w->ln2w, w->ln2b, BT, C, fused);
    }
    if (R >= 1) gelu_forward(la->fch_gelu, la->fch, BT * 4 * Cl, fused);
}

// Forward pass of this rank's pipeline stage over a micro-batch (B, T), on the activation set a (a
// micro-batch slot, or the work set: see micro_batch_activations). The first stage starts from the token
// ids `inputs` (host); the others from a->encoded, which the pipeline has filled with the previous
// stage's output. The last stage, given targets, returns the mean loss (and with dloss != 0 leaves
// dlogits, scaled by dloss, in a->logits for gpt2_backward); without targets a->logits holds the logits.
// Other stages return 0 and leave their output in stage_output(). Without pipelining the one stage is
// first and last. B, T may be below the allocated.
static float gpt2_forward(GPT2* model, Activations* a, const int* inputs, const int* targets, int B, int T, float dloss) {
    const GPT2Config* c = &model->config;
    check_internal(model->B > 0, "gpt2_forward before gpt2_allocate_activations");
    if (B * T > model->B * model->T || T > model->T) fatal("internal error: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    int C = c->C, tp = model->tp, l0 = model->place.l0, Ls = model->place.l1 - l0;
    int Vpl = c->Vp / tp;  // this TP rank's rows of the vocabulary
    int fused = model->kernels.fused;
    size_t BT = (size_t)B * T;
    Comm* comm = model->comm;
    if (model->first) {
        if (fused) copy_to_device_nowait(a->inputs, inputs, BT * sizeof(int));  // llmc/device.h: pageable, staged
        else copy_to_device(a->inputs, inputs, BT * sizeof(int));
        if (a->host_inputs != inputs) memcpy(a->host_inputs, inputs, BT * sizeof(int));  // the pipeline passes them in place
        // TP: each rank looks up the ids in its rows of wte, then the sum over the group (g)
        vocab_parallel_embedding_forward(comm, model->tracer, a->encoded, a->inputs, model->params.wte, model->params.wpe, B, T, C, c->Vp);
    }
    for (int li = 0; li < Ls; li++) {  // this stage's layers l0 .. l0 + Ls - 1, activations by local index
        LayerActs la = layer_acts(model, a, li, B, T);
        layer_forward(model, &la, &model->params.layers[l0 + li], B, T);
    }
    if (!model->last) return 0.0f;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->residual3 + (Ls - 1) * BT * C, model->params.lnfw,
                      model->params.lnfb, BT, C, fused);
    matmul_forward(a->logits, a->lnf, model->params.wte, NULL, BT, C, Vpl, &model->kernel_scratch.matmul, &model->kernels);  // tied: logits = lnf . wte^T (TP: our rows)
    if (targets == NULL) return 0.0f;

    if (fused) copy_to_device_nowait(a->targets, targets, BT * sizeof(int));
    else copy_to_device(a->targets, targets, BT * sizeof(int));
    if (tp == 1) classifier_forward_backward(a->logits, a->losses, a->targets, dloss, BT, c->V, c->Vp, fused);
    else vocab_parallel_cross_entropy(comm, a->logits, a->losses, a->targets, dloss, BT, c->V, c->Vp, &model->kernel_scratch.vocab_ce);
    if (model->loss_dest != NULL) {  // a training step with --fused-kernels: the mean stays on the device
        loss_mean(model->loss_dest, a->losses, (int)BT);
        return 0.0f;
    }
    copy_to_host(model->host_losses, a->losses, BT * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += model->host_losses[i];
    return (float)(sum / BT);
}

// Clears the gradients at the start of an optimizer step (the accumulated ones: the full buffer at
// stages 0 and 1, the shard at stage 2).
static void gpt2_zero_grad(GPT2* model) {
    if (model->grads_memory) device_memset_zero(model->grads_memory, model->layout.total * sizeof(floatX));
    zero2_begin_step(&model->zero2);
}

// The gradient buffer of bucket b as backward writes it (in the flat buffer, or a ZeRO-2 workspace).
static floatX* bucket_grads(GPT2* model, int b) {
    const GPT2Config* c = &model->config;
    if (b == 0) return model->grads.wte;
    if (b == c->L + 1) return model->grads.lnfw;
    return model->grads.layers[b - 1].ln1w;
}

// Bucket b's gradients are final for this micro-step: start their reduction across the DP group
// (all-reduce, or reduce-scatter at ZeRO 1 and 2; see llmc/zero.h). On the GPU with NCCL this runs on
// the communication stream while backward continues with the layers below.
static void gradients_ready(GPT2* model, int b, int communicate) {
    if (!communicate || model->layout.buckets[b].size == 0 || (model->place.dp == 1 && model->zero.stage < 2)) return;
    double t0 = trace_now_us(model->tracer);
    zero_reduce_bucket(model->comm, &model->zero, &model->zero2, b, bucket_grads(model, b));
    trace_add(model->tracer, "allreduce", model->zero.stage == 0 ? "all-reduce" : "reduce-scatter", b, t0);
}

// Backward pass for the last gpt2_forward on the activation set a (which must have had targets and
// dloss != 0). Gradients are accumulated (+=), so micro-steps of gradient accumulation simply add up.
// `communicate`: reduce the gradients across the DP group as they become final (on the last
// micro-step; at ZeRO-2 on every one).
static void gpt2_backward(GPT2* model, Activations* a, int B, int T, int communicate) {
    const GPT2Config* c = &model->config;
    int L = c->L, C = c->C, tp = model->tp, l0 = model->place.l0, Ls = model->place.l1 - l0;
    int Cl = C / tp, NHl = c->NH / tp, Vpl = c->Vp / tp;  // this TP rank's channels of the split tensors
    size_t BT = (size_t)B * T;
    Weights* p = &model->params;
    Weights* g = &model->grads;
    KernelScratch* ks = &model->kernel_scratch;
    int fused = model->kernels.fused, flash = model->kernels.flash_attention;
    communicate = zero_reduces_now(&model->zero, communicate);  // ZeRO-2: in every micro-step
    zero2_begin_micro_step(&model->zero2);
    if (model->last) {
        // classifier: the fused kernel already turned logits into dlogits
        matmul_backward(a->scratch, g->wte, NULL, a->logits, a->lnf, p->wte, BT, C, Vpl, &ks->matmul, &model->kernels);  // dlnf (=), dwte (+=)
        tp_f_backward(model->comm, model->tracer, a->scratch, BT * C);  // TP: f; dlnf had only our vocabulary rows' part
        // final LayerNorm: it writes (+=) into dresidual, which starts at zero
        device_memset_zero(a->dresidual, BT * C * sizeof(floatX));
        layernorm_backward(a->dresidual, g->lnfw, g->lnfb, a->scratch, a->residual3 + (Ls - 1) * BT * C, p->lnfw, a->lnf_mean,
                           a->lnf_rstd, BT, C, &ks->layernorm, fused);
        gradients_ready(model, L + 1, communicate);
    }  // other stages: the pipeline has put the next stage's input gradient in dresidual

    for (int li = Ls - 1; li >= 0; li--) {
        int l = l0 + li;
        const LayerWeights* w = &p->layers[l];
        LayerWeights* dw = &g->layers[l];
        LayerActs la = layer_acts(model, a, li, B, T);
        recompute_layer(model, &la, w, B, T);
        zero2_layer_begins(model->comm, &model->zero2, l);  // ZeRO-2: layer l's workspace slot is free and clear

        // MLP block; dresidual holds d(output) and flows through the residual add unchanged
        // (TP: through g, whose backward is the identity: no communication)
        matmul_backward_gelu(a->dwide, dw->fcprojw, dw->fcprojb, dw->fcb, a->dresidual, la.fch_gelu, la.fch, w->fcprojw, BT, 4 * Cl, C,
                             &ks->matmul, &model->kernels);                                                                 // dfch =, dfcb +=
        matmul_backward(a->scratch, dw->fcw, NULL, a->dwide, la.ln2, w->fcw, BT, C, 4 * Cl, &ks->matmul, &model->kernels);  // dln2 = (dfcb: above)
        tp_f_backward(model->comm, model->tracer, a->scratch, BT * C);  // TP: f; the column-parallel fc saw only our hidden units
        layernorm_backward(a->dresidual, dw->ln2w, dw->ln2b, a->scratch, la.residual2, w->ln2w, la.ln2_mean, la.ln2_rstd,
                           BT, C, &ks->layernorm, fused);                                                            // dresidual2 +=
        // attention block
        matmul_backward(a->scratch, dw->attprojw, dw->attprojb, a->dresidual, la.atty, w->attprojw, BT, Cl, C, &ks->matmul, &model->kernels);  // datty =
        if (flash) attention_backward_flash(a->dwide, a->scratch, la.qkv, la.atty, la.lse, B, T, Cl, NHl, &ks->attention);  // dqkv =
        else attention_backward(a->dwide, a->scratch, la.qkv, la.att, B, T, Cl, NHl, &ks->attention);                // dqkv =
        matmul_backward(a->scratch, dw->qkvw, dw->qkvb, a->dwide, la.ln1, w->qkvw, BT, C, 3 * Cl, &ks->matmul, &model->kernels);  // dln1 =
        tp_f_backward(model->comm, model->tracer, a->scratch, BT * C);  // TP: f; the column-parallel qkv saw only our heads
        layernorm_backward(a->dresidual, dw->ln1w, dw->ln1b, a->scratch, la.input, w->ln1w, la.ln1_mean, la.ln1_rstd,
                           BT, C, &ks->layernorm, fused);                                                            // dresidual +=
        gradients_ready(model, 1 + l, communicate);  // layer l's parameter gradients are final
        zero2_layer_done(model->comm, &model->zero2, l);
    }
    if (model->first) {
        // TP: only the ids in our rows of wte get gradient; dwpe is the same on every rank
        vocab_parallel_embedding_backward(model->comm, g->wte, g->wpe, a->dresidual, a->inputs, a->host_inputs, B, T, C, c->Vp,
                                          &ks->encoder, fused);
    }  // other stages: dresidual now holds the gradient of this stage's input, for the previous stage
    // the embedding bucket waits for the tied-wte sum between first and last stage when pipelining
    if (model->place.pp == 1) gradients_ready(model, 0, communicate);
    comm_join(model->comm);
    zero2_end_micro_step(&model->zero2);  // ZeRO-2: this micro-step's reduced chunks join the accumulated ones
}

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} OptimizerConfig;

// The part [lo, hi) of slot s that this rank owns (stage 0: all of it; stages 1, 2: its overlap with our
// chunk of the bucket), and the offset of lo in the shard buffers. Returns 0 if we own none of it.
static int owned_part(const GPT2* model, const TensorSlot* s, size_t* lo, size_t* hi, size_t* shard_k) {
    const ZeroPlan* z = &model->zero;
    size_t start = owned_start(z, s->bucket), end = start + owned_size(z, s->bucket);
    *lo = s->offset > start ? s->offset : start;
    *hi = s->offset + s->numel < end ? s->offset + s->numel : end;
    *shard_k = z->owned_offset[s->bucket] + (*lo - start);
    return *lo < *hi;
}

// The owned ranges of the gradients that the squared norm sums every step (gpt2_grad_sumsq): group 1
// holds the tensors split by TP, group 0 the replicated ones.
static void gpt2_init_norm_parts(GPT2* model) {
    const ZeroPlan* z = &model->zero;
    size_t lo, hi, k;
    norm_parts_init(&model->norm_parts, model->layout.num_slots);
    for (int i = 0; i < model->layout.num_slots; i++) {
        const TensorSlot* s = &model->layout.slots[i];
        if (!owned_part(model, s, &lo, &hi, &k)) continue;
        if (s->kind == WTE && !model->first) continue;  // PP: the tied wte is counted on the first stage only
        norm_parts_add(&model->norm_parts, grads_of_bucket(model, s->bucket) + (lo - owned_start(z, s->bucket)), hi - lo,
                       s->whole.split != SPLIT_NONE);
    }
    norm_parts_finish(&model->norm_parts);
}

// The squared norm of all the model's gradients (with a loss scaler: of scale x gradients), the same on
// every rank: tensors split by TP are summed over the TP group, replicated ones counted once; the
// stages' tensors are summed over the PP group; with ZeRO the owned parts over the DP group.
static double gpt2_grad_sumsq(GPT2* model) {
    Comm* comm = model->comm;
    double sums[2];  // [replicated, split by TP]
    norm_parts_sum(&model->norm_parts, sums, &model->kernel_scratch.norm, model->kernels.fused);
    if (model->tp > 1) comm_all_reduce_host(comm, &comm->tp_group, &sums[1], 1, REDUCE_SUM);
    double sumsq = sums[1] + sums[0];
    comm_all_reduce_host(comm, &comm->pp_group, &sumsq, 1, REDUCE_SUM);  // PP: every stage's own tensors
    if (model->zero.stage > 0) comm_all_reduce_host(comm, &comm->dp_group, &sumsq, 1, REDUCE_SUM);
    return sumsq;
}

// One AdamW step number t (1-based) on the part of every tensor this rank owns; the gradients are
// multiplied by grad_scale first (clipping, and 1 / the loss scale).
static void gpt2_adamw_owned(GPT2* model, const OptimizerConfig* o, float lr, int t, float grad_scale) {
    const ZeroPlan* z = &model->zero;
    size_t lo, hi, k;
    AdamWArgs args = {.lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .weight_decay = 0.0f, .grad_scale = grad_scale,
                      .t = t, .stochastic = model->stochastic_rounding, .index_base = 0};
    AdamWRange ranges[ADAMW_BATCH];  // (passed on ADAMW_BATCH at a time: with --fused-kernels 1 a launch each on the GPU)
    int n = 0;
    for (int i = 0; i < model->layout.num_slots; i++) {
        const TensorSlot* s = &model->layout.slots[i];
        if (!owned_part(model, s, &lo, &hi, &k)) continue;
        size_t in_bucket = lo - owned_start(z, s->bucket);
        ranges[n++] = (AdamWRange){.master = master_of_bucket(model, s->bucket) + in_bucket,
                                   .param_copy = master_is_params(model) ? NULL : model->params_memory + lo,
                                   .grad = grads_of_bucket(model, s->bucket) + in_bucket, .m = model->m + k, .v = model->v + k,
                                   .n = hi - lo, .index_base = lo, .weight_decay = s->decay ? o->weight_decay : 0.0f};
        if (n == ADAMW_BATCH) adamw_update_ranges(ranges, n, args, model->kernels.fused), n = 0;
    }
    if (n > 0) adamw_update_ranges(ranges, n, args, model->kernels.fused);
}

// The optimizer step: clips the gradients by their global norm (clip_grad_norm_ semantics; grad_clip 0
// disables) and takes AdamW step t on the part of the parameters this rank owns (all of them at ZeRO
// stage 0, its chunk of every bucket at stages 1 and 2, then all-gathered). Returns the norm before
// clipping. With a loss scaler (llmc/loss_scaler.h; NULL: none) the gradients hold scale x their value:
// the norm and the update divide it out, and if any rank's gradients overflowed the step is skipped
// everywhere (*skipped = 1; parameters and optimizer state untouched). Without loss scaling, a non-finite
// norm is returned before anything is updated: the run has diverged, and the caller ends it. Every rank
// sees the same norm, so every rank reaches the same verdict.
static float gpt2_update(GPT2* model, const OptimizerConfig* o, float lr, int t, LossScaler* scaler, int* skipped) {
    float scale = scaler ? loss_scale(scaler) : 1.0f;  // the scale backward ran with (the check may change it)
    double sumsq = gpt2_grad_sumsq(model);
    if (skipped) *skipped = 0;
    if (loss_scaler_check(scaler, model->comm, sumsq)) {
        *skipped = 1;
        return INFINITY;
    }
    float norm = (float)sqrt(sumsq) / scale;
    if (!isfinite(norm)) return norm;  // diverged: parameters and optimizer state stay as they were
    float clip_coef = o->grad_clip > 0.0f ? o->grad_clip / (norm + 1e-6f) : 1.0f;
    gpt2_adamw_owned(model, o, lr, t, (clip_coef < 1.0f ? clip_coef : 1.0f) / scale);
    zero_gather_params(model->comm, &model->zero, model->params_memory);
    comm_join(model->comm);
    return norm;
}

// The parameters as the update of step t left them: each owned range of the master weights rounded the
// way that update rounded it (stochastic rounding depends on the step), then all-gathered. Resume uses
// it, so a BF16 run with stochastic rounding continues bit for bit.
static void gpt2_round_params(GPT2* model, int t) {
    if (master_is_params(model)) return;
    size_t lo, hi, k;
    for (int i = 0; i < model->layout.num_slots; i++) {
        const TensorSlot* s = &model->layout.slots[i];
        if (!owned_part(model, s, &lo, &hi, &k)) continue;
        round_params(model->params_memory + lo, model->master + k, hi - lo, lo, t, model->stochastic_rounding);
    }
    zero_gather_params(model->comm, &model->zero, model->params_memory);
    comm_join(model->comm);
}

// ----------------------------------------------------------------------------------------------------
// the pipeline: one optimizer step's forward and backward passes over the micro-batches

static floatX* stage_output(const GPT2* model, const Activations* a, int B, int T) {  // (B, T, C) the last local layer's output
    return a->residual3 + (size_t)(model->place.l1 - model->place.l0 - 1) * B * T * model->config.C;
}

// The send left over from the previous action, if any, goes out now; if this action receives from
// the same neighbour, the two travel as one paired send-receive (so that two neighbours never both
// block sending to each other). recv_buf NULL: nothing to receive. Messages are named in traces by
// what they carry: "act m" (micro-batch m's activations, forward) or "grad m" (their gradient, backward).
typedef struct {
    const floatX* buf;
    int peer;    // stage index, -1: nothing pending
    int shared;  // buf is shared (dresidual, or the rematerialized work set), which the next action overwrites: wait for the send
    char what[16];  // "act m" or "grad m"
} PendingSend;

static void pipe_exchange(GPT2* model, PendingSend* pending, floatX* recv_buf, int recv_peer, size_t n, const char* recv_what) {
    Comm* c = model->comm;
    Tracer* tr = model->tracer;
    char name[40];
    double t0 = trace_now_us(tr);
    if (pending->peer >= 0 && recv_buf != NULL && pending->peer == recv_peer) {
        comm_sendrecv(c, &c->pp_group, pending->buf, pending->peer, recv_buf, recv_peer, n, DT_FLOATX);
        comm_join(c);
        snprintf(name, sizeof(name), "send %s, recv %s", pending->what, recv_what);
        trace_add(tr, "sendrecv", name, -1, t0);
    } else {
        if (pending->peer >= 0) {
            // A forward output lives in its micro-batch slot, which nothing writes before a later
            // receive has been waited for (same stream, in order): its send is not waited for, and with
            // NCCL it runs while the next forward computes. An input gradient is in the shared dresidual,
            // and with rematerialization a forward output is in the shared work set: the next forward or
            // backward overwrites them, so those sends are waited for.
            comm_send(c, &c->pp_group, pending->buf, n, DT_FLOATX, pending->peer);
            if (pending->shared) comm_join(c);
            snprintf(name, sizeof(name), "send %s", pending->what);
            trace_add(tr, "send", name, -1, t0);
        }
        if (recv_buf != NULL) {
            t0 = trace_now_us(tr);
            comm_recv(c, &c->pp_group, recv_buf, n, DT_FLOATX, recv_peer);
            comm_join(c);
            snprintf(name, sizeof(name), "recv %s", recv_what);
            trace_add(tr, "recv", name, -1, t0);
        }
    }
    pending->peer = -1;
}

// The activations forward and backward of micro-batch i (B, T) work on: its slot. With
// rematerialization the one full work set, starting from the slot's stage input.
static Activations* micro_batch_activations(GPT2* model, int i, int B, int T) {
    Activations* slot = &model->slots[i % model->n_slots];
    if (!model->rematerialize) return slot;
    if (!model->first) device_copy(model->work.encoded, slot->encoded, (size_t)B * T * model->config.C * sizeof(floatX));
    return &model->work;
}

// The activations of a forward-only pass (evaluation, sampling): the first slot, or with
// rematerialization the one full work set (the stage input arrives in it).
static Activations* forward_only_activations(GPT2* model) {
    return model->rematerialize ? &model->work : &model->slots[0];
}

// Forward-only through the pipeline (evaluation, sampling): receive this stage's input (B, T, C) from
// the previous stage, forward, send the output to the next. Each transfer is waited for: nothing
// overlaps outside training. Returns gpt2_forward's loss (the last stage's; 0 on the others).
static float forward_through_stages(GPT2* model, Activations* a, const int* inputs, const int* targets, int B, int T) {
    Comm* comm = model->comm;
    size_t n = (size_t)B * T * model->config.C;
    if (!model->first) {
        comm_recv(comm, &comm->pp_group, a->encoded, n, DT_FLOATX, comm->pp_rank - 1);
        comm_join(comm);
    }
    float loss = gpt2_forward(model, a, inputs, targets, B, T, 0.0f);
    if (!model->last) {
        comm_send(comm, &comm->pp_group, stage_output(model, a, B, T), n, DT_FLOATX, comm->pp_rank + 1);
        comm_join(comm);
    }
    return loss;
}

// A forward action of the schedule: micro-batch m (number `batch` in the data order) is loaded, its input
// arrives from the previous stage (paired with the pending send when that goes there too), forward runs,
// and its output becomes the pending send to the next stage. With defer_loss the mean loss stays on the
// device (model->step_losses[m]). Returns the loss (0 when deferred, and on all but the last stage).
static float schedule_forward(GPT2* model, DataLoader* loader, PendingSend* pending, int m, long long batch, float dloss,
                              int defer_loss) {
    int B = loader->B, T = loader->T, s = model->place.pp_rank;
    Activations* slot = &model->slots[m % model->n_slots];
    dataloader_load(loader, batch);  // every stage reads the ids it needs
    memcpy(slot->host_inputs, loader->inputs, (size_t)B * T * sizeof(int));
    memcpy(slot->host_targets, loader->targets, (size_t)B * T * sizeof(int));
    char what[16];
    snprintf(what, sizeof(what), "act %d", m);
    pipe_exchange(model, pending, model->first ? NULL : slot->encoded, s - 1, (size_t)B * T * model->config.C, what);
    Activations* a = micro_batch_activations(model, m, B, T);
    double t0 = trace_now_us(model->tracer);
    model->loss_dest = defer_loss ? model->step_losses + m : NULL;
    float loss = gpt2_forward(model, a, slot->host_inputs, slot->host_targets, B, T, dloss);
    model->loss_dest = NULL;
    trace_add(model->tracer, "forward", "F", m, t0);
    if (!model->last) {
        *pending = (PendingSend){.buf = stage_output(model, a, B, T), .peer = s + 1, .shared = model->rematerialize};
        memcpy(pending->what, what, sizeof(what));  // (the message sent on carries micro-batch m too)
    }
    return loss;
}

// A backward action: the gradient of micro-batch m's output arrives from the next stage (into dresidual,
// one buffer that every activation set shares), backward runs (after recomputing the forward when the
// slots are rematerialized), and the input's gradient becomes the pending send to the previous stage.
// `communicate`: this is the step's last micro-batch, whose backward reduces the gradients (see
// gpt2_backward).
static void schedule_backward(GPT2* model, PendingSend* pending, int m, int B, int T, float dloss, int communicate) {
    int s = model->place.pp_rank;
    Activations* slot = &model->slots[m % model->n_slots];
    char what[16];
    snprintf(what, sizeof(what), "grad %d", m);
    pipe_exchange(model, pending, model->last ? NULL : slot->dresidual, s + 1, (size_t)B * T * model->config.C, what);
    Activations* a = micro_batch_activations(model, m, B, T);
    double t0 = trace_now_us(model->tracer);
    if (model->rematerialize) gpt2_forward(model, a, slot->host_inputs, slot->host_targets, B, T, dloss);
    gpt2_backward(model, a, B, T, communicate);
    trace_add(model->tracer, "backward", "B", m, t0);
    if (!model->first) {
        *pending = (PendingSend){.buf = a->dresidual, .peer = s - 1, .shared = 1};
        memcpy(pending->what, what, sizeof(what));  // (the message sent on carries micro-batch m too)
    }
}

// --fused-kernels on the last stage: room on the device for a step's M mean losses
static void reserve_step_losses(GPT2* model, int M) {
    if (model->step_losses_cap >= M) return;
    device_free(model->step_losses);
    model->step_losses = (float*)device_malloc((size_t)M * sizeof(float));
    model->step_losses_cap = M;
}

// The sum of the step's M deferred mean losses: one copy for the whole step, added in micro-step order
// (the order forwards run in, so the sum equals the one of losses returned by each forward)
static double sum_step_losses(GPT2* model, int M) {
    float* means = (float*)malloc_check((size_t)M * sizeof(float));
    copy_to_host(means, model->step_losses, (size_t)M * sizeof(float));
    double sum = 0.0;
    for (int m = 0; m < M; m++) sum += means[m];
    free(means);
    return sum;
}

// PP: wte is tied, the first stage's embedding and the last stage's classifier both use it, so its
// gradient is the sum of the two stages' (an all-reduce over the group of the two); then the embedding
// bucket is final and its DP reduction starts. Without pipelining the one stage has summed both itself.
static void sum_tied_embedding_grads(GPT2* model) {
    if (model->place.pp == 1 || !(model->first || model->last)) return;
    Comm* comm = model->comm;
    double t0 = trace_now_us(model->tracer);
    size_t wte = model->layout.slots[0].numel;  // wte is the first tensor of both stages
    comm_all_reduce(comm, &comm->emb_group, model->grads.wte, wte, DT_FLOATX, REDUCE_SUM);
    comm_join(comm);
    trace_add(model->tracer, "allreduce", "tied wte", -1, t0);
    gradients_ready(model, 0, 1);
    comm_join(comm);
}

// Runs this stage's schedule for one optimizer step of M micro-batches (llmc/pipeline.h): receive the
// input, forward, send the output; receive the output's gradient, backward, send the input's gradient.
// The last micro-batch's backward reduces the gradients across the DP group as they become final.
// Without pipelining this is forward and backward of each micro-batch in turn. Returns the mean loss
// of the global batch (on every rank).
static float pipeline_step(GPT2* model, DataLoader* loader, Schedule schedule, int M, long long step, float dloss) {
    Comm* comm = model->comm;
    const Placement* pl = &model->place;
    PipeAction* actions = (PipeAction*)malloc_check(2 * M * sizeof(PipeAction));
    pipeline_schedule(schedule, pl->pp, pl->pp_rank, M, actions);
    PendingSend pending = {.buf = NULL, .peer = -1, .shared = 0, .what = ""};
    double loss = 0.0, t_start = wall_seconds();
    int defer_loss = model->kernels.fused && model->last;  // the micro-steps' mean losses stay on the device
    if (defer_loss) reserve_step_losses(model, M);
    for (int i = 0; i < 2 * M; i++) {
        int m = actions[i].micro;
        long long batch = (step * M + m) * pl->dp + pl->dp_rank;  // data-order contract: micro-step s reads s * D + d
        if (!actions[i].backward) loss += schedule_forward(model, loader, &pending, m, batch, dloss, defer_loss);
        else schedule_backward(model, &pending, m, loader->B, loader->T, dloss, m == M - 1);
    }
    pipe_exchange(model, &pending, NULL, -1, (size_t)loader->B * loader->T * model->config.C, NULL);
    comm_join(comm);  // the last sends are done before the slots are used again
    free(actions);
    if (defer_loss) loss += sum_step_losses(model, M);
    if (model->tracer && model->tracer->enabled) model->tracer->pipeline_s += wall_seconds() - t_start;
    sum_tied_embedding_grads(model);
    double mean = model->last ? loss / M : 0.0;  // the last stage has the loss; the DP ranks average theirs
    comm_all_reduce_host(comm, &comm->pp_group, &mean, 1, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->dp_group, &mean, 1, REDUCE_AVG);
    return (float)mean;
}

// ----------------------------------------------------------------------------------------------------
// 4. checkpoints and sampling

// Ends the run on a verdict that every rank reaches alike from the same values: every rank ends here
// together, without an abort, and rank 0 says why in one line ("error: <msg>").
[[noreturn]] static void end_every_rank(Comm* comm, const char* msg) {
    fflush(stdout);
    if (comm->world_rank == 0) {
        fprintf(stderr, "error: %s\n", msg);
        fflush(stderr);
    }
    comm_finalize(comm);
    exit(1);
}

// The run diverged (a non-finite loss, gradient norm or parameter). Every rank reaches the same verdict
// from the same reduced values, so every rank ends here together, without saving: the newest checkpoint
// stays the last good one.
[[noreturn]] static void end_diverged(Comm* comm, long long step, const char* what, int applied) {
    char msg[512];
    snprintf(msg, sizeof(msg), "training diverged at step %lld: %s; %snothing after step %lld was saved", step, what,
             applied ? "" : "the step was not applied and ", step - 1);
    end_every_rank(comm, msg);
}

// Before any model file is written: the whole model after `step` steps (the same on every rank) must be
// finite. (A finite gradient norm does not rule out an update that overflows, e.g. a huge weight decay.)
static void check_finite_before_save(Comm* comm, const GPT2Config* c, const float* master, long long step) {
    char where[160], what[200];
    if (!find_nonfinite_param(c, master, where, sizeof(where))) return;
    snprintf(what, sizeof(what), "parameter %s", where);
    end_diverged(comm, step, what, 1);
}

// Saves a checkpoint (collective: every rank calls it): the model in llm.c format (fp32 master weights,
// written by rank 0) and the optimizer state, one file per shard (written by the rank that owns it),
// each file atomically. The data position is the step; the state records the RNG and batch shape.
static void save_checkpoint(GPT2* model, const char* dir, RunState* state, int keep_last) {
    Comm* comm = model->comm;
    const ZeroPlan* z = &model->zero;
    int writes_model = comm->world_rank == 0;
    // a checkpoint that a resume would refuse is not written at all (the state is the same on every rank):
    // written, it would become the newest, and --keep-last would delete the good ones before it
    char why[256], msg[400];
    if (run_state_error(state, why, sizeof(why))) {
        snprintf(msg, sizeof(msg), "the checkpoint of step %lld was not written: a resume would refuse its state (%s)", state->step, why);
        end_every_rank(comm, msg);
    }
    if (writes_model && mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("cannot create checkpoint folder '%s': %s", dir, strerror(errno));
    comm_barrier_io(comm, &comm->world);  // the folder exists for everyone
    char path[4200];
    float* master = (float*)malloc_check(model->num_parameters * sizeof(float));
    gpt2_export_master(model, master);
    check_finite_before_save(comm, &model->config, master, state->step);
    state->model_hash = model_file_hash(&model->config, master);
    if (writes_model) {
        snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, state->step);
        model_file_write(path, &model->config, master);
    }
    free(master);

    // shards: stage 0 keeps the whole state on every rank of a DP group (DP rank 0 writes it); otherwise
    // each DP rank writes its chunks. TP ranks and pipeline stages hold different tensors: each writes
    // its own shards. What several of them hold alike is written once, so that the shards cover every
    // parameter exactly once: a replicated tensor by TP rank 0, the tied wte by the first stage.
    int per_tp = z->stage == 0 ? 1 : z->D;
    state->num_shards = model->place.pp * model->tp * per_tp;
    state->shard = (model->place.pp_rank * model->tp + model->tp_rank) * per_tp + (z->stage == 0 ? 0 : z->d);
    if (z->stage > 0 || z->d == 0) {
        size_t cap = 1024, n_ranges = 0, count = 0, lo, hi, k;
        int64_t* ranges = (int64_t*)malloc_check(2 * cap * sizeof(int64_t));
        float* m_host = (float*)malloc_check(z->shard_total * sizeof(float));
        float* v_host = (float*)malloc_check(z->shard_total * sizeof(float));
        float* m_out = (float*)malloc_check(z->shard_total * sizeof(float));
        float* v_out = (float*)malloc_check(z->shard_total * sizeof(float));
        copy_to_host(m_host, model->m, z->shard_total * sizeof(float));
        copy_to_host(v_host, model->v, z->shard_total * sizeof(float));
        for (int i = 0; i < model->layout.num_slots; i++) {  // each tensor's overlap with what we own, in file runs
            const TensorSlot* t = &model->layout.slots[i];
            if (!owned_part(model, t, &lo, &hi, &k)) continue;
            if (t->whole.split == SPLIT_NONE && model->tp_rank != 0) continue;  // TP rank 0 has the same
            if (t->kind == WTE && !model->first) continue;                      // the first stage has the same
            size_t n;
            Run* runs = slot_runs(&model->layout, i, model->tp_rank, lo - t->offset, hi - t->offset, &n);
            for (size_t j = 0; j < n; j++) {
                if (n_ranges == cap) ranges = (int64_t*)realloc(ranges, 2 * (cap *= 2) * sizeof(int64_t));
                if (ranges == NULL) fatal("out of host memory");
                size_t from = k + (runs[j].local - (lo - t->offset));
                ranges[2 * n_ranges] = (int64_t)runs[j].file;
                ranges[2 * n_ranges + 1] = (int64_t)runs[j].count;
                memcpy(m_out + count, m_host + from, runs[j].count * sizeof(float));
                memcpy(v_out + count, v_host + from, runs[j].count * sizeof(float));
                count += runs[j].count;
                n_ranges++;
            }
            free(runs);
        }
        snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, state->step, state->shard);
        state_file_write(path, state, ranges, (int64_t)n_ranges, m_out, v_out);
        free(ranges), free(m_host), free(v_host), free(m_out), free(v_out);
    }
    comm_barrier_io(comm, &comm->world);  // the checkpoint is complete when every rank is past here (rank 0 may take minutes)
    if (writes_model) printf("saved checkpoint %s/model_%08lld.bin and %d state shard(s)\n", dir, state->step, state->num_shards);
    if (writes_model && keep_last > 0) prune_checkpoints(dir, state->step, keep_last);  // only now: the new one is complete
}

// Reads the newest complete checkpoint in dir: its model file into *params (file order) and the
// optimizer state of all its shards into *m, *v (file order). A checkpoint whose files are not all
// there (a crash during a save) is skipped for the one before it. Every shard must be the one its name
// says, of the same checkpoint and run, and together the shards must cover the model (version 2:
// exactly once; see llmc/state_file.h).
static void load_checkpoint(const char* dir, RunState* state, GPT2Config* config, float** params, float** m, float** v) {
    char path[4200], first_path[4200], why[256];
    long long* steps;
    int n_steps = checkpoint_steps(dir, &steps);
    if (n_steps == 0) fatal("no checkpoint (state_*_00000.bin) found in '%s'", dir);
    for (int i = 0; i < n_steps; i++) {
        long long step = steps[i];
        snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, step);
        if (access(path, R_OK) != 0) {
            printf("checkpoint at step %lld in '%s' is incomplete; trying an older one\n", step, dir);
            continue;
        }
        // the model's sizes first (its header, checked against its length): every shard must have the
        // same, so no shard can size the moment arrays, or write past them, beyond what the model needs
        GPT2Config model_config;
        model_file_read(path, &model_config, NULL);
        int complete = 1;
        *m = *v = NULL;
        RunState first;
        RangeList covered = {.pairs = NULL, .n = 0, .cap = 0};
        snprintf(first_path, sizeof(first_path), "%s/state_%08lld_00000.bin", dir, step);
        state_file_read(first_path, &model_config, &first, m, v, &covered);
        for (int s = 1; complete && s < first.num_shards; s++) {
            snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, step, s);
            complete = access(path, R_OK) == 0;
        }
        if (!complete) {
            printf("checkpoint at step %lld in '%s' is incomplete; trying an older one\n", step, dir);
            free(*m), free(*v), free(covered.pairs);
            continue;
        }
        for (int s = 0; s < first.num_shards; s++) {
            snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, step, s);
            if (s > 0) state_file_read(path, &model_config, state, m, v, &covered);
            else *state = first;
            if (state->shard != s || state->step != step)
                fatal("'%s' holds shard %d of step %lld, not what its name says (a copied or renamed file?)", path, state->shard, state->step);
            if (state->model_hash != first.model_hash || state->num_shards != first.num_shards || state->run_id != first.run_id ||
                state->version != first.version || state->data_hash != first.data_hash)
                fatal("'%s' does not belong to the same checkpoint as '%s'", path, first_path);
        }
        if (!ranges_cover(&covered, gpt2_num_parameters(&first.config), first.version >= 2, why, sizeof(why)))
            fatal("the optimizer state shards of step %lld in '%s' do not cover the model: %s", step, dir, why);
        free(covered.pairs);
        *state = first;
        snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, step);
        uint64_t hash = model_file_read(path, config, params);
        if (hash != state->model_hash) fatal("'%s' is not the model saved with its state file (checksum mismatch)", path);
        if (memcmp(config, &state->config, sizeof(*config)) != 0) fatal("'%s' does not match the sizes in its state file", path);
        free(steps);
        return;
    }
    fatal("no complete checkpoint found in '%s'", dir);
}

// How to sample: the prompt's tokens (after an end-of-text token), how many tokens to generate, and how
// to draw each one: temperature 0 is greedy (the most likely token), otherwise softmax(logits / temperature)
// restricted to the top_k most likely tokens (0: all; tokens tied with the k-th are kept too).
typedef struct {
    const int* prompt;
    int n_prompt;
    int len;
    float temperature;
    int top_k;
} SampleConfig;

static int compare_floats_descending(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

// Draws the next token from the logits of the V real tokens (r uniform in [0, 1)). `probs` and `sorted`
// are scratch of V floats.
static int draw_token(const SampleConfig* sc, const float* logits, int V, float r, float* probs, float* sorted) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (sc->temperature == 0.0f) return best;  // greedy
    float cut = -INFINITY;                     // top-k: logits below the k-th largest are excluded
    if (sc->top_k > 0 && sc->top_k < V) {
        memcpy(sorted, logits, V * sizeof(float));
        qsort(sorted, V, sizeof(float), compare_floats_descending);
        cut = sorted[sc->top_k - 1];
    }
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += probs[i] = logits[i] >= cut ? expf((logits[i] - logits[best]) / sc->temperature) : 0.0f;
    double target = r * sum, acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += probs[i];
        if (target < acc) return i;
    }
    return V - 1;
}

// Prints a sampled token; an end-of-text token is a document break, shown as a marker line
static void print_sampled_token(const Tokenizer* tok, int id) {
    if (id == tok->eot) printf("\n--- end of document ---\n");
    else tokenizer_print(tok, id);
}

// Generates sc->len tokens after an end-of-text token and the prompt, printing them if `print`. Reads
// logits at the last position of a full forward over the sequence so far (no KV cache: clear, and cheap
// at these lengths). With TP it is collective over the TP group: the vocabulary slices of the logits are
// all-gathered, and every rank draws the same token from the same generator state. With PP the last
// stage draws and tells the others.
static void gpt2_sample(GPT2* model, const Tokenizer* tok, Rng* rng, const SampleConfig* sc, int print) {
    const GPT2Config* c = &model->config;
    Comm* comm = model->comm;
    int T = 1 + sc->n_prompt + sc->len < model->T ? 1 + sc->n_prompt + sc->len : model->T;
    int Vpl = c->Vp / model->tp;
    int* seq = (int*)calloc_check(T * sizeof(int));
    float* probs = (float*)malloc_check(c->Vp * sizeof(float));
    float* logits = (float*)malloc_check(c->Vp * sizeof(float));
    float* sorted = (float*)malloc_check(c->Vp * sizeof(float));
    floatX* row = (floatX*)malloc_check(c->Vp * sizeof(floatX));
    floatX* gathered = (floatX*)device_malloc(c->Vp * sizeof(floatX));  // [TP rank 0's ids | 1's | ...]
    Activations* a = forward_only_activations(model);
    seq[0] = tok->eot;
    if (print) printf("sample: ");
    for (int t = 1; t <= sc->n_prompt; t++) {
        seq[t] = sc->prompt[t - 1];
        if (print) print_sampled_token(tok, seq[t]);
    }
    for (int t = 1 + sc->n_prompt; t < T; t++) {
        forward_through_stages(model, a, seq, NULL, 1, t);  // PP: the last stage has the logits
        int next = c->V - 1;
        float r = rng_uniform(rng);  // every rank draws, so all generators stay in step
        if (model->last) {
            device_copy(gathered + (size_t)model->tp_rank * Vpl, a->logits + (size_t)(t - 1) * Vpl, Vpl * sizeof(floatX));
            comm_all_gather(comm, &comm->tp_group, gathered, Vpl, DT_FLOATX);
            comm_join(comm);
            copy_to_host(row, gathered, c->Vp * sizeof(floatX));
            for (int i = 0; i < c->V; i++) logits[i] = floatX_to_float(row[i]);
            next = draw_token(sc, logits, c->V, r, probs, sorted);
        }
        double shared = model->last ? next : 0.0;  // the last stage tells the others
        comm_all_reduce_host(comm, &comm->pp_group, &shared, 1, REDUCE_SUM);
        seq[t] = (int)shared;
        if (print) print_sampled_token(tok, seq[t]);
        fflush(stdout);
    }
    if (print) printf("\n");
    device_free(gathered);
    free(seq), free(probs), free(logits), free(sorted), free(row);
}

// ----------------------------------------------------------------------------------------------------
// 5. the run's configuration, and the memory planner (--plan): what each rank will allocate, without
//    allocating it

// Everything the command line sets.
typedef struct {
    // data
    const char* train_data;
    const char* val_data;
    const char* tokenizer;
    int shuffle;
    // model: from a file, or from scratch with these sizes
    const char* model_file;
    GPT2Config arch;
    int arch_given;  // bit mask of the sizes given on the command line: 1 L, 2 C, 4 NH, 8 V, 16 maxT
    uint64_t seed;
    // batch (B is per rank: the global batch of a micro-step is dp x B sequences)
    int B, T, grad_accum;
    // parallelism
    int dp;              // data-parallel ranks (0: the world size / tp)
    int tp;              // tensor-parallel ranks
    int pp;              // pipeline stages
    const char* pp_split;  // layers per stage "a,b,c", or NULL: as even as possible
    Schedule pipe_schedule;  // GPipe or 1F1B
    int rematerialize;     // pipeline: keep only stage inputs, recompute activations in backward
    int recompute;         // --recompute 0..3 (see LayerActs)
    int stochastic_rounding;  // BF16 builds: round parameter updates stochastically
    KernelChoice kernels;     // --fused-kernels, --attention, --cpu-matmul (llmc/device.h): the model's kernel variants
    int plan;                 // --plan: print the memory plan and exit
    int print_schedule;       // --print-schedule: print every stage's pipeline schedule and exit
    const char* plan_precision;
    double device_memory;     // --device-memory, bytes (0: not given)
    const char* trace;     // --trace FILE, or NULL
    int trace_steps;
    int zero;            // ZeRO stage 0, 1, 2
    const char* engine;  // auto | mpi | nccl
    const char* nccl_id_dir;
    double comm_timeout;  // --comm-timeout: seconds a wait on other ranks may take (0: no limit)
    double io_timeout;    // --io-timeout: the same around file I/O (checkpoint saves, loading)
    int fault_rank, fault_step;  // testing: this rank kills itself at this step (-1: never)
    int fault_stop;              // testing: ... or stops itself there (SIGSTOP), as a hung node would
    double fault_slow_save;      // testing: rank 0 takes this many seconds longer to save a checkpoint or the final model
    double fault_slow_sample;    // testing: each sample takes this many seconds longer
    long long fault_wait_signal; // testing: after this step every rank waits for a stop signal (-1: never)
    double fault_clock_skew;     // testing: --trace's clock on rank r reads r times this many seconds ahead
    int fault_inf_rank, fault_inf_step;  // testing: this rank puts an inf into a gradient at this step
    LossScaler scaler;   // loss scaling settings (llmc/loss_scaler.h)
    // optimization
    long long steps;
    long long stop_after;  // end this run after this step (0: run to --steps); the schedule still plans for steps
    OptimizerConfig opt;
    int warmup;
    const char* schedule;  // cosine | linear | constant
    float lr_min_frac;
    // evaluation, sampling, checkpoints, logs
    int val_every, val_batches, sample_every, sample_len;
    const char* prompt;      // --prompt TEXT: samples continue it (NULL: they start from end-of-text alone)
    const char* bpe_dir;     // folder of encoder.json and vocab.bpe (NULL: beside --tokenizer, else data/)
    const char* encode_file; // --encode FILE: print its GPT-2 tokens and exit
    float temperature;       // sampling: 0 greedy
    const char* eval_data;   // --eval-data: multiple-choice examples (llm.c's format), or NULL
    int eval_every;
    const char* eval_dump;   // --eval-dump: each example's completion losses (checks)
    int top_k;               // sampling: 0 all tokens
    int save_every;
    const char* checkpoint_dir;
    const char* resume;  // checkpoint folder to resume from, or NULL
    const char* resume_if_present;  // resume from this folder if it holds a complete checkpoint, else start fresh
    int keep_last;       // keep this many newest checkpoints, delete older ones (0: keep all)
    int allow_data_change;  // --allow-data-change: a resume may train on other data than its checkpoint's
    const char* log_file;
    const char* save_model;  // write the final model here (llm.c format), or NULL
    int save_model_version;  // its model file version: 3 fp32 (default) or 5 bf16
    int quiet;               // no per-step lines (tests)
    int argc;                // the command line, for the log's configuration line
    char** argv;
} TrainConfig;

typedef struct {
    size_t params, grads, optimizer, activations, workspace, comm;  // what the model allocates up front
    size_t kernel_scratch;  // GPU: cuBLASLt workspace and the layer kernels' scratch; CPU: the matmuls' transposes
    size_t host;            // CPU target only: what the host copies of loading and saving add at the peak
} MemoryPlan;

static size_t plan_total(const MemoryPlan* p) {
    return p->params + p->grads + p->optimizer + p->activations + p->workspace + p->comm + p->kernel_scratch + p->host;
}

// On the CPU target "device" memory is host memory: the plan is the process's, and counts what the CPU
// build allocates besides the model's buffers. (A CPU build planning bf16 or fp16 plans for a GPU.)
static int plan_is_cpu(size_t elem_bytes) {
#ifdef LLMC_CPU
    return elem_bytes == sizeof(float);
#else
    return 0;
#endif
}

// CPU target: the transposed operand the reference matmuls keep (llmc/matmul.h, the largest weight in
// forward, the largest output gradient in backward; OpenBLAS reads operands in place), and the
// vocab-parallel loss's scratch
static size_t cpu_kernel_scratch(const GPT2Config* c, const Placement* pl, int last, int B, int T, const KernelChoice* kernels) {
    size_t BT = (size_t)B * T, C = c->C, Cl = C / pl->tp, widest = 4 * Cl > C ? 4 * Cl : C;
    if (last && (size_t)c->Vp / pl->tp > widest) widest = c->Vp / pl->tp;
    size_t transposed = kernels->cpu_blas ? 0 : C * widest > BT * widest ? C * widest : BT * widest;
    return (transposed + (pl->tp > 1 ? 3 * BT : 0)) * sizeof(float);
}

// what a run does besides training, for the CPU target's host copies (see plan_host_copies)
enum { PLAN_RESUMES = 1, PLAN_SAVES_MODEL = 2, PLAN_CHECKPOINTS = 4 };

// CPU target: the host copies of the model that loading and saving make (in file order, see
// gpt2_set_parameters, load_checkpoint, gpt2_export_master, save_checkpoint), while the model's buffers
// are allocated: the extra at the peak, beyond plan_total's other categories. Loading happens before
// the activations and kernel scratch exist, saving after.
static size_t plan_host_copies(const GPT2* m, int phases, size_t acts_and_scratch) {
    size_t n = m->num_parameters, total = m->layout.total, shard = m->zero.shard_total, tp = m->tp;
    size_t master = master_is_params(m) ? 0 : shard;
    size_t load = n + total + master;  // the parameters in file order, and in the memory layout
    if (phases & PLAN_RESUMES) {       // m and v in file order too, and first one shard file's m, v
        size_t resume = 3 * n + total + shard;
        load = resume > 4 * n ? resume : 4 * n;
    }
    size_t save = 0, export_ = n + 2 * total * tp + (m->place.pp > 1 ? n : 0);  // the whole master weights
    if (phases & PLAN_SAVES_MODEL) save = export_;
    // a checkpoint then writes the state shard from 4 host copies; the heap keeps the space of the model's
    // file-order copy, freed just before, so both are counted (the measured peak is within the stated
    // tolerance of scripts/test_cli.sh)
    if (phases & PLAN_CHECKPOINTS) save = n + (2 * total * tp > 4 * shard ? 2 * total * tp : 4 * shard) + (m->place.pp > 1 ? n : 0);
    size_t load_extra = load * sizeof(float) > acts_and_scratch ? load * sizeof(float) - acts_and_scratch : 0;
    return save * sizeof(float) > load_extra ? save * sizeof(float) : load_extra;
}

// the scratch the GPU kernels allocate on first use (the model's KernelScratch, cuBLASLt's workspace)
static size_t gpu_kernel_scratch(const GPT2Config* c, const Placement* pl, int B, int T, size_t elem_bytes,
                                 const KernelChoice* kernels) {
    size_t BT = (size_t)B * T, Cl = c->C / pl->tp, NHl = c->NH / pl->tp, widest = 4 * Cl > (size_t)c->C ? 4 * Cl : c->C;
    size_t attention = kernels->flash_attention ? (size_t)B * NHl * T * sizeof(float)     // attention.h: flash's D
                                                : (8 * BT * Cl + (size_t)B * NHl * T * T) * elem_bytes;  // classic
    size_t reductions = 64 * 2 * c->C * 4 + 64 * widest * 4 + 1024 * 4;         // layernorm, bias, norm partials
    // --fused-kernels: 512 LayerNorm partial rows (LNB_BLOCKS); the bias gradients come from cuBLASLt's
    // epilogues, one vector at a time (llmc/matmul.h; where cuBLASLt refused an epilogue, the launcher's
    // 128 partial rows of floats would take more than planned)
    if (kernels->fused) reductions = 512 * 2 * c->C * 4 + widest * elem_bytes + 1024 * 4;
    size_t embedding = (3 * BT + 1) * sizeof(int) + (pl->tp > 1 ? 3 * BT * 4 : 0);  // encoder, vocab-parallel CE
    return (32 << 20) + attention + reductions + embedding;
}

// The kernel scratch of one rank with elements of `elem_bytes`: the CPU target's own (its build precision)
// or the GPU's
static size_t kernel_scratch_bytes(const GPT2Config* c, const Placement* pl, int last, int B, int T, size_t elem_bytes,
                                   const KernelChoice* kernels) {
    return plan_is_cpu(elem_bytes) ? cpu_kernel_scratch(c, pl, last, B, T, kernels) : gpu_kernel_scratch(c, pl, B, T, elem_bytes, kernels);
}

// Builds one rank dry, with elements of `elem_bytes` and the run's kernel choice, and reads off its
// allocation by category. `phases` (PLAN_*): what the run does besides training, for the CPU target's host
// copies (<0: not counted).
static MemoryPlan plan_rank(const GPT2Config* c, const Placement* pl, int B, int T, int n_slots, int recompute, int rematerialize,
                            int phases, size_t elem_bytes, const KernelChoice* kernels) {
    GPT2 model;
    Comm single = comm_single();
    BuildMode dry = {.elem_bytes = elem_bytes, .dry = 1};
    gpt2_build_as(&model, c, &single, pl, &dry, kernels);
    model.recompute = recompute;
    gpt2_allocate_activations(&model, B, T, n_slots, rematerialize);
    int cpu = plan_is_cpu(elem_bytes);
    MemoryPlan p = {.params = model.bytes_params, .grads = model.bytes_grads, .optimizer = model.bytes_optimizer,
                    .activations = model.bytes_activations, .workspace = model.bytes_workspace, .comm = model.bytes_comm,
                    .kernel_scratch = kernel_scratch_bytes(c, pl, model.last, B, T, elem_bytes, kernels),
                    .host = 0};
    if (cpu && phases >= 0) p.host = plan_host_copies(&model, phases, p.activations + p.kernel_scratch);
    gpt2_free(&model);
    return p;
}

// The plan of every pipeline stage (one rank each; the DP and TP ranks of a stage are alike) for a
// micro-batch of B sequences with elements of `elem_bytes`; returns the largest total.
static size_t plan_stages(const GPT2Config* c, const TrainConfig* tc, int dp, int B, size_t elem_bytes, int print) {
    int* first = (int*)malloc_check((tc->pp + 1) * sizeof(int));
    pipeline_split(c->L, tc->pp, tc->pp_split, first);
    PipeAction* plan = (PipeAction*)malloc_check(2 * tc->grad_accum * sizeof(PipeAction));
    size_t worst = 0;
    for (int s = 0; s < tc->pp; s++) {
        Placement pl = {.zero = tc->zero, .dp = dp, .tp = tc->tp, .pp = tc->pp, .pp_rank = s, .l0 = first[s], .l1 = first[s + 1]};
        int slots = pipeline_schedule(tc->pp == 1 ? SCHEDULE_1F1B : tc->pipe_schedule, tc->pp, s, tc->grad_accum, plan);
        int phases = (tc->resume ? PLAN_RESUMES : 0) | (tc->save_model ? PLAN_SAVES_MODEL : 0) |
                     (tc->save_every > 0 || tc->stop_after > 0 ? PLAN_CHECKPOINTS : 0);
        MemoryPlan p = plan_rank(c, &pl, B, tc->T, slots, tc->recompute, tc->rematerialize, phases, elem_bytes, &tc->kernels);
        size_t total = plan_total(&p);
        worst = total > worst ? total : worst;
        if (print) {
            const double G = 1073741824.0;
            printf("  stage %2d (layers %2d-%2d): parameters %7.3f | gradients %7.3f | optimizer %7.3f | activations %7.3f "
                   "(%d slot%s) | workspace %6.3f | communication %6.3f | kernel scratch %6.3f",
                   s, first[s], first[s + 1] - 1, p.params / G, p.grads / G, p.optimizer / G, p.activations / G, slots,
                   slots > 1 ? "s" : " ", p.workspace / G, p.comm / G, p.kernel_scratch / G);
            if (plan_is_cpu(elem_bytes)) printf(" | load/save copies %6.3f", p.host / G);
            printf(" | total %7.3f GiB\n", total / G);
        }
    }
    free(plan);
    free(first);
    return worst;
}

// --plan: prints the per-rank memory of the configuration on the command line and, with
// --device-memory, the largest micro-batch that fits. The world size is dp x tp x pp (--dp defaults to 1).
static void print_plan(const TrainConfig* tc, const char* precision, double device_memory) {
    GPT2Config c = tc->arch;
    if (tc->model_file) model_file_read(tc->model_file, &c, NULL);
    validate_config(&c, "plan");
    validate_tp(&c, tc->tp);
    if (tc->T > c.maxT) fatal("sequence length T=%d is longer than maxT=%d", tc->T, c.maxT);
    size_t elem_bytes = strcmp(precision, "fp32") == 0 ? 4 : 2;  // the precision planned for
    if (tc->kernels.flash_attention) attention_flash_validate(c.C, c.NH, elem_bytes, 1);
    int dp = tc->dp > 0 ? tc->dp : 1;
    printf("memory plan per rank (%s, GiB): GPT-2 L=%d C=%d NH=%d V=%d maxT=%d, %zu parameters\n",
           plan_is_cpu(elem_bytes) ? "CPU target: host memory" : "device memory", c.L, c.C, c.NH, c.V, c.maxT, gpt2_num_parameters(&c));
    printf("  %d ranks = dp %d x tp %d x pp %d, ZeRO-%d, %s, recompute %d, micro-batch B=%d T=%d, %d micro-batch%s per step%s\n",
           dp * tc->tp * tc->pp, dp, tc->tp, tc->pp, tc->zero, precision, tc->recompute, tc->B, tc->T, tc->grad_accum,
           tc->grad_accum > 1 ? "es" : "", tc->pp > 1 ? (tc->pipe_schedule == SCHEDULE_GPIPE ? " (GPipe)" : " (1F1B)") : "");
    plan_stages(&c, tc, dp, tc->B, elem_bytes, 1);
    if (device_memory > 0) {
        int lo = 0, hi = 1;  // largest B whose worst stage fits: grow, then bisect
        while (hi <= (1 << 16) && plan_stages(&c, tc, dp, hi, elem_bytes, 0) <= device_memory) lo = hi, hi *= 2;
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (plan_stages(&c, tc, dp, mid, elem_bytes, 0) <= device_memory) lo = mid;
            else hi = mid;
        }
        if (lo == 0) printf("  with %.1f GiB per device: even a micro-batch of 1 does not fit\n", device_memory / 1073741824.0);
        else printf("  with %.1f GiB per device: the largest micro-batch that fits is B=%d\n", device_memory / 1073741824.0, lo);
    }
}

// ----------------------------------------------------------------------------------------------------
// 6. training loop


static float learning_rate(const TrainConfig* tc, long long step) {
    float lr = tc->opt.lr, lr_min = tc->opt.lr * tc->lr_min_frac;
    if (step < tc->warmup) return lr * (float)(step + 1) / (float)tc->warmup;
    if (strcmp(tc->schedule, "constant") == 0) return lr;
    long long decay_steps = tc->steps - tc->warmup;
    float progress = decay_steps > 0 ? (float)(step - tc->warmup) / (float)decay_steps : 1.0f;
    if (progress > 1.0f) progress = 1.0f;
    if (strcmp(tc->schedule, "linear") == 0) return lr - (lr - lr_min) * progress;
    return lr_min + (lr - lr_min) * 0.5f * (1.0f + cosf((float)M_PI * progress));  // cosine
}

// Mean validation loss over max_batches global micro-batches: DP rank d of D evaluates micro-batches
// i*D + d (the data-order contract), and the means are averaged across the DP group.
static float evaluate(GPT2* model, DataLoader* val, int max_batches) {
    Comm* comm = model->comm;
    long long n = val->n_batches < max_batches ? val->n_batches : max_batches;
    Activations* a = forward_only_activations(model);
    double sum = 0.0;
    for (long long i = 0; i < n; i++) {
        dataloader_load(val, i * comm->dp + comm->dp_rank);
        sum += forward_through_stages(model, a, val->inputs, val->targets, val->B, val->T);
    }
    double mean = model->last ? sum / n : 0.0;
    comm_all_reduce_host(comm, &comm->pp_group, &mean, 1, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->dp_group, &mean, 1, REDUCE_AVG);
    return (float)mean;
}

// Multiple-choice accuracy (llmc/eval.h) over all examples: DP rank d of D scores examples d, d + D, ...
// Rows (one per completion) are packed many to a forward: the forward is (B*T / Te, Te) with Te the longest
// row, within the activations allocated for (B, T). Forward-only through the pipeline, as evaluate().
// If `dump` is given (main rank), each of this rank's examples' 4 mean losses go there, one line each.
static float evaluate_choices(GPT2* model, const EvalSet* e, const char* path, FILE* dump) {
    Comm* comm = model->comm;
    int T = model->T, K = EVAL_COMPLETIONS;
    int n_mine = e->n_examples > comm->dp_rank ? (e->n_examples - comm->dp_rank + comm->dp - 1) / comm->dp : 0;
    int n_rows = n_mine * K;
    int* in = (int*)malloc_check((size_t)(n_rows + 1) * T * sizeof(int));  // (n_rows, T), then packed
    int* tg = (int*)malloc_check((size_t)(n_rows + 1) * T * sizeof(int));
    int* ntg = (int*)malloc_check((size_t)(n_rows + 1) * sizeof(int));  // targets in each row
    int* nc = (int*)malloc_check((size_t)(n_rows + 1) * sizeof(int));   // of which the completion's (the last)
    int Te = 1;
    for (int r = 0; r < n_rows; r++) {
        int ex = comm->dp_rank + (r / K) * comm->dp;
        ntg[r] = eval_row(e, ex, r % K, T, in + (size_t)r * T, tg + (size_t)r * T, path);
        nc[r] = e->comp_len[ex * K + r % K];
        if (ntg[r] > Te) Te = ntg[r];
    }
    int rows_per_forward = model->B * T / Te;
    double* mean = (double*)calloc_check((size_t)(n_rows + 1) * sizeof(double));
    int* bin = (int*)malloc_check((size_t)rows_per_forward * Te * sizeof(int));
    int* btg = (int*)malloc_check((size_t)rows_per_forward * Te * sizeof(int));
    Activations* a = forward_only_activations(model);
    for (int r0 = 0; r0 < n_rows; r0 += rows_per_forward) {
        for (int j = 0; j < rows_per_forward; j++) {  // rows r0.., cut to Te; past the last row: zeros
            int r = r0 + j < n_rows ? r0 + j : -1;
            for (int t = 0; t < Te; t++) {
                bin[j * Te + t] = r >= 0 ? in[(size_t)r * T + t] : 0;
                btg[j * Te + t] = r >= 0 ? tg[(size_t)r * T + t] : 0;
            }
        }
        forward_through_stages(model, a, bin, btg, rows_per_forward, Te);
        if (!model->last) continue;
        for (int j = 0; j < rows_per_forward && r0 + j < n_rows; j++) {
            int r = r0 + j;
            double sum = 0.0;
            for (int t = ntg[r] - nc[r]; t < ntg[r]; t++) sum += model->host_losses[(size_t)j * Te + t];
            mean[r] = sum / nc[r];
        }
    }
    double counts[2] = {0.0, 0.0};  // right, examples (the last stage's; the others add zeros)
    for (int i = 0; model->last && i < n_mine; i++) {
        int ex = comm->dp_rank + i * comm->dp;
        counts[0] += eval_predict(mean + (size_t)i * K) == e->label[ex];
        counts[1] += 1;
        if (dump) fprintf(dump, "%d %d %.9g %.9g %.9g %.9g\n", ex, e->label[ex], mean[i * K], mean[i * K + 1], mean[i * K + 2], mean[i * K + 3]);
    }
    if (model->tp_rank != 0) counts[0] = counts[1] = 0.0;  // TP ranks hold the same counts: one of them counts
    comm_all_reduce_host(comm, &comm->pp_group, counts, 2, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->tp_group, counts, 2, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->dp_group, counts, 2, REDUCE_SUM);
    free(in), free(tg), free(ntg), free(nc), free(mean), free(bin), free(btg);
    return (float)(counts[0] / counts[1]);
}

// peak dense BF16 tensor throughput of known GPUs, for MFU (0: unknown, MFU not printed)
static double gpu_peak_flops(void) {
    int major, minor;
    device_compute_capability(0, &major, &minor);  // (0.0 on the CPU target)
    if (major == 9 && minor == 0) return 989e12;  // H100 SXM / H200
    if (major == 8 && minor == 0) return 312e12;  // A100
    return 0.0;
}

// testing (--fault-inf-rank/--fault-inf-step): one gradient of this rank becomes inf, as an fp16 overflow would
static void inject_inf_gradient(GPT2* model) {
    for (int b = 0; b < model->zero.num_buckets; b++) {
        if (owned_size(&model->zero, b) == 0) continue;
        floatX inf = float_to_floatX(INFINITY);
        copy_to_device(grads_of_bucket(model, b), &inf, sizeof(inf));
        return;
    }
}

// Writes the trace (every rank its part, rank 0 merges) and prints the pipeline bubble measured in the
// traced steps: the fraction of each rank's pipeline time not spent in forward or backward, averaged
// over the ranks, next to the schedule's (P-1)/(M+P-1) (the trace records both, for plot_trace.py's
// title); then the communication engine's rate in those steps.
static void write_trace(const Tracer* tracer, const TrainConfig* tc, Comm* comm) {
    char label[128], run[256];
    snprintf(label, sizeof(label), "rank %d (dp %d, tp %d, stage %d)", comm->world_rank, comm->dp_rank, comm->tp_rank, comm->pp_rank);
    double bubble = tracer->pipeline_s > 0 ? 1.0 - tracer->busy_s / tracer->pipeline_s : 0.0;
    comm_all_reduce_host(comm, &comm->world, &bubble, 1, REDUCE_AVG);
    int P = comm->pp, M = tc->grad_accum;
    double ideal = (double)(P - 1) / (M + P - 1);
    snprintf(run, sizeof(run), "{\"schedule\": \"%s\", \"P\": %d, \"M\": %d, \"bubble_measured\": %.4f, \"bubble_ideal\": %.4f}",
             tc->pipe_schedule == SCHEDULE_GPIPE ? "gpipe" : "1f1b", P, M, bubble, ideal);
    trace_write_rank(tracer, tc->trace, comm->world_rank, label);
    comm_barrier_io(comm, &comm->world);  // every part is written
    if (comm->world_rank == 0) {
        trace_merge(tc->trace, comm->world_size, run);
        printf("wrote trace %s; pipeline bubble: measured %.1f%%, (P-1)/(M+P-1) = %.1f%%\n", tc->trace, 100.0 * bubble, 100.0 * ideal);
    }
    comm_barrier_io(comm, &comm->world);  // rank 0 has merged (the collective below waits under --comm-timeout)
    comm_print_stats(comm);
}

// A random identity for a run that starts from scratch (kept in its checkpoints and through every
// resume, see llmc/state_file.h): drawn by rank 0, shared with every rank in 16-bit pieces (exact as
// doubles). Never 0, which stands for "unknown" (version 1 state files).
static uint64_t new_run_id(Comm* comm) {
    uint64_t id = 0;
    if (comm->world_rank == 0) {
        FILE* f = fopen("/dev/urandom", "rb");
        if (f == NULL || fread(&id, sizeof(id), 1, f) != 1) id = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
        if (f != NULL) fclose(f);
        if (id == 0) id = 1;
    }
    double parts[4];
    for (int i = 0; i < 4; i++) parts[i] = (double)((id >> (16 * i)) & 0xffff);
    comm_all_reduce_host(comm, &comm->world, parts, 4, REDUCE_SUM);  // the other ranks add 0
    id = 0;
    for (int i = 0; i < 4; i++) id |= (uint64_t)parts[i] << (16 * i);
    return id;
}

// The folder of encoder.json and vocab.bpe: --bpe-dir, else the --tokenizer file's folder if it holds
// encoder.json, else data/
static const char* bpe_dir_of(const TrainConfig* tc, char* buf, size_t cap) {
    if (tc->bpe_dir) return tc->bpe_dir;
    const char* slash = tc->tokenizer ? strrchr(tc->tokenizer, '/') : NULL;
    snprintf(buf, cap, "%.*s/encoder.json", slash ? (int)(slash - tc->tokenizer) : 1, slash ? tc->tokenizer : ".");
    struct stat st;
    if (tc->tokenizer && tc->tokenizer[0] != '\0' && stat(buf, &st) == 0) {
        buf[strlen(buf) - strlen("/encoder.json")] = '\0';
        return buf;
    }
    return "data";
}

// Before the first collective of the run: every rank must run the same job (llmc/agreement.h). What may
// differ between ranks is left out: output paths only rank 0 writes (--log, --save-model's name,
// --eval-dump: one rank only), what only rank 0 does (--keep-last: rank 0 deletes old checkpoints), the
// folders files are read from (node-local copies are fine if their files are the same), each rank's own
// deadlines (--comm-timeout, --io-timeout: the first rank past one ends the run) and threads
// (OMP_NUM_THREADS: a node's cores are its own, and what replicas must compute alike, the gradient norm,
// is summed in fixed chunks whatever the thread count). --comm is compared by the engine's choice
// (mpi_agree_engine), the launchers' variables at the start (llmc/comm/launch.h, llmc/comm/rendezvous.h).
static void check_ranks_agree(const TrainConfig* tc, Comm* comm, const GPT2Config* c, const RunState* state) {
    if (comm->world_size == 1) return;
    Agreement a = {.names = {NULL}, .hashes = {0}, .n = 0};
    agree_string(&a, "the build (target and precision)", TARGET_NAME " " PRECISION_NAME);
    agree_int(&a, "--steps", tc->steps);
    agree_int(&a, "--stop-after", tc->stop_after);
    agree_int(&a, "--batch-size", tc->B);
    agree_int(&a, "--seq-len", tc->T);
    agree_int(&a, "--grad-accum / --micro-batches", tc->grad_accum);
    agree_int(&a, "the grid (--dp, --tp, --pp)", (long long)comm->dp * 1000003 * 1000003 + comm->tp * 1000003 + comm->pp);
    agree_int(&a, "--zero", tc->zero);
    long long pipe[3] = {tc->pipe_schedule, tc->rematerialize, 0};
    agree_bytes(&a, "the pipeline settings (--pp-split, --schedule, --pp-rematerialize)", pipe, sizeof(pipe), tc->pp_split);
    agree_int(&a, "--recompute", tc->recompute);
    agree_int(&a, "--seed", (long long)tc->seed);
    agree_int(&a, "--shuffle", tc->shuffle);
    agree_double(&a, "--lr", tc->opt.lr);
    double opt[5] = {tc->opt.beta1, tc->opt.beta2, tc->opt.eps, tc->opt.weight_decay, tc->opt.grad_clip};
    agree_bytes(&a, "the optimizer settings (--beta1, --beta2, --eps, --weight-decay, --grad-clip)", opt, sizeof(opt), NULL);
    double sched[2] = {(double)tc->warmup, tc->lr_min_frac};
    agree_bytes(&a, "the learning-rate schedule (--warmup, --lr-schedule, --lr-min-frac)", sched, sizeof(sched), tc->schedule);
    const LossScaler* ls = &tc->scaler;
    double scaling[6] = {(double)ls->mode, ls->scale, ls->growth, ls->backoff, (double)ls->interval, (double)ls->hysteresis};
    agree_bytes(&a, "the loss scaling settings", scaling, sizeof(scaling), NULL);
    agree_int(&a, "--stochastic-rounding", tc->stochastic_rounding);
    agree_bytes(&a, "the model sizes (L, C, NH, V, maxT)", c, sizeof(*c), NULL);
    agree_files(&a, "the model file (--model)", tc->model_file);
    agree_files(&a, "the training data (--train-data: a file's name, size or first MiB)", tc->train_data);
    agree_files(&a, "the validation data (--val-data: a file's name, size or first MiB)", tc->val_data);
    // the DP ranks score their share of the examples and add up the counts: another file or another
    // schedule on one rank gives a wrong accuracy, or a collective that the others never reach
    agree_files(&a, "the multiple-choice data (--eval-data: a file's name, size or first MiB)", tc->eval_data);
    long long evals[3] = {tc->val_every, tc->val_batches, tc->eval_every};
    agree_bytes(&a, "the evaluation settings (--val-every, --val-batches, --eval-every)", evals, sizeof(evals), NULL);
    agree_files(&a, "the tokenizer (--tokenizer)", tc->tokenizer);
    // the TP (and PP) ranks of a sample compute its tokens together: each must draw the same way
    double sampling[4] = {(double)tc->sample_every, (double)tc->sample_len, tc->temperature, (double)tc->top_k};
    agree_bytes(&a, "the sampling settings (--sample-every, --sample-len, --prompt, --temperature, --top-k)", sampling, sizeof(sampling),
                tc->prompt);
    uint64_t bpe = AGREE_FNV_INIT;  // the prompt's tokens: from these files, in whichever folder (--bpe-dir)
    if (tc->prompt) {
        char dir[4200], path[4300];
        const char* d = bpe_dir_of(tc, dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/encoder.json", d);
        bpe = agree_file(bpe, path);
        snprintf(path, sizeof(path), "%s/vocab.bpe", d);
        bpe = agree_file(bpe, path);
    }
    agree_add(&a, "the encoding of --prompt (encoder.json and vocab.bpe: their size or first MiB)", bpe);
    long long saving[3] = {tc->save_every, tc->save_model != NULL, tc->save_model_version};
    agree_bytes(&a, "the saving settings (--save-every, --save-model-dtype, whether --save-model is given)", saving, sizeof(saving), NULL);
    agree_int(&a, "the resume step (--resume)", tc->resume ? state->step : -1);
    agree_add(&a, "the checkpoint resumed from (its run and model)", tc->resume ? state->run_id ^ (state->model_hash * 3) : 0);
    // every rank writes its shards into its own --checkpoint-dir: two folders would each hold part of a
    // checkpoint (compared as written: name the folder the same way on every rank)
    agree_string(&a, "--checkpoint-dir (where checkpoints are saved: --resume's folder unless given)", tc->checkpoint_dir);
    agree_int(&a, "--fault-wait-signal", tc->fault_wait_signal);
    agree_bytes(&a, "--fault-clock-skew", &tc->fault_clock_skew, sizeof(tc->fault_clock_skew), NULL);
    agree_int(&a, "the trace settings (--trace, --trace-steps) or --quiet", (long long)(tc->trace != NULL) * 4 + tc->trace_steps * 8 + tc->quiet);
    // other kernels round differently: replicas that each update the whole model would drift apart
    const KernelChoice* k = &tc->kernels;
    agree_int(&a, "the kernel variants (--fused-kernels, --attention)", k->fused * 2 + k->flash_attention);  // (separate_gelu: tests only)
    // OpenBLAS and the reference GEMM sum in other orders: ranks on different ones would compute other bits
    // for the same inputs (TP's partial products, DP's replicas)
    agree_int(&a, "the CPU matmul (--cpu-matmul)", k->cpu_blas);
    // The environment the engine reads, as it resolved it (comm_init). LLMC_MPI_STAGE_BYTES cuts each
    // operation into chunks of that size: a rank with other chunks posts messages of other sizes (an
    // error inside MPI). LLMC_COMM_STRICT runs each operation at its join instead of its post: peers
    // meet in another order than they post, and the check it exists for would hold on some ranks only.
    agree_int(&a, "the MPI engine's settings (LLMC_MPI_STAGE_BYTES, LLMC_COMM_STRICT)", (long long)comm->stage_bytes * 2 + comm->strict);
    agree_check(comm, &a);
}

// A run saves into its checkpoint folder only if every checkpoint already there is its own: after
// another run's checkpoints, a later --resume would continue whichever run saved the newest step. Nor
// may the folder hold a complete checkpoint of its own run after start_step, the step it starts from:
// that is a later part of the same run (a rollback resumes an older copy into the original folder), which
// its saves would overwrite step by step with another branch, leaving a mix whose newest step a later
// --resume would continue. An incomplete one after start_step is what a crash during a save left (a
// requeue resumes from the step before it): no resume can read it, and this run writes that step anew.
//
// An incomplete checkpoint of another run is no checkpoint either: no resume can read it, so no later
// --resume can continue that run from it. It is what a kill during a run's first save leaves (a fresh
// start draws a new run id, so its requeue finds "another run's" files); refusing it would refuse that
// requeue forever. It is deleted instead of being left: were this run to save the same step and be
// killed midway, that run's files mixed with this one's could look complete (a resume then refuses
// them, and the folder is stuck again). Deleting is safe because it happens only when the folder holds
// no complete checkpoint of another run (else this run is refused, and nothing is touched): that run
// has nothing here to continue from. (A second job saving into the same folder at the same time is
// not something a start-up check can prevent, nor was it before.) With `clean` 0 nothing is deleted and
// the first conflict is returned in msg (NULL: none), for a warning.
static const char* checkpoint_dir_conflict(const char* dir, uint64_t run_id, long long start_step, int clean, char* msg, size_t cap) {
    long long* steps;
    int n = checkpoint_steps(dir, &steps), n_debris = 0;
    long long* debris = (long long*)malloc_check((n > 0 ? n : 1) * sizeof(long long));
    const char* conflict = NULL;
    for (int i = 0; i < n && conflict == NULL; i++) {  // newest first
        char path[4200];
        int header[HEADER_INTS];
        long long size;
        snprintf(path, sizeof(path), "%s/state_%08lld_00000.bin", dir, steps[i]);
        FILE* f = open_with_header(path, STATE_MAGIC, "training state file", header, &size);
        fclose(f);
        uint64_t id = header[1] >= 2 ? get_u64(header + 33) : 0;
        int complete = checkpoint_complete(dir, steps[i]);
        if (!complete && id != run_id) debris[n_debris++] = steps[i];
        else if (complete && id != run_id)
            snprintf(msg, cap, "--checkpoint-dir '%s' holds checkpoints of another run (step %lld): continue that run with --resume, "
                     "or save into another folder", dir, steps[i]), conflict = msg;
        else if (complete && steps[i] > start_step)
            snprintf(msg, cap, "--checkpoint-dir '%s' holds checkpoints of this run after step %lld, where it resumes (the newest: "
                     "step %lld): its saves would mix a second branch into them, and the next --resume there would continue the old "
                     "branch's newest step; save into another --checkpoint-dir, or move or delete the checkpoints after step %lld",
                     dir, start_step, steps[i], start_step), conflict = msg;
    }
    if (conflict == NULL && clean)
        for (int i = 0; i < n_debris; i++) {
            printf("--checkpoint-dir '%s': deleting the incomplete checkpoint of step %lld that another run's interrupted save left\n",
                   dir, debris[i]);
            delete_checkpoint_files(dir, debris[i]);
        }
    free(steps), free(debris);
    return conflict;
}

// Refuses a run's saving into dir when checkpoint_dir_conflict finds a conflict; else clears the debris.
static void check_checkpoint_dir_owner(const char* dir, uint64_t run_id, long long start_step) {
    char msg[1600];
    if (checkpoint_dir_conflict(dir, run_id, start_step, 1, msg, sizeof(msg))) fatal("%s", msg);
}

// --encode FILE: prints the GPT-2 token ids of the file's text on one line
static void encode_file(const TrainConfig* tc) {
    char dir[4200];
    BpeEncoder bpe;
    bpe_init(&bpe, bpe_dir_of(tc, dir, sizeof(dir)));
    size_t n, count;
    char* text = read_whole_file(tc->encode_file, &n);
    int* ids = bpe_encode(&bpe, text, n, &count);
    for (size_t i = 0; i < count; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    if (fflush(stdout) != 0 || ferror(stdout)) fatal("cannot write the token ids: %s", strerror(errno));
    free(ids), free(text);
    bpe_free(&bpe);
}

// --prompt: its tokens (malloc'd), checked against the model's vocabulary and the sequence length
static int* encode_prompt(const TrainConfig* tc, const GPT2Config* c, int* n_prompt) {
    char dir[4200];
    BpeEncoder bpe;
    bpe_init(&bpe, bpe_dir_of(tc, dir, sizeof(dir)));
    size_t count;
    int* ids = bpe_encode(&bpe, tc->prompt, strlen(tc->prompt), &count);
    bpe_free(&bpe);
    if (count == 0) fatal("--prompt is empty");
    if (1 + count >= (size_t)tc->T)
        fatal("--prompt is %zu tokens: after the end-of-text token that starts a sample it leaves no room to generate "
              "within --seq-len %d", count, tc->T);
    for (size_t i = 0; i < count; i++)
        if (ids[i] >= c->V) fatal("--prompt: token %d is outside the model's vocabulary of %d", ids[i], c->V);
    *n_prompt = (int)count;
    return ids;
}

// A signal stops the run after the current step with a checkpoint (llmc/stop_signal.h). Its folder was
// checked at the start only if the run meant to save: otherwise it is checked now, before the save.
static void prepare_signal_checkpoint(const TrainConfig* tc, uint64_t run_id, long long start_step) {
    if (tc->save_every > 0 || tc->stop_after > 0) return;
    check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir", 1, CHECKPOINT_NAME_MAX);
    check_checkpoint_dir_owner(tc->checkpoint_dir, run_id, start_step);
}

// After the checkpoint of a run stopped by a signal: one line saying so, and the exit code to come.
static void report_signal_stop(const TrainConfig* tc, Comm* comm, int sig, long long step) {
    stop_signal_ended_run = 1;
    if (comm->world_rank == 0)
        printf("stopped by %s after step %lld: checkpoint saved in '%s'; continue with --resume %s (exit code %d)\n",
               stop_signal_name(sig), step, tc->checkpoint_dir, tc->checkpoint_dir, EXIT_STOPPED_BY_SIGNAL);
}

// The log's first line (and one per resume): the command line and what it resolved to (llmc/logger.h).
static void log_run_config(Logger* lg, const TrainConfig* tc, const Comm* comm, const GPT2* model, long long resumed_from) {
    if (!logger_config_begin(lg, tc->argc, tc->argv)) return;
    const GPT2Config* c = &model->config;
    char device[256];
    device_name(device, sizeof(device));
    FILE* f = lg->f;
    fprintf(f, ", \"target\": \"%s\", \"precision\": \"%s\", \"device\": ", TARGET_NAME, PRECISION_NAME);
    json_string(f, device);
    fprintf(f, ", \"world\": %d, \"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero\": %d", comm->world_size, comm->dp, comm->tp, comm->pp, tc->zero);
    fprintf(f, ", \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d, \"parameters\": %zu}", c->L, c->C,
            c->NH, c->V, c->Vp, c->maxT, model->num_parameters);
    fprintf(f, ", \"batch\": {\"B\": %d, \"T\": %d, \"grad_accum\": %d, \"tokens_per_step\": %lld}", tc->B, tc->T, tc->grad_accum,
            (long long)comm->dp * tc->B * tc->T * tc->grad_accum);
    fprintf(f, ", \"steps\": %lld, \"lr\": %g, \"warmup\": %d, \"lr_schedule\": \"%s\", \"seed\": %llu", tc->steps, tc->opt.lr,
            tc->warmup, tc->schedule, (unsigned long long)tc->seed);
    if (TARGET_IS_CPU) fprintf(f, ", \"cpu_matmul\": \"%s\"", tc->kernels.cpu_blas ? "blas" : "reference");
    if (resumed_from >= 0) fprintf(f, ", \"resumed_from\": %lld", resumed_from);
    logger_config_end(lg);
}

// hours:minutes:seconds, or minutes:seconds under an hour
static void format_duration(double seconds, char* buf, size_t cap) {
    long long s = seconds > 0 && isfinite(seconds) ? (long long)(seconds + 0.5) : 0;
    if (s >= 3600) snprintf(buf, cap, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, cap, "%lld:%02lld", s / 60, s % 60);
}

// The line of a finished step: loss, norm, lr, time, throughput (MFU on a known GPU), the time since
// the loop started and the time left to the last step of this run (--stop-after or --steps), at the
// mean pace of the steps so far.
static void print_step_line(const TrainConfig* tc, long long step, long long start_step, double loop_start, float loss,
                            float norm, float lr, double ms, double tokens_per_s, double mfu) {
    long long end = tc->stop_after > 0 && tc->stop_after < tc->steps ? tc->stop_after : tc->steps;
    double elapsed = wall_seconds() - loop_start;
    char el[32], eta[32];
    format_duration(elapsed, el, sizeof(el));
    format_duration(elapsed / (double)(step - start_step) * (double)(end - step), eta, sizeof(eta));
    printf("step %5lld/%lld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s", step, tc->steps, loss, norm, lr, ms, tokens_per_s);
    if (mfu > 0) printf(" | MFU %.1f%%", mfu);
    printf(" | %s elapsed, ETA %s\n", el, eta);
}

// What a training run holds besides its configuration: the model, its data, what it evaluates and
// samples, its log and trace, and the state a checkpoint saves and a resume restores.
typedef struct {
    const TrainConfig* tc;
    Comm* comm;
    int main_rank;             // world rank 0: prints, logs, samples
    GPT2 model;
    Schedule schedule;         // without pipelining 1F1B: forward and backward of each micro-batch in turn
    DataLoader train_loader, val_loader;
    int have_train, have_val;  // --steps 0 reads no train data; validation needs --val-data and --val-every
    EvalSet choices;           // --eval-data
    FILE* dump;                // --eval-dump
    int have_tok;              // samples on: every rank samples, world rank 0 prints
    Tokenizer tok;
    SampleConfig sample;
    int* prompt;               // (sample.n_prompt) --prompt's tokens, or NULL
    Rng sample_rng;
    LossScaler scaler;
    Logger logger;
    Tracer tracer;
    RunState state;            // what the checkpoint resumed from holds; filled anew at each save
    uint64_t run_id;
    uint64_t data_hash;        // the training data's fingerprint, recorded in every checkpoint
    long long data_tokens;
    int data_files;
    long long start_step;
    long long updates;         // AdamW's step count: skipped steps do not count
    int memory_reported;       // GPU: the plan was compared with the device after the first applied step
    size_t tokens_per_step;    // of the global batch
    double flops_per_token, peak_flops, loop_start;
    float val_loss;            // the last validation loss (NAN: none yet)
} Training;

// Every output path fails now if it cannot be written, not at its first write after hours of training.
// A run that trains can be stopped by a signal, which saves a checkpoint into --checkpoint-dir even
// without --save-every: found unusable only then, after hours of training, the run would end with
// nothing saved. So the folder is checked for every run that trains; it is created only for a run that
// means to save (the default "checkpoints" of a run that is never stopped is never made).
static void check_output_paths(const TrainConfig* tc, int main_rank) {
    if (tc->save_every > 0 || tc->stop_after > 0) check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir", 1, CHECKPOINT_NAME_MAX);
    else if (tc->steps > 0) check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir (where a stop signal saves)", 2, CHECKPOINT_NAME_MAX);
    if (tc->save_model && main_rank) check_writable_file(tc->save_model, "--save-model", strlen(".tmp"));
    if (tc->trace) check_writable_file(tc->trace, "--trace", strlen(".rank") + 7);  // every rank writes its part next to it
}

// What the run starts from: the newest checkpoint in --resume (the model, the AdamW moments into *m, *v
// and the run state), a --model file, or nothing (*params stays NULL: random initialization). The model
// sizes go to *config.
static void read_start_point(Training* run, GPT2Config* config, float** params, float** m, float** v) {
    const TrainConfig* tc = run->tc;
    RunState* state = &run->state;
    int D = run->comm->dp;
    if (tc->resume) {
        load_checkpoint(tc->resume, state, config, params, m, v);
        if (state->B != D * tc->B || state->T != tc->T || state->grad_accum != tc->grad_accum || state->shuffle != tc->shuffle)
            fatal("the checkpoint in '%s' was saved with %d sequences per micro-step (dp x B), T=%d, grad_accum=%d, shuffle=%d; "
                  "resume needs the same (got dp=%d x B=%d, T=%d, grad_accum=%d, shuffle=%d)",
                  tc->resume, state->B, state->T, state->grad_accum, state->shuffle, D, tc->B, tc->T, tc->grad_accum, tc->shuffle);
        if (tc->shuffle && state->data_seed != tc->seed)
            fatal("the checkpoint in '%s' shuffled the data with --seed %llu; resume needs the same (got %llu)", tc->resume,
                  (unsigned long long)state->data_seed, (unsigned long long)tc->seed);
        if (run->main_rank)
            printf("resuming from step %lld of '%s' (saved with dp=%d, ZeRO-%d)\n", state->step, tc->resume, state->dp, state->zero_stage);
    } else if (tc->model_file) {
        model_file_read(tc->model_file, config, params);
    }
    if (tc->resume && tc->steps < state->step)
        fatal("--steps %lld is below the step %lld the checkpoint in '%s' has reached: nothing to train", tc->steps, state->step, tc->resume);
    if (tc->resume && tc->stop_after > 0 && tc->stop_after <= state->step)
        fatal("--stop-after %lld is not after the step %lld the checkpoint in '%s' has reached", tc->stop_after, state->step, tc->resume);
}

// Model sizes given on the command line must be those of the model file or checkpoint.
static void check_sizes_given(const TrainConfig* tc, const GPT2Config* config) {
    const GPT2Config* a = &tc->arch;
    if (((tc->arch_given & 1) && a->L != config->L) || ((tc->arch_given & 2) && a->C != config->C) ||
        ((tc->arch_given & 4) && a->NH != config->NH) || ((tc->arch_given & 8) && a->V != config->V) ||
        ((tc->arch_given & 16) && a->maxT != config->maxT))
        fatal("model sizes on the command line differ from the model file's (L=%d C=%d NH=%d V=%d maxT=%d)", config->L,
              config->C, config->NH, config->V, config->maxT);
}

// This rank's model: its place in the grid (DP rank, TP slice, pipeline stage and the stage's layers),
// its parameters (params, or initialized from --seed when NULL) and, on resume, the AdamW moments m, v.
static void build_rank_model(Training* run, const GPT2Config* config, const float* params, const float* m, const float* v) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    GPT2* model = &run->model;
    int* stage_first = (int*)malloc_check((comm->pp + 1) * sizeof(int));  // first layer of each pipeline stage
    pipeline_split(config->L, comm->pp, tc->pp_split, stage_first);
    Placement place = {.zero = tc->zero, .dp = comm->dp, .dp_rank = comm->dp_rank, .tp = comm->tp, .tp_rank = comm->tp_rank,
                       .pp = comm->pp, .pp_rank = comm->pp_rank, .l0 = stage_first[comm->pp_rank], .l1 = stage_first[comm->pp_rank + 1]};
    free(stage_first);
    if (tc->kernels.flash_attention) attention_flash_validate(config->C, config->NH, sizeof(floatX), 0);
    gpt2_build(model, config, comm, &place, &tc->kernels);
    model->recompute = tc->recompute;
    if (params) gpt2_set_parameters(model, params);
    else gpt2_init_random(model, tc->seed);
    model->stochastic_rounding = tc->stochastic_rounding;
    if (m) gpt2_set_optimizer_state(model, m, v);
    if (tc->resume && model->stochastic_rounding && run->state.updates > 0) gpt2_round_params(model, (int)run->state.updates);
}

// The inputs: train and validation loaders, the multiple-choice set, and the tokenizer and prompt of the
// samples (on the ranks that sample).
static void open_inputs(Training* run) {
    const TrainConfig* tc = run->tc;
    const GPT2Config* c = &run->model.config;
    Comm* comm = run->comm;
    int D = comm->dp;
    run->have_train = tc->steps > 0;  // --steps 0 only validates and samples: the train data is not read
    if (run->have_train) dataloader_init(&run->train_loader, tc->train_data, tc->B, tc->T, D, c->V, tc->shuffle, tc->seed);
    run->have_val = tc->val_data != NULL && tc->val_data[0] != '\0' && tc->val_every > 0;
    if (run->have_val) dataloader_init(&run->val_loader, tc->val_data, tc->B, tc->T, D, c->V, 0, 0);
    if (tc->eval_data) {
        eval_load(&run->choices, tc->eval_data, c->V);
        if (tc->eval_dump && comm->world_size > 1) fatal("--eval-dump is for one rank");
        if (tc->eval_dump) run->dump = fopen_check(tc->eval_dump, "w");
    }
    // Every DP group samples (its TP and PP ranks together); world rank 0 prints. The other DP groups'
    // samples are the same and unseen, but they take the time the first one takes: were only the first
    // to sample, the others would wait for it in the next step's collectives, where a long sample passed
    // --comm-timeout and ended the run as if a peer were stopped, hung or gone.
    run->have_tok = tc->tokenizer != NULL && tc->tokenizer[0] != '\0' && tc->sample_every > 0;
    if (run->have_tok) {
        Tokenizer* tok = &run->tok;
        tokenizer_init(tok, tc->tokenizer);
        // samples are ids of the model's vocabulary, started by the end-of-text id: the table must be the model's
        if (tok->V != c->V)
            fatal("the tokenizer '%s' has %d tokens, the model's vocabulary %d: it cannot decode this model's samples "
                  "(give the model's tokenizer, or --tokenizer \"\" for no samples)", tc->tokenizer, tok->V, c->V);
        if (tok->eot < 0 || tok->eot >= c->V) fatal("the tokenizer '%s': end-of-text id %d is not in the vocabulary of %d", tc->tokenizer, tok->eot, c->V);
    }
    run->sample = (SampleConfig){.prompt = NULL, .n_prompt = 0, .len = tc->sample_len, .temperature = tc->temperature, .top_k = tc->top_k};
    run->prompt = run->have_tok && tc->prompt ? encode_prompt(tc, c, &run->sample.n_prompt) : NULL;
    run->sample.prompt = run->prompt;
    // a sample is one forward window: the end-of-text token, the prompt and what is generated fit in
    // --seq-len, so a longer --sample-len is cut; said once, not left for the reader to count
    int room = tc->T - 1 - run->sample.n_prompt;
    if (run->have_tok && run->main_rank && tc->sample_len > room)
        printf("--sample-len %d: samples have %d tokens after the end-of-text token%s (they fit in --seq-len %d)\n", tc->sample_len,
               room, run->prompt ? " and the prompt" : "", tc->T);
}

// The training data's fingerprint that checkpoints record (llmc/state_file.h): its files' names, sizes and
// first MiB, hashed as the ranks compare them (agree_file, llmc/agreement.h), their number and their
// tokens. Names without their folder: the same files copied to another disk are the same data.
static void fingerprint_train_data(Training* run) {
    const DataLoader* dl = &run->train_loader;
    run->data_hash = AGREE_FNV_INIT;
    for (int i = 0; i < dl->n_files; i++) run->data_hash = agree_file(run->data_hash, dl->paths[i]);
    run->data_files = dl->n_files;
    run->data_tokens = dl->total_tokens;
}

// A resume continues at the position in the token stream that its step fixes: on other files, an added
// shard or a changed file that position means other tokens, and the run would go on without notice on
// data it was not trained on. Refused unless --allow-data-change says the change is meant; a checkpoint
// that records no data (state file version 1 or 2) resumes with a notice. Called after the ranks agreed
// on the data, so every rank comes to the same verdict.
static void check_resumed_data(const Training* run) {
    const TrainConfig* tc = run->tc;
    const RunState* s = &run->state;
    if (!tc->resume || !run->have_train) return;
    if (s->data_files == 0) {
        if (run->main_rank)
            printf("note: the checkpoint in '%s' records no fingerprint of its training data (state file version %d): "
                   "--train-data is not checked against it\n", tc->resume, s->version);
        return;
    }
    if (s->data_hash == run->data_hash && s->data_files == run->data_files && s->data_tokens == run->data_tokens) return;
    char what[256];
    snprintf(what, sizeof(what), "%d file%s, %lld tokens; now %d file%s, %lld tokens%s", s->data_files, s->data_files == 1 ? "" : "s",
             s->data_tokens, run->data_files, run->data_files == 1 ? "" : "s", run->data_tokens,
             s->data_files == run->data_files && s->data_tokens == run->data_tokens ? ", with other names, sizes or contents" : "");
    if (!tc->allow_data_change)
        fatal("the checkpoint in '%s' was trained on other data (%s) than --train-data '%s': resume with its data, or give "
              "--allow-data-change if the change is meant", tc->resume, what, tc->train_data);
    if (run->main_rank)
        printf("--allow-data-change: the checkpoint in '%s' was trained on other data (%s); step %lld goes on with --train-data '%s'\n",
               tc->resume, what, s->step + 1, tc->train_data);
}

// The activations: one slot per micro-batch the schedule keeps in flight (llmc/pipeline.h).
static void allocate_for_schedule(Training* run) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    run->schedule = comm->pp == 1 ? SCHEDULE_1F1B : tc->pipe_schedule;
    PipeAction* plan = (PipeAction*)malloc_check(2 * tc->grad_accum * sizeof(PipeAction));
    int n_slots = pipeline_schedule(run->schedule, comm->pp, comm->pp_rank, tc->grad_accum, plan);
    free(plan);
    gpt2_allocate_activations(&run->model, tc->B, tc->T, n_slots, tc->rematerialize);
}

// Where the loop starts, and with what: from scratch, or as the checkpoint left it (its step, update
// count, sampling generator and loss scale); then the log, continued on resume.
static void restore_run_state(Training* run) {
    const TrainConfig* tc = run->tc;
    const RunState* state = &run->state;
    run->sample_rng.state = tc->resume ? state->sample_rng : tc->seed + 1;
    run->start_step = tc->resume ? state->step : 0;
    run->updates = tc->resume ? state->updates : 0;
    run->scaler = tc->scaler;
    if (tc->resume && run->scaler.mode != SCALE_OFF) {
        run->scaler.scale = state->loss_scale;
        run->scaler.good_steps = state->scale_good_steps;
        run->scaler.hysteresis_left = state->scale_hysteresis_left;
    }
    if (run->main_rank && tc->resume) logger_open_resumed(&run->logger, tc->log_file, run->start_step);
    else if (run->main_rank) logger_open(&run->logger, tc->log_file, 0);
    log_run_config(&run->logger, tc, run->comm, &run->model, tc->resume ? run->start_step : -1);
}

// The start-up lines: the target, the grid, the model, the batch, the data and the pipeline (main rank),
// and each pipeline stage's memory.
static void print_run_summary(const Training* run) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    const GPT2* model = &run->model;
    const GPT2Config* c = &model->config;
    if (run->main_rank && !tc->quiet) {
        printf("target %s, precision %s, %d rank(s): dp=%d tp=%d pp=%d, ZeRO-%d, engine %s\n", TARGET_NAME, PRECISION_NAME,
               comm->world_size, comm->dp, comm->tp, comm->pp, tc->zero, comm->engine == ENGINE_NCCL ? "NCCL" : comm->engine == ENGINE_MPI ? "MPI" : "none");
#if defined(LLMC_CPU) && defined(_OPENMP)
        printf("threads: %d OpenMP thread(s) per rank (OMP_NUM_THREADS %s), matmuls: %s\n", omp_get_max_threads(),
               getenv("OMP_NUM_THREADS") ? "as set" : "unset: the node's cores / its ranks",
               tc->kernels.cpu_blas ? "OpenBLAS (--cpu-matmul blas)" : "reference GEMM (--cpu-matmul reference)");
#endif
        printf("model: L=%d C=%d NH=%d V=%d (padded %d) maxT=%d, %zu parameters\n", c->L, c->C, c->NH, c->V, c->Vp,
               c->maxT, model->num_parameters);
        printf("batch: B=%d T=%d per rank, grad_accum=%d (%zu tokens per step), %lld steps\n", tc->B, tc->T, tc->grad_accum,
               run->tokens_per_step, tc->steps);
        if (run->have_train)
            printf("train data: %lld tokens (%lld global micro-batches per epoch, shuffle %s)\n", run->train_loader.total_tokens,
                   run->train_loader.n_batches, tc->shuffle ? "on" : "off");
        if (comm->pp > 1)
            printf("pipeline: %d stages, schedule %s, %d micro-batches%s\n", comm->pp, run->schedule == SCHEDULE_GPIPE ? "GPipe" : "1F1B",
                   tc->grad_accum, tc->rematerialize ? ", activations rematerialized in backward" : "");
    }
    if (!tc->quiet && comm->dp_rank == 0 && comm->tp_rank == 0) {  // one line per pipeline stage
        comm_barrier(comm, &comm->pp_group);
        size_t scratch = kernel_scratch_bytes(c, &model->place, model->last, tc->B, tc->T, sizeof(floatX), &model->kernels);
        size_t total = model->bytes_params + model->bytes_grads + model->bytes_optimizer + model->bytes_activations +
                       model->bytes_workspace + model->bytes_comm + scratch;
        printf("memory of stage %d (layers %d-%d) per rank (MiB): parameters %.2f | gradients %.2f | optimizer state %.2f | "
               "activations %.2f (%d micro-batch slot%s) | workspace %.2f | communication %.2f | kernel scratch %.2f | total %.2f\n",
               comm->pp_rank, model->place.l0, model->place.l1 - 1, model->bytes_params / 1048576.0, model->bytes_grads / 1048576.0,
               model->bytes_optimizer / 1048576.0, model->bytes_activations / 1048576.0, model->n_slots, model->n_slots > 1 ? "s" : "",
               model->bytes_workspace / 1048576.0, model->bytes_comm / 1048576.0, scratch / 1048576.0, total / 1048576.0);
    }
}

// Everything the loop needs, in this order: outputs checked, the start point read, the ranks agreed on
// the job, this rank's model built, the inputs opened, the activations allocated, the run state restored.
static void training_setup(Training* run, const TrainConfig* tc, Comm* comm) {
    memset(run, 0, sizeof(*run));
    run->tc = tc;
    run->comm = comm;
    run->main_rank = comm->world_rank == 0;
    run->val_loss = NAN;
    check_output_paths(tc, run->main_rank);
    GPT2Config config = tc->arch;
    float *params = NULL, *m = NULL, *v = NULL;
    read_start_point(run, &config, &params, &m, &v);
    if (comm->world_size > 1) comm_barrier_io(comm, &comm->world);  // every rank has read its model or checkpoint
    check_ranks_agree(tc, comm, &config, &run->state);  // the first collective after it: every rank runs the same job
    run->run_id = tc->resume ? run->state.run_id : new_run_id(comm);
    if (tc->save_every > 0 || tc->stop_after > 0)  // (the resumed step is where this run's own saves begin)
        check_checkpoint_dir_owner(tc->checkpoint_dir, run->run_id, tc->resume ? run->state.step : 0);
    else if (tc->steps > 0 && run->main_rank) {  // only a stop signal would save: it would be refused then, so say so now
        char msg[1600];
        if (checkpoint_dir_conflict(tc->checkpoint_dir, run->run_id, tc->resume ? run->state.step : 0, 0, msg, sizeof(msg)))
            fprintf(stderr, "warning: a stop signal could not checkpoint this run: %s\n", msg);
    }
    check_sizes_given(tc, &config);
    build_rank_model(run, &config, params, m, v);
    free(params), free(m), free(v);
    if (tc->T > config.maxT) fatal("sequence length T=%d is longer than the model's maxT=%d", tc->T, config.maxT);
    open_inputs(run);
    if (run->have_train) fingerprint_train_data(run);
    check_resumed_data(run);
    allocate_for_schedule(run);
    if (tc->trace) run->model.tracer = &run->tracer;  // (its clocks are aligned when the first traced step begins)
    restore_run_state(run);
    run->tokens_per_step = (size_t)comm->dp * tc->B * tc->T * tc->grad_accum;
    run->flops_per_token = 6.0 * run->model.num_parameters + 6.0 * config.L * config.C * tc->T;
    run->peak_flops = gpu_peak_flops();
    print_run_summary(run);
}

// Validation loss, multiple-choice accuracy and a sample, each every so many steps and at the last.
static void evaluate_and_sample(Training* run, long long step, int last) {
    const TrainConfig* tc = run->tc;
    if (run->have_val && (step % tc->val_every == 0 || last)) {
        run->val_loss = evaluate(&run->model, &run->val_loader, tc->val_batches);
        if (run->main_rank) printf("step %lld: val loss %.4f\n", step, run->val_loss);
        logger_eval(&run->logger, step, run->val_loss);
    }
    if (tc->eval_data && (step % tc->eval_every == 0 || last)) {
        float accuracy = evaluate_choices(&run->model, &run->choices, tc->eval_data, run->dump);
        if (run->main_rank) printf("step %lld: multiple-choice accuracy %.4f (%d examples)\n", step, accuracy, run->choices.n_examples);
        logger_eval_accuracy(&run->logger, step, accuracy);
    }
    // --steps 0 samples once, from the model as given
    if (run->have_tok && (step > 0 || tc->steps == 0) && (step % tc->sample_every == 0 || last)) {
        if (tc->fault_slow_sample > 0) usleep((useconds_t)(tc->fault_slow_sample * 1e6));  // a long sample of a large model
        gpt2_sample(&run->model, &run->tok, &run->sample_rng, &run->sample, run->main_rank);
    }
}

// The run state a checkpoint saved after `step` holds, for a resume to continue exactly from it.
static void fill_run_state(Training* run, long long step) {
    const TrainConfig* tc = run->tc;
    RunState* state = &run->state;
    state->config = run->model.config;
    state->B = run->comm->dp * tc->B;
    state->T = tc->T;
    state->grad_accum = tc->grad_accum;
    state->shuffle = tc->shuffle;
    state->step = step;
    state->sample_rng = run->sample_rng.state;
    state->data_seed = tc->seed;
    state->zero_stage = tc->zero;
    state->dp = run->comm->dp;
    state->updates = run->updates;
    state->loss_scale = run->scaler.scale;
    state->scale_good_steps = run->scaler.good_steps;
    state->scale_hysteresis_left = run->scaler.hysteresis_left;
    state->run_id = run->run_id;
    state->data_hash = run->data_hash;
    state->data_tokens = run->data_tokens;
    state->data_files = run->data_files;
}

// Saves a checkpoint after `step` when one is due (every --save-every steps and at the last) or when the
// run stops here: at --stop-after, or after a stop signal every rank has agreed on (stop_sig). Returns
// whether the run stops here (a finished run is done, not stopped).
static int checkpoint_if_due(Training* run, long long step, int last, int stop_sig) {
    const TrainConfig* tc = run->tc;
    int stopping = (tc->stop_after > 0 && step == tc->stop_after) || (stop_sig && !last);
    if (stop_sig && !last) prepare_signal_checkpoint(tc, run->run_id, run->start_step);
    int periodic = tc->save_every > 0 && step > run->start_step && (step % tc->save_every == 0 || last);
    if (periodic || (stopping && step > run->start_step)) {
        fill_run_state(run, step);
        if (run->main_rank && tc->fault_slow_save > 0) usleep((useconds_t)(tc->fault_slow_save * 1e6));  // slow storage
        save_checkpoint(&run->model, tc->checkpoint_dir, &run->state, tc->keep_last);
    }
    if (stop_sig && !last) report_signal_stop(tc, run->comm, stop_sig, step);
    return stopping;
}

// --fault-rank R --fault-step S (testing): rank R dies at step S, as a crashed node would; with
// --fault-stop 1 it stops there instead (SIGSTOP), as a hung node would: alive, its connections open.
static void fault_kill_if_due(const TrainConfig* tc, const Comm* comm, long long step) {
    if (comm->world_rank != tc->fault_rank || step != tc->fault_step) return;
    fprintf(stderr, "rank %d: --fault-rank: %s myself at step %lld\n", comm->world_rank, tc->fault_stop ? "stopping" : "killing", step);
    raise(tc->fault_stop ? SIGSTOP : SIGKILL);
}

typedef struct {
    double loss;     // the mean loss of the global batch
    float norm, lr;  // the gradient norm before clipping, the learning rate
    double ms;       // the step's time
    int skipped;     // the gradients overflowed under loss scaling: nothing was updated
} StepResult;

// One optimizer step after `step`: forward and backward over its micro-batches (pipeline_step), then the
// update. A non-finite loss, or a non-finite norm without loss scaling, ends the run (end_diverged); an
// overflow under loss scaling skips the step on every rank. The loss goes to losses[step] if given.
static StepResult train_step(Training* run, long long step, float* losses, long long max_losses) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    GPT2* model = &run->model;
    StepResult r = {.loss = 0.0, .norm = 0.0f, .lr = 0.0f, .ms = 0.0, .skipped = 0};
    double t0 = wall_seconds();
    run->tracer.enabled = tc->trace && step > run->start_step && step <= run->start_step + tc->trace_steps;  // skip the first step
    comm->stats.on = run->tracer.enabled;  // the engine's bytes and time over the same steps (comm_print_stats)
    if (run->tracer.enabled && step == run->start_step + 1) trace_align_clocks(&run->tracer, comm, tc->fault_clock_skew);
    gpt2_zero_grad(model);
    // each position's weight in the mean loss of the global batch, times the loss scale
    float dloss = loss_scale(&run->scaler) / (float)run->tokens_per_step;
    r.loss = pipeline_step(model, &run->train_loader, run->schedule, tc->grad_accum, step, dloss);
    if (losses && step < max_losses) losses[step] = (float)r.loss;
    char why[64];
    snprintf(why, sizeof(why), "the loss is %g", r.loss);
    if (!isfinite(r.loss)) end_diverged(comm, step + 1, why, 0);  // the mean over all ranks: every rank sees it
    if (comm->world_rank == tc->fault_inf_rank && step + 1 == tc->fault_inf_step) inject_inf_gradient(model);
    r.lr = learning_rate(tc, step);
    double t_opt = trace_now_us(&run->tracer);
    float scale_before = loss_scale(&run->scaler);
    r.norm = gpt2_update(model, &tc->opt, r.lr, (int)(run->updates + 1), &run->scaler, &r.skipped);
    trace_add(&run->tracer, "optimizer", "AdamW", -1, t_opt);
    if (r.skipped) {
        if (run->main_rank)
            printf("step %lld: gradients overflowed (inf/nan): step skipped on every rank, loss scale %g -> %g\n", step + 1,
                   scale_before, loss_scale(&run->scaler));
        logger_skip(&run->logger, step + 1, loss_scale(&run->scaler));
    } else if (!isfinite(r.norm)) {  // no loss scaling: gpt2_update changed nothing
        snprintf(why, sizeof(why), "the gradient norm is %g", r.norm);
        end_diverged(comm, step + 1, why, 0);
    } else {
        run->updates++;
    }
    device_synchronize();
    r.ms = 1000.0 * (wall_seconds() - t0);
    run->tracer.enabled = comm->stats.on = 0;  // (evaluation and sampling between steps are not traced)
    return r;
}

// After an applied step: its line (main rank) and its log record; after the first applied step (an FP16
// run may skip its first ones) the GPU build also compares, on every rank, the memory plan with what the
// device reports.
static void report_step(Training* run, long long step, const StepResult* r) {
    const TrainConfig* tc = run->tc;
    double tokens_per_s = run->tokens_per_step / (r->ms / 1000.0);
#ifndef LLMC_CPU
    if (!run->memory_reported && !tc->quiet) {  // the plan against what the device reports, on every rank (stages differ)
        run->memory_reported = 1;
        char rank[32] = "";
        if (run->comm->world_size > 1) snprintf(rank, sizeof(rank), ", rank %d", run->comm->world_rank);
        size_t free_b, total_b;
        device_memory_info(&free_b, &total_b);
        MemoryPlan p = plan_rank(&run->model.config, &run->model.place, tc->B, tc->T, run->model.n_slots, tc->recompute, tc->rematerialize, -1,
                                 sizeof(floatX), &run->model.kernels);
        printf("device memory after the first step%s: %.3f GiB in use (cudaMemGetInfo, CUDA context included), %.3f GiB planned "
               "(in use - planned: %+.3f MiB)\n", rank, (total_b - free_b) / 1073741824.0, plan_total(&p) / 1073741824.0,
               ((double)(total_b - free_b) - (double)plan_total(&p)) / 1048576.0);
    }
#endif
    double peak = run->peak_flops;
    if (run->main_rank && !tc->quiet)
        print_step_line(tc, step + 1, run->start_step, run->loop_start, r->loss, r->norm, r->lr, r->ms, tokens_per_s,
                        peak > 0 ? 100.0 * run->flops_per_token * tokens_per_s / (peak * run->comm->world_size) : 0.0);
    logger_step(&run->logger, step + 1, (float)r->loss, r->lr, r->norm, tokens_per_s, r->ms);
}

// The end of a run: the final model (not after a stop signal: that run is not finished), the trace, and
// everything freed.
static void training_finish(Training* run) {
    const TrainConfig* tc = run->tc;
    GPT2* model = &run->model;
    if (tc->save_model && !stop_signal_ended_run) {
        float* buf = (float*)malloc_check(model->num_parameters * sizeof(float));
        gpt2_export_master(model, buf);
        check_finite_before_save(run->comm, &model->config, buf, tc->stop_after > 0 && tc->stop_after < tc->steps ? tc->stop_after : tc->steps);
        char where[160], msg[4400];
        if (tc->save_model_version == 5 && find_bf16_overflow_param(&model->config, buf, where, sizeof(where))) {
            // a finite model that bf16 cannot hold: refused as a non-finite one is (the same on every rank),
            // and whatever file is at the path stays as it was
            snprintf(msg, sizeof(msg), "--save-model-dtype bf16: parameter %s is beyond bf16's range (it would round to "
                     "infinity); '%s' was not written (--save-model-dtype fp32 can hold it)", where, tc->save_model);
            end_every_rank(run->comm, msg);
        }
        if (run->main_rank) {
            if (tc->fault_slow_save > 0) usleep((useconds_t)(tc->fault_slow_save * 1e6));  // slow storage
            model_file_write_version(tc->save_model, &model->config, buf, tc->save_model_version);
            if (!tc->quiet) printf("wrote %s\n", tc->save_model);
        }
        free(buf);
        // The other ranks wait here for rank 0's write, under --io-timeout as a checkpoint's do: going on,
        // they waited in the next collective (finalize, at the latest) under --comm-timeout, and a slow
        // write ended the job, rank 0 with it, halfway through the file.
        comm_barrier_io(run->comm, &run->comm->world);
    }
    if (tc->trace) write_trace(&run->tracer, tc, run->comm);
    free(run->tracer.events);
    logger_close(&run->logger);
    if (run->have_tok) tokenizer_free(&run->tok);
    free(run->prompt);
    if (tc->eval_data) eval_free(&run->choices);
    if (run->dump && fclose(run->dump) != 0) fatal("cannot write '%s': %s", tc->eval_dump, strerror(errno));
    if (run->have_val) dataloader_free(&run->val_loader);
    if (run->have_train) dataloader_free(&run->train_loader);
    gpt2_free(model);
}

// Trains as configured, as one rank of `comm`. If losses != NULL, the mean training loss of each step
// (over the whole DP group) is stored there at index step, up to max_losses, so tests can compare runs.
// Returns the last validation loss (or NAN).
static float train(const TrainConfig* tc, Comm* comm, float* losses, long long max_losses) {
    Training run;
    training_setup(&run, tc, comm);
    int stop_sig = 0;  // a stop signal every rank knows of (agreed after each step)
    run.loop_start = wall_seconds();
    stop_signal_install();
    for (long long step = run.start_step; step <= tc->steps; step++) {
        int last = step == tc->steps;
        // the run that saved the checkpoint we resumed from has evaluated and sampled at this step, just
        // before saving (the sampling generator in the checkpoint is past that sample): not again
        if (!(tc->resume && step == run.start_step)) evaluate_and_sample(&run, step, last);
        if (checkpoint_if_due(&run, step, last, stop_sig) || last) break;
        fault_kill_if_due(tc, comm, step);
        StepResult r = train_step(&run, step, losses, max_losses);
        stop_sig = stop_signal_agreed(comm);
        if (!r.skipped) report_step(&run, step, &r);
        if (step + 1 == tc->fault_wait_signal && !stop_sig) stop_sig = stop_signal_wait(comm, step + 1, 60.0);  // (step + 1 is done)
    }
    training_finish(&run);
    return run.val_loss;
}

// "80GiB", "80GB", "512MiB", or bytes
static double parse_size(const char* flag, const char* v) {
    char* end;
    double x = strtod(v, &end);
    double unit = 1.0;
    if (!strcmp(end, "GiB") || !strcmp(end, "G")) unit = 1073741824.0;
    else if (!strcmp(end, "GB")) unit = 1e9;
    else if (!strcmp(end, "MiB") || !strcmp(end, "M")) unit = 1048576.0;
    else if (!strcmp(end, "MB")) unit = 1e6;
    else if (*end != '\0' || end == v) fatal("%s expects a size like 80GiB, 80GB or 512MiB, got '%s'", flag, v);
    if (!(x > 0) || !isfinite(x * unit)) fatal("%s must be a positive, finite size, got '%s'", flag, v);
    return x * unit;
}

// ----------------------------------------------------------------------------------------------------
// command line

static void default_train_config(TrainConfig* tc) {
    memset(tc, 0, sizeof(*tc));
    tc->train_data = "data/devil_train.bin";
    tc->val_data = "data/devil_val.bin";
    tc->tokenizer = "data/gpt2_tokenizer.bin";
    tc->arch = (GPT2Config){.maxT = 128, .V = 50257, .Vp = 0, .L = 4, .NH = 4, .C = 128};  // Vp: derived from V
    tc->seed = 1337;
    tc->comm_timeout = 120.0;
    tc->io_timeout = 3600.0;
    tc->kernels.cpu_blas = cpu_blas_linked;  // llmc/matmul.h: OpenBLAS where the build linked it
    tc->B = 8;
    tc->T = 64;
    tc->grad_accum = 1;
    tc->steps = 150;
    tc->opt = (OptimizerConfig){.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    tc->warmup = 20;
    tc->schedule = "cosine";
    tc->lr_min_frac = 0.1f;
    tc->val_every = 50;
    tc->val_batches = 10;
    tc->sample_every = 75;
    tc->sample_len = 48;
    tc->temperature = 1.0f;
    tc->eval_every = 50;
    tc->checkpoint_dir = "checkpoints";
    tc->save_model_version = 3;
    tc->engine = "auto";
    tc->tp = 1;
    tc->pp = 1;
    tc->pipe_schedule = SCHEDULE_GPIPE;
    tc->trace_steps = 2;
    tc->fault_rank = -1;
    tc->fault_step = -1;
    tc->fault_wait_signal = -1;
    tc->stochastic_rounding = BF16_BUILD;
    tc->fault_inf_rank = -1;
    tc->fault_inf_step = -1;
    // FP16 needs loss scaling; BF16 and FP32 have fp32's exponent range and do not
    tc->scaler = (LossScaler){.mode = FP16_BUILD ? SCALE_DYNAMIC : SCALE_OFF, .scale = 65536.0f, .growth = 2.0f, .backoff = 0.5f,
                              .interval = 2000, .hysteresis = 1, .good_steps = 0, .hysteresis_left = 1};
}

static void print_usage(void) {
    TrainConfig d;
    default_train_config(&d);
    printf(
        "usage: train_gpt [flags]   (GPT-2 trainer, target %s, precision %s)\n"
        "\n"
        "data\n"
        "  --train-data GLOB     token shards to train on             [%s]\n"
        "  --val-data GLOB       token shards for validation (\"\" off) [%s]\n"
        "  --tokenizer FILE      decode table for samples (\"\" off)    [%s]\n"
        "  --shuffle 0|1         visit micro-batches in a seeded random order per epoch [0: in order]\n"
        "model (from a file, or from scratch with GPT-2 initialization)\n"
        "  --model FILE          start from this llm.c model file (versions 3 fp32 and 5 bf16)\n"
        "  --layers L            [%d]   --channels C   [%d]   --heads NH   [%d]\n"
        "  --vocab V             [%d]   --max-seq-len maxT [%d]   --seed N   [%llu]\n"
        "batch\n"
        "  --batch-size B        sequences per micro-batch, per rank  [%d]\n"
        "  --seq-len T           tokens per sequence (<= maxT)        [%d]\n"
        "  --grad-accum N        micro-batches per optimizer step     [%d]\n"
        "parallelism (launch with mpirun -np W, or torchrun-style RANK/WORLD_SIZE/LOCAL_RANK on GPUs)\n"
        "  --dp D                data-parallel ranks                  [world size / (tp x pp)]\n"
        "  --tp T                tensor-parallel ranks (Megatron splits; T divides NH and Vp) [1]\n"
        "  --pp P                pipeline stages (P <= L)             [1]\n"
        "  --pp-split a,b,..     layers per stage                     [as even as possible]\n"
        "  --schedule S          gpipe | 1f1b                         [gpipe]\n"
        "  --micro-batches M     split each step's --batch-size into M micro-batches (pipelining needs M >= P to fill)\n"
        "  --pp-rematerialize 0|1  keep only stage inputs, recompute activations in backward [0]\n"
        "  --print-schedule      print every stage's schedule for --pp, --micro-batches, --schedule\n"
        "                        (timeline, actions, which sends pair with which receives), and exit\n"
        "  --trace FILE          Chrome/Perfetto trace of a few steps (see scripts/plot_trace.py)\n"
        "  --trace-steps N       steps to trace, after the first      [2]\n"
        "  --zero S              0 all-reduce, 1 shard optimizer state, 2 also shard gradients [0]\n"
        "  --comm E              auto | mpi | nccl (auto: NCCL unless ranks share a GPU) [auto]\n"
        "  --nccl-id-dir DIR     without mpirun: a shared folder for the NCCL id [none: TCP at MASTER_ADDR:MASTER_PORT]\n"
        "  --comm-timeout S      a wait on other ranks longer than S seconds ends the run (0: never) [120]\n"
        "  --io-timeout S        the same while ranks wait for file I/O, e.g. a checkpoint save [3600]\n"
        "  --fault-rank R --fault-step S   testing: rank R kills itself at step S\n"
        "  --fault-stop 1        testing: ... stops itself instead (SIGSTOP), as a hung rank would\n"
        "  --fault-slow-save S   testing: rank 0 takes S seconds longer to save each checkpoint and the final model\n"
        "  --fault-slow-sample S  testing: every sample takes S seconds longer (on every rank that samples)\n"
        "  --fault-wait-signal S  testing: after step S every rank waits (up to 60 s) for a stop signal\n"
        "  --fault-clock-skew S  testing: rank r's clock for --trace reads r x S seconds ahead (the trace must not show it)\n"
        "mixed precision\n"
        "  --loss-scale S        dynamic | off | a fixed scale (1 to 2^24) [%s]\n"
        "  --loss-scale-init X   first dynamic scale (1 to 2^24)      [65536]\n"
        "  --loss-scale-growth X  --loss-scale-backoff X  --loss-scale-interval N  --loss-scale-hysteresis N [2 0.5 2000 1]\n"
        "  --stochastic-rounding 0|1  BF16: round parameter updates stochastically [1 in BF16 builds]\n"
        "  --fault-inf-rank R --fault-inf-step S   testing: rank R makes a gradient inf at step S\n"
        "memory\n"
        "  --recompute R         0 keep all activations, 1 recompute GELU, 2 also LayerNorms, 3 whole layers [0]\n"
        "  --attention classic|flash  classic: cuBLAS over the stored (B,NH,T,T) probabilities (the CPU\n"
        "                        reference's algorithm); flash: tensor-core flash attention, BF16/FP16 GPU builds,\n"
        "                        head size 64, no T x T buffer (not yet verified on a GPU) [classic]\n"
        "  --plan                print each rank's memory for this configuration (any size, dp/tp/pp/zero/\n"
        "                        recompute/batch) without allocating, and exit\n"
        "  --device-memory SIZE  with --plan: also the largest micro-batch that fits, e.g. 80GiB\n"
        "  --precision P         with --plan: bf16 | fp16 | fp32      [this build's]\n"
        "GPU speed\n"
        "  --fused-kernels 0|1   GPU: fused LayerNorm (residual add + forward; one-pass backward), 16-byte\n"
        "                        classifier kernels, GELU and bias gradients in cuBLASLt epilogues, plans kept\n"
        "                        per shape, micro-step inputs copied without waiting, a step's losses summed on\n"
        "                        the device and copied once. Off until verified on a GPU (scripts/check_gpu.sh).\n"
        "                        CPU target: accepted, the same reference loops, identical results [0]\n"
        "CPU speed\n"
        "  --cpu-matmul M        blas: the CPU target's matmuls through OpenBLAS (cblas_sgemm); reference: its\n"
        "                        hand-written GEMM (llmc/matmul.h), slower, the same bits at any thread count;\n"
        "                        the two agree to fp32 rounding. GPU target: ignored [blas where the build\n"
        "                        found OpenBLAS, else reference]\n"
        "optimization\n"
        "  --steps N             optimizer steps                      [%lld]\n"
        "  --stop-after N        end this run after step N (checkpointing there); resume later\n"
        "  --lr X                peak learning rate                   [%g]\n"
        "  --warmup N            linear warmup steps                  [%d]\n"
        "  --lr-schedule S       cosine | linear | constant           [%s]\n"
        "  --lr-min-frac X       final lr as a fraction of --lr       [%g]\n"
        "  --beta1 X  --beta2 X  --eps X                               [%g %g %g]\n"
        "  --weight-decay X      on 2-D weights only                  [%g]\n"
        "  --grad-clip X         max global gradient norm, 0 = off    [%g]\n"
        "evaluation, sampling, checkpoints, logs\n"
        "  --val-every N         validation loss every N steps, 0 off [%d]\n"
        "  --val-batches N       micro-batches per validation         [%d]\n"
        "  --eval-data FILE      multiple-choice examples (llm.c's HellaSwag format): accuracy\n"
        "  --eval-every N        multiple-choice accuracy every N steps (and at the end) [50]\n"
        "  --eval-dump FILE      one rank: write each example's 4 mean completion losses\n"
        "  --sample-every N      print a sample every N steps, 0 off  [%d]\n"
        "  --sample-len N        tokens per sample                    [%d]\n"
        "  --prompt TEXT         samples continue TEXT (GPT-2 BPE; needs encoder.json and vocab.bpe)\n"
        "  --temperature X       sampling temperature, 0 = greedy     [1]\n"
        "  --top-k K             sample among the K most likely tokens, 0 = all [0]\n"
        "  --bpe-dir DIR         folder of encoder.json, vocab.bpe    [beside --tokenizer, else data]\n"
        "  --encode FILE         print the GPT-2 token ids of a UTF-8 text file and exit\n"
        "                        (--steps 0 --model FILE --prompt TEXT: sample once from a model, no training)\n"
        "  --save-every N        checkpoint every N steps, 0 off      [%d]\n"
        "  --checkpoint-dir DIR  where checkpoints go (created if missing) [%s]\n"
        "  --resume DIR          continue from the newest checkpoint in DIR (and save there: --checkpoint-dir's default)\n"
        "  --resume-if-present DIR  the same if DIR holds a complete checkpoint, else start fresh (from --model or\n"
        "                        from scratch), saving into DIR: one command line for a job that is requeued\n"
        "  --keep-last N         after each save keep the N newest resumable checkpoints, delete older ones [all kept]\n"
        "  --allow-data-change   resume on other training data than the checkpoint's (else refused: its files, sizes\n"
        "                        and tokens are recorded in the checkpoint)\n"
        "  --save-model FILE     write the final model (llm.c format)\n"
        "  --save-model-dtype D  fp32 (version 3) | bf16 (version 5, rounded to nearest even; what llm.c's GPU builds read) [fp32]\n"
        "  --log FILE            one JSON object per line per step and evaluation\n"
        "  --help                this text\n"
        "exit codes: 0 done, 1 error, 3 stopped by SIGINT, SIGTERM or SIGUSR1: the step in progress was finished\n"
        "  and checkpointed into --checkpoint-dir (continue with --resume)\n",
        TARGET_NAME, PRECISION_NAME, d.train_data, d.val_data, d.tokenizer, d.arch.L, d.arch.C, d.arch.NH, d.arch.V,
        d.arch.maxT, (unsigned long long)d.seed, d.B, d.T, d.grad_accum,
        d.scaler.mode == SCALE_DYNAMIC ? "dynamic" : "off", d.steps, d.opt.lr, d.warmup, d.schedule,
        d.lr_min_frac, d.opt.beta1, d.opt.beta2, d.opt.eps, d.opt.weight_decay, d.opt.grad_clip, d.val_every,
        d.val_batches, d.sample_every, d.sample_len, d.save_every, d.checkpoint_dir);
}

static long long parse_int(const char* flag, const char* s, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') fatal("%s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) fatal("%s must be between %lld and %lld, got %lld", flag, lo, hi, v);
    return v;
}

static float parse_float(const char* flag, const char* s, double lo, double hi) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) fatal("%s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) fatal("%s must be between %g and %g, got %g", flag, lo, hi, v);
    return (float)v;
}

enum { MAX_PRINTED_STAGES = 64, MAX_PRINTED_MICRO_BATCHES = 1024, MAX_PLANNED_ACTIONS = 1 << 22 };

// Flags whose meaning depends on others, remembered until all are read (check_flag_combinations).
typedef struct {
    int micro_batches;                 // --micro-batches M (0: not given)
    const char* checkpoint_dir_given;  // --checkpoint-dir (NULL: not given, the default or --resume's folder)
} FlagsSeen;

// The flags that take a value, one function per part of --help. Each returns 0 for a flag not its own.
static int parse_data_model_flag(TrainConfig* tc, const char* f, const char* v) {  // data, model, batch
    const long long BIG = 1LL << 40;
    if (!strcmp(f, "--train-data")) tc->train_data = v;
    else if (!strcmp(f, "--val-data")) tc->val_data = v;
    else if (!strcmp(f, "--tokenizer")) tc->tokenizer = v;
    else if (!strcmp(f, "--shuffle")) tc->shuffle = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--model")) tc->model_file = v;
    else if (!strcmp(f, "--layers")) { tc->arch.L = (int)parse_int(f, v, 1, 4096); tc->arch_given |= 1; }
    else if (!strcmp(f, "--channels")) { tc->arch.C = (int)parse_int(f, v, 1, 65536); tc->arch_given |= 2; }
    else if (!strcmp(f, "--heads")) { tc->arch.NH = (int)parse_int(f, v, 1, 65536); tc->arch_given |= 4; }
    else if (!strcmp(f, "--vocab")) { tc->arch.V = (int)parse_int(f, v, 1, 65536); tc->arch_given |= 8; }
    else if (!strcmp(f, "--max-seq-len")) { tc->arch.maxT = (int)parse_int(f, v, 1, 1 << 20); tc->arch_given |= 16; }
    else if (!strcmp(f, "--seed")) tc->seed = (uint64_t)parse_int(f, v, 0, BIG);
    else if (!strcmp(f, "--batch-size")) tc->B = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--seq-len")) tc->T = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--grad-accum")) tc->grad_accum = (int)parse_int(f, v, 1, 1 << 20);
    else return 0;
    return 1;
}

static int parse_parallel_flag(TrainConfig* tc, FlagsSeen* seen, const char* f, const char* v) {
    if (!strcmp(f, "--dp")) tc->dp = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--tp")) tc->tp = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--pp")) tc->pp = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--pp-split")) tc->pp_split = v;
    else if (!strcmp(f, "--schedule")) {
        if (strcmp(v, "gpipe") && strcmp(v, "1f1b")) fatal("--schedule must be gpipe or 1f1b, got '%s'", v);
        tc->pipe_schedule = strcmp(v, "gpipe") == 0 ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
    } else if (!strcmp(f, "--micro-batches")) seen->micro_batches = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--pp-rematerialize")) tc->rematerialize = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--trace")) tc->trace = v;
    else if (!strcmp(f, "--trace-steps")) tc->trace_steps = (int)parse_int(f, v, 1, 1000);
    else if (!strcmp(f, "--zero")) tc->zero = (int)parse_int(f, v, 0, 2);
    else if (!strcmp(f, "--comm")) {
        if (strcmp(v, "auto") && strcmp(v, "mpi") && strcmp(v, "nccl")) fatal("--comm must be auto, mpi or nccl, got '%s'", v);
        tc->engine = v;
    } else if (!strcmp(f, "--nccl-id-dir")) tc->nccl_id_dir = v;
    else if (!strcmp(f, "--comm-timeout")) tc->comm_timeout = parse_float(f, v, 0.0f, 1e9f);
    else if (!strcmp(f, "--io-timeout")) tc->io_timeout = parse_float(f, v, 0.0f, 1e9f);
    else if (!strcmp(f, "--fault-rank")) tc->fault_rank = (int)parse_int(f, v, 0, 1 << 20);
    else if (!strcmp(f, "--fault-slow-save")) tc->fault_slow_save = parse_float(f, v, 0.0f, 3600.0f);
    else if (!strcmp(f, "--fault-slow-sample")) tc->fault_slow_sample = parse_float(f, v, 0.0f, 3600.0f);
    else if (!strcmp(f, "--fault-step")) tc->fault_step = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--fault-stop")) tc->fault_stop = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--fault-wait-signal")) tc->fault_wait_signal = parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--fault-clock-skew")) tc->fault_clock_skew = parse_float(f, v, -1e6f, 1e6f);
    else return 0;
    return 1;
}

static int parse_precision_memory_flag(TrainConfig* tc, const char* f, const char* v) {  // mixed precision, memory, GPU speed
    if (!strcmp(f, "--loss-scale")) {
        if (!strcmp(v, "dynamic")) tc->scaler.mode = SCALE_DYNAMIC;
        else if (!strcmp(v, "off")) tc->scaler.mode = SCALE_OFF;
        else {
            tc->scaler.mode = SCALE_STATIC;
            tc->scaler.scale = parse_float(f, v, 1e-30, 1e30);
        }
    } else if (!strcmp(f, "--loss-scale-init")) tc->scaler.scale = parse_float(f, v, 1e-30, 1e30);
    else if (!strcmp(f, "--loss-scale-growth")) tc->scaler.growth = parse_float(f, v, 1.0, 1e6);
    else if (!strcmp(f, "--loss-scale-backoff")) tc->scaler.backoff = parse_float(f, v, 1e-6, 1.0);
    else if (!strcmp(f, "--loss-scale-interval")) tc->scaler.interval = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--loss-scale-hysteresis")) tc->scaler.hysteresis = tc->scaler.hysteresis_left = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--stochastic-rounding")) tc->stochastic_rounding = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--fault-inf-rank")) tc->fault_inf_rank = (int)parse_int(f, v, 0, 1 << 20);
    else if (!strcmp(f, "--fault-inf-step")) tc->fault_inf_step = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--recompute")) tc->recompute = (int)parse_int(f, v, 0, 3);
    else if (!strcmp(f, "--attention")) {
        if (strcmp(v, "classic") && strcmp(v, "flash")) fatal("--attention must be classic or flash, got '%s'", v);
        tc->kernels.flash_attention = strcmp(v, "flash") == 0;
    } else if (!strcmp(f, "--device-memory")) tc->device_memory = parse_size(f, v);
    else if (!strcmp(f, "--precision")) {
        if (strcmp(v, "bf16") && strcmp(v, "fp16") && strcmp(v, "fp32")) fatal("--precision must be bf16, fp16 or fp32, got '%s'", v);
        tc->plan_precision = v;
    } else if (!strcmp(f, "--fused-kernels")) tc->kernels.fused = (int)parse_int(f, v, 0, 1);  // llmc/device.h
    else if (!strcmp(f, "--cpu-matmul")) {
        if (strcmp(v, "blas") && strcmp(v, "reference")) fatal("--cpu-matmul must be blas or reference, got '%s'", v);
        tc->kernels.cpu_blas = strcmp(v, "blas") == 0;
        if (tc->kernels.cpu_blas && !cpu_blas_linked && TARGET_IS_CPU)
            fatal("--cpu-matmul blas: this build has no BLAS (OpenBLAS was not found when it was built: make deps installs "
                  "libopenblas-openmp-dev, then rebuild); use --cpu-matmul reference");
    } else return 0;
    return 1;
}

static int parse_optimization_flag(TrainConfig* tc, const char* f, const char* v) {
    // at most INT_MAX steps: AdamW's step number is an int, and a state file holds no more (state_file.h)
    if (!strcmp(f, "--steps")) tc->steps = parse_int(f, v, 0, INT_MAX);
    else if (!strcmp(f, "--stop-after")) tc->stop_after = parse_int(f, v, 1, INT_MAX);
    else if (!strcmp(f, "--lr")) tc->opt.lr = parse_float(f, v, 0.0, 10.0);
    else if (!strcmp(f, "--warmup")) tc->warmup = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--lr-schedule")) {
        if (strcmp(v, "cosine") && strcmp(v, "linear") && strcmp(v, "constant"))
            fatal("--lr-schedule must be cosine, linear or constant, got '%s'", v);
        tc->schedule = v;
    } else if (!strcmp(f, "--lr-min-frac")) tc->lr_min_frac = parse_float(f, v, 0.0, 1.0);
    else if (!strcmp(f, "--beta1")) tc->opt.beta1 = parse_float(f, v, 0.0, 0.999999);
    else if (!strcmp(f, "--beta2")) tc->opt.beta2 = parse_float(f, v, 0.0, 0.999999);
    else if (!strcmp(f, "--eps")) {
        tc->opt.eps = parse_float(f, v, 0.0, 1.0);
        // AdamW divides m by sqrt(v) + eps, and m = v = 0 where a gradient is always 0 (the padded
        // vocabulary rows): eps = 0 would write 0/0 = NaN into the model
        if (!(tc->opt.eps > 0.0f)) fatal("--eps must be positive as a float32 (with 0, AdamW computes 0/0 for parameters whose gradient is 0), got '%s'", v);
    } else if (!strcmp(f, "--weight-decay")) tc->opt.weight_decay = parse_float(f, v, 0.0, 10.0);
    else if (!strcmp(f, "--grad-clip")) tc->opt.grad_clip = parse_float(f, v, 0.0, 1e9);
    else return 0;
    return 1;
}

static int parse_output_flag(TrainConfig* tc, FlagsSeen* seen, const char* f, const char* v) {  // evaluation, sampling, checkpoints, logs
    if (!strcmp(f, "--val-every")) tc->val_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--val-batches")) tc->val_batches = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--eval-data")) tc->eval_data = v;
    else if (!strcmp(f, "--eval-every")) tc->eval_every = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--eval-dump")) tc->eval_dump = v;
    else if (!strcmp(f, "--sample-every")) tc->sample_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--sample-len")) tc->sample_len = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--prompt")) tc->prompt = v;
    else if (!strcmp(f, "--temperature")) tc->temperature = parse_float(f, v, 0.0, 1e6);
    else if (!strcmp(f, "--top-k")) tc->top_k = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--bpe-dir")) tc->bpe_dir = v;
    else if (!strcmp(f, "--encode")) tc->encode_file = v;
    else if (!strcmp(f, "--save-every")) tc->save_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--checkpoint-dir")) tc->checkpoint_dir = seen->checkpoint_dir_given = v;
    else if (!strcmp(f, "--resume")) tc->resume = v;
    else if (!strcmp(f, "--resume-if-present")) tc->resume_if_present = v;
    else if (!strcmp(f, "--keep-last")) tc->keep_last = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--save-model")) tc->save_model = v;
    else if (!strcmp(f, "--save-model-dtype")) {
        if (strcmp(v, "fp32") && strcmp(v, "bf16")) fatal("--save-model-dtype must be fp32 or bf16, got '%s'", v);
        tc->save_model_version = strcmp(v, "bf16") == 0 ? 5 : 3;
    } else if (!strcmp(f, "--log")) tc->log_file = v;
    else return 0;
    return 1;
}

// What one flag means depends on another: conflicts, --micro-batches turned into B and grad_accum, the
// checkpoint folder of a resumed run, and a model from the command line's sizes.
static void check_flag_combinations(TrainConfig* tc, const FlagsSeen* seen) {
    if (tc->model_file && tc->resume) fatal("--resume loads the model from the checkpoint; do not also give --model");
    if (tc->resume && tc->resume_if_present) fatal("give --resume or --resume-if-present, not both");
    // a resumed run saves where it resumed from, so that the next resume finds its newest checkpoint
    if (!seen->checkpoint_dir_given && (tc->resume || tc->resume_if_present)) tc->checkpoint_dir = tc->resume ? tc->resume : tc->resume_if_present;
    if (seen->micro_batches > 0) {  // B sequences per step, in M micro-batches of B/M: gradient accumulation over M
        if (tc->grad_accum != 1) fatal("give --micro-batches or --grad-accum, not both");
        if (tc->B % seen->micro_batches != 0)
            fatal("--batch-size %d does not split into %d micro-batches (it must be a multiple)", tc->B, seen->micro_batches);
        tc->B /= seen->micro_batches;
        tc->grad_accum = seen->micro_batches;
    }
    if (tc->pp > 1 && tc->zero == 2)
        fatal("--zero 2 with --pp is not supported: a pipeline accumulates each layer's gradients over all its micro-batches "
              "(and the tied wte's over both end stages) before they are final, so sharding them would mean a reduce-scatter "
              "per micro-batch; use --zero 1, which shards the optimizer state");
    if (tc->pp == 1 && tc->rematerialize) fatal("--pp-rematerialize needs --pp > 1");
    // --print-schedule and --plan work out every stage's schedule in this one process (P x 2M actions, and
    // printed a timeline line of about 3(M + P) slots per stage): bounded, so that a huge --pp or
    // --micro-batches gets an answer at once, not a loop of hours or gigabytes of text
    if (tc->print_schedule && (tc->pp > MAX_PRINTED_STAGES || tc->grad_accum > MAX_PRINTED_MICRO_BATCHES))
        fatal("--print-schedule prints at most %d stages and %d micro-batches (got --pp %d, %d micro-batches)", MAX_PRINTED_STAGES,
              MAX_PRINTED_MICRO_BATCHES, tc->pp, tc->grad_accum);
    if (tc->plan && (long long)tc->pp * tc->grad_accum > MAX_PLANNED_ACTIONS)
        fatal("--plan: --pp %d x %d micro-batches is more than the %d stage micro-batches it plans (a pipeline of that many "
              "micro-batches per stage is no configuration to run)", tc->pp, tc->grad_accum, MAX_PLANNED_ACTIONS);
    char why[256];
    if (loss_scaler_settings_error(&tc->scaler, why, sizeof(why))) fatal("%s", why);
    if (tc->fault_wait_signal >= tc->steps)  // (a signal after the last step stops nothing: the run is done)
        fatal("--fault-wait-signal %lld must be below --steps %lld", tc->fault_wait_signal, tc->steps);
    if (tc->prompt && (tc->tokenizer == NULL || tc->tokenizer[0] == '\0' || tc->sample_every == 0))
        fatal("--prompt needs sampling on: a --tokenizer and --sample-every above 0");
    tc->arch.Vp = padded_vocab(tc->arch.V);
    if (!tc->model_file && !tc->resume) validate_config(&tc->arch, "command line");
    if (!tc->model_file && !tc->resume && tc->T > tc->arch.maxT)
        fatal("sequence length T=%d is longer than maxT=%d", tc->T, tc->arch.maxT);
}

static void parse_args(TrainConfig* tc, int argc, char** argv) {
    default_train_config(tc);
    tc->argc = argc;
    tc->argv = argv;
    FlagsSeen seen = {.micro_batches = 0, .checkpoint_dir_given = NULL};
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
            print_usage();
            exit(0);
        }
        if (strncmp(f, "--", 2) != 0) fatal("unexpected argument '%s' (flags start with --; see --help)", f);
        if (!strcmp(f, "--plan")) {
            tc->plan = 1;
            continue;
        }
        if (!strcmp(f, "--print-schedule")) {
            tc->print_schedule = 1;
            continue;
        }
        if (!strcmp(f, "--allow-data-change")) {
            tc->allow_data_change = 1;
            continue;
        }
        if (i + 1 >= argc) fatal("flag %s needs a value (see --help)", f);
        const char* v = argv[++i];
        if (!parse_data_model_flag(tc, f, v) && !parse_parallel_flag(tc, &seen, f, v) && !parse_precision_memory_flag(tc, f, v) &&
            !parse_optimization_flag(tc, f, v) && !parse_output_flag(tc, &seen, f, v))
            fatal("unknown flag %s (see --help)", f);
    }
    check_flag_combinations(tc, &seen);
}

// --resume-if-present DIR: a requeued job's fixed command line. If DIR holds a complete checkpoint, the
// run resumes from it (as --resume DIR); otherwise it starts fresh (from --model, or from scratch) and
// says so. Every rank must see the same folder: the ranks compare what they found.
static void resolve_resume_if_present(TrainConfig* tc, Comm* comm) {
    if (!tc->resume_if_present) return;
    long long step = newest_complete_checkpoint(tc->resume_if_present);
    double found[2] = {(double)step, -(double)step};  // the largest and (negated) the smallest over the ranks
    comm_all_reduce_host(comm, &comm->world, found, 2, REDUCE_MAX);
    double hi = found[0], lo = -found[1];
    if (lo != hi)
        fatal("--resume-if-present '%s': the ranks see different checkpoints (newest complete: step %.0f on some, %.0f on "
              "others); the folder must be shared", tc->resume_if_present, lo, hi);
    if (step >= 0) {
        tc->resume = tc->resume_if_present;
        tc->model_file = NULL;  // the checkpoint holds the model
    } else if (comm->world_rank == 0) {
        printf("--resume-if-present: no complete checkpoint in '%s': starting %s\n", tc->resume_if_present,
               tc->model_file ? "from --model" : "from scratch");
    }
}

#ifndef TRAIN_GPT_NO_MAIN
int main(int argc, char** argv) {
    TrainConfig tc;
    parse_args(&tc, argc, argv);
    check_omp_threads();  // before the first parallel loop
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (tc.encode_file) {
        encode_file(&tc);
        return 0;
    }
    if (tc.print_schedule) {  // no ranks needed: every stage's schedule is a function of P, M and the schedule
        pipeline_print_schedule(tc.pipe_schedule, tc.pp, tc.grad_accum);
        return 0;
    }
    if (tc.plan) {
        const char* own = BF16_BUILD ? "bf16" : FP16_BUILD ? "fp16" : "fp32";
        print_plan(&tc, tc.plan_precision ? tc.plan_precision : own, tc.device_memory);
        return 0;
    }
    device_require_gpu();  // GPU build: a clear error without a GPU or driver (CPU build: nothing)
    Comm comm;
    comm_init(&comm, &argc, &argv, tc.dp, tc.tp, tc.pp, tc.engine, tc.nccl_id_dir, tc.comm_timeout, tc.io_timeout);
    resolve_resume_if_present(&tc, &comm);
    double t0 = wall_seconds();
    float val = train(&tc, &comm, NULL, 0);
    if (comm.world_rank == 0) {
        printf("done in %.1f s", wall_seconds() - t0);
        if (!isnan(val)) printf(", final val loss %.4f", val);
        printf("\n");
    }
    // what was printed (step lines, samples) must have reached stdout: a full disk or a closed pipe is
    // an error, not a silent success (stdout is line-buffered: a failed write left its error flag)
    errno = 0;
    if (comm.world_rank == 0 && (fflush(stdout) != 0 || ferror(stdout)))
        fatal("cannot write to standard output: %s", errno ? strerror(errno) : "a write failed (a full disk?)");
    comm_finalize(&comm);
    return stop_signal_ended_run ? EXIT_STOPPED_BY_SIGNAL : 0;
}
#endif
