/*
 * fuzz_tokens.cpp: libFuzzer harness for the token shard reader, dataloader_init and dataloader_load
 * (llmc/run/dataloader.h).
 *
 * Each input is a candidate shard, shard_0.bin, read together with a small valid shard_1.bin (so
 * batches cross from one file to the next). A stream that loads is then read as training reads it,
 * in order and shuffled, with one and two data-parallel ranks, past the end of the first epoch; every
 * token handed out must be below the vocabulary size the loader checked against.
 */
#include "fuzz_harness.h"
#include "../../llmc/run/dataloader.h"

static const int B = 2, T = 4, V = 50257;  // GPT-2's vocabulary, as the default data uses

typedef struct {
    const char* pattern;
    int D, shuffle;
    DataLoader dl;
} LoaderCall;

static void open_loader(void* ctx) {
    LoaderCall* call = (LoaderCall*)ctx;
    dataloader_init(&call->dl, call->pattern, B, T, call->D, V, call->shuffle, 1234);
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {  // the valid second shard: 16 tokens 0..15
    int header[256] = {TOKENS_MAGIC, 1, 16};
    uint8_t bytes[sizeof(header) + 16 * sizeof(uint16_t)];
    memcpy(bytes, header, sizeof(header));
    for (uint16_t i = 0; i < 16; i++) memcpy(bytes + sizeof(header) + 2 * i, &i, 2);
    char path[512];
    fuzz_path("shard_1.bin", path, sizeof(path));
    fuzz_write_file(path, bytes, sizeof(bytes));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[512], pattern[512];
    fuzz_path("shard_0.bin", path, sizeof(path));
    fuzz_path("shard_*.bin", pattern, sizeof(pattern));
    fuzz_write_file(path, data, size);
    for (int D = 1; D <= 2; D++)
        for (int shuffle = 0; shuffle <= 1; shuffle++) {
            LoaderCall call = {pattern, D, shuffle, {}};
            if (!fuzz_try(open_loader, &call)) return 0;
            long long batches = 2 * call.dl.n_batches * D + 1;  // into the third epoch
            for (long long k = 0; k < batches && k < 64; k++) {
                dataloader_load(&call.dl, k);
                for (int i = 0; i < B * T; i++)
                    if (call.dl.inputs[i] >= V || call.dl.targets[i] >= V) {
                        fprintf(stderr, "token %d or %d >= V = %d handed out\n", call.dl.inputs[i], call.dl.targets[i], V);
                        abort();
                    }
            }
            dataloader_free(&call.dl);
        }
    return 0;
}
