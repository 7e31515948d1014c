/*
 * fuzz_state.cpp: libFuzzer harness for the optimizer state reader, state_file_read (llmc/run/state_file.h).
 *
 * Each input is a candidate state shard, read three ways, as load_checkpoint reads shards:
 *   1. as it is, as the first shard (the reader allocates the whole-model moment arrays);
 *   2. with its trailing checksum recomputed, as the first shard: a mutated file almost never carries a
 *      matching FNV-1a checksum, and without this the fuzzer would hardly get past that check;
 *   3. the same, as a later shard, after a valid shard of the tiny model has allocated the arrays: a
 *      later shard must fit them.
 * The model file of the checkpoint is taken to be the tiny model's: TINY_CONFIG, the sizes the seeds
 * of make_seeds.sh are trained with (it also makes a seed of other sizes, which must be refused).
 * What a read accepts must be usable: the step within AdamW's int step number, every m finite, every v
 * finite and >= 0 (anything else would turn the run's updates into NaN without a word).
 */
#include <limits.h>

#include "fuzz_harness.h"
#include "../../llmc/run/state_file.h"

static const GPT2Config TINY_CONFIG = {8, 64, 128, 1, 1, 4};  // maxT V Vp L NH C
static char valid_shard[512];  // path of the valid shard of the tiny model

typedef struct {
    const char* path;
    RunState state;
    float *m, *v;         // (n) whole-model moments, allocated by the first shard read
    RangeList covered;  // the ranges of the shards read so far
} StateCall;

static void read_state(void* ctx) {
    StateCall* call = (StateCall*)ctx;
    state_file_read(call->path, &TINY_CONFIG, &call->state, &call->m, &call->v, &call->covered);  // the model file's sizes
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {  // one shard with every moment of the tiny model
    size_t n = gpt2_num_parameters(&TINY_CONFIG);
    float* moments = (float*)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) moments[i] = 0.5f;
    RunState s = {};
    s.config = TINY_CONFIG;
    s.B = 1, s.T = 8, s.grad_accum = 1, s.step = 2, s.updates = 2, s.num_shards = 1, s.dp = 1, s.loss_scale = 1.0f;
    int64_t range[2] = {0, (int64_t)n};
    fuzz_path("valid_state.bin", valid_shard, sizeof(valid_shard));
    state_file_write(valid_shard, &s, range, 1, moments, moments);
    free(moments);
    return 0;
}

// reads `paths` in order into one pair of moment arrays, as the shards of one checkpoint, then checks
// that their ranges cover the model, as load_checkpoint does
static void read_shards(const char* const* paths, int count) {
    StateCall call = {NULL, {}, NULL, NULL, {NULL, 0, 0}};
    for (int i = 0; i < count; i++) {
        call.path = paths[i];
        StateCall before = call;  // what earlier shards allocated belongs to this function
        if (!fuzz_try(read_state, &call)) {  // what this call allocated is freed already
            free(before.m);  // a reader allocates the moments only when they are NULL
            free(before.v);
            if (call.covered.pairs == before.covered.pairs) free(before.covered.pairs);  // else realloc freed it
            return;
        }
    }
    size_t n = gpt2_num_parameters(&TINY_CONFIG);
    if (call.state.step > INT_MAX) {
        fprintf(stderr, "step %lld accepted, beyond AdamW's int step number\n", call.state.step);
        abort();
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(call.m[i]) || !isfinite(call.v[i]) || call.v[i] < 0.0f) {
            fprintf(stderr, "moments m = %g, v = %g of parameter %zu accepted\n", call.m[i], call.v[i], i);
            abort();
        }
    char why[256];
    ranges_cover(&call.covered, gpt2_num_parameters(&call.state.config), call.state.version >= 2, why, sizeof(why));
    free(call.m);
    free(call.v);
    free(call.covered.pairs);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char raw[512], fixed[512];
    fuzz_path("state_raw.bin", raw, sizeof(raw));
    fuzz_path("state_fixed.bin", fixed, sizeof(fixed));
    fuzz_write_file(raw, data, size);
    const char* alone[1] = {raw};
    read_shards(alone, 1);
    if (size < 1024 + 8) return 0;
    uint8_t* copy = (uint8_t*)malloc(size);
    memcpy(copy, data, size);
    uint64_t checksum = fnv1a_update(FNV1A_INIT, copy, size - 8);
    memcpy(copy + size - 8, &checksum, 8);
    fuzz_write_file(fixed, copy, size);
    free(copy);
    alone[0] = fixed;
    read_shards(alone, 1);
    const char* after_valid[2] = {valid_shard, fixed};
    read_shards(after_valid, 2);
    return 0;
}
