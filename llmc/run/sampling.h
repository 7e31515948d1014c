/*
 * sampling.h: what a sample needs besides the model's forward (train_gpt.cu's gpt2_sample): how to draw
 * the next token from the logits (greedy, temperature, top-k), how to print it, and the GPT-2 encoding of
 * --prompt (llmc/run/bpe.h); also --encode, which prints the token ids of a text.
 */
#pragma once

#include "bpe.h"        // BpeEncoder
#include "config.h"     // TrainConfig, bpe_dir_of
#include "tokenizer.h"  // Tokenizer

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
    for (int i = 0; i < V; i++)
        sum += probs[i] = logits[i] >= cut ? expf((logits[i] - logits[best]) / sc->temperature) : 0.0f;
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
    free(ids);
    free(text);
    bpe_free(&bpe);
}
