/*
 * config.h: a run's configuration: everything the command line sets (TrainConfig; llmc/run/cli.h parses
 * it), its defaults (the `make train` job), and the settings every rank must share, compared at start-up
 * (check_ranks_agree, through llmc/run/agreement.h).
 */
#pragma once

#include <sys/stat.h>  // stat

#include "../adamw.h"        // OptimizerConfig
#include "agreement.h"       // Agreement, agree_*
#include "../comm.h"         // Comm
#include "../device.h"       // KernelChoice, TARGET_NAME, PRECISION_NAME
#include "fault.h"           // FaultPlan
#include "../loss_scaler.h"  // LossScaler
#include "../matmul.h"       // cpu_blas_linked
#include "../model_file.h"   // GPT2Config
#include "../pipeline.h"     // Schedule
#include "state_file.h"      // RunState

// --model-preset NAME: a model's sizes, and the data it trains on unless --train-data, --val-data or
// --tokenizer say otherwise.
typedef struct {
    const char* name;
    GPT2Config arch;  // (Vp: derived from V)
    const char* train_data;
    const char* val_data;
    const char* tokenizer;
    const char* made_by;  // the script that writes the data
} ModelPreset;

// learner: the model the guides teach on. The default model's vocabulary of 50257 makes its embedding
// 89% of the parameters, so ZeRO's fixed costs (ZeRO-2's whole-embedding gradient workspace, ZeRO-3's
// gathered embedding) outweigh what it shards, and its classifier is 30 layers' work on the last pipeline
// stage. With bytes for tokens (V = 256) the 16 layers hold 99% of the parameters, model state (16 bytes a
// parameter in fp32) outweighs the activations of the default micro-batch, and stages of whole layers do
// even work (the classifier is 1/12 of a layer); a step on one CPU core takes about a third of a second.
static const ModelPreset MODEL_PRESETS[] = {
    {"learner", {.maxT = 128, .V = 256, .Vp = 0, .L = 16, .NH = 4, .C = 256}, "build/learner/train.bin",
     "build/learner/val.bin", "build/learner/tokenizer.bin", "scripts/learner_data.py"},
};

static const ModelPreset* find_model_preset(const char* name) {
    for (size_t i = 0; i < sizeof(MODEL_PRESETS) / sizeof(MODEL_PRESETS[0]); i++)
        if (!strcmp(MODEL_PRESETS[i].name, name)) return &MODEL_PRESETS[i];
    return NULL;
}

// TrainConfig.arch_given's bits: the model sizes given on the command line (or by --model-preset)
enum { GIVEN_L = 1, GIVEN_C = 2, GIVEN_NH = 4, GIVEN_V = 8, GIVEN_MAXT = 16, GIVEN_ALL_SIZES = 31 };

// Everything the command line sets.
typedef struct {
    // data
    const char* train_data;
    const char* val_data;
    const char* tokenizer;
    int shuffle;
    // model: from a file, or from scratch with these sizes
    const char* model_file;
    GPT2Config arch;
    int arch_given;  // which sizes the command line gave: GIVEN_L | GIVEN_C | ... (a model file must match them)
    uint64_t seed;
    // batch (B is per rank: the global batch of a micro-step is dp x B sequences)
    int B, T, grad_accum;
    // parallelism
    int dp;              // data-parallel ranks (0: the world size / tp)
    int tp;              // tensor-parallel ranks
    int pp;              // pipeline stages
    const char* pp_split;  // layers per stage "a,b,c", or NULL: as even as possible
    Schedule pipe_schedule;  // GPipe, 1F1B, interleaved 1F1B or ZB-H1
    int virtual_stages;    // --virtual-stages V: chunks per stage (interleaved; 1 otherwise)
    int rematerialize;     // pipeline: keep only stage inputs, recompute activations in backward
    int recompute;         // --recompute 0..3 (what each level keeps: RecomputeKeeps, llmc/recompute.h)
    int recompute_segment; // --recompute-segment K: with --recompute 3, layers per segment (1: a checkpoint per layer)
    int stochastic_rounding;  // BF16 builds: round parameter updates stochastically
    KernelChoice kernels;     // --fused-kernels, --attention, --cpu-matmul (llmc/device.h): the model's kernel variants
    int plan;                 // --plan: print the memory plan and exit
    int print_schedule;       // --print-schedule: print every stage's pipeline schedule and exit
    const char* plan_precision;
    double device_memory;     // --device-memory, bytes (0: not given)
    const char* trace;     // --trace FILE, or NULL
    int trace_steps;
    int zero;            // ZeRO stage 0, 1, 2, 3
    const char* engine;  // auto | mpi | nccl
    const char* nccl_id_dir;
    double comm_timeout;  // --comm-timeout: seconds a wait on other ranks may take (0: no limit)
    double io_timeout;    // --io-timeout: the same around file I/O (checkpoint saves, loading)
    FaultPlan fault;     // testing: fault injection (llmc/run/fault.h, --help-testing)
    LossScaler scaler;   // loss scaling settings (llmc/loss_scaler.h)
    // optimization
    long long steps;
    long long stop_after;  // end this run after this step (0: run to --steps); the schedule still plans for steps
    OptimizerConfig opt;
    int warmup;
    const char* lr_schedule;  // --lr-schedule: cosine | linear | constant (llmc/run/lr_schedule.h)
    float lr_min_frac;
    // evaluation, sampling, checkpoints, logs
    int val_every, val_batches, sample_every, sample_len;
    const char* prompt;      // --prompt TEXT: samples continue it (NULL: they start from end-of-text alone)
    const char* bpe_dir;     // folder of encoder.json and vocab.bpe (NULL: beside --tokenizer, else data/)
    const char* encode_file; // --encode FILE: print its GPT-2 tokens and exit
    float temperature;       // sampling: 0 greedy
    const char* eval_data;   // --eval-data: multiple-choice examples (llm.c's format), or NULL
    int eval_every;
    const char* eval_dump;   // --eval-dump: each example's completion losses (checks)
    int top_k;               // sampling: 0 all tokens
    int save_every;
    const char* checkpoint_dir;
    const char* resume;  // checkpoint folder to resume from, or NULL
    const char* resume_if_present;  // resume from this folder if it holds a complete checkpoint, else start fresh
    int keep_last;       // keep this many newest checkpoints, delete older ones (0: keep all)
    int allow_data_change;  // --allow-data-change: a resume may train on other data than its checkpoint's
    const char* log_file;
    const char* save_model;  // write the final model here (llm.c format), or NULL
    int save_model_version;  // its model file version: 3 fp32 (default) or 5 bf16
    int quiet;               // no per-step lines (tests)
    int argc;                // the command line, for the log's configuration line
    char** argv;
} TrainConfig;

static void default_train_config(TrainConfig* tc) {
    memset(tc, 0, sizeof(*tc));
    tc->train_data = "data/devil_train.bin";
    tc->val_data = "data/devil_val.bin";
    tc->tokenizer = "data/gpt2_tokenizer.bin";
    tc->arch = (GPT2Config){.maxT = 128, .V = 50257, .Vp = 0, .L = 4, .NH = 4, .C = 128};  // Vp: derived from V
    tc->seed = 1337;
    tc->comm_timeout = 120.0;
    tc->io_timeout = 3600.0;
    tc->kernels.cpu_blas = cpu_blas_linked;  // llmc/matmul.h: OpenBLAS where the build linked it
    // the GPU's fast path, the default since it passed scripts/check_gpu.sh (README's status): the fused
    // kernels (the CPU target runs its one set of loops either way), and flash attention wherever it can
    // run (made for the model: attention_choice)
    tc->kernels.fused = 1;
    tc->kernels.flash_attention = ATTENTION_AUTO;
    tc->B = 8;
    tc->T = 64;
    tc->grad_accum = 1;
    tc->steps = 150;
    // lr: at 3e-3 the default job's 150 steps were chaotic (a change of rounding alone moved its final val
    // loss by 0.1 nats); at 1.5e-3 it ends lower, about 5.12 against 5.2-5.3, and the same whatever the rounding
    tc->opt = (OptimizerConfig){.lr = 1.5e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                .grad_clip = 1.0f};
    tc->warmup = 20;
    tc->lr_schedule = "cosine";
    tc->lr_min_frac = 0.1f;
    tc->val_every = 50;
    tc->val_batches = 10;
    tc->sample_every = 75;
    tc->sample_len = 48;
    tc->temperature = 1.0f;
    tc->eval_every = 50;
    tc->checkpoint_dir = "checkpoints";
    tc->save_model_version = 3;
    tc->engine = "auto";
    tc->tp = 1;
    tc->recompute_segment = 1;
    tc->pp = 1;
    tc->pipe_schedule = SCHEDULE_GPIPE;
    tc->virtual_stages = 1;
    tc->trace_steps = 2;
    tc->fault = fault_plan_none();
    tc->stochastic_rounding = BF16_BUILD;
    // FP16 needs loss scaling; BF16 and FP32 have fp32's exponent range and do not
    tc->scaler = (LossScaler){.mode = FP16_BUILD ? SCALE_DYNAMIC : SCALE_OFF, .scale = 65536.0f, .growth = 2.0f,
                              .backoff = 0.5f, .interval = 2000, .hysteresis = 1, .good_steps = 0,
                              .hysteresis_left = 1};
}

// The folder of encoder.json and vocab.bpe: --bpe-dir, else the --tokenizer file's folder if it holds
// encoder.json, else data/
static const char* bpe_dir_of(const TrainConfig* tc, char* buf, size_t cap) {
    if (tc->bpe_dir) return tc->bpe_dir;
    const char* slash = tc->tokenizer ? strrchr(tc->tokenizer, '/') : NULL;
    snprintf(buf, cap, "%.*s/encoder.json", slash ? (int)(slash - tc->tokenizer) : 1, slash ? tc->tokenizer : ".");
    struct stat st;
    if (tc->tokenizer && tc->tokenizer[0] != '\0' && stat(buf, &st) == 0) {
        buf[strlen(buf) - strlen("/encoder.json")] = '\0';
        return buf;
    }
    return "data";
}

// Before the first collective of the run: every rank must run the same job (llmc/run/agreement.h). What may
// differ between ranks is left out: output paths only rank 0 writes (--log, --save-model's name,
// --eval-dump: one rank only), what only rank 0 does (--keep-last: rank 0 deletes old checkpoints), the
// folders files are read from (node-local copies are fine if their files are the same), each rank's own
// deadlines (--comm-timeout, --io-timeout: the first rank past one ends the run) and threads
// (OMP_NUM_THREADS: a node's cores are its own, and what replicas must compute alike, the gradient norm,
// is summed in fixed chunks whatever the thread count). --comm is compared by the engine's choice
// (mpi_agree_engine), the launchers' variables at the start (llmc/comm/launch.h, llmc/comm/rendezvous.h).
static void check_ranks_agree(const TrainConfig* tc, Comm* comm, const GPT2Config* c, const RunState* state) {
    if (comm->world_size == 1) return;
    Agreement a = {.names = {NULL}, .hashes = {0}, .n = 0};
    agree_string(&a, "the build (target and precision)", TARGET_NAME " " PRECISION_NAME);
    agree_int(&a, "--steps", tc->steps);
    agree_int(&a, "--stop-after", tc->stop_after);
    agree_int(&a, "--batch-size", tc->B);
    agree_int(&a, "--seq-len", tc->T);
    agree_int(&a, "--grad-accum / --micro-batches", tc->grad_accum);
    agree_int(&a, "the grid (--dp, --tp, --pp)",
              (long long)comm->dp * 1000003 * 1000003 + comm->tp * 1000003 + comm->pp);
    agree_int(&a, "--zero", tc->zero);
    long long pipe[3] = {tc->pipe_schedule, tc->rematerialize, tc->virtual_stages};
    agree_bytes(&a, "the pipeline settings (--pp-split, --pp-schedule, --pp-rematerialize, --virtual-stages)", pipe,
                sizeof(pipe), tc->pp_split);
    agree_int(&a, "--recompute", tc->recompute);
    agree_int(&a, "--recompute-segment", tc->recompute_segment);
    agree_int(&a, "--seed", (long long)tc->seed);
    agree_int(&a, "--shuffle", tc->shuffle);
    agree_double(&a, "--lr", tc->opt.lr);
    double opt[5] = {tc->opt.beta1, tc->opt.beta2, tc->opt.eps, tc->opt.weight_decay, tc->opt.grad_clip};
    agree_bytes(&a, "the optimizer settings (--beta1, --beta2, --eps, --weight-decay, --grad-clip)", opt,
                sizeof(opt), NULL);
    double sched[2] = {(double)tc->warmup, tc->lr_min_frac};
    agree_bytes(&a, "the learning-rate schedule (--warmup, --lr-schedule, --lr-min-frac)", sched, sizeof(sched),
                tc->lr_schedule);
    const LossScaler* ls = &tc->scaler;
    double scaling[6] = {(double)ls->mode, ls->scale, ls->growth, ls->backoff, (double)ls->interval,
                         (double)ls->hysteresis};
    agree_bytes(&a, "the loss scaling settings", scaling, sizeof(scaling), NULL);
    agree_int(&a, "--stochastic-rounding", tc->stochastic_rounding);
    agree_bytes(&a, "the model sizes (L, C, NH, V, maxT)", c, sizeof(*c), NULL);
    agree_files(&a, "the model file (--model)", tc->model_file);
    agree_files(&a, "the training data (--train-data: a file's name, size or first MiB)", tc->train_data);
    agree_files(&a, "the validation data (--val-data: a file's name, size or first MiB)", tc->val_data);
    // the DP ranks score their share of the examples and add up the counts: another file or another
    // schedule on one rank gives a wrong accuracy, or a collective that the others never reach
    agree_files(&a, "the multiple-choice data (--eval-data: a file's name, size or first MiB)", tc->eval_data);
    long long evals[3] = {tc->val_every, tc->val_batches, tc->eval_every};
    agree_bytes(&a, "the evaluation settings (--val-every, --val-batches, --eval-every)", evals, sizeof(evals), NULL);
    agree_files(&a, "the tokenizer (--tokenizer)", tc->tokenizer);
    // the TP (and PP) ranks of a sample compute its tokens together: each must draw the same way
    double sampling[4] = {(double)tc->sample_every, (double)tc->sample_len, tc->temperature, (double)tc->top_k};
    agree_bytes(&a, "the sampling settings (--sample-every, --sample-len, --prompt, --temperature, --top-k)", sampling,
                sizeof(sampling), tc->prompt);
    uint64_t bpe = AGREE_FNV_INIT;  // the prompt's tokens: from these files, in whichever folder (--bpe-dir)
    if (tc->prompt) {
        char dir[4200], path[4300];
        const char* d = bpe_dir_of(tc, dir, sizeof(dir));
        snprintf(path, sizeof(path), "%s/encoder.json", d);
        bpe = agree_file(bpe, path);
        snprintf(path, sizeof(path), "%s/vocab.bpe", d);
        bpe = agree_file(bpe, path);
    }
    agree_add(&a, "the encoding of --prompt (encoder.json and vocab.bpe: their size or first MiB)", bpe);
    long long saving[3] = {tc->save_every, tc->save_model != NULL, tc->save_model_version};
    agree_bytes(&a, "the saving settings (--save-every, --save-model-dtype, whether --save-model is given)", saving,
                sizeof(saving), NULL);
    agree_int(&a, "the resume step (--resume)", tc->resume ? state->step : -1);
    agree_add(&a, "the checkpoint resumed from (its run and model)",
              tc->resume ? state->run_id ^ (state->model_hash * 3) : 0);
    // every rank writes its shards into its own --checkpoint-dir: two folders would each hold part of a
    // checkpoint (compared as written: name the folder the same way on every rank)
    agree_string(&a, "--checkpoint-dir (where checkpoints are saved: --resume's folder unless given)",
                 tc->checkpoint_dir);
    agree_int(&a, "--fault-wait-signal", tc->fault.wait_signal);
    agree_bytes(&a, "--fault-clock-skew", &tc->fault.clock_skew, sizeof(tc->fault.clock_skew), NULL);
    agree_int(&a, "the trace settings (--trace, --trace-steps) or --quiet",
              (long long)(tc->trace != NULL) * 4 + tc->trace_steps * 8 + tc->quiet);
    // other kernels round differently: replicas that each update the whole model would drift apart
    const KernelChoice* k = &tc->kernels;
    // (--attention's default is made on each rank for its GPU: a GPU older than compute capability 8.0
    // among newer ones takes classic attention alone, which this names)
    agree_int(&a, "the kernel variants (--fused-kernels, --attention, by default flash from compute capability 8.0)",
              k->fused * 2 + k->flash_attention);  // (separate_gelu: tests only)
    // OpenBLAS and the reference GEMM sum in other orders: ranks on different ones would compute other bits
    // for the same inputs (TP's partial products, DP's replicas)
    agree_int(&a, "the CPU matmul (--cpu-matmul)", k->cpu_blas);
    // The environment the engine reads, as it resolved it (comm_init). LLMC_MPI_STAGE_BYTES cuts each
    // operation into pieces of that size: a rank with other pieces posts messages of other sizes (an
    // error inside MPI). LLMC_COMM_STRICT runs each operation at its join instead of its post: peers
    // meet in another order than they post, and the check it exists for would hold on some ranks only.
    agree_int(&a, "the MPI engine's settings (LLMC_MPI_STAGE_BYTES, LLMC_COMM_STRICT)",
              (long long)comm->stage_bytes * 2 + comm->strict);
    agree_check(comm, &a);
}
