/*
 * state_file.h: our optimizer and run state file, one per shard of the AdamW moments, written atomically
 * and read back with every field checked (a resume re-shards them for any DP size).
 *
 * State files (ours), one per shard of the optimizer state (one in all when it is not sharded), named
 * state_<step>_<shard>.bin, little-endian: 256 int32 header
 *   [0] 20261123 magic   [1] 1 version   [2..7] maxT V L NH C Vp   [8] B (sequences per micro-step, all
 *   DP ranks together)  [9] T  [10] grad_accum  [11] shuffle  [12..13] step (int64)
 *   [14..15] num_params (int64)  [16..17] sampling rng state (uint64)  [18..19] FNV-1a hash of the
 *   companion model file (uint64)  [20..21] data seed (uint64)  [22] shard  [23] number of shards
 *   [24] ZeRO stage  [25] DP size  [26..27] number of ranges R (int64)  [28..29] optimizer updates
 *   applied (int64)  [30] loss scale (float32)  [31] clean steps since its last change  [32] overflows
 *   it still tolerates  [33..34] run id (uint64, version 2)  [35..36] hash of the training data (uint64,
 *   version 3)  [37..38] its tokens (int64)  [39] its files
 * then R pairs (offset in file order, count) as int64, then AdamW's m for those ranges (float32), then
 * v, then the FNV-1a hash (uint64) of all the bytes before it. Shards of any DP size can be read by any
 * other: a resume reassembles the whole state and takes its own parts (re-sharding). The model hash
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
 * Version 3 (written now) adds the fingerprint of the training data the run was trained on: the number
 * of files, their tokens, and a hash of their names (without the folder), sizes and first MiB, as the
 * ranks compare them at start-up (llmc/run/agreement.h). A resume on other data is then refused unless it
 * is meant, instead of silently continuing on a different stream. Version 1 and 2 files record none
 * (0 files): their data is not checked.
 *
 * Every write goes through atomic_file.h (temp file, fsync, rename), so a crash in the middle of a save
 * leaves the previous checkpoint intact.
 */
#pragma once

#include <limits.h>

#include "atomic_file.h"    // files written whole or not at all
#include "../common.h"      // fatal, checked file calls
#include "../model_file.h"  // GPT2Config, gpt2_num_parameters

#define STATE_MAGIC 20261123
#define STATE_VERSION 3

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
    uint64_t data_hash;     // the training data's fingerprint (version 3; data_files 0: none recorded)
    long long data_tokens;
    int data_files;
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
    if (l->n > 0)  // pairs is NULL when there are none
        qsort(l->pairs, l->n, 2 * sizeof(int64_t), compare_range_offsets);
    uint64_t pos = 0;  // everything below pos is covered
    for (size_t i = 0; i < l->n; i++) {
        uint64_t off = (uint64_t)l->pairs[2 * i], end = off + (uint64_t)l->pairs[2 * i + 1];
        if (off == end) continue;
        if (off > pos) {
            snprintf(msg, msg_len, "parameters %llu to %llu are in no shard", (unsigned long long)pos,
                     (unsigned long long)off - 1);
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
        snprintf(msg, msg_len, "parameters %llu to %llu are in no shard", (unsigned long long)pos,
                 (unsigned long long)n - 1);
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
    put_u64(header + 35, s->data_hash);
    put_u64(header + 37, (uint64_t)s->data_tokens);
    header[39] = s->data_files;
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

// The header's fields into s (no checks yet); n: its parameter count, n_ranges: its number of ranges
static void state_header_decode(const int* header, RunState* s, uint64_t* n, uint64_t* n_ranges) {
    s->version = header[1];
    s->run_id = s->version >= 2 ? get_u64(header + 33) : 0;
    s->data_hash = s->version >= 3 ? get_u64(header + 35) : 0;
    s->data_tokens = s->version >= 3 ? (long long)get_u64(header + 37) : 0;
    s->data_files = s->version >= 3 ? header[39] : 0;
    s->config = (GPT2Config){.maxT = header[2], .V = header[3], .Vp = header[7], .L = header[4], .NH = header[5],
                             .C = header[6]};
    s->B = header[8];
    s->T = header[9];
    s->grad_accum = header[10];
    s->shuffle = header[11];
    s->step = (long long)get_u64(header + 12);
    *n = get_u64(header + 14);
    s->sample_rng = get_u64(header + 16);
    s->model_hash = get_u64(header + 18);
    s->data_seed = get_u64(header + 20);
    s->shard = header[22];
    s->num_shards = header[23];
    s->zero_stage = header[24];
    s->dp = header[25];
    *n_ranges = get_u64(header + 26);
    s->updates = (long long)get_u64(header + 28);
    memcpy(&s->loss_scale, header + 30, sizeof(float));
    s->scale_good_steps = header[31];
    s->scale_hysteresis_left = header[32];
}

// The run's fields that a reader range-checks (all but the sizes and the shard): NULL if they are in
// range, else what is wrong, written into msg. A reader refuses a file that fails it; a save checks its
// state with it before writing anything, so that no checkpoint is written that a resume would refuse.
static const char* run_state_error(const RunState* s, char* msg, size_t len) {
    // what --steps accepts: AdamW's step number (updates + 1, at most the step) is an int, and a step
    // count beyond it would wrap to a negative one in the bias correction
    const long long MAX_STEP = INT_MAX;
    if (s->step < 0 || s->step > MAX_STEP)
        snprintf(msg, len, "step %lld is out of range (0 to %lld)", s->step, MAX_STEP);
    else if (s->updates < 0 || s->updates > s->step)
        snprintf(msg, len, "%lld optimizer updates in %lld steps is impossible", s->updates, s->step);
    else if (s->B < 1 || s->B > (1 << 30) || s->T < 1 || s->T > s->config.maxT || s->grad_accum < 1 ||
             s->grad_accum > (1 << 20))
        snprintf(msg, len, "batch shape B=%d T=%d grad_accum=%d is out of range", s->B, s->T, s->grad_accum);
    else if (s->shuffle != 0 && s->shuffle != 1) snprintf(msg, len, "shuffle flag %d is neither 0 nor 1", s->shuffle);
    else if (s->zero_stage < 0 || s->zero_stage > 3 || s->dp < 1 || s->dp > (1 << 20))
        snprintf(msg, len, "ZeRO stage %d or dp %d is out of range", s->zero_stage, s->dp);
    else if (!(s->loss_scale > 0.0f) || !isfinite(s->loss_scale) || s->scale_good_steps < 0 ||
             s->scale_hysteresis_left < 0)
        snprintf(msg, len, "loss scaler state (scale %g, %d clean steps, %d overflows left) is out of range",
                 s->loss_scale, s->scale_good_steps, s->scale_hysteresis_left);
    else if (s->data_files < 0 || s->data_tokens < 0 || (s->data_files == 0) != (s->data_tokens == 0))
        snprintf(msg, len, "training data fingerprint (%d files, %lld tokens) is impossible", s->data_files,
                 s->data_tokens);
    else return NULL;
    return msg;
}

// Refuses a decoded header whose sizes differ from the model's or whose fields are out of range, so that
// a forged or damaged header cannot steer the run (a negative step would mean a negative learning rate,
// an absurd batch an absurd allocation). size: the file's length in bytes.
static void state_header_check(const char* path, const GPT2Config* model, const RunState* s, uint64_t n,
                               uint64_t n_ranges, long long size) {
    validate_config(&s->config, path);
    if (memcmp(&s->config, model, sizeof(*model)) != 0)
        fatal("'%s' holds the optimizer state of a model of other sizes (L=%d C=%d NH=%d V=%d maxT=%d) than its model "
              "file (L=%d C=%d NH=%d V=%d maxT=%d)",
              path, s->config.L, s->config.C, s->config.NH, s->config.V, s->config.maxT, model->L, model->C, model->NH,
              model->V, model->maxT);
    if (n != gpt2_num_parameters(&s->config))
        fatal("'%s': parameter count %llu does not match its model sizes", path, (unsigned long long)n);
    if (s->num_shards < 1 || s->num_shards > (1 << 24) || s->shard < 0 || s->shard >= s->num_shards)
        fatal("'%s': bad shard %d of %d", path, s->shard, s->num_shards);
    char why[256];
    if (run_state_error(s, why, sizeof(why))) fatal("'%s': %s", path, why);
    if (n_ranges > n + 1024 || (long long)(1024 + 16 * n_ranges) > size)
        fatal("'%s' is truncated or corrupt (%llu ranges)", path, (unsigned long long)n_ranges);
}

// Reads the n_ranges (offset, count) pairs that follow the header, each checked to lie inside the n
// parameters; returns them malloc'ed ([2 * n_ranges]) and their total count of values in *count.
static int64_t* state_ranges_read(FILE* f, const char* path, uint64_t n, uint64_t n_ranges, uint64_t* count) {
    int64_t* ranges = (int64_t*)malloc_check(2 * n_ranges * sizeof(int64_t));
    fread_check(ranges, sizeof(int64_t), 2 * n_ranges, f, path);
    *count = 0;
    for (uint64_t r = 0; r < n_ranges; r++) {
        // offset + count > n, written so that forged values cannot overflow the sum
        if (ranges[2 * r] < 0 || ranges[2 * r + 1] < 0 || (uint64_t)ranges[2 * r] > n ||
            (uint64_t)ranges[2 * r + 1] > n - (uint64_t)ranges[2 * r])
            fatal("'%s' is corrupt: range %llu is outside the model", path, (unsigned long long)r);
        *count += ranges[2 * r + 1];
    }
    return ranges;
}

static void range_list_append(RangeList* l, int64_t offset, int64_t count) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->pairs = (int64_t*)realloc_check(l->pairs, 2 * l->cap * sizeof(int64_t));
    }
    l->pairs[2 * l->n] = offset;
    l->pairs[2 * l->n++ + 1] = count;
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
    if (header[1] < 1 || header[1] > STATE_VERSION)
        fatal("'%s': unsupported state file version %d (1 to %d are known)", path, header[1], STATE_VERSION);
    uint64_t n, n_ranges, count;
    state_header_decode(header, s, &n, &n_ranges);
    state_header_check(path, model, s, n, n_ranges, size);
    int64_t* ranges = state_ranges_read(f, path, n, n_ranges, &count);
    long long expected = 1024LL + 16LL * (long long)n_ranges + 8LL * (long long)count + 8;
    if (size != expected)
        fatal("'%s' has %lld bytes but its header implies %lld (%s)", path, size, expected,
              size < expected ? "truncated" : "trailing bytes");
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
        // The moments themselves: a NaN or infinite m, or a negative or infinite v (a mean of squares),
        // would make every later update of its parameter NaN (the square root of a negative) or
        // infinite, silently. Checked after the checksum, so that a damaged file is called corrupt; a
        // file with a good checksum and such values was written so (forged, or by another program).
        for (int64_t j = 0; j < ranges[2 * r + 1]; j++) {
            float mj = m[pos + j], vj = v[pos + j];
            if (!isfinite(mj) || !isfinite(vj) || vj < 0.0f)
                fatal("'%s': AdamW moments m = %g, v = %g of parameter %lld: m must be finite, v finite and >= 0", path,
                      mj, vj, (long long)(ranges[2 * r] + j));
        }
        if (covered) range_list_append(covered, ranges[2 * r], ranges[2 * r + 1]);
        memcpy(*m_full + ranges[2 * r], m + pos, ranges[2 * r + 1] * sizeof(float));
        memcpy(*v_full + ranges[2 * r], v + pos, ranges[2 * r + 1] * sizeof(float));
        pos += ranges[2 * r + 1];
    }
    free(ranges);
    free(m);
    free(v);
}
