/*
 * model_file.h: the GPT-2 model file in llm.c's format: the configuration, the tensors in file order,
 * reading and (atomically) writing.
 *
 * Model file, little-endian: 256 int32 header [20240326, version, maxT, V, L, NH, C, Vp, 0...], then the
 * parameters, float32 (version 3) or bf16 (version 5), in llm.c's order:
 *   wte (Vp,C)  wpe (maxT,C)  ln1w ln1b (L,C)  qkvw (L,3C,C)  qkvb (L,3C)  attprojw (L,C,C)  attprojb (L,C)
 *   ln2w ln2b (L,C)  fcw (L,4C,C)  fcb (L,4C)  fcprojw (L,C,4C)  fcprojb (L,C)  lnfw lnfb (C)
 * Checkpoints always hold version 3 (the fp32 master weights, so that a resume is exact); --save-model
 * writes either (version 5 rounds each fp32 master weight to the nearest bf16, ties to even, as llm.c's
 * and PyTorch's conversions do, for llm.c's GPU builds, which read only version 5). Both are read.
 * A file is written through llmc/run/atomic_file.h: a crash mid-save never leaves half a model.
 *
 * The 16 tensors are named once, by FileTensor, in that order; the trainer keeps a layer's tensors
 * together in memory (train_gpt.cu) and tensor parallelism slices some of them (tensor_parallel.h), and
 * both ask the predicates below what a tensor is (per layer, a matrix...) instead of listing numbers.
 */
#pragma once

#include "run/atomic_file.h"  // files written whole or not at all
#include "common.h"           // fatal, checked file calls, Rng

#define MODEL_MAGIC 20240326
#define HEADER_INTS 256

typedef struct {
    int maxT;  // longest sequence (rows of wpe)
    int V;     // vocabulary size
    int Vp;    // vocabulary padded up to a multiple of 128 (rows of wte)
    int L;     // transformer blocks
    int NH;    // attention heads
    int C;     // channels
} GPT2Config;

typedef enum {
    WTE, WPE,                                 // embeddings (wte is tied with the classifier)
    LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB,  // per layer: the attention block
    LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,      // per layer: the MLP block
    LNFW, LNFB,                               // final LayerNorm
    NUM_FILE_TENSORS
} FileTensor;

#define NUM_LAYER_TENSORS (FCPROJB - LN1W + 1)  // the 12 tensors of one transformer block

[[maybe_unused]] static const char* FILE_TENSOR_NAMES[NUM_FILE_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb", "fcprojw",
    "fcprojb", "lnfw", "lnfb"};

// one per transformer block (L of them in the file), or once for the whole model
static int tensor_is_per_layer(int kind) { return kind >= LN1W && kind <= FCPROJB; }

// the 2-D weights: initialized at random and weight-decayed (biases and LayerNorms are neither)
static int tensor_is_matrix(int kind) {
    return kind == WTE || kind == WPE || kind == QKVW || kind == ATTPROJW || kind == FCW || kind == FCPROJW;
}

// LayerNorm gains, which start at 1
static int tensor_is_layernorm_weight(int kind) { return kind == LN1W || kind == LN2W || kind == LNFW; }

// the projections that write into the residual stream, whose initialization GPT-2 scales by 1/sqrt(2L)
static int tensor_is_residual_projection(int kind) { return kind == ATTPROJW || kind == FCPROJW; }

// (rows, cols) of one layer's tensor, as PyTorch's Linear stores it (out, in); a vector is (n, 1)
static void file_tensor_dims(const GPT2Config* c, int kind, size_t* rows, size_t* cols) {
    size_t C = c->C;
    *cols = 1;
    switch (kind) {
        case WTE: *rows = c->Vp; *cols = C; break;
        case WPE: *rows = c->maxT; *cols = C; break;
        case QKVW: *rows = 3 * C; *cols = C; break;
        case ATTPROJW: *rows = C; *cols = C; break;
        case FCW: *rows = 4 * C; *cols = C; break;
        case FCPROJW: *rows = C; *cols = 4 * C; break;
        case QKVB: *rows = 3 * C; break;
        case FCB: *rows = 4 * C; break;
        default: *rows = C; break;  // LayerNorms, attprojb, fcprojb
    }
}

// elements of one layer's tensor (per-layer tensors repeat L times in the file; the others appear once)
static size_t file_tensor_numel(const GPT2Config* c, int kind) {
    size_t rows, cols;
    file_tensor_dims(c, kind, &rows, &cols);
    return rows * cols;
}

static size_t gpt2_num_parameters(const GPT2Config* c) {
    size_t n = 0;
    for (int k = 0; k < NUM_FILE_TENSORS; k++) n += file_tensor_numel(c, k) * (tensor_is_per_layer(k) ? c->L : 1);
    return n;
}

static int padded_vocab(int V) { return (V + 127) / 128 * 128; }

// Writes the tensor and element of parameter i (file order) and its value into `where`, e.g.
// "wte[500][3] = nan" (row, column) or "ln1w of layer 2 [7] = inf".
static void describe_param(const GPT2Config* c, const float* params, size_t i, char* where, size_t where_len) {
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++) {
        int layers = tensor_is_per_layer(kind) ? c->L : 1;
        size_t rows, cols;
        file_tensor_dims(c, kind, &rows, &cols);
        size_t numel = rows * cols;
        if (i >= pos + numel * layers) {
            pos += numel * layers;
            continue;
        }
        size_t k = i - pos, layer = k / numel, e = k % numel;
        char layer_s[32] = "";
        if (layers > 1) snprintf(layer_s, sizeof(layer_s), " of layer %zu ", layer);
        if (tensor_is_matrix(kind))
            snprintf(where, where_len, "%s%s[%zu][%zu] = %g", FILE_TENSOR_NAMES[kind], layer_s,
                     e / cols, e % cols, params[i]);
        else snprintf(where, where_len, "%s%s[%zu] = %g", FILE_TENSOR_NAMES[kind], layer_s, e, params[i]);
        return;
    }
}

// Finds the first non-finite (NaN or infinite) value of a whole model in file order. Returns 0 if every
// value is finite; otherwise 1, with the tensor and element written into `where` (describe_param).
static int find_nonfinite_param(const GPT2Config* c, const float* params, char* where, size_t where_len) {
    size_t n = gpt2_num_parameters(c), i = 0;
    while (i < n && isfinite(params[i])) i++;
    if (i == n) return 0;
    describe_param(c, params, i, where, where_len);
    return 1;
}

// Checks that a configuration is well formed; `what` names its origin for the message.
static void validate_config(const GPT2Config* c, const char* what) {
    if (c->L < 1 || c->C < 1 || c->NH < 1 || c->V < 1 || c->maxT < 1)
        fatal("%s: every size must be positive (L=%d C=%d NH=%d V=%d maxT=%d)", what, c->L, c->C, c->NH, c->V, c->maxT);
    if (c->C % c->NH != 0) fatal("%s: channels C=%d is not divisible by heads NH=%d", what, c->C, c->NH);
    if (c->Vp < c->V || c->Vp % 128 != 0)
        fatal("%s: padded vocab Vp=%d must be a multiple of 128 and >= V=%d", what, c->Vp, c->V);
    if (c->V > 65536) fatal("%s: vocab V=%d does not fit the uint16 token files", what, c->V);
    if (c->L > 4096 || c->C > 65536 || c->maxT > 1 << 20 || c->Vp > 1 << 20)
        fatal("%s: implausibly large model sizes", what);
}

// ----------------------------------------------------------------------------------------------------
// model file

static void model_file_header(const GPT2Config* c, int* header, int version) {
    memset(header, 0, HEADER_INTS * sizeof(int));
    header[0] = MODEL_MAGIC;
    header[1] = version;
    header[2] = c->maxT;
    header[3] = c->V;
    header[4] = c->L;
    header[5] = c->NH;
    header[6] = c->C;
    header[7] = c->Vp;
}

// float32 -> bf16 bits, rounded to nearest, ties to even (finite inputs; values beyond bf16's largest
// finite number round to infinity, as in PyTorch)
static uint16_t float_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// Finds the first finite fp32 value that bf16 cannot hold: beyond its largest finite value, 3.3895e38,
// by at least half a step (|x| >= 3.3961e38, bits 0x7F7F8000), it rounds to infinity. Returns 0 if there
// is none; otherwise 1, with the tensor and element written into `where` (describe_param). The test is
// the conversion itself, so it holds exactly for what a version 5 file would get.
static int find_bf16_overflow_param(const GPT2Config* c, const float* params, char* where, size_t where_len) {
    size_t n = gpt2_num_parameters(c), i = 0;
    while (i < n && (!isfinite(params[i]) || isfinite(bf16_bits_to_float(float_to_bf16_bits(params[i]))))) i++;
    if (i == n) return 0;
    describe_param(c, params, i, where, where_len);
    return 1;
}

// Writes params (llm.c order, float32, finite) as a model file of `version` 3 (float32) or 5 (bf16,
// rounded to nearest even); returns the file's FNV-1a hash. A value that bf16 would round to infinity
// stops a version 5 save before anything is written (callers check first, to end every rank alike; this
// is the writer's own guarantee that no version 5 file holds an inf that its fp32 master did not).
static uint64_t model_file_write_version(const char* path, const GPT2Config* c, const float* params, int version) {
    char where[160];
    if (version == 5 && find_bf16_overflow_param(c, params, where, sizeof(where)))
        fatal("'%s' not written: parameter %s is beyond bf16's range (it would round to infinity)", path, where);
    int header[HEADER_INTS];
    model_file_header(c, header, version);
    AtomicFile a;
    atomic_open(&a, path);
    atomic_write(&a, header, sizeof(header));
    size_t n = gpt2_num_parameters(c);
    if (version == 3) {
        atomic_write(&a, params, n * sizeof(float));
    } else {
        const size_t CHUNK = 1 << 16;  // converted in pieces: no second copy of the model
        uint16_t* bits = (uint16_t*)malloc_check(CHUNK * sizeof(uint16_t));
        for (size_t i = 0; i < n; i += CHUNK) {
            size_t k = n - i < CHUNK ? n - i : CHUNK;
            for (size_t j = 0; j < k; j++) bits[j] = float_to_bf16_bits(params[i + j]);
            atomic_write(&a, bits, k * sizeof(uint16_t));
        }
        free(bits);
    }
    atomic_commit(&a);
    return a.hash;
}

// Writes params (llm.c order, float32) as a version 3 model file; returns the file's FNV-1a hash.
static uint64_t model_file_write(const char* path, const GPT2Config* c, const float* params) {
    return model_file_write_version(path, c, params, 3);
}

// the hash model_file_write would return, without writing (for the ranks that do not write)
static uint64_t model_file_hash(const GPT2Config* c, const float* params) {
    int header[HEADER_INTS];
    model_file_header(c, header, 3);
    uint64_t hash = fnv1a_update(FNV1A_INIT, header, sizeof(header));
    return fnv1a_update(hash, params, gpt2_num_parameters(c) * sizeof(float));
}

// Reads a model file: its config, and (if params != NULL) a malloc'ed float array in llm.c order.
// Returns the file's FNV-1a hash when params are read.
static uint64_t model_file_read(const char* path, GPT2Config* c, float** params) {
    int header[HEADER_INTS];
    long long size;
    FILE* f = open_with_header(path, MODEL_MAGIC, "GPT-2 model file", header, &size);
    int version = header[1];
    if (version != 3 && version != 5)
        fatal("'%s': unsupported model file version %d (3 = fp32 and 5 = bf16 are known)", path, version);
    c->maxT = header[2];
    c->V = header[3];
    c->L = header[4];
    c->NH = header[5];
    c->C = header[6];
    c->Vp = header[7];
    validate_config(c, path);
    size_t n = gpt2_num_parameters(c);
    size_t elem = version == 3 ? 4 : 2;
    long long expected = (long long)sizeof(header) + (long long)(n * elem);
    if (size != expected)
        fatal("'%s' has %lld bytes but its header implies %lld (%s)", path, size, expected,
              size < expected ? "truncated" : "trailing bytes");
    uint64_t hash = fnv1a_update(FNV1A_INIT, header, sizeof(header));
    if (params != NULL) {
        float* p = (float*)malloc_check(n * sizeof(float));
        if (version == 3) {
            fread_check(p, sizeof(float), n, f, path);
            hash = fnv1a_update(hash, p, n * sizeof(float));
        } else {
            uint16_t* tmp = (uint16_t*)malloc_check(n * sizeof(uint16_t));
            fread_check(tmp, sizeof(uint16_t), n, f, path);
            hash = fnv1a_update(hash, tmp, n * sizeof(uint16_t));
            for (size_t i = 0; i < n; i++) p[i] = bf16_bits_to_float(tmp[i]);
            free(tmp);
        }
        char where[160];
        if (find_nonfinite_param(c, p, where, sizeof(where)))
            fatal("'%s' holds a non-finite parameter: %s (a model file must hold finite values)", path, where);
        *params = p;
    }
    fclose(f);
    return hash;
}

// GPT-2 initialization: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0,
// LayerNorm weights 1; padded vocabulary rows 0. Drawn in file order from one seeded generator into p
// (gpt2_num_parameters(c) floats).
static void model_init_random(const GPT2Config* c, uint64_t seed, float* p) {
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
}
