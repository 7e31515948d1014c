/*
 * fuzz_model.cpp: libFuzzer harness for the model file reader, model_file_read (llmc/model_file.h).
 *
 * Each input is a candidate model file. The reader runs twice, as the trainer calls it: header only
 * (to learn the sizes), then with the parameters. A forged file must end in fatal(), never in an
 * out-of-bounds access, undefined behaviour or an allocation the file's size does not justify.
 */
#include "fuzz_harness.h"
#include "../../llmc/model_file.h"

typedef struct {
    const char* path;
    GPT2Config config;
    float* params;  // (n) in file order; NULL for the header-only read
    int with_params;
} ModelCall;

static void read_model(void* ctx) {
    ModelCall* call = (ModelCall*)ctx;
    model_file_read(call->path, &call->config, call->with_params ? &call->params : NULL);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[512];
    fuzz_path("model.bin", path, sizeof(path));
    fuzz_write_file(path, data, size);
    for (int with_params = 0; with_params <= 1; with_params++) {
        ModelCall call = {path, {}, NULL, with_params};
        if (!fuzz_try(read_model, &call)) return 0;
        free(call.params);
    }
    return 0;
}
