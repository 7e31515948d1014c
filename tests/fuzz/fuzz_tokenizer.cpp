/*
 * fuzz_tokenizer.cpp: libFuzzer harness for the decode table reader, tokenizer_init (llmc/run/tokenizer.h).
 *
 * Each input is a candidate tokenizer file. A table that loads is then used as the trainer uses it:
 * every id, the end-of-text id and a few ids outside the table are printed (stdout goes to /dev/null).
 */
#include "fuzz_harness.h"
#include "../../llmc/run/tokenizer.h"

typedef struct {
    const char* path;
    Tokenizer tok;
} TokenizerCall;

static void read_tokenizer(void* ctx) {
    TokenizerCall* call = (TokenizerCall*)ctx;
    tokenizer_init(&call->tok, call->path);
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    if (freopen("/dev/null", "w", stdout) == NULL) abort();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    char path[512];
    fuzz_path("tokenizer.bin", path, sizeof(path));
    fuzz_write_file(path, data, size);
    TokenizerCall call = {path, {}};
    if (!fuzz_try(read_tokenizer, &call)) return 0;
    for (int id = 0; id < call.tok.V; id++) tokenizer_print(&call.tok, id);
    const int others[] = {call.tok.eot, -1, call.tok.V, 65536, -2147483647 - 1};
    for (int id : others) tokenizer_print(&call.tok, id);
    tokenizer_free(&call.tok);
    return 0;
}
