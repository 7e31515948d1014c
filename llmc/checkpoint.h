/*
 * checkpoint.h: the model file (llm.c's format) and our optimizer/run state file, written atomically.
 *
 * Model file, little-endian: 256 int32 header [20240326, version, maxT, V, L, NH, C, Vp, 0...], then the
 * parameters, float32 (version 3) or bf16 (version 5), in llm.c's order:
 *   wte (Vp,C)  wpe (maxT,C)  ln1w ln1b (L,C)  qkvw (L,3C,C)  qkvb (L,3C)  attprojw (L,C,C)  attprojb (L,C)
 *   ln2w ln2b (L,C)  fcw (L,4C,C)  fcb (L,4C)  fcprojw (L,C,4C)  fcprojb (L,C)  lnfw lnfb (C)
 * Checkpoints always hold version 3 (the fp32 master weights, so that a resume is exact); --save-model
 * writes either (version 5 rounds each fp32 master weight to the nearest bf16, ties to even, as llm.c's
 * and PyTorch's conversions do, for llm.c's GPU builds, which read only version 5). Both are read.
 *
 * State files (ours), one per shard of the optimizer state (one in all when it is not sharded), named
 * state_<step>_<shard>.bin, little-endian: 256 int32 header
 *   [0] 20261123 magic   [1] 1 version   [2..7] maxT V L NH C Vp   [8] B (sequences per micro-step, all
 *   DP ranks together)  [9] T  [10] grad_accum  [11] shuffle  [12..13] step (int64)
 *   [14..15] num_params (int64)  [16..17] sampling rng state (uint64)  [18..19] FNV-1a hash of the
 *   companion model file (uint64)  [20..21] data seed (uint64)  [22] shard  [23] number of shards
 *   [24] ZeRO stage  [25] DP size  [26..27] number of ranges R (int64)  [28..29] optimizer updates
 *   applied (int64)  [30] loss scale (float32)  [31] clean steps since its last change  [32] overflows
 *   it still tolerates  [33..34] run id (uint64, version 2)
 * then R pairs (offset in file order, count) as int64, then AdamW's m for those ranges (float32), then
 * v, then the FNV-1a hash (uint64) of all the bytes before it. Shards of any DP size can be read by any
 * other: a resume reassembles the whole state and takes its own chunks (re-sharding). The model hash
 * ties state and model together: a state file never resumes another model.
 *
 * Version 2 (written now) adds the run id: a random number drawn when a run starts from scratch and kept
 * through every resume, so that checkpoints of two different runs in one folder are told apart. And in
 * version 2 the shards of one checkpoint hold every parameter exactly once (a tensor held by several
 * ranks, such as a replicated LayerNorm under TP or the tied wte on both end stages, is written by one of
 * them); a reader checks that each file is the shard its name says and that the shards' ranges cover
 * the model exactly once, so a missing, duplicated or swapped shard is an error, never silent zeros.
 * Version 1 files (no run id, run id 0; replicated tensors in several shards) are still read: their
 * ranges must cover every parameter at least once.
 *
 * Every write goes to "<path>.tmp", is flushed and fsync'ed, then renamed over <path>, so a crash in the
 * middle of a save leaves the previous checkpoint intact.
 */
#pragma once

#include <dirent.h>

#include "common.h"

#define MODEL_MAGIC 20240326
#define STATE_MAGIC 20261123
#define STATE_VERSION 2
#define HEADER_INTS 256

typedef struct {
    int maxT;  // longest sequence (rows of wpe)
    int V;     // vocabulary size
    int Vp;    // vocabulary padded up to a multiple of 128 (rows of wte)
    int L;     // transformer blocks
    int NH;    // attention heads
    int C;     // channels
} GPT2Config;

#define NUM_FILE_TENSORS 16
[[maybe_unused]] static const char* FILE_TENSOR_NAMES[NUM_FILE_TENSORS] = {"wte",  "wpe",      "ln1w",     "ln1b", "qkvw", "qkvb",
                                                          "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                                                          "fcprojw", "fcprojb", "lnfw", "lnfb"};

// elements of file tensor `kind` for ONE layer (kinds 2..13 repeat L times; the others appear once)
static size_t file_tensor_numel(const GPT2Config* c, int kind) {
    size_t C = c->C;
    static const int mult[NUM_FILE_TENSORS] = {0, 0, 1, 1, 3 * 1, 3, 1, 1, 1, 1, 4, 4, 4, 1, 1, 1};
    switch (kind) {
        case 0: return (size_t)c->Vp * C;
        case 1: return (size_t)c->maxT * C;
        case 4: case 6: case 10: case 12: return mult[kind] * C * C;  // qkvw 3CxC, attprojw CxC, fcw 4CxC, fcprojw Cx4C
        default: return mult[kind] * C;
    }
}
static int file_tensor_is_per_layer(int kind) { return kind >= 2 && kind <= 13; }

static size_t gpt2_num_parameters(const GPT2Config* c) {
    size_t n = 0;
    for (int k = 0; k < NUM_FILE_TENSORS; k++) n += file_tensor_numel(c, k) * (file_tensor_is_per_layer(k) ? c->L : 1);
    return n;
}

static int padded_vocab(int V) { return (V + 127) / 128 * 128; }

// Finds the first non-finite (NaN or infinite) value of a whole model in file order. Returns 0 if every
// value is finite; otherwise 1, with the tensor and element written into `where`, e.g. "wte[500][3]"
// (row, column) or "ln1w of layer 2 [7]".
static int find_nonfinite_param(const GPT2Config* c, const float* params, char* where, size_t where_len) {
    size_t n = gpt2_num_parameters(c), i = 0;
    while (i < n && isfinite(params[i])) i++;
    if (i == n) return 0;
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++) {
        int layers = file_tensor_is_per_layer(kind) ? c->L : 1;
        size_t numel = file_tensor_numel(c, kind);
        if (i >= pos + numel * layers) {
            pos += numel * layers;
            continue;
        }
        size_t k = i - pos, layer = k / numel, e = k % numel;
        size_t cols = kind == 12 ? 4 * (size_t)c->C : (kind <= 1 || kind == 4 || kind == 6 || kind == 10) ? (size_t)c->C : 0;
        char layer_s[32] = "";
        if (layers > 1) snprintf(layer_s, sizeof(layer_s), " of layer %zu ", layer);
        if (cols > 0) snprintf(where, where_len, "%s%s[%zu][%zu] = %g", FILE_TENSOR_NAMES[kind], layer_s, e / cols, e % cols, params[i]);
        else snprintf(where, where_len, "%s%s[%zu] = %g", FILE_TENSOR_NAMES[kind], layer_s, e, params[i]);
        return 1;
    }
    return 1;
}

// Checks that a configuration is well formed; `what` names its origin for the message.
static void validate_config(const GPT2Config* c, const char* what) {
    if (c->L < 1 || c->C < 1 || c->NH < 1 || c->V < 1 || c->maxT < 1)
        fatal("%s: every size must be positive (L=%d C=%d NH=%d V=%d maxT=%d)", what, c->L, c->C, c->NH, c->V, c->maxT);
    if (c->C % c->NH != 0) fatal("%s: channels C=%d is not divisible by heads NH=%d", what, c->C, c->NH);
    if (c->Vp < c->V || c->Vp % 128 != 0) fatal("%s: padded vocab Vp=%d must be a multiple of 128 and >= V=%d", what, c->Vp, c->V);
    if (c->V > 65536) fatal("%s: vocab V=%d does not fit the uint16 token files", what, c->V);
    if (c->L > 4096 || c->C > 65536 || c->maxT > 1 << 20 || c->Vp > 1 << 20) fatal("%s: implausibly large model sizes", what);
}

// ----------------------------------------------------------------------------------------------------
// atomic writes

typedef struct {
    FILE* f;
    char path[4096], tmp_path[4200];
    uint64_t hash;  // FNV-1a of everything written so far
} AtomicFile;

static void atomic_open(AtomicFile* a, const char* path) {
    if (strlen(path) >= sizeof(a->path)) fatal("path too long: %s", path);
    strcpy(a->path, path);
    snprintf(a->tmp_path, sizeof(a->tmp_path), "%s.tmp", path);
    a->f = fopen_check(a->tmp_path, "wb");
    a->hash = FNV1A_INIT;
}

static void atomic_write(AtomicFile* a, const void* data, size_t bytes) {
    fwrite_check(data, 1, bytes, a->f, a->tmp_path);
    a->hash = fnv1a_update(a->hash, data, bytes);
}

static void atomic_commit(AtomicFile* a) {
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) fatal("cannot flush '%s': %s", a->tmp_path, strerror(errno));
    if (fclose(a->f) != 0) fatal("cannot close '%s': %s", a->tmp_path, strerror(errno));
    if (rename(a->tmp_path, a->path) != 0) fatal("cannot rename '%s' to '%s': %s", a->tmp_path, a->path, strerror(errno));
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

// Writes params (llm.c order, float32) as a model file of `version` 3 (float32) or 5 (bf16, rounded to
// nearest even); returns the file's FNV-1a hash.
static uint64_t model_file_write_version(const char* path, const GPT2Config* c, const float* params, int version) {
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

static float bf16_bits_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// Reads a model file: its config, and (if params != NULL) a malloc'ed float array in llm.c order.
// Returns the file's FNV-1a hash when params are read.
static uint64_t model_file_read(const char* path, GPT2Config* c, float** params) {
    int header[HEADER_INTS];
    long long size;
    FILE* f = open_with_header(path, MODEL_MAGIC, "GPT-2 model file", header, &size);
    int version = header[1];
    if (version != 3 && version != 5) fatal("'%s': unsupported model file version %d (3 = fp32 and 5 = bf16 are known)", path, version);
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
        fatal("'%s' has %lld bytes but its header implies %lld (%s)", path, size, expected, size < expected ? "truncated" : "trailing bytes");
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

// ----------------------------------------------------------------------------------------------------
// state file: one per shard of the optimizer state

typedef struct {
    GPT2Config config;
    int B;             // sequences per micro-step over the whole DP group (dp x per-rank batch)
    int T, grad_accum, shuffle;
    long long step;    // optimizer steps completed
    uint64_t sample_rng;  // state of the sampling generator
    uint64_t model_hash;  // FNV-1a of the model file saved with this state
    uint64_t data_seed;   // seed of the shuffled data order
    int shard, num_shards;  // which shard of the optimizer state this file holds
    int zero_stage, dp;     // how the run that saved it was sharded (informational)
    long long updates;      // optimizer updates applied (steps minus the ones skipped on overflow)
    float loss_scale;       // the loss scaler's state (llmc/loss_scaler.h)
    int scale_good_steps, scale_hysteresis_left;
    uint64_t run_id;        // drawn when the run started from scratch, kept on resume (0: a version 1 file)
    int version;            // of the file read
} RunState;

// The (offset, count) ranges of the shards read so far, to check that they cover the model.
typedef struct {
    int64_t* pairs;  // [2 * n]
    size_t n, cap;
} RangeList;

static int compare_range_offsets(const void* a, const void* b) {
    int64_t x = ((const int64_t*)a)[0], y = ((const int64_t*)b)[0];
    return x < y ? -1 : x > y;
}

// Checks that the ranges cover parameters [0, n) exactly once (exact) or at least once; on failure
// writes what is wrong into msg and returns 0.
static int ranges_cover(RangeList* l, uint64_t n, int exact, char* msg, size_t msg_len) {
    if (l->n > 0) qsort(l->pairs, l->n, 2 * sizeof(int64_t), compare_range_offsets);  // pairs is NULL when there are none
    uint64_t pos = 0;  // everything below pos is covered
    for (size_t i = 0; i < l->n; i++) {
        uint64_t off = (uint64_t)l->pairs[2 * i], end = off + (uint64_t)l->pairs[2 * i + 1];
        if (off == end) continue;
        if (off > pos) {
            snprintf(msg, msg_len, "parameters %llu to %llu are in no shard", (unsigned long long)pos, (unsigned long long)off - 1);
            return 0;
        }
        if (off < pos && exact) {
            snprintf(msg, msg_len, "parameters %llu to %llu are in more than one shard", (unsigned long long)off,
                     (unsigned long long)(end < pos ? end : pos) - 1);
            return 0;
        }
        pos = end > pos ? end : pos;
    }
    if (pos < n) {
        snprintf(msg, msg_len, "parameters %llu to %llu are in no shard", (unsigned long long)pos, (unsigned long long)n - 1);
        return 0;
    }
    return 1;
}

static void put_u64(int* h, uint64_t v) { memcpy(h, &v, sizeof(v)); }
static uint64_t get_u64(const int* h) {
    uint64_t v;
    memcpy(&v, h, sizeof(v));
    return v;
}

// Writes one shard: the AdamW moments of `n_ranges` ranges of the parameters, given as (offset in file
// order, count) pairs, values concatenated in the same order.
static void state_file_write(const char* path, const RunState* s, const int64_t* ranges, int64_t n_ranges,
                             const float* m, const float* v) {
    int64_t count = 0;
    for (int64_t r = 0; r < n_ranges; r++) count += ranges[2 * r + 1];
    int header[HEADER_INTS] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = s->config.maxT;
    header[3] = s->config.V;
    header[4] = s->config.L;
    header[5] = s->config.NH;
    header[6] = s->config.C;
    header[7] = s->config.Vp;
    header[8] = s->B;
    header[9] = s->T;
    header[10] = s->grad_accum;
    header[11] = s->shuffle;
    put_u64(header + 12, (uint64_t)s->step);
    put_u64(header + 14, (uint64_t)gpt2_num_parameters(&s->config));
    put_u64(header + 16, s->sample_rng);
    put_u64(header + 18, s->model_hash);
    put_u64(header + 20, s->data_seed);
    header[22] = s->shard;
    header[23] = s->num_shards;
    header[24] = s->zero_stage;
    header[25] = s->dp;
    put_u64(header + 26, (uint64_t)n_ranges);
    put_u64(header + 28, (uint64_t)s->updates);
    memcpy(header + 30, &s->loss_scale, sizeof(float));
    header[31] = s->scale_good_steps;
    header[32] = s->scale_hysteresis_left;
    put_u64(header + 33, s->run_id);
    AtomicFile a;
    atomic_open(&a, path);
    atomic_write(&a, header, sizeof(header));
    atomic_write(&a, ranges, 2 * n_ranges * sizeof(int64_t));
    atomic_write(&a, m, count * sizeof(float));
    atomic_write(&a, v, count * sizeof(float));
    uint64_t checksum = a.hash;
    atomic_write(&a, &checksum, sizeof(checksum));
    atomic_commit(&a);
}

// Reads one shard, verifying magic, version, sizes, the range of every header field and the checksum,
// scatters its moments into the whole-model arrays m_full and v_full (file order; allocated, zeroed,
// on the first call), and appends its ranges to *covered (if not NULL). `model` holds the sizes of the
// model file saved with the shard (whose header is checked against its length): a shard of any other
// sizes is refused before anything is allocated, so a forged header cannot ask for more memory than
// the model needs, and m_full and v_full always hold that model's parameter count.
static void state_file_read(const char* path, const GPT2Config* model, RunState* s, float** m_full, float** v_full,
                            RangeList* covered) {
    int header[HEADER_INTS];
    long long size;
    FILE* f = open_with_header(path, STATE_MAGIC, "training state file", header, &size);
    if (header[1] != 1 && header[1] != 2) fatal("'%s': unsupported state file version %d (1 and 2 are known)", path, header[1]);
    s->version = header[1];
    s->run_id = s->version >= 2 ? get_u64(header + 33) : 0;
    s->config = (GPT2Config){header[2], header[3], header[7], header[4], header[5], header[6]};
    validate_config(&s->config, path);
    if (memcmp(&s->config, model, sizeof(*model)) != 0)
        fatal("'%s' holds the optimizer state of a model of other sizes (L=%d C=%d NH=%d V=%d maxT=%d) than its model file "
              "(L=%d C=%d NH=%d V=%d maxT=%d)", path, s->config.L, s->config.C, s->config.NH, s->config.V, s->config.maxT,
              model->L, model->C, model->NH, model->V, model->maxT);
    s->B = header[8];
    s->T = header[9];
    s->grad_accum = header[10];
    s->shuffle = header[11];
    s->step = (long long)get_u64(header + 12);
    uint64_t n = get_u64(header + 14);
    s->sample_rng = get_u64(header + 16);
    s->model_hash = get_u64(header + 18);
    s->data_seed = get_u64(header + 20);
    s->shard = header[22];
    s->num_shards = header[23];
    s->zero_stage = header[24];
    s->dp = header[25];
    uint64_t n_ranges = get_u64(header + 26);
    s->updates = (long long)get_u64(header + 28);
    memcpy(&s->loss_scale, header + 30, sizeof(float));
    s->scale_good_steps = header[31];
    s->scale_hysteresis_left = header[32];
    if (n != gpt2_num_parameters(&s->config)) fatal("'%s': parameter count %llu does not match its model sizes", path, (unsigned long long)n);
    if (s->num_shards < 1 || s->num_shards > (1 << 24) || s->shard < 0 || s->shard >= s->num_shards)
        fatal("'%s': bad shard %d of %d", path, s->shard, s->num_shards);
    // the other fields, so that a forged or damaged header cannot steer the run (a negative step would
    // mean a negative learning rate, an absurd batch an absurd allocation)
    const long long MAX_STEP = 1LL << 40;  // what --steps accepts
    if (s->step < 0 || s->step > MAX_STEP) fatal("'%s': step %lld is out of range (0 to %lld)", path, s->step, MAX_STEP);
    if (s->updates < 0 || s->updates > s->step) fatal("'%s': %lld optimizer updates in %lld steps is impossible", path, s->updates, s->step);
    if (s->B < 1 || s->B > (1 << 30) || s->T < 1 || s->T > s->config.maxT || s->grad_accum < 1 || s->grad_accum > (1 << 20))
        fatal("'%s': batch shape B=%d T=%d grad_accum=%d is out of range", path, s->B, s->T, s->grad_accum);
    if (s->shuffle != 0 && s->shuffle != 1) fatal("'%s': shuffle flag %d is neither 0 nor 1", path, s->shuffle);
    if (s->zero_stage < 0 || s->zero_stage > 2 || s->dp < 1 || s->dp > (1 << 20))
        fatal("'%s': ZeRO stage %d or dp %d is out of range", path, s->zero_stage, s->dp);
    if (!(s->loss_scale > 0.0f) || !isfinite(s->loss_scale) || s->scale_good_steps < 0 || s->scale_hysteresis_left < 0)
        fatal("'%s': loss scaler state (scale %g, %d clean steps, %d overflows left) is out of range", path, s->loss_scale,
              s->scale_good_steps, s->scale_hysteresis_left);
    if (n_ranges > n + 1024 || (long long)(1024 + 16 * n_ranges) > size) fatal("'%s' is truncated or corrupt (%llu ranges)", path, (unsigned long long)n_ranges);
    int64_t* ranges = (int64_t*)malloc_check(2 * n_ranges * sizeof(int64_t));
    fread_check(ranges, sizeof(int64_t), 2 * n_ranges, f, path);
    uint64_t count = 0;
    for (uint64_t r = 0; r < n_ranges; r++) {
        // offset + count > n, written so that forged values cannot overflow the sum
        if (ranges[2 * r] < 0 || ranges[2 * r + 1] < 0 || (uint64_t)ranges[2 * r] > n || (uint64_t)ranges[2 * r + 1] > n - (uint64_t)ranges[2 * r])
            fatal("'%s' is corrupt: range %llu is outside the model", path, (unsigned long long)r);
        count += ranges[2 * r + 1];
    }
    long long expected = 1024LL + 16LL * (long long)n_ranges + 8LL * (long long)count + 8;
    if (size != expected)
        fatal("'%s' has %lld bytes but its header implies %lld (%s)", path, size, expected, size < expected ? "truncated" : "trailing bytes");
    float* m = (float*)malloc_check(count * sizeof(float));
    float* v = (float*)malloc_check(count * sizeof(float));
    fread_check(m, sizeof(float), count, f, path);
    fread_check(v, sizeof(float), count, f, path);
    uint64_t stored;
    fread_check(&stored, sizeof(stored), 1, f, path);
    fclose(f);
    uint64_t hash = fnv1a_update(FNV1A_INIT, header, sizeof(header));
    hash = fnv1a_update(hash, ranges, 2 * n_ranges * sizeof(int64_t));
    hash = fnv1a_update(hash, m, count * sizeof(float));
    hash = fnv1a_update(hash, v, count * sizeof(float));
    if (hash != stored) fatal("'%s' is corrupt: checksum mismatch", path);
    if (*m_full == NULL) {
        *m_full = (float*)calloc_check(n * sizeof(float));
        *v_full = (float*)calloc_check(n * sizeof(float));
    }
    size_t pos = 0;
    for (uint64_t r = 0; r < n_ranges; r++) {
        if (covered) {
            if (covered->n == covered->cap) {
                covered->cap = covered->cap ? 2 * covered->cap : 1024;
                covered->pairs = (int64_t*)realloc(covered->pairs, 2 * covered->cap * sizeof(int64_t));
                if (covered->pairs == NULL) fatal("out of host memory");
            }
            covered->pairs[2 * covered->n] = ranges[2 * r];
            covered->pairs[2 * covered->n++ + 1] = ranges[2 * r + 1];
        }
        memcpy(*m_full + ranges[2 * r], m + pos, ranges[2 * r + 1] * sizeof(float));
        memcpy(*v_full + ranges[2 * r], v + pos, ranges[2 * r + 1] * sizeof(float));
        pos += ranges[2 * r + 1];
    }
    free(ranges);
    free(m);
    free(v);
}

// ----------------------------------------------------------------------------------------------------
// checkpoint folders

static int compare_steps_descending(const void* a, const void* b) {
    long long x = *(const long long*)a, y = *(const long long*)b;
    return x > y ? -1 : x < y;
}

// The steps of the checkpoints in dir (those with a first state shard, state_<step>_00000.bin), newest
// first; *steps is malloc'ed. The folder is listed with readdir, not matched with a glob pattern, so any
// character in its name is taken literally ("ck[1]"), and steps are compared as numbers (names of steps
// at or above 1e8 have more than 8 digits). A folder that does not exist holds none.
static int checkpoint_steps(const char* dir, long long** steps) {
    int n = 0, cap = 16;
    *steps = (long long*)malloc_check(cap * sizeof(long long));
    DIR* d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) return 0;
        fatal("cannot list checkpoint folder '%s': %s", dir, strerror(errno));
    }
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        const char* name = e->d_name;
        size_t len = strlen(name), digits = 0;
        if (strncmp(name, "state_", 6) != 0) continue;
        while (6 + digits < len && name[6 + digits] >= '0' && name[6 + digits] <= '9') digits++;
        if (digits < 1 || digits > 18 || strcmp(name + 6 + digits, "_00000.bin") != 0) continue;
        if (n == cap) *steps = (long long*)realloc(*steps, (cap *= 2) * sizeof(long long));
        if (*steps == NULL) fatal("out of host memory");
        (*steps)[n++] = strtoll(name + 6, NULL, 10);
    }
    closedir(d);
    qsort(*steps, n, sizeof(long long), compare_steps_descending);
    return n;
}

// Whether the checkpoint of `step` in dir is complete: its model file and every state shard (as many as
// its first shard says) are there. (A save writes the model, then the shards, each atomically.)
static int checkpoint_complete(const char* dir, long long step) {
    char path[4200];
    int header[HEADER_INTS];
    long long size;
    snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, step);
    if (access(path, R_OK) != 0) return 0;
    snprintf(path, sizeof(path), "%s/state_%08lld_00000.bin", dir, step);
    FILE* f = open_with_header(path, STATE_MAGIC, "training state file", header, &size);
    fclose(f);
    if (header[23] < 1 || header[23] > (1 << 24)) fatal("'%s': bad number of shards %d", path, header[23]);
    for (int s = 1; s < header[23]; s++) {
        snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, step, s);
        if (access(path, R_OK) != 0) return 0;
    }
    return 1;
}

// The step of the newest complete checkpoint in dir, or -1 if there is none (or no such folder).
static long long newest_complete_checkpoint(const char* dir) {
    long long* steps;
    int n = checkpoint_steps(dir, &steps);
    long long found = -1;
    for (int i = 0; i < n && found < 0; i++)
        if (checkpoint_complete(dir, steps[i])) found = steps[i];
    free(steps);
    return found;
}

// The step in a checkpoint file's name: model_<step>.bin or state_<step>_<shard>.bin, with or without
// the ".tmp" of an unfinished write; -1 for any other name.
static long long checkpoint_file_step(const char* name) {
    const char* p = strncmp(name, "model_", 6) == 0 ? name + 6 : strncmp(name, "state_", 6) == 0 ? name + 6 : NULL;
    if (p == NULL || *p < '0' || *p > '9') return -1;
    char* end;
    long long step = strtoll(p, &end, 10);
    if (name[0] == 's') {  // _<shard>
        if (*end != '_' || end[1] < '0' || end[1] > '9') return -1;
        strtoll(end + 1, &end, 10);
    }
    return strcmp(end, ".bin") == 0 || strcmp(end, ".bin.tmp") == 0 ? step : -1;
}

// --keep-last: after the checkpoint of step `saved` is complete, keeps it and the keep-1 newest complete
// checkpoints before it, and deletes every checkpoint file of an older step (all its shards, and what
// an interrupted save left). Newer steps (left by a run that crashed before a resume) are not touched.
// A file that cannot be deleted is reported and training goes on: it costs space, not correctness.
static void prune_checkpoints(const char* dir, long long saved, int keep) {
    long long* steps;
    int n = checkpoint_steps(dir, &steps), kept = 1;  // the one just saved
    long long oldest_kept = saved;
    for (int i = 0; i < n && kept < keep; i++)  // newest first
        if (steps[i] < saved && checkpoint_complete(dir, steps[i])) oldest_kept = steps[i], kept++;
    free(steps);
    DIR* d = opendir(dir);
    if (d == NULL) fatal("cannot list checkpoint folder '%s': %s", dir, strerror(errno));
    long long deleted_newest = -1;
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        long long step = checkpoint_file_step(e->d_name);
        if (step < 0 || step >= oldest_kept) continue;
        char path[4400];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) fprintf(stderr, "warning: --keep-last: cannot delete '%s': %s\n", path, strerror(errno));
        else if (step > deleted_newest) deleted_newest = step;
    }
    closedir(d);
    if (deleted_newest >= 0) printf("--keep-last %d: deleted the checkpoints before step %lld in '%s'\n", keep, oldest_kept, dir);
}
