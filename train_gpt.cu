/*
 * train_gpt.cu: GPT-2 training in one readable file, from one source for two targets.
 *
 *   GPU: nvcc, CUDA kernels, cuBLASLt and NCCL, floatX = bf16 (PRECISION=BF16), fp16 (PRECISION=FP16,
 *        with loss scaling) or float (PRECISION=FP32)
 *   CPU: g++ -x c++ -DLLMC_CPU, the same code with the CPU reference loops and OpenMP, floatX = float
 *
 * What is here, top to bottom (llmc/ holds the rest: each layer's math, each parallelism, and in llmc/run/
 * the run's machinery):
 *   1. the parameters: one flat buffer per rank (its layout: llmc/param_layout.h) and the model's tables of
 *      pointers into it (Weights, LayerWeights)
 *   2. the activations: flat buffers and pointer tables into them, one set per micro-batch in flight, and
 *      recomputation (--recompute): which of them are kept per layer
 *   3. the model: GPT2 (build: this rank's tensors and slices, its ZeRO shard), parameters in and out of
 *      the llm.c file order, random initialization, the activations' allocation
 *   4. forward and 5. backward of this rank's layers, with recomputation, and the DP reduction started as
 *      each layer's gradients become final
 *   6. the update: the step's verdict (norm, clipping, loss scaling; llmc/step_outputs.h), AdamW on the
 *      owned shard (ZeRO), all-gather
 *   7. the step: plain_step (one stage: gradient accumulation) and pipeline_step (--pp > 1: one loop over
 *      the stage's plan of actions and exchanges, llmc/pipeline.h)
 *   8. checkpoints, evaluation and sampling, 9. the memory plan (--plan), 10. the training loop, 11. main
 * Every layer's math lives in llmc/<layer>.h, CPU reference and CUDA kernels side by side; each kind of
 * parallelism has its own header (comm, zero, zero3, tensor_parallel, pipeline) and "DP:", "TP:", "PP:"
 * comments mark where the model code calls into it.
 */
// the layers: CPU reference and CUDA kernels side by side
#include "llmc/attention.h"        // attention_forward/_backward, and flash attention's
#include "llmc/classifier.h"       // classifier_forward_backward, loss_mean
#include "llmc/encoder.h"          // the token + position embedding, forward and backward
#include "llmc/gelu.h"             // gelu_forward
#include "llmc/layernorm.h"        // layernorm_forward/_backward, residual_layernorm_forward
#include "llmc/matmul.h"           // matmul_forward/_backward, cuBLASLt epilogues, the CPU's BLAS or reference GEMM
// the optimizer and the numerics
#include "llmc/adamw.h"            // OptimizerConfig, adamw_update_ranges, round_params
#include "llmc/global_norm.h"      // NormParts: the gradient norm over the owned ranges
#include "llmc/loss_scaler.h"      // LossScaler: dynamic loss scaling
#include "llmc/step_outputs.h"     // StepOutputs: the step's losses and the update's verdict (host or device)
#include "llmc/recompute.h"        // RecomputeKeeps: which activations --recompute keeps
// the parallelisms
#include "llmc/comm.h"             // Comm: ranks, groups and collectives (MPI or NCCL)
#include "llmc/param_layout.h"     // ParamLayout: the flat buffer's tensors and buckets, this rank's share
#include "llmc/placement.h"        // Placement: this rank's place in the grid, its stage's layers
#include "llmc/pipeline.h"         // Schedule, pipeline_plan, pipe_sendrecv: GPipe, 1F1B, interleaved, ZB-H1
#include "llmc/tensor_parallel.h"  // f and g, the vocabulary-parallel embedding and loss
#include "llmc/zero.h"             // ZeroPlan: ZeRO-1/2 sharding, reduce-scatter and all-gather
#include "llmc/zero3.h"            // Zero3Params: ZeRO-3, the parameters sharded and gathered per layer
// the run around the model (llmc/run/)
#include "llmc/run/checkpoint.h"   // the checkpoint folder and its owner, load_checkpoint, the final model
#include "llmc/run/cli.h"          // parse_args, --help
#include "llmc/run/config.h"       // TrainConfig, check_ranks_agree
#include "llmc/run/dataloader.h"   // DataLoader: token shards, in the data-order contract
#include "llmc/run/eval.h"         // EvalSet: multiple-choice examples
#include "llmc/run/fault.h"        // FaultPlan: the testing flags' fault injection
#include "llmc/run/inputs.h"       // RunInputs: the start point, data, eval set, tokenizer, prompt
#include "llmc/run/logger.h"       // Logger: the JSONL log
#include "llmc/run/lr_schedule.h"  // learning_rate
#include "llmc/run/memory_plan.h"  // MemoryPlan, print_plan: --plan
#include "llmc/run/report.h"       // log_run_config, print_step_line
#include "llmc/run/sampling.h"     // SampleConfig, draw_token, encode_prompt
#include "llmc/run/stop_signal.h"  // a signal stops the run after its step, with a checkpoint
#include "llmc/run/tokenizer.h"    // Tokenizer: ids to text for samples
#include "llmc/run/trace.h"        // Tracer: --trace's spans

// ----------------------------------------------------------------------------------------------------
// 1. the parameters: their layout, and the model's tables of pointers into them
//
// A rank's parameters are one flat buffer, laid out layer by layer so that each layer's tensors (a
// bucket) are one contiguous range; which tensors and slices it holds follow from its place in the grid.
// llmc/param_layout.h computes that layout (ParamLayout: a TensorEntry per tensor, a Bucket per layer) and
// its mapping to the llm.c file order. The model reads its tensors through tables of pointers into it:
// Weights, with a LayerWeights per layer (the 12 tensors of a block in file order), made by point_weights
// from each bucket's base (bucket_bases). The gradients are laid out the same way.

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

// Pointer table into buffers laid out like the parameters: tensor = bucket_base[its bucket] + its
// offset inside the bucket. Usually bucket_base[b] = base + bucket offset; ZeRO-2 points the gradient
// buckets into a workspace instead, ZeRO-3 the parameter buckets into the layer buffers they are gathered into.
static Weights point_weights(const GPT2Config* c, const ParamLayout* lay, floatX* const* bucket_base) {
    Weights w;
    memset(&w, 0, sizeof(w));
    w.layers = (LayerWeights*)calloc_check(c->L * sizeof(LayerWeights));  // layers of other stages stay NULL
    for (int i = 0; i < lay->num_entries; i++) {
        const TensorEntry* s = &lay->entries[i];
        floatX* p = bucket_base[s->bucket] + (s->offset - lay->buckets[s->bucket].offset);
        if (s->kind == WTE) w.wte = p;
        else if (s->kind == WPE) w.wpe = p;
        else if (s->kind == LNFW) w.lnfw = p;
        else if (s->kind == LNFB) w.lnfb = p;
        else ((floatX**)&w.layers[s->layer])[s->kind - LN1W] = p;  // LayerWeights is a table in file order
    }
    return w;
}

// bases[b] for point_weights: bucket b of a flat buffer, or its place in ZeRO-2/3's layer buffers (llmc/zero.h)
static floatX** bucket_bases(const ParamLayout* lay, const ZeroPlan* z, int in_layer_buffers, floatX* flat,
                             const LayerBuffers* buffers, floatX** bases) {
    if (in_layer_buffers) {
        layer_buffers_bases(buffers, z, bases);
        return bases;
    }
    for (int b = 0; b < lay->num_buckets; b++) bases[b] = flat + lay->buckets[b].offset;
    return bases;
}

// ----------------------------------------------------------------------------------------------------
// 2. activations and recomputation

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
    floatX* dreceived;                      // (B, T, C) interleaved: an output's gradient received before
                                            // other work, kept for its backward (the plan stages it)
    int *inputs, *targets;                  // (B, T) token ids on the device (stage_token_ids puts them there)
    int* host_inputs;                       // (B, T) the same ids on the host (the GPU encoder backward groups them)
    int* host_targets;                      // (B, T) kept for a rematerialized forward
                                            // (both pinned with --fused-kernels: copied without waiting)
    DeviceEvent ids_copied;                 // recorded after the last copy from host_inputs or host_targets
    floatX* checkpoints;                    // (ceil(L/K) - 1, B, T, C) --recompute-segment K: segment inputs
} Activations;

// One layer's activations (local index li of this stage) inside an activation set (layer_acts).
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

// ZB-H1: the output gradients of a layer's four linear layers, which its B computes and its deferred W
// reads: d(output) for fcproj and d(residual2) for attproj (BT, C), dfch (BT, 4C/tp) for fc, dqkv (BT,
// 3C/tp) for qkv. Set `set` of a chunk's buffer `douts` holds them for each of its L layers.
typedef struct {
    floatX *doutput, *dresidual2, *dfch, *dqkv;
} LayerDouts;
static size_t douts_per_layer(size_t BT, size_t C, size_t Cl) { return BT * (2 * C + 7 * Cl); }
static LayerDouts layer_douts(floatX* douts, int set, int li, int L, size_t BT, size_t C, size_t Cl) {
    floatX* p = douts + ((size_t)set * L + li) * douts_per_layer(BT, C, Cl);
    return (LayerDouts){.doutput = p, .dresidual2 = p + BT * C, .dfch = p + 2 * BT * C,
                        .dqkv = p + BT * (2 * C + 4 * Cl)};
}

// PP: a run of consecutive layers of this rank, and the activations of its micro-batches in flight: the
// rank's stage, or with --virtual-stages V one of its V chunks (chunk v is virtual stage v*P + pp_rank)
typedef struct {
    int l0, l1, first, last;  // its layers [l0, l1); it is the first / last (virtual) stage: it embeds / it classifies
    Activations* slots;       // (n_slots) one per micro-batch in flight in the pipeline schedule
    Activations work;         // rematerialization: the one full set; slots then hold only stage inputs
    floatX* douts;            // ZB-H1: (n_douts, L, B, T, 2C + 7C/tp) what each B kept for its deferred W (layer_douts)
    int n_slots, n_douts, n_logits;  // (n_douts 0: no deferred W's; n_logits 0: one per slot; set before allocating)
    void* acts_memory;        // the sets' one allocation
} Chunk;


// ----------------------------------------------------------------------------------------------------
// 3. the model: build, parameters in and out, activations

// The layer launchers' scratch: buffers a launcher needs only while it runs, grown on first
// use and kept, one per purpose, owned by the model and freed with it. The planner counts them as kernel
// scratch (gpu_kernel_scratch, cpu_kernel_scratch).
typedef struct {
    Scratch matmul;     // CPU: the transposed operand; GPU: the bias gradient's partial sums
    Scratch layernorm;  // GPU: layernorm_backward's partial sums of dweight and dbias
    Scratch attention;  // GPU: classic attention's q, k, v, y and scores, or flash backward's D
    Scratch encoder;    // GPU: encoder_backward's positions grouped by token
    HostStaging encoder_host;  // GPU: the same grouping on the host (pinned with --fused-kernels),
                               // on its way to `encoder`
    Scratch norm;       // GPU: the gradient norm's per-block partial sums
    Scratch vocab_ce;   // TP: the vocab-parallel cross-entropy's per-row max, sum and target logit
} KernelScratch;

static void kernel_scratch_free(KernelScratch* k) {
    Scratch* all[] = {&k->matmul, &k->layernorm, &k->attention, &k->encoder, &k->norm, &k->vocab_ce};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) scratch_free(all[i]);
    host_staging_free(&k->encoder_host);
}

typedef struct {
    GPT2Config config;
    ParamLayout layout;
    size_t num_parameters;  // real parameters (padding of Vp included, alignment gaps not)
    BuildMode mode;         // real, or dry for the planner (and the element size it plans for)
    KernelChoice kernels;   // which kernel variants forward and backward launch (llmc/device.h)
    Comm* comm;             // ranks and collectives (a single-rank Comm when not distributed)
    Placement place;        // this rank's grid position, its layers and its slices
    int first, last;        // this is the first / last pipeline stage (both without pipelining)
    Chunk chunks[MAX_VIRTUAL_STAGES];  // (n_chunks) this rank's layers: its stage, or with --virtual-stages its chunks
    Chunk* chunk;           // the chunk forward and backward work on (the pipeline step selects it per action)
    ZeroPlan zero;          // which part of each bucket's optimizer state (and from stage 2, gradients) is ours
    floatX* params_memory;  // (layout.total) what forward and backward read, whole; NULL at stage 3
    Zero3Params zero3;      // stage 3: the parameter shard and the buffer layers are gathered into (llmc/zero3.h)
    floatX* grads_memory;   // (layout.total) stages 0 and 1; NULL at stages 2 and 3
    Zero2Grads zero2;       // stages 2, 3: the gradient shard and the workspace backward writes (llmc/zero.h)
    float* master;          // (zero.shard_total) fp32 master weights in BF16 builds; NULL in FP32 builds,
                            // where the parameters are their own master copy
    float *m, *v;           // (zero.shard_total) AdamW moments
    NormParts norm_parts;   // this rank's owned gradient ranges, as the norm sums them (llmc/global_norm.h)
    Weights params, grads;
    int n_chunks, rematerialize;  // PP: rematerialize: the slots keep only each micro-batch's stage input (Chunk)
    int recompute;           // --recompute level: which layer activations backward recomputes (RecomputeKeeps)
    int douts_set;           // ZB-H1: backward keeps its output gradients in this set of chunk->douts (-1: W at once)
    int recompute_segment;   // --recompute-segment K: layers per segment at level 3 (0, 1: no segments)
    int stochastic_rounding; // BF16: parameter updates rounded stochastically (llmc/adamw.h)
    KernelScratch kernel_scratch;  // the layer launchers' buffers (allocated by the launchers, on first use)
    int B, T;  // the batch shape activations were allocated for (0: not yet)
    size_t bytes_params, bytes_grads, bytes_optimizer, bytes_activations, bytes_workspace;
    Tracer* tracer;  // spans for --trace (NULL: off)
    float* host_losses;  // (B, T) evaluation: the last forward's per-position losses, brought to the host
    StepOutputs outputs;  // the step's losses and the update's verdict (llmc/step_outputs.h)
} GPT2;

// In fp32 the parameters are their own master weights; in bf16 and fp16 an fp32 copy is kept.
static int master_is_params(const GPT2* model) { return model->mode.elem_bytes == sizeof(float); }

static void gpt2_init_norm_parts(GPT2* model);

// Allocates the parameters, gradients and optimizer state of the rank at `place`: its pipeline stage's
// tensors, its slices of the TP-split ones, sharded over its DP group per its ZeRO stage (llmc/zero.h).
// `mode`: for real, or dry for the planner (gpt2_build builds for a run); `kernels`: the run's choice of
// kernel variants, which the activations' layout follows too.
static void gpt2_build_as(GPT2* model, const GPT2Config* c, Comm* comm, const Placement* place, const BuildMode* mode,
                          const KernelChoice* kernels) {
    memset(model, 0, sizeof(*model));
    model->douts_set = -1;  // (backward computes its weight gradients itself)
    model->mode = *mode;
    model->kernels = *kernels;
    validate_config(c, "model");
    validate_tp(c, place->tp);
    model->config = *c;
    model->comm = comm;
    model->place = *place;
    model->first = is_first_stage(place);
    model->last = is_last_stage(place);
    model->n_chunks = num_chunks(place);
    // the first stage's first chunk embeds, the last stage's last classifies
    for (int v = 0; v < model->n_chunks; v++) {
        chunk_layers(place, v, &model->chunks[v].l0, &model->chunks[v].l1);
        model->chunks[v].first = model->first && v == 0;
        model->chunks[v].last = model->last && v == model->n_chunks - 1;
    }
    model->chunk = &model->chunks[0];
    int zero_stage = place->zero;
    model->layout = build_layout(c, place);
    model->num_parameters = gpt2_num_parameters(c);
    ParamLayout* lay = &model->layout;
    zero_plan_init(&model->zero, &model->place, lay->buckets, lay->num_buckets);
    size_t n = lay->total, shard = model->zero.shard_total, fx = mode->elem_bytes;

    // whole buffers, or shards (gradients at ZeRO-2 and 3, parameters at 3) and the layer buffers the
    // tensors point into
    check_internal(place->pp == 1 || zero_stage < 2, "ZeRO-2 or 3 with pipeline parallelism");
    if (zero_stage < 3) model->params_memory = (floatX*)zeroed_device_buffer(mode, n * fx, &model->bytes_params);
    if (zero_stage < 2) model->grads_memory = (floatX*)zeroed_device_buffer(mode, n * fx, &model->bytes_grads);
    zero3_init(&model->zero3, &model->zero, mode, &model->bytes_params, &model->bytes_workspace);
    zero2_init(&model->zero2, &model->zero, mode, &model->bytes_grads, &model->bytes_workspace);
    floatX** bases = (floatX**)malloc_check(lay->num_buckets * sizeof(floatX*));
    model->params = point_weights(c, lay, bucket_bases(lay, &model->zero, zero_stage == 3, model->params_memory,
                                                       &model->zero3.gathered, bases));
    model->grads = point_weights(c, lay, bucket_bases(lay, &model->zero, zero_stage >= 2, model->grads_memory,
                                                      &model->zero2.workspace, bases));
    free(bases);
    if (!master_is_params(model))
        model->master = (float*)zeroed_device_buffer(mode, shard * sizeof(float), &model->bytes_optimizer);
    model->m = (float*)zeroed_device_buffer(mode, shard * sizeof(float), &model->bytes_optimizer);
    model->v = (float*)zeroed_device_buffer(mode, shard * sizeof(float), &model->bytes_optimizer);
    gpt2_init_norm_parts(model);
    // --fused-kernels on the GPU: the step's outputs stay on the device, and only kernels wait for TP's sums
    model->outputs.on_device = kernels->fused && !TARGET_IS_CPU;
    comm->kernels_wait = model->outputs.on_device;  // (comm_join_for_kernels)
}

// For real runs and tests: builds for this build's precision, allocating everything.
static void gpt2_build(GPT2* model, const GPT2Config* c, Comm* comm, const Placement* place,
                       const KernelChoice* kernels) {
    gpt2_build_as(model, c, comm, place, &BUILD_FOR_RUN, kernels);
}

static void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    zero2_free(&model->zero2);
    zero3_free(&model->zero3);
    device_free(model->master);
    device_free(model->m);
    device_free(model->v);
    kernel_scratch_free(&model->kernel_scratch);
    // (pinned buffers are freed once the device is idle: no copy from the ids is left to run)
    int pinned = model->kernels.fused;
    for (int v = 0; v < model->n_chunks; v++) {
        Chunk* ck = &model->chunks[v];
        Activations* sets[] = {ck->slots, &ck->work};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < (k == 0 ? ck->n_slots : 1); i++) {
                host_buffer_free(sets[k][i].host_inputs, pinned);
                host_buffer_free(sets[k][i].host_targets, pinned);
                device_event_destroy(&sets[k][i].ids_copied);
            }
        device_free(ck->acts_memory);
        free(ck->slots);
    }
    free(model->params.layers);
    free(model->grads.layers);
    free_layout(&model->layout);
    zero_plan_free(&model->zero);
    norm_parts_free(&model->norm_parts);
    step_outputs_free(&model->outputs);
    free(model->host_losses);
}

static floatX* owned_params(GPT2* model, int b) {  // bucket b's owned range of the parameters (ZeRO-3: in its shard)
    return model->zero.stage == 3 ? model->zero3.shard + model->zero.owned_offset[b]
                                  : model->params_memory + owned_start(&model->zero, b);
}

// The fp32 master weights of bucket b's owned range: a shard buffer (BF16, FP16), the parameters themselves (FP32)
static float* owned_master(GPT2* model, int b) {
    if (master_is_params(model)) return (float*)owned_params(model, b);
    return model->master + model->zero.owned_offset[b];
}

// The reduced gradients of bucket b's owned range.
static floatX* owned_grads(GPT2* model, int b) {
    if (model->zero.stage >= 2) return model->zero2.shard + model->zero.owned_offset[b];
    return model->grads_memory + owned_start(&model->zero, b);
}

// parameters from a host float array in file order: the floatX copy (whole; ZeRO-3: our parts), our master shard
static void gpt2_set_parameters(GPT2* model, const float* file_order) {
    float* mem = (float*)malloc_check(model->layout.total * sizeof(float));
    float* shard = model->zero.stage == 3 || !master_is_params(model)
                       ? (float*)malloc_check(model->zero.shard_total * sizeof(float))
                       : NULL;
    file_order_to_layout(&model->layout, &model->place, model->place.tp_rank, file_order, mem);
    if (shard) shard_from_layout(&model->zero, mem, shard);
    if (model->zero.stage == 3) upload_floats(model->zero3.shard, shard, model->zero.shard_total);
    else upload_floats(model->params_memory, mem, model->layout.total);
    if (!master_is_params(model)) copy_to_device(model->master, shard, model->zero.shard_total * sizeof(float));
    zero3_params_changed(&model->zero3);
    free(mem);
    free(shard);
}

// AdamW moments from host float arrays in file order (resume), into our shard
static void gpt2_set_optimizer_state(GPT2* model, const float* m_file, const float* v_file) {
    float* mem = (float*)malloc_check(model->layout.total * sizeof(float));
    float* shard = (float*)malloc_check(model->zero.shard_total * sizeof(float));
    const float* src[2] = {m_file, v_file};
    float* dst[2] = {model->m, model->v};
    for (int i = 0; i < 2; i++) {
        file_order_to_layout(&model->layout, &model->place, model->place.tp_rank, src[i], mem);
        shard_from_layout(&model->zero, mem, shard);
        copy_to_device(dst[i], shard, model->zero.shard_total * sizeof(float));
    }
    free(mem);
    free(shard);
}

// The fp32 master weights, whole, in file order (collective: every rank must call it). The owned
// parts of the master shards are all-gathered across the DP group (stages 1 to 3), then the TP slices
// across the TP group, then the pipeline stages' tensors are summed across the PP group.
static void gpt2_export_master(GPT2* model, float* file_order) {
    const ZeroPlan* z = &model->zero;
    Comm* comm = model->comm;
    size_t n = model->layout.total;
    float* whole = (float*)device_malloc(n * model->place.tp * sizeof(float));  // [TP rank 0 | 1 | ...]
    float* mine = whole + (size_t)model->place.tp_rank * n;
    device_memset_zero(mine, n * sizeof(float));
    for (int b = 0; b < z->num_buckets; b++) {
        float* src = owned_master(model, b);
        device_copy(mine + owned_start(z, b), src, owned_size(z, b) * sizeof(float));
        if (z->stage > 0)
            comm_all_gather(comm, &comm->dp_group, mine + z->buckets[b].offset, owned_size(z, b), DT_FLOAT);
    }
    comm_join_group(comm, &comm->dp_group);  // the TP all-gather sends what the DP all-gathers wrote
    comm_all_gather(comm, &comm->tp_group, whole, n, DT_FLOAT);
    comm_join(comm);
    float* host = (float*)malloc_check(n * model->place.tp * sizeof(float));
    copy_to_host(host, whole, n * model->place.tp * sizeof(float));
    size_t total = model->num_parameters;
    memset(file_order, 0, total * sizeof(float));
    for (int r = 0; r < model->place.tp; r++)
        layout_to_file_order(&model->layout, &model->place, r, host + (size_t)r * n, file_order);
    free(host);
    device_free(whole);
    if (model->place.pp > 1) {  // PP: each stage filled in its own tensors; the sum over stages is the model
        // wte once
        if (model->last && !model->first) memset(file_order, 0, file_tensor_numel(&model->config, WTE) * sizeof(float));
        comm_sum_host_floats(comm, &comm->pp_group, file_order, total);
    }
}

// GPT-2's initialization (llmc/model_file.h: drawn in file order from one seeded generator), then laid out
static void gpt2_init_random(GPT2* model, uint64_t seed) {
    float* p = (float*)malloc_check(model->num_parameters * sizeof(float));
    model_init_random(&model->config, seed, p);
    gpt2_set_parameters(model, p);
    free(p);
}

// The activations of the current chunk's layers (model->chunk: the stage's, or one of its chunks) for
// micro-batches of (B, T): n_slots sets for the micro-batches a pipeline schedule keeps in flight (1
// without pipelining), plus the workspace they share. With rematerialization the slots keep only each
// micro-batch's stage input and ids, and one full set is recomputed in backward.
static void gpt2_allocate_activations(GPT2* model, int B, int T, int n_slots, int rematerialize) {
    const GPT2Config* c = &model->config;
    Chunk* ck = model->chunk;
    if (T > c->maxT) fatal("sequence length T=%d is longer than the model's maxT=%d", T, c->maxT);
    // with tensor parallelism the split activations hold this rank's heads, hidden units and vocabulary
    size_t L = ck->l1 - ck->l0, C = c->C, tp = model->place.tp, BT = (size_t)B * T;
    size_t Cl = C / tp, NHl = c->NH / tp, Vpl = ck->last ? c->Vp / tp : 0, lf = ck->last ? 1 : 0;
    size_t fx = model->mode.elem_bytes, f = sizeof(float);
    int n_full = rematerialize ? 1 : n_slots;
    int n_sets = n_full + (rematerialize ? n_slots : 0);
    // Built dry (the planner) nothing is allocated, and of the sets that are alike (a GPipe stage keeps one
    // per micro-batch in flight) one is laid out and the rest counted: --plan for a million micro-batches
    // must not lay out a million sets, or allocate the host copies of their token ids.
    int dry = model->mode.dry, n_laid = dry ? (rematerialize ? 2 : 1) : n_sets;
    size_t set_bytes[2] = {0, 0};  // [input-only set, full set], each buffer rounded as allocate_buffers does
    ck->slots = dry ? NULL : (Activations*)calloc_check(n_slots * sizeof(Activations));
    Activations* sets = (Activations*)calloc_check(n_laid * sizeof(Activations));
    BufferSpec* specs = (BufferSpec*)malloc_check((7 + 25 * n_laid) * sizeof(BufferSpec));
    int n = 0;
    Activations shared;
    specs[n++] = (BufferSpec){(void**)&shared.losses, BT * f};
    specs[n++] = (BufferSpec){(void**)&shared.scratch, BT * C * fx};
    specs[n++] = (BufferSpec){(void**)&shared.dresidual, BT * C * fx};
    // (ZB-H1: dfch, dqkv in douts)
    specs[n++] = (BufferSpec){(void**)&shared.dwide, ck->n_douts ? 0 : BT * 4 * Cl * fx};
    specs[n++] = (BufferSpec){(void**)&shared.dreceived, model->n_chunks > 1 ? BT * C * fx : 0};
    specs[n++] = (BufferSpec){(void**)&ck->douts, ck->n_douts * L * douts_per_layer(BT, C, Cl) * fx};
    // the full sets share them (ZB-H1: StageSlots)
    int n_logits = rematerialize || !ck->n_logits ? n_full : ck->n_logits;
    specs[n++] = (BufferSpec){(void**)&shared.logits, n_logits * BT * Vpl * fx};
    for (int i = 0; i < n_laid; i++) {
        Activations* a = &sets[i];
        int full = i < n_full;  // (dry: set 0 is full, set 1 of a rematerializing stage input-only)
        size_t k = full ? 1 : 0;  // a stage-input-only set keeps encoded and the ids
        int flash = model->kernels.flash_attention;
        // per-layer buffers, or one layer's (one segment's) worth for what --recompute recomputes
        RecomputeKeeps keep = recompute_keeps(model->recompute, model->recompute_segment, (int)L);
        size_t Lall = keep.all, Lln = keep.ln, Lgelu = keep.gelu, Lout = keep.outputs, Lck = keep.checkpoints;
        BufferSpec per[] = {
            {(void**)&a->encoded, BT * C * fx},                              // (B, T, C)
            {(void**)&a->ln1, k * Lln * BT * C * fx},                        // (L, B, T, C)
            {(void**)&a->ln1_mean, k * Lall * BT * f},                       // (L, B, T)
            {(void**)&a->ln1_rstd, k * Lall * BT * f},                       // (L, B, T)
            {(void**)&a->qkv, k * Lall * BT * 3 * Cl * fx},                  // (L, B, T, 3C/tp)
            {(void**)&a->atty, k * Lall * BT * Cl * fx},                     // (L, B, T, C/tp)
            // flash: no T x T term
            {(void**)&a->att, flash ? 0 : k * Lall * B * NHl * T * T * fx},  // (L, B, NH/tp, T, T)
            {(void**)&a->lse, flash ? k * Lall * B * NHl * T * f : 0},       // (L, B, NH/tp, T)
            {(void**)&a->residual2, k * Lall * BT * C * fx},                 // (L, B, T, C)
            {(void**)&a->ln2, k * Lln * BT * C * fx},                        // (L, B, T, C)
            {(void**)&a->ln2_mean, k * Lall * BT * f},                       // (L, B, T)
            {(void**)&a->ln2_rstd, k * Lall * BT * f},                       // (L, B, T)
            {(void**)&a->fch, k * Lall * BT * 4 * Cl * fx},                  // (L, B, T, 4C/tp)
            {(void**)&a->fch_gelu, k * Lgelu * BT * 4 * Cl * fx},            // (L, B, T, 4C/tp)
            {(void**)&a->residual3, k * Lout * BT * C * fx},                 // (L, B, T, C)
            {(void**)&a->lnf, k * lf * BT * C * fx},                         // (B, T, C)
            {(void**)&a->lnf_mean, k * lf * BT * f},                         // (B, T)
            {(void**)&a->lnf_rstd, k * lf * BT * f},                         // (B, T)
            {(void**)&a->inputs, BT * sizeof(int)},                          // (B, T)
            {(void**)&a->targets, BT * sizeof(int)},                         // (B, T)
            {(void**)&a->checkpoints, k * Lck * BT * C * fx},                // (ceil(L/K) - 1, B, T, C)
        };
        for (size_t j = 0; j < sizeof(per) / sizeof(per[0]); j++) {
            specs[n++] = per[j];
            set_bytes[full] += round_up(per[j].bytes, 256);
        }
    }
    size_t bytes;  // (the chunks' activations add up)
    ck->acts_memory = allocate_buffers(&model->mode, specs, n, &bytes);
    model->bytes_activations += bytes;
    free(specs);
    if (dry) {  // the sets not laid out
        model->bytes_activations += (size_t)(n_full - 1) * set_bytes[1] +
                                    (size_t)(n_sets - n_full - (n_laid - 1)) * set_bytes[0];
        ck->n_slots = 0;  // (no slots to free)
        model->rematerialize = rematerialize;
        model->B = B;
        model->T = T;
        free(sets);
        return;
    }
    for (int i = 0; i < n_sets; i++) {
        sets[i].losses = shared.losses;
        sets[i].scratch = shared.scratch;
        sets[i].dresidual = shared.dresidual;
        sets[i].dwide = shared.dwide;
        sets[i].dreceived = shared.dreceived;
        sets[i].logits = i < n_full ? shared.logits + (size_t)(i % n_logits) * BT * Vpl : NULL;
        sets[i].host_inputs = (int*)host_buffer_malloc(BT * sizeof(int), model->kernels.fused);
        sets[i].host_targets = (int*)host_buffer_malloc(BT * sizeof(int), model->kernels.fused);
        device_event_create(&sets[i].ids_copied);
    }
    if (rematerialize) ck->work = sets[0];
    memcpy(ck->slots, sets + (rematerialize ? 1 : 0), n_slots * sizeof(Activations));
    ck->n_slots = n_slots;
    model->rematerialize = rematerialize;
    model->B = B;
    model->T = T;
    if (!model->host_losses) model->host_losses = (float*)malloc_check(BT * sizeof(float));
    free(sets);
}

// The activations of every chunk of this rank's layers (its stage, or its --virtual-stages chunks):
// llmc/run/memory_plan.h
static void allocate_stage_activations(GPT2* model, int B, int T, StageSlots slots, int rematerialize) {
    for (int v = 0; v < model->n_chunks; v++) {
        model->chunk = &model->chunks[v];
        model->chunk->n_douts = slots.douts;
        model->chunk->n_logits = slots.logits;
        gpt2_allocate_activations(model, B, T, slots.n[v], rematerialize);
    }
}

// Layer li's output (B, T, C), the next layer's input: in the residual stream's buffer, or with segments
// the checkpoint of the next segment when li ends one (and is not the stage's last layer)
static floatX* layer_output(const GPT2* model, const Activations* a, int li, int B, int T) {
    int L = model->chunk->l1 - model->chunk->l0;
    RecomputeKeeps keep = recompute_keeps(model->recompute, model->recompute_segment, L);
    size_t BTC = (size_t)B * T * model->config.C;
    int K = keep.segment;
    if (K && li % K == K - 1 && li != L - 1) return a->checkpoints + (size_t)(li / K) * BTC;
    return a->residual3 + keep_index(keep.outputs, L, &keep, li) * BTC;
}

static LayerActs layer_acts(const GPT2* model, const Activations* a, int li, int B, int T) {
    int tp = model->place.tp;
    size_t BT = (size_t)B * T, C = model->config.C, Cl = C / tp, NHl = model->config.NH / tp;
    int L = model->chunk->l1 - model->chunk->l0;
    RecomputeKeeps keep = recompute_keeps(model->recompute, model->recompute_segment, L);  // the buffers used
    size_t all = keep_index(keep.all, L, &keep, li), ln = keep_index(keep.ln, L, &keep, li),
           gelu = keep_index(keep.gelu, L, &keep, li);
    LayerActs la;
    la.input = li == 0 ? a->encoded : layer_output(model, a, li - 1, B, T);
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
    la.output = layer_output(model, a, li, B, T);
    la.scratch = a->scratch;
    return la;
}

// ----------------------------------------------------------------------------------------------------
// 4. forward

// out (N, C) = residual + inp (N, IC) . weight^T + bias: a projection back into the residual stream. With
// TP it is row-parallel: inp and weight hold this rank's IC = (C or 4C)/tp input channels, the partial
// products are summed across the TP group (Megatron's g), and the bias is added once, after the sum.
// scratch (N, C) holds the projection before the add.
static void row_parallel_forward(GPT2* model, floatX* out, const floatX* residual, const floatX* inp,
                                 const floatX* weight, const floatX* bias, floatX* scratch, int N, int IC) {
    int C = model->config.C;
    if (model->place.tp == 1) {  // (with --fused-kernels one product that reads the residual: scratch unused)
        matmul_forward_residual(out, residual, scratch, inp, weight, bias, N, IC, C, &model->kernel_scratch.matmul,
                                &model->kernels);
        return;
    }
    matmul_forward(scratch, inp, weight, NULL, N, IC, C, &model->kernel_scratch.matmul, &model->kernels);
    tp_g_forward(model->comm, model->tracer, scratch, (size_t)N * C);  // TP: g
    residual_bias_forward(out, residual, scratch, bias, N, C);
}

// forward of one transformer block: la.input -> la.output
static void layer_forward(GPT2* model, const LayerActs* la, const LayerWeights* w, int B, int T) {
    int C = model->config.C, Cl = C / model->place.tp, NHl = model->config.NH / model->place.tp;
    size_t BT = (size_t)B * T;
    KernelScratch* ks = &model->kernel_scratch;
    int fused = model->kernels.fused, flash = model->kernels.flash_attention;
    // attention block: residual2 = input + attproj(attention(ln1(input)))
    layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->input, w->ln1w, w->ln1b, BT, C, fused);
    // TP: column-parallel, our heads
    matmul_forward(la->qkv, la->ln1, w->qkvw, w->qkvb, BT, C, 3 * Cl, &ks->matmul, &model->kernels);
    if (flash) attention_forward_flash(la->atty, la->lse, la->qkv, B, T, Cl, NHl);
    else attention_forward(la->atty, la->att, la->qkv, B, T, Cl, NHl, &ks->attention, &model->kernels);
    if (fused && model->place.tp == 1) {  // --fused-kernels: the residual add and ln2 in one kernel
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
    matmul_forward_gelu(la->fch_gelu, la->fch, la->ln2, w->fcw, w->fcb, BT, C, 4 * Cl,
                        &ks->matmul, &model->kernels, gelu_epilogue);
    row_parallel_forward(model, la->output, la->residual2, la->fch_gelu, w->fcprojw, w->fcprojb,
                         la->scratch, BT, 4 * Cl);
}

// before a layer's backward: recompute what --recompute did not keep (with segments: recompute_segment)
static void recompute_layer(GPT2* model, const LayerActs* la, const LayerWeights* w, int B, int T) {
    int R = model->recompute, C = model->config.C, Cl = C / model->place.tp, fused = model->kernels.fused;
    size_t BT = (size_t)B * T;
    if (model->recompute_segment > 1 && R == 3) return;
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

// --recompute-segment K, before the backward of local layer li: if li ends a segment other than the
// stage's last, that segment's forward runs again from its checkpoint, keeping all its activations
static void recompute_segment(GPT2* model, const Activations* a, int li, int B, int T) {
    int l0 = model->chunk->l0, L = model->chunk->l1 - l0;
    RecomputeKeeps keep = recompute_keeps(model->recompute, model->recompute_segment, L);
    int K = keep.segment;
    if (!K || li % K != K - 1 || li / K == (L - 1) / K) return;  // (the last segment is kept from the forward)
    for (int j = li - K + 1; j <= li; j++) {
        LayerActs lj = layer_acts(model, a, j, B, T);
        // ZeRO-3: gathered again
        zero3_need_layer(model->comm, &model->zero3, &model->zero, l0 + j, j < li ? l0 + j + 1 : -1);
        layer_forward(model, &lj, &model->params.layers[l0 + j], B, T);
    }
}

// The token ids of a micro-batch (B, T) into the activation set a, where forward and backward read them
// on the device: `inputs` if the current chunk embeds (it is the first), `targets` if it classifies (the
// last; NULL: none). They go through the set's host buffers, pinned with --fused-kernels so that the
// copies do not wait: the host first waits until the set's previous copies have run (ids_copied). The
// GPU's embedding backward also groups the host copy of the inputs.
static void stage_token_ids(GPT2* model, Activations* a, const int* inputs, const int* targets, int B, int T) {
    if (B * T > model->B * model->T || T > model->T)
        fatal("internal error: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    size_t bytes = (size_t)B * T * sizeof(int);
    int nowait = model->kernels.fused;
    device_event_wait(&a->ids_copied);
    if (model->chunk->first) {
        memcpy(a->host_inputs, inputs, bytes);
        copy_host_buffer_to_device(a->inputs, a->host_inputs, bytes, &a->ids_copied, nowait);
    }
    if (model->chunk->last && targets != NULL) {
        memcpy(a->host_targets, targets, bytes);
        copy_host_buffer_to_device(a->targets, a->host_targets, bytes, &a->ids_copied, nowait);
    }
}

// Forward pass of the current chunk of this rank's layers (its pipeline stage, or one of its virtual
// stages) over a micro-batch (B, T), on the activation set a (a micro-batch slot, or the work set: see
// micro_batch_activations), whose token ids stage_token_ids has put in place. The first chunk starts from
// the ids; the others from a->encoded, which the pipeline has filled with the previous stage's output.
// The last chunk leaves the logits in a->logits or, with targets, each position's loss in a->losses (and
// with dloss != 0 dlogits, scaled by dloss, in a->logits for gpt2_backward). The others leave their
// output in stage_output(). Without pipelining the one chunk is first and last. B, T may be below the
// allocated.
static void gpt2_forward(GPT2* model, Activations* a, int B, int T, float dloss, int with_targets) {
    const GPT2Config* c = &model->config;
    check_internal(model->B > 0, "gpt2_forward before gpt2_allocate_activations");
    int C = c->C, tp = model->place.tp, l0 = model->chunk->l0, Ls = model->chunk->l1 - l0, first = model->chunk->first;
    int Vpl = c->Vp / tp;  // this TP rank's rows of the vocabulary
    int fused = model->kernels.fused;
    size_t BT = (size_t)B * T;
    Comm* comm = model->comm;
    zero3_need_ends(comm, &model->zero3, &model->zero);  // ZeRO-3: the embeddings and final LayerNorm, gathered
    if (first)  // TP: each rank looks up the ids in its rows of wte, then the sum over the group (g)
        vocab_parallel_embedding_forward(comm, model->tracer, a->encoded, a->inputs, model->params.wte,
                                         model->params.wpe, B, T, C, c->Vp);
    for (int li = 0; li < Ls; li++) {  // this stage's layers l0 .. l0 + Ls - 1, activations by local index
        LayerActs la = layer_acts(model, a, li, B, T);
        // ZeRO-3: gathered
        zero3_need_layer(comm, &model->zero3, &model->zero, l0 + li, li + 1 < Ls ? l0 + li + 1 : -1);
        layer_forward(model, &la, &model->params.layers[l0 + li], B, T);
    }
    if (!model->chunk->last) return;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, layer_output(model, a, Ls - 1, B, T), model->params.lnfw,
                      model->params.lnfb, BT, C, fused);
    // tied: logits = lnf . wte^T (TP: our rows)
    matmul_forward(a->logits, a->lnf, model->params.wte, NULL, BT, C, Vpl,
                   &model->kernel_scratch.matmul, &model->kernels);
    if (!with_targets) return;
    if (tp == 1) classifier_forward_backward(a->logits, a->losses, a->targets, dloss, BT, c->V, c->Vp, fused);
    else vocab_parallel_cross_entropy(comm, a->logits, a->losses, a->targets, dloss, BT, c->V, c->Vp,
                                      &model->kernel_scratch.vocab_ce);
}

// ----------------------------------------------------------------------------------------------------
// 5. backward

// Clears the gradients at the start of an optimizer step (the accumulated ones: the full buffer at
// stages 0 and 1, the shard at stages 2 and 3).
static void gpt2_zero_grad(GPT2* model) {
    if (model->grads_memory) device_memset_zero(model->grads_memory, model->layout.total * sizeof(floatX));
    zero2_begin_step(&model->zero2);
}

// The gradient buffer of bucket b as backward writes it (in the flat buffer, or a ZeRO-2 workspace).
static floatX* backward_grads(GPT2* model, int b) {
    const GPT2Config* c = &model->config;
    if (b == 0) return model->grads.wte;
    if (b == c->L + 1) return model->grads.lnfw;
    return model->grads.layers[b - 1].ln1w;
}

// Bucket b's gradients are final for this micro-step: start their reduction across the DP group
// (all-reduce, or reduce-scatter at ZeRO 1 to 3; see llmc/zero.h). On the GPU with NCCL this runs on
// the communication stream while backward continues with the layers below.
static void gradients_ready(GPT2* model, int b, int communicate) {
    if (!communicate || model->layout.buckets[b].size == 0 || (model->place.dp == 1 && model->zero.stage < 2)) return;
    double t0 = trace_now_us(model->tracer);
    zero_reduce_bucket(model->comm, &model->zero, b, backward_grads(model, b));
    if (model->zero.stage == 0) trace_add(model->tracer, "allreduce", "all-reduce", b, t0);
    else trace_add(model->tracer, "reducescatter", "reduce-scatter", b, t0);
}

// Backward pass for the last gpt2_forward on the activation set a (which must have had targets and
// dloss != 0). Gradients are accumulated (+=), so micro-steps of gradient accumulation simply add up.
// `communicate`: reduce the gradients across the DP group as they become final (on the last
// micro-step; at ZeRO-2 on every one). A linear layer's backward is two calls, B (its input's gradient)
// and W (its weight's and bias's) right after; with ZB-H1 (douts_set >= 0) B keeps the output gradients
// and W is left to gpt2_backward_weights (what it does not defer: llmc/pipeline.h).
static void gpt2_backward(GPT2* model, Activations* a, int B, int T, int communicate) {
    const GPT2Config* c = &model->config;
    int L = c->L, C = c->C, tp = model->place.tp, l0 = model->chunk->l0, Ls = model->chunk->l1 - l0;
    int Cl = C / tp, NHl = c->NH / tp, Vpl = c->Vp / tp;  // this TP rank's channels of the split tensors
    size_t BT = (size_t)B * T;
    Weights *p = &model->params, *g = &model->grads;
    KernelScratch* ks = &model->kernel_scratch;
    KernelChoice* kc = &model->kernels;
    int fused = kc->fused, flash = kc->flash_attention, defer = model->douts_set >= 0;  // (defer: ZB-H1's B)
    communicate = zero_reduces_now(&model->zero, communicate);  // ZeRO-2, 3: in every micro-step
    zero2_begin_micro_step(&model->zero2);
    if (model->chunk->last) {
        // classifier: the fused kernel already turned logits into dlogits
        // dlnf (=), dwte (+=)
        matmul_backward(a->scratch, g->wte, NULL, a->logits, a->lnf, p->wte, BT, C, Vpl, &ks->matmul, kc);
        // TP: f; dlnf had only our vocabulary rows' part
        tp_f_backward(model->comm, model->tracer, a->scratch, BT * C);
        // final LayerNorm: it writes (+=) into dresidual, which starts at zero
        device_memset_zero(a->dresidual, BT * C * sizeof(floatX));
        layernorm_backward(a->dresidual, g->lnfw, g->lnfb, a->scratch, layer_output(model, a, Ls - 1, B, T), p->lnfw,
                           a->lnf_mean, a->lnf_rstd, BT, C, &ks->layernorm, fused);
        gradients_ready(model, L + 1, communicate);
    }  // other stages: the pipeline has put the next stage's input gradient in dresidual

    for (int li = Ls - 1; li >= 0; li--) {
        int l = l0 + li;
        const LayerWeights* w = &p->layers[l];
        LayerWeights* dw = &g->layers[l];
        recompute_segment(model, a, li, B, T);
        zero3_need_layer(model->comm, &model->zero3, &model->zero, l, li > 0 ? l - 1 : -1);  // ZeRO-3: gathered (again)
        LayerActs la = layer_acts(model, a, li, B, T);
        recompute_layer(model, &la, w, B, T);
        zero2_layer_begins(model->comm, &model->zero2, l);  // ZeRO-2: layer l's workspace buffer is free and clear

        // where the output gradients go: the shared work buffers, or (ZB-H1) the set its W will read
        LayerDouts d = defer ? layer_douts(model->chunk->douts, model->douts_set, li, Ls, BT, C, Cl)
                             : (LayerDouts){NULL, NULL, a->dwide, a->dwide};
        // (layernorm_backward adds to dresidual)
        if (defer) device_copy(d.doutput, a->dresidual, BT * C * sizeof(floatX));
        // MLP block; dresidual holds d(output) and flows through the residual add unchanged
        // (TP: through g, whose backward is the identity: no communication)
        // dfch =, dfcb +=
        matmul_backward_gelu_input(d.dfch, dw->fcb, a->dresidual, la.fch, w->fcprojw, BT, 4 * Cl, C, &ks->matmul, kc);
        if (!defer)  // W
            matmul_backward_weight(dw->fcprojw, dw->fcprojb, a->dresidual, la.fch_gelu, BT, 4 * Cl, C, &ks->matmul, kc);
        matmul_backward_input(a->scratch, d.dfch, w->fcw, BT, C, 4 * Cl, kc);  // dln2 =
        if (!defer)  // W (dfcb: above)
            matmul_backward_weight(dw->fcw, NULL, d.dfch, la.ln2, BT, C, 4 * Cl, &ks->matmul, kc);
        // TP: f; the column-parallel fc saw only our hidden units
        tp_f_backward(model->comm, model->tracer, a->scratch, BT * C);
        layernorm_backward(a->dresidual, dw->ln2w, dw->ln2b, a->scratch, la.residual2, w->ln2w, la.ln2_mean,
                           la.ln2_rstd, BT, C, &ks->layernorm, fused);  // dresidual2 +=
        if (defer) device_copy(d.dresidual2, a->dresidual, BT * C * sizeof(floatX));
        // attention block
        matmul_backward_input(a->scratch, a->dresidual, w->attprojw, BT, Cl, C, kc);  // datty =
        if (!defer)  // W
            matmul_backward_weight(dw->attprojw, dw->attprojb, a->dresidual, la.atty, BT, Cl, C, &ks->matmul, kc);
        // dqkv =
        if (flash) attention_backward_flash(d.dqkv, a->scratch, la.qkv, la.atty, la.lse, B, T, Cl, NHl, &ks->attention);
        else attention_backward(d.dqkv, a->scratch, la.qkv, la.att, B, T, Cl, NHl, &ks->attention, kc);
        matmul_backward_input(a->scratch, d.dqkv, w->qkvw, BT, C, 3 * Cl, kc);  // dln1 =
        if (!defer)  // W
            matmul_backward_weight(dw->qkvw, dw->qkvb, d.dqkv, la.ln1, BT, C, 3 * Cl, &ks->matmul, kc);
        // TP: f; the column-parallel qkv saw only our heads
        tp_f_backward(model->comm, model->tracer, a->scratch, BT * C);
        layernorm_backward(a->dresidual, dw->ln1w, dw->ln1b, a->scratch, la.input, w->ln1w, la.ln1_mean, la.ln1_rstd,
                           BT, C, &ks->layernorm, fused);  // dresidual +=
        if (!defer) gradients_ready(model, 1 + l, communicate);  // layer l's parameter gradients are final
        zero2_layer_done(model->comm, &model->zero2, l);
    }
    if (model->chunk->first) {
        // TP: only the ids in our rows of wte get gradient; dwpe is the same on every rank
        vocab_parallel_embedding_backward(model->comm, g->wte, g->wpe, a->dresidual, a->inputs, a->host_inputs,
                                          B, T, C, c->Vp, &ks->encoder, &ks->encoder_host, fused);
    }  // other stages: dresidual now holds the gradient of this stage's input, for the previous stage
    // (pipelining: after the tied-wte sum, pipeline_step)
    if (model->place.pp == 1) gradients_ready(model, 0, communicate);
    // fused: host goes on
    if (model->comm->kernels_wait && model->place.pp == 1) comm_main_waits(model->comm, &model->comm->dp_group);
    else comm_join(model->comm);
    zero2_end_micro_step(&model->zero2);  // ZeRO-2: this micro-step's reduced parts join the accumulated ones
}

// ZB-H1's W of micro-batch m: the weight gradients gpt2_backward deferred, of every layer of the chunk,
// from the activations in m's slot and the output gradients its B kept. `communicate`: the step's last
// micro-batch: each layer's gradients are then final and its DP reduction starts.
static void gpt2_backward_weights(GPT2* model, int m, int B, int T, int communicate) {
    const Chunk* ck = model->chunk;
    const Activations* a = &ck->slots[m % ck->n_slots];
    check_internal(model->zero.stage < 2, "ZeRO-2 and 3 reduce per micro-batch in backward, not in a deferred W");
    int C = model->config.C, Cl = C / model->place.tp, l0 = ck->l0, Ls = ck->l1 - l0;
    size_t BT = (size_t)B * T;
    Scratch* ks = &model->kernel_scratch.matmul;
    for (int li = Ls - 1; li >= 0; li--) {
        LayerActs la = layer_acts(model, a, li, B, T);
        LayerDouts d = layer_douts(ck->douts, m % ck->n_douts, li, Ls, BT, C, Cl);
        LayerWeights* dw = &model->grads.layers[l0 + li];
        matmul_backward_weight(dw->fcprojw, dw->fcprojb, d.doutput, la.fch_gelu, BT, 4 * Cl, C, ks, &model->kernels);
        matmul_backward_weight(dw->fcw, NULL, d.dfch, la.ln2, BT, C, 4 * Cl, ks, &model->kernels);
        matmul_backward_weight(dw->attprojw, dw->attprojb, d.dresidual2, la.atty, BT, Cl, C, ks, &model->kernels);
        matmul_backward_weight(dw->qkvw, dw->qkvb, d.dqkv, la.ln1, BT, C, 3 * Cl, ks, &model->kernels);
        gradients_ready(model, 1 + l0 + li, communicate);
    }
    if (communicate) comm_join(model->comm);
}

// ----------------------------------------------------------------------------------------------------
// 6. update: the global norm, clipping, loss scaling and AdamW on the owned shard

// The owned ranges of the gradients that the squared norm sums every step (grad_sumsq_on_host): group 1
// holds the tensors split by TP, group 0 the replicated ones.
static void gpt2_init_norm_parts(GPT2* model) {
    const ZeroPlan* z = &model->zero;
    size_t lo, hi, k;
    norm_parts_init(&model->norm_parts, model->layout.num_entries);
    for (int i = 0; i < model->layout.num_entries; i++) {
        const TensorEntry* s = &model->layout.entries[i];
        if (!owned_part(&model->zero, s, &lo, &hi, &k)) continue;
        if (s->kind == WTE && !model->first) continue;  // PP: the tied wte is counted on the first stage only
        norm_parts_add(&model->norm_parts, owned_grads(model, s->bucket) + (lo - owned_start(z, s->bucket)), hi - lo,
                       s->whole.split != SPLIT_NONE);
    }
    norm_parts_finish(&model->norm_parts);
}

// One AdamW step number t (1-based) on the part of every tensor this rank owns; the gradients are multiplied
// first by the verdict's factor (clipping, and 1 / the loss scale), decided on the host or on the device
// (llmc/step_outputs.h; there AdamW also skips itself on the device's verdict).
static void gpt2_adamw_owned(GPT2* model, const OptimizerConfig* o, float lr, int t, const UpdateVerdict* verdict) {
    const ZeroPlan* z = &model->zero;
    size_t lo, hi, k;
    AdamWArgs args = {.lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .weight_decay = 0.0f,
                      .grad_scale = verdict->grad_scale, .t = t, .stochastic = model->stochastic_rounding,
                      .index_base = 0};
    // (passed on ADAMW_BATCH at a time: with --fused-kernels 1 a launch each on the GPU)
    AdamWRange ranges[ADAMW_BATCH];
    int n = 0;
    for (int i = 0; i < model->layout.num_entries; i++) {
        const TensorEntry* s = &model->layout.entries[i];
        if (!owned_part(&model->zero, s, &lo, &hi, &k)) continue;
        size_t in_bucket = lo - owned_start(z, s->bucket);
        ranges[n++] = (AdamWRange){
            .master = owned_master(model, s->bucket) + in_bucket,
            .param_copy = master_is_params(model) ? NULL : owned_params(model, s->bucket) + in_bucket,
            .grad = owned_grads(model, s->bucket) + in_bucket, .m = model->m + k, .v = model->v + k,
            .n = hi - lo, .index_base = lo, .weight_decay = s->decay ? o->weight_decay : 0.0f};
        if (n == ADAMW_BATCH) {
            adamw_update_ranges(ranges, n, args, model->kernels.fused, verdict->on_device);
            n = 0;
        }
    }
    if (n > 0) adamw_update_ranges(ranges, n, args, model->kernels.fused, verdict->on_device);
    zero3_params_changed(&model->zero3);
}

// The optimizer step: clips the gradients by their global norm (clip_grad_norm_ semantics; grad_clip 0
// disables) and takes AdamW step t on the part of the parameters this rank owns (all of them at ZeRO
// stage 0, its chunk of every bucket at stages 1-3, all-gathered at 1 and 2). With a loss scaler
// (llmc/loss_scaler.h; NULL: none) the gradients hold scale x their value: the norm and the update divide
// it out, and if any rank's gradients overflowed the step is skipped everywhere (*skipped = 1; parameters
// and optimizer state untouched). A non-finite loss, or a non-finite norm without loss scaling, updates
// nothing: the run has diverged, and the caller ends it. Every rank reaches the same verdict. The step's
// outputs (llmc/step_outputs.h) decide it on the host or on the device, and give the step's mean loss
// (*loss) and the norm before clipping (returned) afterwards.
static float gpt2_update(GPT2* model, const OptimizerConfig* o, float lr, int t, LossScaler* scaler, int* skipped,
                         double* loss) {
    UpdateVerdict verdict = step_outputs_verdict(&model->outputs, model->comm, &model->norm_parts,
                                                 &model->kernel_scratch.norm, model->place.tp, model->zero.stage,
                                                 scaler, o->grad_clip, model->kernels.fused);
    if (verdict.apply) {
        gpt2_adamw_owned(model, o, lr, t, &verdict);
        zero_gather_params(model->comm, &model->zero, model->params_memory);
        comm_join(model->comm);
    }
    return step_outputs_fetch(&model->outputs, scaler, model->place.dp, loss, skipped);
}

// The parameters as the update of step t left them: each owned range of the master weights rounded the
// way that update rounded it (stochastic rounding depends on the step), then all-gathered. Resume uses
// it, so a BF16 run with stochastic rounding continues bit for bit.
static void gpt2_round_params(GPT2* model, int t) {
    if (master_is_params(model)) return;
    size_t lo, hi, k;
    for (int i = 0; i < model->layout.num_entries; i++) {
        const TensorEntry* s = &model->layout.entries[i];
        if (!owned_part(&model->zero, s, &lo, &hi, &k)) continue;
        floatX* params = owned_params(model, s->bucket) + (lo - owned_start(&model->zero, s->bucket));
        round_params(params, model->master + k, hi - lo, lo, t, model->stochastic_rounding);
    }
    zero3_params_changed(&model->zero3);
    zero_gather_params(model->comm, &model->zero, model->params_memory);
    comm_join(model->comm);
}

// ----------------------------------------------------------------------------------------------------
// 7. the step: forward and backward over an optimizer step's micro-batches, plain or pipelined

// The plain step, one stage (no pipelining): gradient accumulation over M micro-batches, each a forward
// and a backward that adds into the gradients, and its mean loss into the step's outputs. The last
// micro-batch's backward also reduces them across the DP group (at ZeRO-2 every micro-batch's does: see
// gpt2_backward), bucket by bucket as each layer's become final (gradients_ready), so a layer's reduction
// overlaps the backward of the layers below it.
static void plain_step(GPT2* model, DataLoader* loader, int M, long long step, float dloss) {
    const Placement* pl = &model->place;
    Activations* a = &model->chunk->slots[0];
    int B = loader->B, T = loader->T;
    for (int m = 0; m < M; m++) {
        // data-order contract: micro-step s reads s * D + d
        dataloader_load(loader, (step * M + m) * pl->dp + pl->dp_rank);
        stage_token_ids(model, a, loader->inputs, loader->targets, B, T);
        double t0 = trace_now_us(model->tracer);
        gpt2_forward(model, a, B, T, dloss, 1);
        step_outputs_loss(&model->outputs, m, a->losses, B * T);
        trace_add(model->tracer, "forward", "F", m, t0);
        t0 = trace_now_us(model->tracer);
        gpt2_backward(model, a, B, T, m == M - 1);  // DP: the last micro-batch reduces (ZeRO-2, 3: each)
        trace_add(model->tracer, "backward", "B", m, t0);
    }
}

// --- the pipeline step (--pp > 1): one loop over the stage's plan (llmc/pipeline.h), whose steps are
// actions (a forward, a backward or ZB-H1's W of one micro-batch, on its slot) and exchanges (messages to
// and from the neighbouring stages, pipe_sendrecv). Each action works on one chunk of the stage's layers
// (model->chunk: the whole stage but with --virtual-stages), whose messages go round the ring of stages.

// (B, T, C) the last local layer's output
static floatX* stage_output(const GPT2* model, const Activations* a, int B, int T) {
    return layer_output(model, a, model->chunk->l1 - model->chunk->l0 - 1, B, T);
}

// The activations forward and backward of micro-batch m (B, T) work on: its slot. With
// rematerialization the one full work set, starting from the slot's stage input and ids.
static Activations* micro_batch_activations(GPT2* model, int m, int B, int T) {
    Chunk* ck = model->chunk;
    Activations* slot = &ck->slots[m % ck->n_slots];
    if (!model->rematerialize) return slot;
    if (!ck->first) device_copy(ck->work.encoded, slot->encoded, (size_t)B * T * model->config.C * sizeof(floatX));
    stage_token_ids(model, &ck->work, slot->host_inputs, slot->host_targets, B, T);
    return &ck->work;
}

// A forward action: micro-batch m (number `batch` in the data order) is loaded into its slot (every stage
// reads the ids it needs: the first the inputs, the last the targets), and forward runs; its input is
// there (the exchange before it received it). The last stage adds its mean loss to the step's outputs.
static void schedule_forward(GPT2* model, DataLoader* loader, int m, long long batch, float dloss) {
    int B = loader->B, T = loader->T;
    Activations* slot = &model->chunk->slots[m % model->chunk->n_slots];
    dataloader_load(loader, batch);
    stage_token_ids(model, slot, loader->inputs, loader->targets, B, T);
    Activations* a = micro_batch_activations(model, m, B, T);
    gpt2_forward(model, a, B, T, dloss, 1);
    if (model->chunk->last) step_outputs_loss(&model->outputs, m, a->losses, B * T);
}

// A backward action: the gradient of micro-batch m's output is in dresidual (one buffer that every
// activation set shares; the exchange before it received it there, or, staged, into dreceived, which is
// copied over first). Backward runs, after recomputing the forward when the slots are rematerialized, and
// leaves its input's gradient in dresidual. `communicate`: this is the step's last micro-batch, whose
// backward reduces the gradients (see gpt2_backward). ZB-H1 (the chunk has douts): this is B, which keeps
// the output gradients for its W.
static void schedule_backward(GPT2* model, const PipeAction* act, int B, int T, float dloss, int communicate) {
    Chunk* ck = model->chunk;
    int m = act->micro;
    Activations* slot = &ck->slots[m % ck->n_slots];
    if (act->staged) device_copy(slot->dresidual, slot->dreceived, (size_t)B * T * model->config.C * sizeof(floatX));
    Activations* a = micro_batch_activations(model, m, B, T);
    if (model->rematerialize) gpt2_forward(model, a, B, T, dloss, 1);
    model->douts_set = ck->n_douts ? m % ck->n_douts : -1;  // (ZB-H1: a set per B until its W)
    gpt2_backward(model, a, B, T, communicate);
    model->douts_set = -1;
}

// The buffer of a message of an exchange (pipe_sendrecv): an activation goes out of its micro-batch's
// stage output (with rematerialization: the work set's, which its forward has just filled) and into the
// slot's input; a gradient out of dresidual (its backward has just run) and into dresidual, or when the
// plan stages it, into the chunk's dreceived. NULL: the step has no such message.
static floatX* message_buffer(GPT2* model, const PipeMessage* msg, int received, int B, int T) {
    if (msg->peer < 0) return NULL;
    model->chunk = &model->chunks[msg->chunk];
    Chunk* ck = model->chunk;
    Activations* slot = &ck->slots[msg->micro % ck->n_slots];
    check_internal(!(received && msg->staged) || model->n_chunks > 1, "a staged gradient without dreceived");
    if (msg->backward) return received && msg->staged ? slot->dreceived : slot->dresidual;
    if (received) return slot->encoded;
    return stage_output(model, model->rematerialize ? &ck->work : slot, B, T);
}

// PP: wte is tied, the first stage's embedding and the last stage's classifier both use it, so its
// gradient is the sum of the two stages' (an all-reduce over the group of the two); then the embedding
// bucket is final and its DP reduction starts. (Without pipelining the one stage has summed both itself.)
static void sum_tied_embedding_grads(GPT2* model) {
    if (!(model->first || model->last)) return;
    Comm* comm = model->comm;
    double t0 = trace_now_us(model->tracer);
    size_t wte = model->layout.entries[0].numel;  // wte is the first tensor of both stages
    comm_all_reduce(comm, &comm->emb_group, model->grads.wte, wte, DT_FLOATX, REDUCE_SUM);
    comm_join(comm);
    trace_add(model->tracer, "allreduce", "tied wte", -1, t0);
    gradients_ready(model, 0, 1);
    comm_join(comm);
}

// The pipeline step (--pp > 1): this stage runs its plan for one optimizer step of M micro-batches
// (llmc/pipeline.h): receive the input, forward, send the output; receive the output's gradient,
// backward, send the input's gradient (ZB-H1: and later the W's). The last micro-batch's backward (its W)
// reduces the gradients across the DP group as they become final.
static void pipeline_step(GPT2* model, DataLoader* loader, Schedule schedule, int M, long long step, float dloss) {
    const Placement* pl = &model->place;
    int B = loader->B, T = loader->T, V = model->n_chunks;
    PipeStep* plan = (PipeStep*)malloc_check((size_t)pipeline_plan_capacity(M, V) * sizeof(PipeStep));
    int n = pipeline_plan(schedule, pl->pp, pl->pp_rank, M, V, plan);
    double t_start = wall_seconds();
    for (int i = 0; i < n; i++) {
        const PipeStep* st = &plan[i];
        if (st->exchange) {  // (a send's buffer is shared, and waited for, if the next action overwrites it)
            floatX* send = message_buffer(model, &st->send, 0, B, T);
            floatX* recv = message_buffer(model, &st->recv, 1, B, T);
            int shared = st->send.backward || model->rematerialize;
            pipe_sendrecv(model->comm, model->tracer, st, send, recv, shared, (size_t)B * T * model->config.C, V);
            continue;
        }
        int m = st->action.micro;
        long long batch = (step * M + m) * pl->dp + pl->dp_rank;  // data-order contract: micro-step s reads s * D + d
        model->chunk = &model->chunks[st->action.chunk];
        double t0 = trace_now_us(model->tracer);
        if (st->action.kind == PIPE_F)
            schedule_forward(model, loader, m, batch, dloss);
        else if (st->action.kind == PIPE_B)  // (a chunk's last)
            schedule_backward(model, &st->action, B, T, dloss, m == M - 1);
        else  // ZB-H1's W, from the slot and what its B kept
            gpt2_backward_weights(model, m, B, T, m == M - 1);
        trace_action(model->tracer, st->action, V, t0);
    }
    comm_join(model->comm);  // the last sends are done before the slots are used again
    free(plan);
    trace_pipeline_time(model->tracer, wall_seconds() - t_start);  // (--trace: the bubble is measured against it)
    sum_tied_embedding_grads(model);
}

// ----------------------------------------------------------------------------------------------------
// 8. checkpoints, evaluation and sampling

// Saves a checkpoint (collective: every rank calls it): the model in llm.c format (fp32 master weights,
// written by rank 0) and the optimizer state, one file per shard (written by the rank that owns it),
// each file atomically. The data position is the step; the state records the RNG and batch shape.
static void save_checkpoint(GPT2* model, const char* dir, RunState* state, int keep_last) {
    Comm* comm = model->comm;
    const ZeroPlan* z = &model->zero;
    int writes_model = comm->world_rank == 0;
    prepare_checkpoint_save(comm, dir, state);  // (its state checked, its folder made)
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
    // each DP rank writes its parts. TP ranks and pipeline stages hold different tensors: each writes
    // its own shards. What several of them hold alike is written once, so that the shards cover every
    // parameter exactly once: a replicated tensor by TP rank 0, the tied wte by the first stage.
    const Placement* pl = &model->place;
    int per_tp = z->stage == 0 ? 1 : pl->dp;
    state->num_shards = model->place.pp * model->place.tp * per_tp;
    state->shard = (pl->pp_rank * pl->tp + pl->tp_rank) * per_tp + (z->stage == 0 ? 0 : pl->dp_rank);
    if (z->stage > 0 || pl->dp_rank == 0) {
        int64_t* ranges;
        float *m, *v;
        size_t n_ranges = shard_file_runs(&model->layout, z, &model->place, model->m, model->v, &ranges, &m, &v);
        snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, state->step, state->shard);
        state_file_write(path, state, ranges, (int64_t)n_ranges, m, v);
        free(ranges);
        free(m);
        free(v);
    }
    // the checkpoint is complete when every rank is past here (rank 0 may take minutes)
    comm_barrier_io(comm, &comm->world);
    if (writes_model)
        printf("saved checkpoint %s/model_%08lld.bin and %d state shard(s)\n", dir, state->step, state->num_shards);
    // only now: the new one is complete
    if (writes_model && keep_last > 0) prune_checkpoints(dir, state->step, keep_last);
}

// The activations of a forward-only pass (evaluation, sampling) of the current chunk: the first slot,
// or with rematerialization the one full work set (the stage input arrives in it).
static Activations* forward_only_activations(GPT2* model) {
    return model->rematerialize ? &model->chunk->work : &model->chunk->slots[0];
}

// Forward-only through the pipeline (evaluation, sampling), chunk after chunk of this stage: receive the
// chunk's input (B, T, C) from the previous stage, forward, send the output to the next. Each transfer is
// waited for: nothing overlaps outside training. Leaves the stage's last chunk current (the last stage's
// holds the logits). With targets, the last stage brings each position's loss to model->host_losses and
// returns their mean (0 on the others, and without targets).
static float forward_through_stages(GPT2* model, const int* inputs, const int* targets, int B, int T) {
    Comm* comm = model->comm;
    size_t n = (size_t)B * T * model->config.C;
    for (int v = 0; v < model->n_chunks; v++) {
        model->chunk = &model->chunks[v];
        Activations* a = forward_only_activations(model);
        if (!model->chunk->first) {
            comm_recv(comm, &comm->pp_group, a->encoded, n, DT_FLOATX, ring_prev(&model->place));
            comm_join(comm);
        }
        stage_token_ids(model, a, inputs, targets, B, T);
        gpt2_forward(model, a, B, T, 0.0f, targets != NULL);
        if (!model->chunk->last) {
            comm_send(comm, &comm->pp_group, stage_output(model, a, B, T), n, DT_FLOATX, ring_next(&model->place));
            comm_join(comm);
        }
    }
    if (!model->last || targets == NULL) return 0.0f;
    return mean_loss_on_host(model->host_losses, forward_only_activations(model)->losses, (size_t)B * T);
}

// Mean validation loss over max_batches global micro-batches: DP rank d of D evaluates micro-batches
// i*D + d (the data-order contract), and the means are averaged across the DP group.
static float evaluate(GPT2* model, DataLoader* val, int max_batches) {
    Comm* comm = model->comm;
    long long n = val->n_batches < max_batches ? val->n_batches : max_batches;
    double sum = 0.0;
    for (long long i = 0; i < n; i++) {
        dataloader_load(val, i * model->place.dp + model->place.dp_rank);
        sum += forward_through_stages(model, val->inputs, val->targets, val->B, val->T);
    }
    double mean = model->last ? sum / n : 0.0;
    comm_all_reduce_host(comm, &comm->pp_group, &mean, 1, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->dp_group, &mean, 1, REDUCE_AVG);
    return (float)mean;
}

// Multiple-choice accuracy (llmc/run/eval.h) over all examples: DP rank d of D scores examples d, d + D, ...
// Rows (one per completion) are packed many to a forward: the forward is (B*T / Te, Te) with Te the longest
// row, within the activations allocated for (B, T). Forward-only through the pipeline, as evaluate().
// If `dump` is given (main rank), each of this rank's examples' 4 mean losses go there, one line each.
static float evaluate_choices(GPT2* model, const EvalSet* e, const char* path, FILE* dump) {
    Comm* comm = model->comm;
    EvalRows rows = eval_rows(e, model->place.dp_rank, model->place.dp, model->T, path);
    int per_forward = model->B * model->T / rows.Te;
    int* bin = (int*)malloc_check((size_t)per_forward * rows.Te * sizeof(int));
    int* btg = (int*)malloc_check((size_t)per_forward * rows.Te * sizeof(int));
    // every DP rank runs as many (ZeRO-3 gathers in each)
    double forwards = (rows.n_rows + per_forward - 1) / per_forward;
    comm_all_reduce_host(comm, &comm->dp_group, &forwards, 1, REDUCE_MAX);
    for (int r0 = 0; r0 < (int)forwards * per_forward; r0 += per_forward) {
        eval_pack(&rows, r0, per_forward, bin, btg);  // (rows past this rank's: zeros, not counted)
        forward_through_stages(model, bin, btg, per_forward, rows.Te);
        if (model->last) eval_row_means(&rows, r0, per_forward, model->host_losses);
    }
    double counts[2] = {0.0, 0.0};  // right, examples (the last stage's; the others add zeros)
    if (model->last) eval_count(&rows, e, counts, dump);
    if (model->place.tp_rank != 0) counts[0] = counts[1] = 0.0;  // TP ranks hold the same counts: one of them counts
    comm_all_reduce_host(comm, &comm->pp_group, counts, 2, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->tp_group, counts, 2, REDUCE_SUM);
    comm_all_reduce_host(comm, &comm->dp_group, counts, 2, REDUCE_SUM);
    eval_rows_free(&rows);
    free(bin);
    free(btg);
    return (float)(counts[0] / counts[1]);
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
    int Vpl = c->Vp / model->place.tp;
    int* seq = (int*)calloc_check(T * sizeof(int));
    float* probs = (float*)malloc_check(c->Vp * sizeof(float));
    float* logits = (float*)malloc_check(c->Vp * sizeof(float));
    float* sorted = (float*)malloc_check(c->Vp * sizeof(float));
    floatX* row = (floatX*)malloc_check(c->Vp * sizeof(floatX));
    floatX* gathered = (floatX*)device_malloc(c->Vp * sizeof(floatX));  // [TP rank 0's ids | 1's | ...]
    seq[0] = tok->eot;
    if (print) printf("sample: ");
    for (int t = 1; t <= sc->n_prompt; t++) {
        seq[t] = sc->prompt[t - 1];
        if (print) print_sampled_token(tok, seq[t]);
    }
    for (int t = 1 + sc->n_prompt; t < T; t++) {
        forward_through_stages(model, seq, NULL, 1, t);  // PP: the last stage has the logits
        Activations* a = forward_only_activations(model);  // (its last chunk's)
        int next = c->V - 1;
        float r = rng_uniform(rng);  // every rank draws, so all generators stay in step
        if (model->last) {  // TP: each rank has its rows of the vocabulary
            vocab_parallel_logits_row(comm, a->logits + (size_t)(t - 1) * Vpl, c->Vp, c->V, gathered, row, logits);
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
    free(seq);
    free(probs);
    free(logits);
    free(sorted);
    free(row);
}

// ----------------------------------------------------------------------------------------------------
// 9. the memory plan (--plan): one rank built dry

// What a model allocated, by category, and the scratch its kernels allocate on first use for the batch
// shape its activations were allocated for, with elements of `elem_bytes`
static MemoryPlan model_memory(const GPT2* m, size_t elem_bytes) {
    return (MemoryPlan){.params = m->bytes_params, .grads = m->bytes_grads, .optimizer = m->bytes_optimizer,
                        .activations = m->bytes_activations, .workspace = m->bytes_workspace,
                        .kernel_scratch = kernel_scratch_bytes(&m->config, &m->place, m->last, m->B, m->T, elem_bytes,
                                                               &m->kernels),
                        .host = 0};
}

// Builds one rank dry, with elements of `elem_bytes` and the run's kernel choice, and reads off its
// allocation by category. `phases` (PLAN_*): what the run does besides training, for the CPU target's host
// copies (<0: not counted).
static MemoryPlan plan_rank(const GPT2Config* c, const Placement* pl, int B, int T, StageSlots slots, int recompute,
                            int segment, int rematerialize, int phases, size_t elem_bytes,
                            const KernelChoice* kernels) {
    GPT2 model;
    Comm single = comm_single();
    BuildMode dry = {.elem_bytes = elem_bytes, .dry = 1};
    gpt2_build_as(&model, c, &single, pl, &dry, kernels);
    model.recompute = recompute;
    model.recompute_segment = segment;
    allocate_stage_activations(&model, B, T, slots, rematerialize);
    MemoryPlan p = model_memory(&model, elem_bytes);
    if (plan_is_cpu(elem_bytes) && phases >= 0)
        p.host = plan_host_copies(model.num_parameters, model.layout.total, model.zero.shard_total,
                                  !master_is_params(&model) || pl->zero == 3, pl, phases,
                                  p.activations + p.kernel_scratch);
    gpt2_free(&model);
    return p;
}

// ----------------------------------------------------------------------------------------------------
// 10. the training loop

// testing (--fault-inf-rank/--fault-inf-step): one gradient of this rank becomes inf, as an fp16 overflow would
static void inject_inf_gradient(GPT2* model) {
    for (int b = 0; b < model->zero.num_buckets; b++) {
        if (owned_size(&model->zero, b) == 0) continue;
        floatX inf = float_to_floatX(INFINITY);
        copy_to_device(owned_grads(model, b), &inf, sizeof(inf));
        return;
    }
}

// What a training run holds besides its configuration: the model, its data, what it evaluates and
// samples, its log and trace, and the state a checkpoint saves and a resume restores.
typedef struct {
    const TrainConfig* tc;
    Comm* comm;
    int main_rank;             // world rank 0: prints, logs, samples
    GPT2 model;
    RunInputs in;              // data, multiple-choice set, tokenizer, prompt (llmc/run/inputs.h)
    Rng sample_rng;
    LossScaler scaler;
    Logger logger;
    Tracer tracer;
    RunState state;            // what the checkpoint resumed from holds; filled anew at each save
    uint64_t run_id;
    long long start_step;
    long long updates;         // AdamW's step count: skipped steps do not count
    int memory_reported;       // GPU: the plan was compared with the device after the first applied step
    size_t tokens_per_step;    // of the global batch
    double flops_per_token, peak_flops, loop_start;
    float val_loss;            // the last validation loss (NAN: none yet)
} Training;

// This rank's model: its place in the grid (DP rank, TP slice, pipeline stage and the stage's layers),
// its parameters (params, or initialized from --seed when NULL) and, on resume, the AdamW moments m, v.
static void build_rank_model(Training* run, const GPT2Config* config, const float* params, const float* m,
                             const float* v) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    GPT2* model = &run->model;
    Placement place = {.zero = tc->zero, .dp = comm->dp, .dp_rank = comm->dp_rank, .tp = comm->tp,
                       .tp_rank = comm->tp_rank, .pp = comm->pp, .pp_rank = comm->pp_rank};
    place_layers(&place, config->L, tc->pp_split, tc->virtual_stages);  // the stage's layers, or its chunks
    if (tc->kernels.flash_attention) attention_flash_validate(config->C, config->NH, sizeof(floatX), 0);
    gpt2_build(model, config, comm, &place, &tc->kernels);
    model->recompute = tc->recompute;
    model->recompute_segment = tc->recompute_segment;
    if (params) gpt2_set_parameters(model, params);
    else gpt2_init_random(model, tc->seed);
    model->stochastic_rounding = tc->stochastic_rounding;
    if (m) gpt2_set_optimizer_state(model, m, v);
    if (tc->resume && model->stochastic_rounding && run->state.updates > 0)
        gpt2_round_params(model, (int)run->state.updates);
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
    open_run_log(&run->logger, tc, run->comm, &run->model.config, run->model.num_parameters, run->start_step);
}

// The start-up lines: the run's (main rank) and each pipeline stage's memory.
static void print_run_summary(const Training* run) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    const GPT2* model = &run->model;
    if (run->main_rank && !tc->quiet)
        print_run_header(tc, comm, &model->config, model->num_parameters, run->tokens_per_step,
                         run->in.have_train ? &run->in.train : NULL);
    if (!tc->quiet && model->place.dp_rank == 0 && model->place.tp_rank == 0) {  // one line per pipeline stage
        comm_barrier(comm, &comm->pp_group);
        MemoryPlan p = model_memory(model, sizeof(floatX));
        print_stage_memory(&p, &model->place, stage_slots(tc, model->place.pp_rank));
    }
}

// Everything the loop needs, in this order: outputs checked, the start point read (and --attention's default
// made for its model), the ranks agreed on the job, this rank's model built, the inputs opened, the
// activations allocated, the run state restored.
static void training_setup(Training* run, TrainConfig* tc, Comm* comm) {
    memset(run, 0, sizeof(*run));
    run->tc = tc;
    run->comm = comm;
    run->main_rank = comm->world_rank == 0;
    run->val_loss = NAN;
    check_output_paths(tc, run->main_rank);
    GPT2Config config = tc->arch;
    float *params = NULL, *m = NULL, *v = NULL;
    read_start_point(tc, comm->dp, run->main_rank, &run->state, &config, &params, &m, &v);
    tc->kernels.flash_attention = attention_choice(tc->kernels.flash_attention, tc->B, tc->T, config.C, config.NH,
                                                   sizeof(floatX), 0);
    if (comm->world_size > 1) comm_barrier_io(comm, &comm->world);  // every rank has read its model or checkpoint
    check_ranks_agree(tc, comm, &config, &run->state);  // the first collective after it: every rank runs the same job
    run->run_id = tc->resume ? run->state.run_id : new_run_id(comm);
    claim_checkpoint_dir(tc, run->run_id, tc->resume ? run->state.step : 0, run->main_rank);
    check_sizes_given(tc, &config);
    build_rank_model(run, &config, params, m, v);
    free(params);
    free(m);
    free(v);
    if (tc->T > config.maxT) fatal("sequence length T=%d is longer than the model's maxT=%d", tc->T, config.maxT);
    run_inputs_open(&run->in, tc, &config, comm);
    if (run->in.have_train) run->in.data = fingerprint_train_data(&run->in.train);
    check_resumed_data(tc, &run->state, &run->in, run->main_rank);
    // the activations: one set for the plain step, or one slot per micro-batch the pipeline keeps in flight
    allocate_stage_activations(&run->model, tc->B, tc->T, stage_slots(tc, run->model.place.pp_rank), tc->rematerialize);
    // (its clocks are aligned when the first traced step begins)
    if (tc->trace) run->model.tracer = run->model.zero3.tracer = &run->tracer;
    restore_run_state(run);
    run->tokens_per_step = (size_t)run->model.place.dp * tc->B * tc->T * tc->grad_accum;
    run->flops_per_token = 6.0 * run->model.num_parameters + 6.0 * config.L * config.C * tc->T;
    run->peak_flops = device_peak_flops();
    print_run_summary(run);
}

// Validation loss, multiple-choice accuracy and a sample, each every so many steps and at the last.
static void evaluate_and_sample(Training* run, long long step, int last) {
    const TrainConfig* tc = run->tc;
    if (run->in.have_val && (step % tc->val_every == 0 || last)) {
        run->val_loss = evaluate(&run->model, &run->in.val, tc->val_batches);
        if (run->main_rank) printf("step %lld: val loss %.4f\n", step, run->val_loss);
        logger_eval(&run->logger, step, run->val_loss);
    }
    if (tc->eval_data && (step % tc->eval_every == 0 || last)) {
        float accuracy = evaluate_choices(&run->model, &run->in.choices, tc->eval_data, run->in.dump);
        if (run->main_rank)
            printf("step %lld: multiple-choice accuracy %.4f (%d examples)\n", step, accuracy,
                   run->in.choices.n_examples);
        logger_eval_accuracy(&run->logger, step, accuracy);
    }
    // --steps 0 samples once, from the model as given
    if (run->in.have_tok && (step > 0 || tc->steps == 0) && (step % tc->sample_every == 0 || last)) {
        fault_due(&tc->fault, FAULT_SLOW_SAMPLE, run->comm->world_rank, step);  // testing: a long sample
        gpt2_sample(&run->model, &run->in.tok, &run->sample_rng, &run->in.sample, run->main_rank);
    }
}

// The run state a checkpoint saved after `step` holds, for a resume to continue exactly from it.
static void fill_run_state(Training* run, long long step) {
    const TrainConfig* tc = run->tc;
    const LossScaler* ls = &run->scaler;
    run->state = (RunState){.config = run->model.config, .B = run->model.place.dp * tc->B, .T = tc->T,
                            .grad_accum = tc->grad_accum, .shuffle = tc->shuffle, .step = step,
                            .sample_rng = run->sample_rng.state, .model_hash = 0, .data_seed = tc->seed, .shard = 0,
                            .num_shards = 0, .zero_stage = tc->zero, .dp = run->model.place.dp, .updates = run->updates,
                            .loss_scale = ls->scale, .scale_good_steps = ls->good_steps,
                            .scale_hysteresis_left = ls->hysteresis_left, .run_id = run->run_id,
                            .data_hash = run->in.data.hash, .data_tokens = run->in.data.tokens,
                            .data_files = run->in.data.files, .version = run->state.version};
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
        fault_due(&tc->fault, FAULT_SLOW_SAVE, run->comm->world_rank, step);  // testing: slow storage
        save_checkpoint(&run->model, tc->checkpoint_dir, &run->state, tc->keep_last);
    }
    if (stop_sig && !last) report_signal_stop(tc, run->comm, stop_sig, step);
    return stopping;
}

typedef struct {
    double loss;     // the mean loss of the global batch
    float norm, lr;  // the gradient norm before clipping, the learning rate
    double ms;       // the step's time
    int skipped;     // the gradients overflowed under loss scaling: nothing was updated
} StepResult;

// One optimizer step after `step`: forward and backward over its micro-batches (plain_step, or
// pipeline_step with --pp > 1), then the update. A non-finite loss, or a non-finite norm without loss
// scaling, ends the run (end_diverged); an overflow under loss scaling skips the step on every rank. The
// loss goes to losses[step] if given.
static StepResult train_step(Training* run, long long step, float* losses, long long max_losses) {
    const TrainConfig* tc = run->tc;
    Comm* comm = run->comm;
    GPT2* model = &run->model;
    StepResult r = {.loss = 0.0, .norm = 0.0f, .lr = 0.0f, .ms = 0.0, .skipped = 0};
    double t0 = wall_seconds();
    trace_step_begin(&run->tracer, comm, tc->trace != NULL, step - run->start_step, tc->trace_steps,
                     tc->fault.clock_skew);
    gpt2_zero_grad(model);
    step_outputs_begin(&model->outputs, tc->grad_accum);
    // each position's weight in the mean loss of the global batch, times the loss scale
    float dloss = loss_scale(&run->scaler) / (float)run->tokens_per_step;
    if (model->place.pp == 1) plain_step(model, &run->in.train, tc->grad_accum, step, dloss);
    else pipeline_step(model, &run->in.train, tc->pipe_schedule, tc->grad_accum, step, dloss);
    if (fault_due(&tc->fault, FAULT_INF_GRADIENT, comm->world_rank, step + 1)) inject_inf_gradient(model);
    r.lr = learning_rate(tc, step);
    double t_opt = trace_now_us(&run->tracer);
    float scale_before = loss_scale(&run->scaler);
    r.norm = gpt2_update(model, &tc->opt, r.lr, (int)(run->updates + 1), &run->scaler, &r.skipped, &r.loss);
    trace_add(&run->tracer, "optimizer", "AdamW", -1, t_opt);
    end_if_loss_diverged(comm, step + 1, r.loss);  // (the verdict has updated nothing then)
    if (losses && step < max_losses) losses[step] = (float)r.loss;
    if (r.skipped) {
        if (run->main_rank)
            printf("step %lld: gradients overflowed (inf/nan): step skipped on every rank, loss scale %g -> %g\n",
                   step + 1, scale_before, loss_scale(&run->scaler));
        logger_skip(&run->logger, step + 1, loss_scale(&run->scaler));
    } else if (!isfinite(r.norm)) {  // no loss scaling: gpt2_update changed nothing
        char why[64];
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
    // the plan against what the device reports, on every rank (stages differ)
    if (!run->memory_reported && !tc->quiet) {
        run->memory_reported = 1;
        MemoryPlan p = plan_rank(&run->model.config, &run->model.place, tc->B, tc->T,
                                 stage_slots(tc, run->model.place.pp_rank), tc->recompute, tc->recompute_segment,
                                 tc->rematerialize, -1, sizeof(floatX), &run->model.kernels);
        print_device_memory_vs_plan(&p, run->comm);
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
        save_final_model(run->comm, tc, &model->config, buf);
        free(buf);
    }
    if (tc->trace)
        pipeline_trace_finish(&run->tracer, tc->trace, tc->pipe_schedule, tc->grad_accum, tc->virtual_stages,
                              model->zero.stage, run->comm);
    free(run->tracer.events);
    logger_close(&run->logger);
    run_inputs_free(&run->in, tc);
    gpt2_free(model);
}

// Trains as configured, as one rank of `comm`. If losses != NULL, the mean training loss of each step
// (over the whole DP group) is stored there at index step, up to max_losses, so tests can compare runs.
// Returns the last validation loss (or NAN).
static float train(const TrainConfig* given, Comm* comm, float* losses, long long max_losses) {
    TrainConfig resolved = *given;  // with the kernel choice made for the model (training_setup)
    const TrainConfig* tc = &resolved;
    Training run;
    training_setup(&run, &resolved, comm);
    int stop_sig = 0;  // a stop signal every rank knows of (agreed after each step)
    run.loop_start = wall_seconds();
    stop_signal_install();
    for (long long step = run.start_step; step <= tc->steps; step++) {
        int last = step == tc->steps;
        // the run that saved the checkpoint we resumed from has evaluated and sampled at this step, just
        // before saving (the sampling generator in the checkpoint is past that sample): not again
        if (!(tc->resume && step == run.start_step)) evaluate_and_sample(&run, step, last);
        if (checkpoint_if_due(&run, step, last, stop_sig) || last) break;
        fault_due(&tc->fault, FAULT_KILL, comm->world_rank, step);
        StepResult r = train_step(&run, step, losses, max_losses);
        stop_sig = stop_signal_agreed(comm);
        if (!r.skipped) report_step(&run, step, &r);
        if (fault_due(&tc->fault, FAULT_WAIT_SIGNAL, comm->world_rank, step + 1) && !stop_sig)  // (step + 1 is done)
            stop_sig = stop_signal_wait(comm, step + 1, 60.0);
    }
    training_finish(&run);
    return run.val_loss;
}

// ----------------------------------------------------------------------------------------------------
// 11. main

#ifndef TRAIN_GPT_NO_MAIN
int main(int argc, char** argv) {
    TrainConfig tc;
    parse_args(&tc, argc, argv);
    check_omp_threads();  // before the first parallel loop
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (run_tool(&tc, plan_rank)) return 0;  // --encode, --print-schedule, --plan: no ranks, no training
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
