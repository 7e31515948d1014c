/*
 * inputs.h: what a run reads: where it starts from (the newest checkpoint of --resume, a --model file,
 * or nothing), its training and validation data, its multiple-choice set, and the tokenizer and prompt of
 * its samples; and what a resume must find unchanged (the batch shape, the data's fingerprint).
 */
#pragma once

#include "agreement.h"   // agree_file, AGREE_FNV_INIT: the data's fingerprint hashes files as the ranks compare them
#include "checkpoint.h"  // load_checkpoint
#include "../comm.h"     // Comm
#include "dataloader.h"  // DataLoader
#include "eval.h"        // EvalSet
#include "config.h"      // TrainConfig
#include "sampling.h"    // SampleConfig, encode_prompt
#include "tokenizer.h"   // Tokenizer

// The training data's fingerprint (state files record it: llmc/run/state_file.h)
typedef struct {
    uint64_t hash;     // its files' names, sizes and first MiB
    long long tokens;
    int files;
} DataFingerprint;

typedef struct {
    DataLoader train, val;
    int have_train, have_val;  // --steps 0 reads no train data; validation needs --val-data and --val-every
    DataFingerprint data;      // of the training data (have_train)
    EvalSet choices;           // --eval-data
    FILE* dump;                // --eval-dump
    int have_tok;              // samples on: every rank samples, world rank 0 prints
    Tokenizer tok;
    SampleConfig sample;
    int* prompt;               // (sample.n_prompt) --prompt's tokens, or NULL
} RunInputs;

// What the run starts from: the newest checkpoint in --resume (the model, the AdamW moments into *m, *v
// and the run state), a --model file, or nothing (*params stays NULL: random initialization). The model
// sizes go to *config.
static void read_start_point(const TrainConfig* tc, int D, int main_rank, RunState* state, GPT2Config* config,
                             float** params, float** m, float** v) {
    if (tc->resume) {
        load_checkpoint(tc->resume, state, config, params, m, v);
        if (state->B != D * tc->B || state->T != tc->T || state->grad_accum != tc->grad_accum ||
            state->shuffle != tc->shuffle)
            fatal("the checkpoint in '%s' was saved with %d sequences per micro-step (dp x B), T=%d, grad_accum=%d, "
                  "shuffle=%d; resume needs the same (got dp=%d x B=%d, T=%d, grad_accum=%d, shuffle=%d)",
                  tc->resume, state->B, state->T, state->grad_accum, state->shuffle, D, tc->B, tc->T, tc->grad_accum,
                  tc->shuffle);
        if (tc->shuffle && state->data_seed != tc->seed)
            fatal("the checkpoint in '%s' shuffled the data with --seed %llu; resume needs the same (got %llu)",
                  tc->resume, (unsigned long long)state->data_seed, (unsigned long long)tc->seed);
        if (main_rank)
            printf("resuming from step %lld of '%s' (saved with dp=%d, ZeRO-%d)\n", state->step, tc->resume, state->dp,
                   state->zero_stage);
    } else if (tc->model_file) {
        model_file_read(tc->model_file, config, params);
    }
    if (tc->resume && tc->steps < state->step)
        fatal("--steps %lld is below the step %lld the checkpoint in '%s' has reached: nothing to train", tc->steps,
              state->step, tc->resume);
    if (tc->resume && tc->stop_after > 0 && tc->stop_after <= state->step)
        fatal("--stop-after %lld is not after the step %lld the checkpoint in '%s' has reached", tc->stop_after,
              state->step, tc->resume);
}

// Model sizes given on the command line must be those of the model file or checkpoint.
static void check_sizes_given(const TrainConfig* tc, const GPT2Config* config) {
    const GPT2Config* a = &tc->arch;
    if (((tc->arch_given & GIVEN_L) && a->L != config->L) || ((tc->arch_given & GIVEN_C) && a->C != config->C) ||
        ((tc->arch_given & GIVEN_NH) && a->NH != config->NH) || ((tc->arch_given & GIVEN_V) && a->V != config->V) ||
        ((tc->arch_given & GIVEN_MAXT) && a->maxT != config->maxT))
        fatal("model sizes on the command line differ from the model file's (L=%d C=%d NH=%d V=%d maxT=%d)", config->L,
              config->C, config->NH, config->V, config->maxT);
}

// The training data's fingerprint that checkpoints record (llmc/run/state_file.h): its files' names, sizes and
// first MiB, hashed as the ranks compare them (agree_file, llmc/run/agreement.h), their number and their
// tokens. Names without their folder: the same files copied to another disk are the same data.
static DataFingerprint fingerprint_train_data(const DataLoader* dl) {
    DataFingerprint f = {.hash = AGREE_FNV_INIT, .tokens = dl->total_tokens, .files = dl->n_files};
    for (int i = 0; i < dl->n_files; i++) f.hash = agree_file(f.hash, dl->paths[i]);
    return f;
}

// A resume continues at the position in the token stream that its step fixes: on other files, an added
// shard or a changed file that position means other tokens, and the run would go on without notice on
// data it was not trained on. Refused unless --allow-data-change says the change is meant; a checkpoint
// that records no data (state file version 1 or 2) resumes with a notice. Called after the ranks agreed
// on the data, so every rank comes to the same verdict.
static void check_resumed_data(const TrainConfig* tc, const RunState* s, const RunInputs* in, int main_rank) {
    if (!tc->resume || !in->have_train) return;
    if (s->data_files == 0) {
        if (main_rank)
            printf("note: the checkpoint in '%s' records no fingerprint of its training data (state file version %d): "
                   "--train-data is not checked against it\n", tc->resume, s->version);
        return;
    }
    if (s->data_hash == in->data.hash && s->data_files == in->data.files && s->data_tokens == in->data.tokens) return;
    char what[256];
    snprintf(what, sizeof(what), "%d file%s, %lld tokens; now %d file%s, %lld tokens%s", s->data_files,
             s->data_files == 1 ? "" : "s", s->data_tokens, in->data.files, in->data.files == 1 ? "" : "s",
             in->data.tokens,
             s->data_files == in->data.files && s->data_tokens == in->data.tokens
                 ? ", with other names, sizes or contents"
                 : "");
    if (!tc->allow_data_change)
        fatal("the checkpoint in '%s' was trained on other data (%s) than --train-data '%s': resume with its data, or "
              "give --allow-data-change if the change is meant", tc->resume, what, tc->train_data);
    if (main_rank)
        printf("--allow-data-change: the checkpoint in '%s' was trained on other data (%s); step %lld goes on with "
               "--train-data '%s'\n", tc->resume, what, s->step + 1, tc->train_data);
}

// Opens the inputs: train and validation loaders, the multiple-choice set, and the tokenizer and prompt of
// the samples (on the ranks that sample).
static void run_inputs_open(RunInputs* in, const TrainConfig* tc, const GPT2Config* c, const Comm* comm) {
    int D = comm->dp, main_rank = comm->world_rank == 0;
    in->have_train = tc->steps > 0;  // --steps 0 only validates and samples: the train data is not read
    if (in->have_train) dataloader_init(&in->train, tc->train_data, tc->B, tc->T, D, c->V, tc->shuffle, tc->seed);
    in->have_val = tc->val_data != NULL && tc->val_data[0] != '\0' && tc->val_every > 0;
    if (in->have_val) dataloader_init(&in->val, tc->val_data, tc->B, tc->T, D, c->V, 0, 0);
    if (tc->eval_data) {
        eval_load(&in->choices, tc->eval_data, c->V);
        if (tc->eval_dump && comm->world_size > 1) fatal("--eval-dump is for one rank");
        if (tc->eval_dump) in->dump = fopen_check(tc->eval_dump, "w");
    }
    // Every DP group samples (its TP and PP ranks together); world rank 0 prints. The other DP groups'
    // samples are the same and unseen, but they take the time the first one takes: were only the first
    // to sample, the others would wait for it in the next step's collectives, where a long sample passed
    // --comm-timeout and ended the run as if a peer were stopped, hung or gone.
    in->have_tok = tc->tokenizer != NULL && tc->tokenizer[0] != '\0' && tc->sample_every > 0;
    if (in->have_tok) {
        Tokenizer* tok = &in->tok;
        tokenizer_init(tok, tc->tokenizer);
        // samples are ids of the model's vocabulary, started by the end-of-text id: the table must be the model's
        if (tok->V != c->V)
            fatal("the tokenizer '%s' has %d tokens, the model's vocabulary %d: it cannot decode this model's samples "
                  "(give the model's tokenizer, or --tokenizer \"\" for no samples)", tc->tokenizer, tok->V, c->V);
        if (tok->eot < 0 || tok->eot >= c->V)
            fatal("the tokenizer '%s': end-of-text id %d is not in the vocabulary of %d",
                  tc->tokenizer, tok->eot, c->V);
    }
    in->sample = (SampleConfig){.prompt = NULL, .n_prompt = 0, .len = tc->sample_len, .temperature = tc->temperature,
                                .top_k = tc->top_k};
    in->prompt = in->have_tok && tc->prompt ? encode_prompt(tc, c, &in->sample.n_prompt) : NULL;
    in->sample.prompt = in->prompt;
    // a sample is one forward window: the end-of-text token, the prompt and what is generated fit in
    // --seq-len, so a longer --sample-len is cut; said once, not left for the reader to count
    int room = tc->T - 1 - in->sample.n_prompt;
    if (in->have_tok && main_rank && tc->sample_len > room)
        printf("--sample-len %d: samples have %d tokens after the end-of-text token%s (they fit in --seq-len %d)\n",
               tc->sample_len, room, in->prompt ? " and the prompt" : "", tc->T);
}

// Closes what run_inputs_open opened.
static void run_inputs_free(RunInputs* in, const TrainConfig* tc) {
    if (in->have_tok) tokenizer_free(&in->tok);
    free(in->prompt);
    if (tc->eval_data) eval_free(&in->choices);
    if (in->dump && fclose(in->dump) != 0) fatal("cannot write '%s': %s", tc->eval_dump, strerror(errno));
    if (in->have_val) dataloader_free(&in->val);
    if (in->have_train) dataloader_free(&in->train);
}
