/*
 * train_gpt.cu: GPT-2 training in one readable file, from one source for two targets.
 *
 *   GPU: nvcc, CUDA kernels and cuBLASLt, floatX = bf16 (PRECISION=BF16) or float (PRECISION=FP32)
 *   CPU: g++ -x c++ -DLLMC_CPU, the same code with the CPU reference loops and OpenMP, floatX = float
 *
 * What is here, top to bottom:
 *   1. the parameter layout: one flat buffer, and a pointer table into it
 *   2. the activations: one flat buffer, and a pointer table into it
 *   3. the model: build, initialize or load, forward, backward, optimizer update
 *   4. checkpoints (model + optimizer + data position + RNG) and sampling
 *   5. the training loop and the command line
 * Every layer's math lives in llmc/<layer>.h, CPU reference and CUDA kernels side by side.
 *
 * Parameters are laid out in memory layer by layer (wte, wpe, then for each layer its 12 tensors, then
 * lnfw, lnfb), not in the file's tensor-by-tensor order: a layer's parameters and gradients are one
 * contiguous range, which is what the parallel modes slice, communicate and shard. Conversion to the
 * llm.c file order happens only when reading and writing files.
 */
#include "llmc/adamw.h"
#include "llmc/attention.h"
#include "llmc/checkpoint.h"
#include "llmc/classifier.h"
#include "llmc/common.h"
#include "llmc/dataloader.h"
#include "llmc/device.h"
#include "llmc/encoder.h"
#include "llmc/gelu.h"
#include "llmc/global_norm.h"
#include "llmc/layernorm.h"
#include "llmc/logger.h"
#include "llmc/matmul.h"
#include "llmc/residual.h"
#include "llmc/tokenizer.h"

#include <sys/stat.h>

// ----------------------------------------------------------------------------------------------------
// 1. parameter layout

// the 12 tensors of one transformer block, in file order (file kinds 2..13)
enum { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, NUM_LAYER_TENSORS };

typedef struct {
    floatX *ln1w, *ln1b;          // (C)
    floatX *qkvw, *qkvb;          // (3C, C), (3C)
    floatX *attprojw, *attprojb;  // (C, C), (C)
    floatX *ln2w, *ln2b;          // (C)
    floatX *fcw, *fcb;            // (4C, C), (4C)
    floatX *fcprojw, *fcprojb;    // (C, 4C), (C)
} LayerWeights;
static_assert(sizeof(LayerWeights) == NUM_LAYER_TENSORS * sizeof(floatX*), "LayerWeights is a table of 12 pointers");

typedef struct {
    floatX* wte;  // (Vp, C) token embedding, tied with the classifier
    floatX* wpe;  // (maxT, C) position embedding
    LayerWeights* layers;  // [L]
    floatX *lnfw, *lnfb;   // (C) final LayerNorm
} Weights;

// One tensor's place in the flat buffer. Offsets are rounded up to 64 elements so every tensor starts
// 128-byte aligned (cuBLASLt's fast paths); the gaps are zero and stay zero.
typedef struct {
    int kind;   // file tensor index 0..15 (see FILE_TENSOR_NAMES)
    int layer;  // 0..L-1 for per-layer tensors, 0 otherwise
    size_t offset, numel;
    int decay;  // weight decay applies (2-D weights: wte, wpe, qkvw, attprojw, fcw, fcprojw)
} TensorSlot;

typedef struct {
    int num_slots;  // 12 L + 4, in memory order
    TensorSlot* slots;
    size_t total;  // elements of the flat buffer, gaps included
} ParamLayout;

// memory order: wte, wpe, layer 0 .. layer L-1, lnfw, lnfb
static int slot_index(const GPT2Config* c, int kind, int layer) {
    if (kind < 2) return kind;
    if (kind >= 14) return 2 + NUM_LAYER_TENSORS * c->L + (kind - 14);
    return 2 + layer * NUM_LAYER_TENSORS + (kind - 2);
}

static ParamLayout build_layout(const GPT2Config* c) {
    ParamLayout lay;
    lay.num_slots = NUM_LAYER_TENSORS * c->L + 4;
    lay.slots = (TensorSlot*)malloc_check(lay.num_slots * sizeof(TensorSlot));
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++) {
        int layers = file_tensor_is_per_layer(kind) ? c->L : 1;
        for (int l = 0; l < layers; l++) {
            TensorSlot* s = &lay.slots[slot_index(c, kind, l)];
            s->kind = kind;
            s->layer = l;
            s->numel = file_tensor_numel(c, kind);
            s->decay = kind == 0 || kind == 1 || kind == 4 || kind == 6 || kind == 10 || kind == 12;
        }
    }
    size_t offset = 0;
    for (int i = 0; i < lay.num_slots; i++) {
        lay.slots[i].offset = offset;
        offset = round_up(offset + lay.slots[i].numel, 64);
    }
    lay.total = offset;
    return lay;
}

static Weights point_weights(const GPT2Config* c, const ParamLayout* lay, floatX* base) {
    Weights w;
    w.wte = base + lay->slots[slot_index(c, 0, 0)].offset;
    w.wpe = base + lay->slots[slot_index(c, 1, 0)].offset;
    w.lnfw = base + lay->slots[slot_index(c, 14, 0)].offset;
    w.lnfb = base + lay->slots[slot_index(c, 15, 0)].offset;
    w.layers = (LayerWeights*)malloc_check(c->L * sizeof(LayerWeights));
    for (int l = 0; l < c->L; l++) {
        floatX** table = (floatX**)&w.layers[l];
        for (int j = 0; j < NUM_LAYER_TENSORS; j++) table[j] = base + lay->slots[slot_index(c, 2 + j, l)].offset;
    }
    return w;
}

// memory layout <-> llm.c file order, for float buffers on the host
static void layout_to_file_order(const GPT2Config* c, const ParamLayout* lay, const float* mem, float* file) {
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++)
        for (int l = 0; l < (file_tensor_is_per_layer(kind) ? c->L : 1); l++) {
            const TensorSlot* s = &lay->slots[slot_index(c, kind, l)];
            memcpy(file + pos, mem + s->offset, s->numel * sizeof(float));
            pos += s->numel;
        }
}
static void file_order_to_layout(const GPT2Config* c, const ParamLayout* lay, const float* file, float* mem) {
    memset(mem, 0, lay->total * sizeof(float));
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++)
        for (int l = 0; l < (file_tensor_is_per_layer(kind) ? c->L : 1); l++) {
            const TensorSlot* s = &lay->slots[slot_index(c, kind, l)];
            memcpy(mem + s->offset, file + pos, s->numel * sizeof(float));
            pos += s->numel;
        }
}

// ----------------------------------------------------------------------------------------------------
// 2. activations

typedef struct {
    floatX* encoded;                        // (B, T, C)
    floatX* ln1;                            // (L, B, T, C)
    float *ln1_mean, *ln1_rstd;             // (L, B, T)
    floatX* qkv;                            // (L, B, T, 3C)
    floatX* atty;                           // (L, B, T, C) attention output, before the projection
    floatX* att;                            // (L, B, NH, T, T) attention probabilities
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
} Activations;

typedef struct {
    void** ptr;
    size_t bytes;
} BufferSpec;

// Lays out `n` buffers in one allocation (256-byte aligned each); returns the base pointer.
static void* allocate_buffers(BufferSpec* specs, int n, size_t* total_bytes) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += round_up(specs[i].bytes, 256);
    char* base = (char*)device_malloc(total);
    device_memset_zero(base, total);
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
    floatX* params_memory;  // (layout.total) what forward and backward read
    floatX* grads_memory;   // (layout.total)
    float* master;          // (layout.total) fp32 master weights; == params_memory in FP32 builds
    float *m, *v;           // (layout.total) AdamW moments
    Weights params, grads;
    Activations acts;
    void* acts_memory;
    int B, T;  // the batch shape activations were allocated for (0: not yet)
    size_t bytes_params, bytes_grads, bytes_optimizer, bytes_activations;
    int* host_inputs;   // (B, T) the last forward's token ids (the GPU encoder backward groups them)
    float* host_losses; // (B, T)
} GPT2;

static int master_is_params(void) { return sizeof(floatX) == sizeof(float); }

static void gpt2_build(GPT2* model, const GPT2Config* c) {
    memset(model, 0, sizeof(*model));
    validate_config(c, "model");
    model->config = *c;
    model->layout = build_layout(c);
    model->num_parameters = gpt2_num_parameters(c);
    size_t n = model->layout.total;
    model->params_memory = (floatX*)device_malloc(n * sizeof(floatX));
    model->grads_memory = (floatX*)device_malloc(n * sizeof(floatX));
    model->master = master_is_params() ? (float*)model->params_memory : (float*)device_malloc(n * sizeof(float));
    model->m = (float*)device_malloc(n * sizeof(float));
    model->v = (float*)device_malloc(n * sizeof(float));
    device_memset_zero(model->params_memory, n * sizeof(floatX));
    device_memset_zero(model->grads_memory, n * sizeof(floatX));
    device_memset_zero(model->master, n * sizeof(float));
    device_memset_zero(model->m, n * sizeof(float));
    device_memset_zero(model->v, n * sizeof(float));
    model->params = point_weights(c, &model->layout, model->params_memory);
    model->grads = point_weights(c, &model->layout, model->grads_memory);
    model->bytes_params = n * sizeof(floatX);
    model->bytes_grads = n * sizeof(floatX);
    model->bytes_optimizer = (master_is_params() ? 2 : 3) * n * sizeof(float);
}

static void gpt2_free(GPT2* model) {
    device_free(model->params_memory);
    device_free(model->grads_memory);
    if (!master_is_params()) device_free(model->master);
    device_free(model->m);
    device_free(model->v);
    if (model->acts_memory) device_free(model->acts_memory);
    free(model->params.layers);
    free(model->grads.layers);
    free(model->layout.slots);
    free(model->host_inputs);
    free(model->host_losses);
}

// parameters from a host float array in file order (into the master weights, and their floatX copy)
static void gpt2_set_parameters(GPT2* model, const float* file_order) {
    float* mem = (float*)malloc_check(model->layout.total * sizeof(float));
    file_order_to_layout(&model->config, &model->layout, file_order, mem);
    if (!master_is_params()) copy_to_device(model->master, mem, model->layout.total * sizeof(float));
    upload_floats(model->params_memory, mem, model->layout.total);
    free(mem);
}

// a float buffer laid out like the parameters (floatX or float) -> host float array in file order
static void gpt2_export(const GPT2* model, const void* buffer, int is_floatX, float* file_order) {
    size_t n = model->layout.total;
    float* mem = (float*)malloc_check(n * sizeof(float));
    if (is_floatX) download_floats(mem, (const floatX*)buffer, n);
    else copy_to_host(mem, buffer, n * sizeof(float));
    layout_to_file_order(&model->config, &model->layout, mem, file_order);
    free(mem);
}

// GPT-2 initialization: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0,
// LayerNorm weights 1; padded vocabulary rows 0. Drawn in file order from one seeded generator.
static void gpt2_init_random(GPT2* model, uint64_t seed) {
    const GPT2Config* c = &model->config;
    float* p = (float*)malloc_check(model->num_parameters * sizeof(float));
    Rng rng = {seed};
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++) {
        for (int l = 0; l < (file_tensor_is_per_layer(kind) ? c->L : 1); l++) {
            size_t n = file_tensor_numel(c, kind);
            int is_ln_weight = kind == 2 || kind == 8 || kind == 14;
            int is_matrix = kind == 0 || kind == 1 || kind == 4 || kind == 6 || kind == 10 || kind == 12;
            float std = (kind == 6 || kind == 12) ? 0.02f / sqrtf(2.0f * c->L) : 0.02f;
            for (size_t i = 0; i < n; i++) {
                float value = is_ln_weight ? 1.0f : is_matrix ? std * rng_normal(&rng) : 0.0f;
                if (kind == 0 && i >= (size_t)c->V * c->C) value = 0.0f;  // padded rows of wte
                p[pos + i] = value;
            }
            pos += n;
        }
    }
    gpt2_set_parameters(model, p);
    free(p);
}

static void gpt2_allocate_activations(GPT2* model, int B, int T) {
    const GPT2Config* c = &model->config;
    if (T > c->maxT) fatal("sequence length T=%d is longer than the model's maxT=%d", T, c->maxT);
    size_t L = c->L, C = c->C, NH = c->NH, Vp = c->Vp, BT = (size_t)B * T;
    Activations* a = &model->acts;
    size_t fx = sizeof(floatX), f = sizeof(float);
    BufferSpec specs[] = {
        {(void**)&a->encoded, BT * C * fx},       {(void**)&a->ln1, L * BT * C * fx},
        {(void**)&a->ln1_mean, L * BT * f},       {(void**)&a->ln1_rstd, L * BT * f},
        {(void**)&a->qkv, L * BT * 3 * C * fx},   {(void**)&a->atty, L * BT * C * fx},
        {(void**)&a->att, L * B * NH * T * T * fx}, {(void**)&a->residual2, L * BT * C * fx},
        {(void**)&a->ln2, L * BT * C * fx},       {(void**)&a->ln2_mean, L * BT * f},
        {(void**)&a->ln2_rstd, L * BT * f},       {(void**)&a->fch, L * BT * 4 * C * fx},
        {(void**)&a->fch_gelu, L * BT * 4 * C * fx}, {(void**)&a->residual3, L * BT * C * fx},
        {(void**)&a->lnf, BT * C * fx},           {(void**)&a->lnf_mean, BT * f},
        {(void**)&a->lnf_rstd, BT * f},           {(void**)&a->logits, BT * Vp * fx},
        {(void**)&a->losses, BT * f},             {(void**)&a->scratch, BT * C * fx},
        {(void**)&a->dresidual, BT * C * fx},     {(void**)&a->dwide, BT * 4 * C * fx},
        {(void**)&a->inputs, BT * sizeof(int)},   {(void**)&a->targets, BT * sizeof(int)},
    };
    model->acts_memory = allocate_buffers(specs, sizeof(specs) / sizeof(specs[0]), &model->bytes_activations);
    model->B = B;
    model->T = T;
    model->host_inputs = (int*)malloc_check(BT * sizeof(int));
    model->host_losses = (float*)malloc_check(BT * sizeof(float));
}

// Forward pass over inputs (B, T) (host ids). With targets, returns the mean loss; with dloss != 0 it
// also leaves dlogits (scaled by dloss) in acts.logits for gpt2_backward. Without targets (inference)
// acts.logits holds the logits and the return value is 0. B and T may be smaller than allocated.
static float gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss) {
    const GPT2Config* c = &model->config;
    if (model->B == 0) gpt2_allocate_activations(model, B, T);
    if (B * T > model->B * model->T || T > model->T) fatal("internal error: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    int L = c->L, C = c->C, NH = c->NH, Vp = c->Vp;
    size_t BT = (size_t)B * T;
    Activations* a = &model->acts;
    copy_to_device(a->inputs, inputs, BT * sizeof(int));
    memcpy(model->host_inputs, inputs, BT * sizeof(int));
    if (targets) copy_to_device(a->targets, targets, BT * sizeof(int));

    encoder_forward(a->encoded, a->inputs, model->params.wte, model->params.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        const LayerWeights* w = &model->params.layers[l];
        floatX* residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * BT * C;  // (B, T, C) this layer's input
        floatX* ln1 = a->ln1 + l * BT * C;
        float* ln1_mean = a->ln1_mean + l * BT;
        float* ln1_rstd = a->ln1_rstd + l * BT;
        floatX* qkv = a->qkv + l * BT * 3 * C;
        floatX* atty = a->atty + l * BT * C;
        floatX* att = a->att + (size_t)l * B * NH * T * T;
        floatX* residual2 = a->residual2 + l * BT * C;
        floatX* ln2 = a->ln2 + l * BT * C;
        float* ln2_mean = a->ln2_mean + l * BT;
        float* ln2_rstd = a->ln2_rstd + l * BT;
        floatX* fch = a->fch + l * BT * 4 * C;
        floatX* fch_gelu = a->fch_gelu + l * BT * 4 * C;
        floatX* residual3 = a->residual3 + l * BT * C;

        // attention block: residual2 = residual + attproj(attention(ln1(residual)))
        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, w->ln1w, w->ln1b, BT, C);
        matmul_forward(qkv, ln1, w->qkvw, w->qkvb, BT, C, 3 * C);
        attention_forward(atty, att, qkv, B, T, C, NH);
        matmul_forward(a->scratch, atty, w->attprojw, w->attprojb, BT, C, C);
        residual_forward(residual2, residual, a->scratch, BT * C);
        // MLP block: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2))))
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, w->ln2w, w->ln2b, BT, C);
        matmul_forward(fch, ln2, w->fcw, w->fcb, BT, C, 4 * C);
        gelu_forward(fch_gelu, fch, BT * 4 * C);
        matmul_forward(a->scratch, fch_gelu, w->fcprojw, w->fcprojb, BT, 4 * C, C);
        residual_forward(residual3, residual2, a->scratch, BT * C);
    }
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->residual3 + (L - 1) * BT * C, model->params.lnfw,
                      model->params.lnfb, BT, C);
    matmul_forward(a->logits, a->lnf, model->params.wte, NULL, BT, C, Vp);  // tied: logits = lnf . wte^T
    if (targets == NULL) return 0.0f;

    classifier_forward_backward(a->logits, a->losses, a->targets, dloss, BT, c->V, Vp);
    copy_to_host(model->host_losses, a->losses, BT * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += model->host_losses[i];
    return (float)(sum / BT);
}

static void gpt2_zero_grad(GPT2* model) { device_memset_zero(model->grads_memory, model->layout.total * sizeof(floatX)); }

// Backward pass for the last gpt2_forward (which must have had targets and dloss != 0). Gradients are
// accumulated (+=) into model->grads, so micro-steps of gradient accumulation simply add up.
static void gpt2_backward(GPT2* model, int B, int T) {
    const GPT2Config* c = &model->config;
    int L = c->L, C = c->C, NH = c->NH, Vp = c->Vp;
    size_t BT = (size_t)B * T;
    Activations* a = &model->acts;
    Weights* p = &model->params;
    Weights* g = &model->grads;

    // classifier: the fused kernel already turned logits into dlogits
    matmul_backward(a->scratch, g->wte, NULL, a->logits, a->lnf, p->wte, BT, C, Vp);  // dlnf (=), dwte (+=)
    // final LayerNorm: it writes (+=) into dresidual, which starts at zero
    device_memset_zero(a->dresidual, BT * C * sizeof(floatX));
    layernorm_backward(a->dresidual, g->lnfw, g->lnfb, a->scratch, a->residual3 + (L - 1) * BT * C, p->lnfw, a->lnf_mean,
                       a->lnf_rstd, BT, C);

    for (int l = L - 1; l >= 0; l--) {
        const LayerWeights* w = &p->layers[l];
        LayerWeights* dw = &g->layers[l];
        floatX* residual = l == 0 ? a->encoded : a->residual3 + (l - 1) * BT * C;
        floatX* ln1 = a->ln1 + l * BT * C;
        floatX* qkv = a->qkv + l * BT * 3 * C;
        floatX* atty = a->atty + l * BT * C;
        floatX* att = a->att + (size_t)l * B * NH * T * T;
        floatX* residual2 = a->residual2 + l * BT * C;
        floatX* ln2 = a->ln2 + l * BT * C;
        floatX* fch = a->fch + l * BT * 4 * C;
        floatX* fch_gelu = a->fch_gelu + l * BT * 4 * C;

        // MLP block; dresidual holds d(residual3) and flows through the residual add unchanged
        matmul_backward(a->dwide, dw->fcprojw, dw->fcprojb, a->dresidual, fch_gelu, w->fcprojw, BT, 4 * C, C);  // dfch_gelu =
        gelu_backward(a->dwide, fch, a->dwide, BT * 4 * C);                                                     // dfch = (in place)
        matmul_backward(a->scratch, dw->fcw, dw->fcb, a->dwide, ln2, w->fcw, BT, C, 4 * C);                     // dln2 =
        layernorm_backward(a->dresidual, dw->ln2w, dw->ln2b, a->scratch, residual2, w->ln2w, a->ln2_mean + l * BT,
                           a->ln2_rstd + l * BT, BT, C);                                                        // dresidual2 +=
        // attention block
        matmul_backward(a->scratch, dw->attprojw, dw->attprojb, a->dresidual, atty, w->attprojw, BT, C, C);    // datty =
        attention_backward(a->dwide, a->scratch, qkv, att, B, T, C, NH);                                        // dqkv =
        matmul_backward(a->scratch, dw->qkvw, dw->qkvb, a->dwide, ln1, w->qkvw, BT, C, 3 * C);                  // dln1 =
        layernorm_backward(a->dresidual, dw->ln1w, dw->ln1b, a->scratch, residual, w->ln1w, a->ln1_mean + l * BT,
                           a->ln1_rstd + l * BT, BT, C);                                                        // dresidual +=
        // Layer l's parameter gradients are final here (for this micro-step): the point where data
        // parallelism can start reducing them while the layers below are still in backward.
    }
    encoder_backward(g->wte, g->wpe, a->dresidual, a->inputs, model->host_inputs, B, T, C);
}

typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} OptimizerConfig;

// Clips the gradients by their global norm (clip_grad_norm_ semantics; grad_clip 0 disables) and takes
// one AdamW step number t (1-based). Returns the norm before clipping.
static float gpt2_update(GPT2* model, const OptimizerConfig* o, float lr, int t) {
    float norm = global_norm(model->grads_memory, model->layout.total);
    float clip_coef = o->grad_clip > 0.0f ? o->grad_clip / (norm + 1e-6f) : 1.0f;
    AdamWArgs args = {lr, o->beta1, o->beta2, o->eps, 0.0f, clip_coef < 1.0f ? clip_coef : 1.0f, t};
    floatX* copy = master_is_params() ? NULL : model->params_memory;
    for (int i = 0; i < model->layout.num_slots; i++) {
        const TensorSlot* s = &model->layout.slots[i];
        args.weight_decay = s->decay ? o->weight_decay : 0.0f;
        adamw_update(model->master + s->offset, copy ? copy + s->offset : NULL, model->grads_memory + s->offset,
                     model->m + s->offset, model->v + s->offset, s->numel, args);
    }
    return norm;
}

// ----------------------------------------------------------------------------------------------------
// 4. checkpoints and sampling

// Saves model (llm.c format, fp32 master weights) and state (optimizer, data position, RNG), each atomically.
static void save_checkpoint(const GPT2* model, const char* dir, RunState* state) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("cannot create checkpoint folder '%s': %s", dir, strerror(errno));
    char model_path[4096], state_path[4096];
    snprintf(model_path, sizeof(model_path), "%s/model_%08lld.bin", dir, state->step);
    snprintf(state_path, sizeof(state_path), "%s/state_%08lld.bin", dir, state->step);
    size_t n = model->num_parameters;
    float* buf = (float*)malloc_check(n * sizeof(float));
    float* buf2 = (float*)malloc_check(n * sizeof(float));
    gpt2_export(model, model->master, 0, buf);
    state->model_hash = model_file_write(model_path, &model->config, buf);
    gpt2_export(model, model->m, 0, buf);
    gpt2_export(model, model->v, 0, buf2);
    state_file_write(state_path, state, buf, buf2);
    free(buf);
    free(buf2);
    printf("saved checkpoint %s and %s\n", model_path, state_path);
}

// the state file of the newest checkpoint in dir (the highest step), or fatal if there is none
static void find_latest_checkpoint(const char* dir, char* state_path, size_t size) {
    char pattern[4096];
    snprintf(pattern, sizeof(pattern), "%s/state_*.bin", dir);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) fatal("no checkpoint (state_*.bin) found in '%s'", dir);
    snprintf(state_path, size, "%s", g.gl_pathv[g.gl_pathc - 1]);  // zero-padded steps: sorted by name = by step
    globfree(&g);
}

// Generates `len` tokens after an end-of-text token and prints them. Reads logits at the last position
// of a full forward over the sequence so far (no KV cache: clear, and cheap at these lengths).
static void gpt2_sample(GPT2* model, const Tokenizer* tok, Rng* rng, int len) {
    const GPT2Config* c = &model->config;
    int T = len + 1 < model->T ? len + 1 : model->T;
    int* seq = (int*)calloc_check(T * sizeof(int));
    float* probs = (float*)malloc_check(c->Vp * sizeof(float));
    floatX* row = (floatX*)malloc_check(c->Vp * sizeof(floatX));
    seq[0] = tok ? tok->eot : c->V - 1;
    printf("sample: ");
    for (int t = 1; t < T; t++) {
        gpt2_forward(model, seq, NULL, 1, t, 0.0f);
        copy_to_host(row, model->acts.logits + (size_t)(t - 1) * c->Vp, c->Vp * sizeof(floatX));
        float maxv = -INFINITY;
        for (int i = 0; i < c->V; i++) maxv = fmaxf(maxv, floatX_to_float(row[i]));
        double sum = 0.0;
        for (int i = 0; i < c->V; i++) sum += probs[i] = expf(floatX_to_float(row[i]) - maxv);
        double r = rng_uniform(rng) * sum, acc = 0.0;
        int next = c->V - 1;
        for (int i = 0; i < c->V; i++) {
            acc += probs[i];
            if (r < acc) { next = i; break; }
        }
        seq[t] = next;
        if (tok) tokenizer_print(tok, next);
        else printf("%d ", next);
        fflush(stdout);
    }
    printf("\n");
    free(seq);
    free(probs);
    free(row);
}

// ----------------------------------------------------------------------------------------------------
// 5. training loop

typedef struct {
    // data
    const char* train_data;
    const char* val_data;
    const char* tokenizer;
    int shuffle;
    // model: from a file, or from scratch with these sizes
    const char* model_file;
    GPT2Config arch;
    uint64_t seed;
    // batch
    int B, T, grad_accum;
    // optimization
    long long steps;
    long long stop_after;  // end this run after this step (0: run to --steps); the schedule still plans for steps
    OptimizerConfig opt;
    int warmup;
    const char* schedule;  // cosine | linear | constant
    float lr_min_frac;
    // evaluation, sampling, checkpoints, logs
    int val_every, val_batches, sample_every, sample_len;
    int save_every;
    const char* checkpoint_dir;
    const char* resume;  // checkpoint folder to resume from, or NULL
    const char* log_file;
    const char* save_model;  // write the final model here (llm.c format), or NULL
    int quiet;               // no per-step lines (tests)
} TrainConfig;

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

static float evaluate(GPT2* model, DataLoader* val, int max_batches) {
    long long n = val->n_batches < max_batches ? val->n_batches : max_batches;
    double sum = 0.0;
    for (long long k = 0; k < n; k++) {
        dataloader_load(val, k);
        sum += gpt2_forward(model, val->inputs, val->targets, val->B, val->T, 0.0f);
    }
    return (float)(sum / n);
}

// peak dense BF16 tensor throughput of known GPUs, for MFU (0: unknown, MFU not printed)
static double gpu_peak_flops(void) {
#ifdef LLMC_CPU
    return 0.0;
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (prop.major == 9 && prop.minor == 0) return 989e12;  // H100 SXM / H200
    if (prop.major == 8 && prop.minor == 0) return 312e12;  // A100
    return 0.0;
#endif
}

// Trains as configured. If losses != NULL, the mean training loss of each step is stored there (at
// index step, up to max_losses) so tests can compare runs. Returns the last validation loss (or NAN).
static float train(const TrainConfig* tc, float* losses, long long max_losses) {
    GPT2 model;
    RunState state;
    memset(&state, 0, sizeof(state));
    float *resume_m = NULL, *resume_v = NULL;
    char resume_model_path[4200] = "";
    if (tc->resume) {
        char state_path[4096];
        find_latest_checkpoint(tc->resume, state_path, sizeof(state_path));
        state_file_read(state_path, &state, &resume_m, &resume_v);
        snprintf(resume_model_path, sizeof(resume_model_path), "%s/model_%08lld.bin", tc->resume, state.step);
        if (state.B != tc->B || state.T != tc->T || state.grad_accum != tc->grad_accum || state.shuffle != tc->shuffle)
            fatal("checkpoint '%s' was saved with B=%d T=%d grad_accum=%d shuffle=%d; resume needs the same (got B=%d T=%d grad_accum=%d shuffle=%d)",
                  state_path, state.B, state.T, state.grad_accum, state.shuffle, tc->B, tc->T, tc->grad_accum, tc->shuffle);
        printf("resuming from %s (step %lld)\n", state_path, state.step);
    }
    const char* model_path = tc->resume ? resume_model_path : tc->model_file;
    if (model_path) {
        GPT2Config c;
        float* p = NULL;
        uint64_t hash = model_file_read(model_path, &c, &p);
        if (tc->resume) {
            if (hash != state.model_hash) fatal("'%s' is not the model saved with its state file (checksum mismatch)", model_path);
            if (memcmp(&c, &state.config, sizeof(c)) != 0) fatal("'%s' does not match the sizes in its state file", model_path);
        }
        gpt2_build(&model, &c);
        gpt2_set_parameters(&model, p);
        free(p);
    } else {
        gpt2_build(&model, &tc->arch);
        gpt2_init_random(&model, tc->seed);
    }
    const GPT2Config* c = &model.config;
    if (tc->T > c->maxT) fatal("sequence length T=%d is longer than the model's maxT=%d", tc->T, c->maxT);
    if (resume_m) {  // optimizer state, file order -> memory layout
        float* mem = (float*)malloc_check(model.layout.total * sizeof(float));
        file_order_to_layout(c, &model.layout, resume_m, mem);
        copy_to_device(model.m, mem, model.layout.total * sizeof(float));
        file_order_to_layout(c, &model.layout, resume_v, mem);
        copy_to_device(model.v, mem, model.layout.total * sizeof(float));
        free(mem);
        free(resume_m);
        free(resume_v);
    }

    DataLoader train_loader, val_loader;
    dataloader_init(&train_loader, tc->train_data, tc->B, tc->T, c->V, tc->shuffle, tc->seed);
    int have_val = tc->val_data != NULL && tc->val_data[0] != '\0' && tc->val_every > 0;
    if (have_val) dataloader_init(&val_loader, tc->val_data, tc->B, tc->T, c->V, 0, 0);
    Tokenizer tok = {0, 0, NULL};
    int have_tok = tc->tokenizer != NULL && tc->tokenizer[0] != '\0' && tc->sample_every > 0;
    if (have_tok) tokenizer_init(&tok, tc->tokenizer);
    gpt2_allocate_activations(&model, tc->B, tc->T);

    Rng sample_rng = {tc->resume ? state.sample_rng : tc->seed + 1};
    long long start_step = tc->resume ? state.step : 0;
    Logger logger;
    logger_open(&logger, tc->log_file, tc->resume != NULL);

    size_t BT = (size_t)tc->B * tc->T;
    double flops_per_token = 6.0 * model.num_parameters + 6.0 * c->L * c->C * tc->T;
    double peak = gpu_peak_flops();
    if (!tc->quiet) {
        printf("target %s, precision %s\n", TARGET_NAME, PRECISION_NAME);
        printf("model: L=%d C=%d NH=%d V=%d (padded %d) maxT=%d, %zu parameters\n", c->L, c->C, c->NH, c->V, c->Vp,
               c->maxT, model.num_parameters);
        printf("batch: B=%d T=%d grad_accum=%d (%zu tokens per step), %lld steps\n", tc->B, tc->T, tc->grad_accum,
               BT * tc->grad_accum, tc->steps);
        printf("train data: %lld tokens (%lld micro-batches per epoch, shuffle %s)\n", train_loader.total_tokens,
               train_loader.n_batches, tc->shuffle ? "on" : "off");
        printf("memory: parameters %.1f MiB, gradients %.1f MiB, optimizer state %.1f MiB, activations %.1f MiB\n",
               model.bytes_params / 1048576.0, model.bytes_grads / 1048576.0, model.bytes_optimizer / 1048576.0,
               model.bytes_activations / 1048576.0);
    }

    float val_loss = NAN;
    float dloss = 1.0f / (float)(BT * tc->grad_accum);
    for (long long step = start_step; step <= tc->steps; step++) {
        int last = step == tc->steps;
        if (have_val && (step % tc->val_every == 0 || last)) {
            val_loss = evaluate(&model, &val_loader, tc->val_batches);
            printf("step %lld: val loss %.4f\n", step, val_loss);
            logger_eval(&logger, step, val_loss);
        }
        if (have_tok && step > 0 && (step % tc->sample_every == 0 || last)) gpt2_sample(&model, &tok, &sample_rng, tc->sample_len);
        int stopping = tc->stop_after > 0 && step == tc->stop_after;
        int periodic = tc->save_every > 0 && step > start_step && (step % tc->save_every == 0 || last);
        if (periodic || (stopping && step > start_step)) {
            state.config = *c;
            state.B = tc->B;
            state.T = tc->T;
            state.grad_accum = tc->grad_accum;
            state.shuffle = tc->shuffle;
            state.step = step;
            state.sample_rng = sample_rng.state;
            state.data_seed = tc->seed;
            save_checkpoint(&model, tc->checkpoint_dir, &state);
        }
        if (last || stopping) break;

        double t0 = wall_seconds();
        gpt2_zero_grad(&model);
        double loss = 0.0;
        for (int micro = 0; micro < tc->grad_accum; micro++) {
            dataloader_load(&train_loader, step * tc->grad_accum + micro);  // data-order contract, D = 1
            loss += gpt2_forward(&model, train_loader.inputs, train_loader.targets, tc->B, tc->T, dloss);
            gpt2_backward(&model, tc->B, tc->T);
        }
        loss /= tc->grad_accum;
        float lr = learning_rate(tc, step);
        float norm = gpt2_update(&model, &tc->opt, lr, (int)(step + 1));
        device_synchronize();
        double ms = 1000.0 * (wall_seconds() - t0);
        double tokens_per_s = BT * tc->grad_accum / (ms / 1000.0);
        if (losses && step < max_losses) losses[step] = (float)loss;
        if (!isfinite(loss)) fatal("loss is %f at step %lld: training diverged", loss, step + 1);
        if (!tc->quiet) {
            printf("step %5lld/%lld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s", step + 1, tc->steps, loss,
                   norm, lr, ms, tokens_per_s);
            if (peak > 0) printf(" | MFU %.1f%%", 100.0 * flops_per_token * tokens_per_s / peak);
            printf("\n");
        }
        logger_step(&logger, step + 1, (float)loss, lr, norm, tokens_per_s, ms);
    }

    if (tc->save_model) {
        float* buf = (float*)malloc_check(model.num_parameters * sizeof(float));
        gpt2_export(&model, model.master, 0, buf);
        model_file_write(tc->save_model, c, buf);
        free(buf);
        printf("wrote %s\n", tc->save_model);
    }
    logger_close(&logger);
    if (have_tok) tokenizer_free(&tok);
    if (have_val) dataloader_free(&val_loader);
    dataloader_free(&train_loader);
    gpt2_free(&model);
    return val_loss;
}

// ----------------------------------------------------------------------------------------------------
// command line

static void default_train_config(TrainConfig* tc) {
    memset(tc, 0, sizeof(*tc));
    tc->train_data = "data/devil_train.bin";
    tc->val_data = "data/devil_val.bin";
    tc->tokenizer = "data/gpt2_tokenizer.bin";
    tc->arch = (GPT2Config){128, 50257, 0, 4, 4, 128};  // maxT V Vp L NH C (Vp derived)
    tc->seed = 1337;
    tc->B = 8;
    tc->T = 64;
    tc->grad_accum = 1;
    tc->steps = 150;
    tc->opt = (OptimizerConfig){3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    tc->warmup = 20;
    tc->schedule = "cosine";
    tc->lr_min_frac = 0.1f;
    tc->val_every = 50;
    tc->val_batches = 10;
    tc->sample_every = 75;
    tc->sample_len = 48;
    tc->checkpoint_dir = "checkpoints";
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
        "  --batch-size B        sequences per micro-batch            [%d]\n"
        "  --seq-len T           tokens per sequence (<= maxT)        [%d]\n"
        "  --grad-accum N        micro-batches per optimizer step     [%d]\n"
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
        "  --sample-every N      print a sample every N steps, 0 off  [%d]\n"
        "  --sample-len N        tokens per sample                    [%d]\n"
        "  --save-every N        checkpoint every N steps, 0 off      [%d]\n"
        "  --checkpoint-dir DIR  where checkpoints go                 [%s]\n"
        "  --resume DIR          continue from the newest checkpoint in DIR\n"
        "  --save-model FILE     write the final model (llm.c format, fp32)\n"
        "  --log FILE            one JSON object per line per step and evaluation\n"
        "  --help                this text\n",
        TARGET_NAME, PRECISION_NAME, d.train_data, d.val_data, d.tokenizer, d.arch.L, d.arch.C, d.arch.NH, d.arch.V,
        d.arch.maxT, (unsigned long long)d.seed, d.B, d.T, d.grad_accum, d.steps, d.opt.lr, d.warmup, d.schedule,
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

static void parse_args(TrainConfig* tc, int argc, char** argv) {
    default_train_config(tc);
    int arch_given = 0;
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
            print_usage();
            exit(0);
        }
        if (strncmp(f, "--", 2) != 0) fatal("unexpected argument '%s' (flags start with --; see --help)", f);
        if (i + 1 >= argc) fatal("flag %s needs a value (see --help)", f);
        const char* v = argv[++i];
        const long long BIG = 1LL << 40;
        if (!strcmp(f, "--train-data")) tc->train_data = v;
        else if (!strcmp(f, "--val-data")) tc->val_data = v;
        else if (!strcmp(f, "--tokenizer")) tc->tokenizer = v;
        else if (!strcmp(f, "--shuffle")) tc->shuffle = (int)parse_int(f, v, 0, 1);
        else if (!strcmp(f, "--model")) tc->model_file = v;
        else if (!strcmp(f, "--layers")) { tc->arch.L = (int)parse_int(f, v, 1, 4096); arch_given = 1; }
        else if (!strcmp(f, "--channels")) { tc->arch.C = (int)parse_int(f, v, 1, 65536); arch_given = 1; }
        else if (!strcmp(f, "--heads")) { tc->arch.NH = (int)parse_int(f, v, 1, 65536); arch_given = 1; }
        else if (!strcmp(f, "--vocab")) { tc->arch.V = (int)parse_int(f, v, 1, 65536); arch_given = 1; }
        else if (!strcmp(f, "--max-seq-len")) { tc->arch.maxT = (int)parse_int(f, v, 1, 1 << 20); arch_given = 1; }
        else if (!strcmp(f, "--seed")) tc->seed = (uint64_t)parse_int(f, v, 0, BIG);
        else if (!strcmp(f, "--batch-size")) tc->B = (int)parse_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--seq-len")) tc->T = (int)parse_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--grad-accum")) tc->grad_accum = (int)parse_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--steps")) tc->steps = parse_int(f, v, 0, BIG);
        else if (!strcmp(f, "--stop-after")) tc->stop_after = parse_int(f, v, 1, BIG);
        else if (!strcmp(f, "--lr")) tc->opt.lr = parse_float(f, v, 0.0, 10.0);
        else if (!strcmp(f, "--warmup")) tc->warmup = (int)parse_int(f, v, 0, 1 << 30);
        else if (!strcmp(f, "--lr-schedule")) {
            if (strcmp(v, "cosine") && strcmp(v, "linear") && strcmp(v, "constant"))
                fatal("--lr-schedule must be cosine, linear or constant, got '%s'", v);
            tc->schedule = v;
        } else if (!strcmp(f, "--lr-min-frac")) tc->lr_min_frac = parse_float(f, v, 0.0, 1.0);
        else if (!strcmp(f, "--beta1")) tc->opt.beta1 = parse_float(f, v, 0.0, 0.999999);
        else if (!strcmp(f, "--beta2")) tc->opt.beta2 = parse_float(f, v, 0.0, 0.999999);
        else if (!strcmp(f, "--eps")) tc->opt.eps = parse_float(f, v, 0.0, 1.0);
        else if (!strcmp(f, "--weight-decay")) tc->opt.weight_decay = parse_float(f, v, 0.0, 10.0);
        else if (!strcmp(f, "--grad-clip")) tc->opt.grad_clip = parse_float(f, v, 0.0, 1e9);
        else if (!strcmp(f, "--val-every")) tc->val_every = (int)parse_int(f, v, 0, 1 << 30);
        else if (!strcmp(f, "--val-batches")) tc->val_batches = (int)parse_int(f, v, 1, 1 << 30);
        else if (!strcmp(f, "--sample-every")) tc->sample_every = (int)parse_int(f, v, 0, 1 << 30);
        else if (!strcmp(f, "--sample-len")) tc->sample_len = (int)parse_int(f, v, 1, 1 << 20);
        else if (!strcmp(f, "--save-every")) tc->save_every = (int)parse_int(f, v, 0, 1 << 30);
        else if (!strcmp(f, "--checkpoint-dir")) tc->checkpoint_dir = v;
        else if (!strcmp(f, "--resume")) tc->resume = v;
        else if (!strcmp(f, "--save-model")) tc->save_model = v;
        else if (!strcmp(f, "--log")) tc->log_file = v;
        else fatal("unknown flag %s (see --help)", f);
    }
    if ((tc->model_file || tc->resume) && arch_given)
        fatal("model sizes (--layers, --channels, ...) come from the model file; do not give both");
    if (tc->model_file && tc->resume) fatal("--resume loads the model from the checkpoint; do not also give --model");
    tc->arch.Vp = padded_vocab(tc->arch.V);
    if (!tc->model_file && !tc->resume) validate_config(&tc->arch, "command line");
    if (!tc->model_file && !tc->resume && tc->T > tc->arch.maxT)
        fatal("sequence length T=%d is longer than maxT=%d", tc->T, tc->arch.maxT);
}

#ifndef TRAIN_GPT_NO_MAIN
int main(int argc, char** argv) {
    TrainConfig tc;
    parse_args(&tc, argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    double t0 = wall_seconds();
    float val = train(&tc, NULL, 0);
    printf("done in %.1f s", wall_seconds() - t0);
    if (!isnan(val)) printf(", final val loss %.4f", val);
    printf("\n");
    return 0;
}
#endif
