/*
 * cli.h: the command line: --help (and --help-testing), every flag parsed into a TrainConfig
 * (llmc/run/config.h) with its range checked, and the flags whose meaning depends on others. A bad value
 * ends the program with one line naming the flag. Also the modes that print and exit (run_tool).
 */
#pragma once

#include "checkpoint.h"   // newest_complete_checkpoint
#include "memory_plan.h"  // print_plan, PlanRank
#include "../pipeline.h"  // pipeline_print_schedule
#include "config.h"       // TrainConfig, default_train_config
#include "sampling.h"     // encode_file

// "80GiB", "80GB", "512MiB", or bytes
static double parse_size(const char* flag, const char* v) {
    char* end;
    double x = strtod(v, &end);
    double unit = 1.0;
    if (!strcmp(end, "GiB") || !strcmp(end, "G")) unit = 1073741824.0;
    else if (!strcmp(end, "GB")) unit = 1e9;
    else if (!strcmp(end, "MiB") || !strcmp(end, "M")) unit = 1048576.0;
    else if (!strcmp(end, "MB")) unit = 1e6;
    else if (*end != '\0' || end == v) fatal("%s expects a size like 80GiB, 80GB or 512MiB, got '%s'", flag, v);
    if (!(x > 0) || !isfinite(x * unit)) fatal("%s must be a positive, finite size, got '%s'", flag, v);
    return x * unit;
}

static void print_usage(void) {
    TrainConfig d;
    default_train_config(&d);
    const ModelPreset* learner = &MODEL_PRESETS[0];
    printf(
        "usage: train_gpt [flags]   (GPT-2 trainer, target %s, precision %s)\n"
        "\n"
        "data\n"
        "  --train-data GLOB     token shards to train on             [%s]\n"
        "  --val-data GLOB       token shards for validation (\"\" off) [%s]\n"
        "  --tokenizer FILE      decode table for samples (\"\" off)    [%s]\n"
        "  --shuffle 0|1         visit micro-batches in a seeded random order per epoch [0: in order]\n"
        "model (from a file, or from scratch with GPT-2 initialization)\n"
        "  --model FILE          start from this llm.c model file (versions 3 fp32 and 5 bf16)\n"
        "  --layers L            [%d]   --channels C   [%d]   --heads NH   [%d]\n"
        "  --vocab V             [%d]   --max-seq-len maxT [%d]   --seed N   [%llu]\n"
        "  --model-preset NAME   %s: L=%d C=%d NH=%d V=%d maxT=%d, the guides' model (bytes for tokens), trained on\n"
        "                        %s etc. (%s writes them); size and data flags win\n"
        "batch\n"
        "  --batch-size B        sequences per micro-batch, per rank  [%d]\n"
        "  --seq-len T           tokens per sequence (<= maxT)        [%d]\n"
        "  --grad-accum N        micro-batches per optimizer step     [%d]\n"
        "parallelism (launch with mpirun -np W, or torchrun-style RANK/WORLD_SIZE/LOCAL_RANK on GPUs)\n"
        "  --dp D                data-parallel ranks                  [world size / (tp x pp)]\n"
        "  --tp T                tensor-parallel ranks (Megatron splits; T divides NH and Vp) [1]\n"
        "  --pp P                pipeline stages (P <= L)             [1]\n"
        "  --pp-split a,b,..     layers per stage                     [as even as possible]\n"
        "  --pp-schedule S       gpipe | 1f1b | interleaved | zb-h1 (M >= P) [gpipe]; --schedule is the old name\n"
        "  --virtual-stages V    interleaved: chunks of layers per stage (2..8; M a multiple of P)\n"
        "  --micro-batches M     split each step's --batch-size into M micro-batches (pipelining needs M >= P"
        " to fill)\n"
        "  --pp-rematerialize 0|1  keep only stage inputs, recompute activations in backward [0]\n"
        "  --print-schedule      print every stage's schedule for --pp, --micro-batches, --pp-schedule\n"
        "                        (timeline, actions, which sends pair with which receives), and exit\n"
        "  --trace FILE          Chrome/Perfetto trace of a few steps (see scripts/plot_trace.py)\n"
        "  --trace-steps N       steps to trace, after the first      [2]\n"
        "  --zero S              0 all-reduce, 1 shard optimizer state, 2 also gradients, 3 also parameters [0]\n"
        "  --comm E              auto | mpi | nccl (auto: NCCL unless ranks share a GPU) [auto]\n"
        "  --nccl-id-dir DIR     without mpirun: a shared folder for the NCCL id"
        " [none: TCP at MASTER_ADDR:MASTER_PORT]\n"
        "  --comm-timeout S      a wait on other ranks longer than S seconds ends the run (0: never) [120]\n"
        "  --io-timeout S        the same while ranks wait for file I/O, e.g. a checkpoint save [3600]\n"
        "mixed precision\n"
        "  --loss-scale S        dynamic | off | a fixed scale (1 to 2^24) [%s]\n"
        "  --loss-scale-init X   first dynamic scale (1 to 2^24)      [65536]\n"
        "  --loss-scale-growth X  --loss-scale-backoff X  --loss-scale-interval N  --loss-scale-hysteresis N"
        " [2 0.5 2000 1]\n"
        "  --stochastic-rounding 0|1  BF16: round parameter updates stochastically [1 in BF16 builds]\n"
        "memory\n"
        "  --recompute R         0 keep all activations, 1 recompute GELU, 2 also LayerNorms, 3 whole layers [0]\n"
        "  --recompute-segment K  with --recompute 3: keep only every K-th layer's input; backward reruns K layers\n"
        "                        at a time, keeping their activations (sublinear checkpointing; --plan names the\n"
        "                        best K) [1]\n"
        "  --attention classic|flash  classic: cuBLAS over the stored (B,NH,T,T) probabilities (the CPU\n"
        "                        reference's algorithm); flash: tensor-core flash attention, BF16/FP16 GPU builds,\n"
        "                        head size 64, no T x T buffer [flash where it can run, else classic]\n"
        "  --plan                print each rank's memory for this configuration (any size, dp/tp/pp/zero/\n"
        "                        recompute/batch) without allocating, and exit\n"
        "  --device-memory SIZE  with --plan: also the largest micro-batch that fits, e.g. 80GiB\n"
        "  --precision P         with --plan: bf16 | fp16 | fp32      [this build's]\n"
        "GPU speed\n"
        "  --fused-kernels 0|1   GPU: fused LayerNorm (residual add + forward; one-pass backward), 16-byte\n"
        "                        classifier, GELU's backward with fc's bias gradient in one pass, the\n"
        "                        embedding's gradient in chunks, GELU and most bias gradients in cuBLASLt\n"
        "                        epilogues, plans kept per shape, micro-step inputs copied without waiting,\n"
        "                        no wait before AdamW (loss, norm, clipping and the skip decided on the\n"
        "                        device, copied once after the update). CPU target: the same reference loops\n"
        "                        either way [1]\n"
        "CPU speed\n"
        "  --cpu-matmul M        blas: the CPU target's matmuls through OpenBLAS (cblas_sgemm); reference: its\n"
        "                        hand-written GEMM (llmc/matmul.h), slower, the same bits at any thread count;\n"
        "                        the two agree to fp32 rounding. GPU target: ignored [blas where the build\n"
        "                        found OpenBLAS, else reference]\n"
        "optimization\n"
        "  --steps N             optimizer steps                      [%lld]\n"
        "  --stop-after N        end this run after step N (checkpointing there); resume later\n"
        "  --lr X                peak learning rate                   [%g]\n"
        "  --warmup N            linear warmup steps                  [%d]\n"
        "  --lr-schedule S       cosine | linear | constant           [%s]\n"
        "  --lr-min-frac X       final lr as a fraction of --lr       [%g]\n"
        "  --beta1 X  --beta2 X  --eps X                               [%g %g %g]\n"
        "  --weight-decay X      on 2-D weights only                  [%g]\n"
        "  --grad-clip X         max global gradient norm, 0 = off    [%g]\n"
        "evaluation, sampling, checkpoints, logs\n"
        "  --val-every N         validation loss every N steps, 0 off [%d]\n"
        "  --val-batches N       micro-batches per validation         [%d]\n"
        "  --eval-data FILE      multiple-choice examples (llm.c's HellaSwag format): accuracy\n"
        "  --eval-every N        multiple-choice accuracy every N steps (and at the end) [50]\n"
        "  --eval-dump FILE      one rank: write each example's 4 mean completion losses\n"
        "  --sample-every N      print a sample every N steps, 0 off  [%d]\n"
        "  --sample-len N        tokens per sample                    [%d]\n"
        "  --prompt TEXT         samples continue TEXT (GPT-2 BPE; needs encoder.json and vocab.bpe)\n"
        "  --temperature X       sampling temperature, 0 = greedy     [1]\n"
        "  --top-k K             sample among the K most likely tokens, 0 = all [0]\n"
        "  --bpe-dir DIR         folder of encoder.json, vocab.bpe    [beside --tokenizer, else data]\n"
        "  --encode FILE         print the GPT-2 token ids of a UTF-8 text file and exit\n"
        "                        (--steps 0 --model FILE --prompt TEXT: sample once from a model, no training)\n"
        "  --save-every N        checkpoint every N steps, 0 off      [%d]\n"
        "  --checkpoint-dir DIR  where checkpoints go (created if missing) [%s]\n"
        "  --resume DIR          continue from the newest checkpoint in DIR"
        " (and save there: --checkpoint-dir's default)\n"
        "  --resume-if-present DIR  the same if DIR holds a complete checkpoint, else start fresh (from --model or\n"
        "                        from scratch), saving into DIR: one command line for a job that is requeued\n"
        "  --keep-last N         after each save keep the N newest resumable checkpoints, delete older ones"
        " [all kept]\n"
        "  --allow-data-change   resume on other training data than the checkpoint's (else refused: its files, sizes\n"
        "                        and tokens are recorded in the checkpoint)\n"
        "  --save-model FILE     write the final model (llm.c format)\n"
        "  --save-model-dtype D  fp32 (version 3) | bf16 (version 5, rounded to nearest even;"
        " what llm.c's GPU builds read) [fp32]\n"
        "  --log FILE            one JSON object per line per step and evaluation\n"
        "  --help                this text\n"
        "  --help-testing        the testing flags (fault injection)\n"
        "exit codes: 0 done, 1 error, 3 stopped by SIGINT, SIGTERM or SIGUSR1: the step in progress was finished\n"
        "  and checkpointed into --checkpoint-dir (continue with --resume)\n",
        TARGET_NAME, PRECISION_NAME, d.train_data, d.val_data, d.tokenizer, d.arch.L, d.arch.C, d.arch.NH, d.arch.V,
        d.arch.maxT, (unsigned long long)d.seed, learner->name, learner->arch.L, learner->arch.C, learner->arch.NH,
        learner->arch.V, learner->arch.maxT, learner->train_data, learner->made_by, d.B, d.T, d.grad_accum,
        d.scaler.mode == SCALE_DYNAMIC ? "dynamic" : "off", d.steps, d.opt.lr, d.warmup, d.lr_schedule,
        d.lr_min_frac, d.opt.beta1, d.opt.beta2, d.opt.eps, d.opt.weight_decay, d.opt.grad_clip, d.val_every,
        d.val_batches, d.sample_every, d.sample_len, d.save_every, d.checkpoint_dir);
}

static long long parse_int(const char* flag, const char* s, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') fatal("%s expects an integer, got '%s'", flag, s);
    if (v < lo || v > hi) fatal("%s must be between %lld and %lld, got %lld", flag, lo, hi, v);
    return v;
}

static float parse_float(const char* flag, const char* s, double lo, double hi) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v)) fatal("%s expects a number, got '%s'", flag, s);
    if (v < lo || v > hi) fatal("%s must be between %g and %g, got %g", flag, lo, hi, v);
    return (float)v;
}

enum { MAX_PRINTED_STAGES = 64, MAX_PRINTED_MICRO_BATCHES = 1024, MAX_PLANNED_ACTIONS = 1 << 22 };

// Flags whose meaning depends on others, remembered until all are read (check_flag_combinations).
// FlagsSeen.data_given's bits: the data flags given on the command line
enum { GIVEN_TRAIN = 1, GIVEN_VAL = 2, GIVEN_TOKENIZER = 4 };

typedef struct {
    int micro_batches;                 // --micro-batches M (0: not given)
    const char* checkpoint_dir_given;  // --checkpoint-dir (NULL: not given, the default or --resume's folder)
    const ModelPreset* preset;         // --model-preset (NULL: not given)
    int data_given;                    // the data flags given: GIVEN_TRAIN | GIVEN_VAL | GIVEN_TOKENIZER
} FlagsSeen;

// The flags that take a value, one function per part of --help. Each returns 0 for a flag not its own.
// data, model, batch
static int parse_data_model_flag(TrainConfig* tc, FlagsSeen* seen, const char* f, const char* v) {
    const long long BIG = 1LL << 40;
    if (!strcmp(f, "--train-data")) { tc->train_data = v; seen->data_given |= GIVEN_TRAIN; }
    else if (!strcmp(f, "--val-data")) { tc->val_data = v; seen->data_given |= GIVEN_VAL; }
    else if (!strcmp(f, "--tokenizer")) { tc->tokenizer = v; seen->data_given |= GIVEN_TOKENIZER; }
    else if (!strcmp(f, "--shuffle")) tc->shuffle = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--model")) tc->model_file = v;
    else if (!strcmp(f, "--model-preset")) {
        seen->preset = find_model_preset(v);
        if (!seen->preset) fatal("--model-preset must be %s, got '%s'", MODEL_PRESETS[0].name, v);
    }
    else if (!strcmp(f, "--layers")) { tc->arch.L = (int)parse_int(f, v, 1, 4096); tc->arch_given |= GIVEN_L; }
    else if (!strcmp(f, "--channels")) { tc->arch.C = (int)parse_int(f, v, 1, 65536); tc->arch_given |= GIVEN_C; }
    else if (!strcmp(f, "--heads")) { tc->arch.NH = (int)parse_int(f, v, 1, 65536); tc->arch_given |= GIVEN_NH; }
    else if (!strcmp(f, "--vocab")) { tc->arch.V = (int)parse_int(f, v, 1, 65536); tc->arch_given |= GIVEN_V; }
    else if (!strcmp(f, "--max-seq-len")) {
        tc->arch.maxT = (int)parse_int(f, v, 1, 1 << 20);
        tc->arch_given |= GIVEN_MAXT;
    }
    else if (!strcmp(f, "--seed")) tc->seed = (uint64_t)parse_int(f, v, 0, BIG);
    else if (!strcmp(f, "--batch-size")) tc->B = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--seq-len")) tc->T = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--grad-accum")) tc->grad_accum = (int)parse_int(f, v, 1, 1 << 20);
    else return 0;
    return 1;
}

static int parse_parallel_flag(TrainConfig* tc, FlagsSeen* seen, const char* f, const char* v) {
    if (!strcmp(f, "--dp")) tc->dp = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--tp")) tc->tp = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--pp")) tc->pp = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--pp-split")) tc->pp_split = v;
    else if (!strcmp(f, "--pp-schedule") || !strcmp(f, "--schedule")) {  // (--schedule: the old name)
        Schedule all[] = {SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZBH1};
        int known = 0;
        for (int i = 0; i < (int)(sizeof(all) / sizeof(all[0])); i++)
            if (!strcmp(v, schedule_flag(all[i]))) {
                tc->pipe_schedule = all[i];
                known = 1;
            }
        if (!known) fatal("--pp-schedule must be gpipe, 1f1b, interleaved or zb-h1, got '%s'", v);
    } else if (!strcmp(f, "--virtual-stages")) tc->virtual_stages = (int)parse_int(f, v, 1, MAX_VIRTUAL_STAGES);
    else if (!strcmp(f, "--micro-batches")) seen->micro_batches = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--pp-rematerialize")) tc->rematerialize = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--trace")) tc->trace = v;
    else if (!strcmp(f, "--trace-steps")) tc->trace_steps = (int)parse_int(f, v, 1, 1000);
    else if (!strcmp(f, "--zero")) tc->zero = (int)parse_int(f, v, 0, 3);
    else if (!strcmp(f, "--comm")) {
        if (strcmp(v, "auto") && strcmp(v, "mpi") && strcmp(v, "nccl"))
            fatal("--comm must be auto, mpi or nccl, got '%s'", v);
        tc->engine = v;
    } else if (!strcmp(f, "--nccl-id-dir")) tc->nccl_id_dir = v;
    else if (!strcmp(f, "--comm-timeout")) tc->comm_timeout = parse_float(f, v, 0.0f, 1e9f);
    else if (!strcmp(f, "--io-timeout")) tc->io_timeout = parse_float(f, v, 0.0f, 1e9f);
    else return 0;
    return 1;
}

// mixed precision, memory, GPU speed
static int parse_precision_memory_flag(TrainConfig* tc, const char* f, const char* v) {
    if (!strcmp(f, "--loss-scale")) {
        if (!strcmp(v, "dynamic")) tc->scaler.mode = SCALE_DYNAMIC;
        else if (!strcmp(v, "off")) tc->scaler.mode = SCALE_OFF;
        else {
            tc->scaler.mode = SCALE_STATIC;
            tc->scaler.scale = parse_float(f, v, 1e-30, 1e30);
        }
    } else if (!strcmp(f, "--loss-scale-init")) tc->scaler.scale = parse_float(f, v, 1e-30, 1e30);
    else if (!strcmp(f, "--loss-scale-growth")) tc->scaler.growth = parse_float(f, v, 1.0, 1e6);
    else if (!strcmp(f, "--loss-scale-backoff")) tc->scaler.backoff = parse_float(f, v, 1e-6, 1.0);
    else if (!strcmp(f, "--loss-scale-interval")) tc->scaler.interval = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--loss-scale-hysteresis"))
        tc->scaler.hysteresis = tc->scaler.hysteresis_left = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--stochastic-rounding")) tc->stochastic_rounding = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--recompute")) tc->recompute = (int)parse_int(f, v, 0, 3);
    else if (!strcmp(f, "--recompute-segment")) tc->recompute_segment = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--attention")) {
        if (strcmp(v, "classic") && strcmp(v, "flash")) fatal("--attention must be classic or flash, got '%s'", v);
        tc->kernels.flash_attention = strcmp(v, "flash") == 0;
    } else if (!strcmp(f, "--device-memory")) tc->device_memory = parse_size(f, v);
    else if (!strcmp(f, "--precision")) {
        if (strcmp(v, "bf16") && strcmp(v, "fp16") && strcmp(v, "fp32"))
            fatal("--precision must be bf16, fp16 or fp32, got '%s'", v);
        tc->plan_precision = v;
    } else if (!strcmp(f, "--fused-kernels")) tc->kernels.fused = (int)parse_int(f, v, 0, 1);  // llmc/device.h
    else if (!strcmp(f, "--cpu-matmul")) {
        if (strcmp(v, "blas") && strcmp(v, "reference")) fatal("--cpu-matmul must be blas or reference, got '%s'", v);
        tc->kernels.cpu_blas = strcmp(v, "blas") == 0;
        if (tc->kernels.cpu_blas && !cpu_blas_linked && TARGET_IS_CPU)
            fatal("--cpu-matmul blas: this build has no BLAS (OpenBLAS was not found when it was built: "
                  "make deps installs libopenblas-openmp-dev, then rebuild); use --cpu-matmul reference");
    } else return 0;
    return 1;
}

static int parse_optimization_flag(TrainConfig* tc, const char* f, const char* v) {
    // at most INT_MAX steps: AdamW's step number is an int, and a state file holds no more (state_file.h)
    if (!strcmp(f, "--steps")) tc->steps = parse_int(f, v, 0, INT_MAX);
    else if (!strcmp(f, "--stop-after")) tc->stop_after = parse_int(f, v, 1, INT_MAX);
    else if (!strcmp(f, "--lr")) tc->opt.lr = parse_float(f, v, 0.0, 10.0);
    else if (!strcmp(f, "--warmup")) tc->warmup = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--lr-schedule")) {
        if (strcmp(v, "cosine") && strcmp(v, "linear") && strcmp(v, "constant"))
            fatal("--lr-schedule must be cosine, linear or constant, got '%s'", v);
        tc->lr_schedule = v;
    } else if (!strcmp(f, "--lr-min-frac")) tc->lr_min_frac = parse_float(f, v, 0.0, 1.0);
    else if (!strcmp(f, "--beta1")) tc->opt.beta1 = parse_float(f, v, 0.0, 0.999999);
    else if (!strcmp(f, "--beta2")) tc->opt.beta2 = parse_float(f, v, 0.0, 0.999999);
    else if (!strcmp(f, "--eps")) {
        tc->opt.eps = parse_float(f, v, 0.0, 1.0);
        // AdamW divides m by sqrt(v) + eps, and m = v = 0 where a gradient is always 0 (the padded
        // vocabulary rows): eps = 0 would write 0/0 = NaN into the model
        if (!(tc->opt.eps > 0.0f))
            fatal("--eps must be positive as a float32 (with 0, AdamW computes 0/0 for parameters whose gradient "
                  "is 0), got '%s'", v);
    } else if (!strcmp(f, "--weight-decay")) tc->opt.weight_decay = parse_float(f, v, 0.0, 10.0);
    else if (!strcmp(f, "--grad-clip")) tc->opt.grad_clip = parse_float(f, v, 0.0, 1e9);
    else return 0;
    return 1;
}

// evaluation, sampling, checkpoints, logs
static int parse_output_flag(TrainConfig* tc, FlagsSeen* seen, const char* f, const char* v) {
    if (!strcmp(f, "--val-every")) tc->val_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--val-batches")) tc->val_batches = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--eval-data")) tc->eval_data = v;
    else if (!strcmp(f, "--eval-every")) tc->eval_every = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--eval-dump")) tc->eval_dump = v;
    else if (!strcmp(f, "--sample-every")) tc->sample_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--sample-len")) tc->sample_len = (int)parse_int(f, v, 1, 1 << 20);
    else if (!strcmp(f, "--prompt")) tc->prompt = v;
    else if (!strcmp(f, "--temperature")) tc->temperature = parse_float(f, v, 0.0, 1e6);
    else if (!strcmp(f, "--top-k")) tc->top_k = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--bpe-dir")) tc->bpe_dir = v;
    else if (!strcmp(f, "--encode")) tc->encode_file = v;
    else if (!strcmp(f, "--save-every")) tc->save_every = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--checkpoint-dir")) tc->checkpoint_dir = seen->checkpoint_dir_given = v;
    else if (!strcmp(f, "--resume")) tc->resume = v;
    else if (!strcmp(f, "--resume-if-present")) tc->resume_if_present = v;
    else if (!strcmp(f, "--keep-last")) tc->keep_last = (int)parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--save-model")) tc->save_model = v;
    else if (!strcmp(f, "--save-model-dtype")) {
        if (strcmp(v, "fp32") && strcmp(v, "bf16")) fatal("--save-model-dtype must be fp32 or bf16, got '%s'", v);
        tc->save_model_version = strcmp(v, "bf16") == 0 ? 5 : 3;
    } else if (!strcmp(f, "--log")) tc->log_file = v;
    else return 0;
    return 1;
}

// The testing flags (--help-testing): the fault plan (llmc/run/fault.h)
static int parse_testing_flag(TrainConfig* tc, const char* f, const char* v) {
    FaultPlan* p = &tc->fault;
    if (!strcmp(f, "--fault-rank")) p->rank = (int)parse_int(f, v, 0, 1 << 20);
    else if (!strcmp(f, "--fault-step")) p->step = (int)parse_int(f, v, 0, 1 << 30);
    else if (!strcmp(f, "--fault-stop")) p->stop = (int)parse_int(f, v, 0, 1);
    else if (!strcmp(f, "--fault-slow-save")) p->slow_save = parse_float(f, v, 0.0f, 3600.0f);
    else if (!strcmp(f, "--fault-slow-sample")) p->slow_sample = parse_float(f, v, 0.0f, 3600.0f);
    else if (!strcmp(f, "--fault-wait-signal")) p->wait_signal = parse_int(f, v, 1, 1 << 30);
    else if (!strcmp(f, "--fault-clock-skew")) p->clock_skew = parse_float(f, v, -1e6f, 1e6f);
    else if (!strcmp(f, "--fault-inf-rank")) p->inf_rank = (int)parse_int(f, v, 0, 1 << 20);
    else if (!strcmp(f, "--fault-inf-step")) p->inf_step = (int)parse_int(f, v, 1, 1 << 30);
    else return 0;
    return 1;
}

// --pp-schedule interleaved --virtual-stages V: what it needs, and what it does not do
static void check_interleaved_flags(const TrainConfig* tc) {
    int interleaved = tc->pipe_schedule == SCHEDULE_INTERLEAVED, V = tc->virtual_stages;
    if (!interleaved && V > 1) fatal("--virtual-stages %d needs --pp-schedule interleaved", V);
    if (!interleaved) return;
    if (V < 2)
        fatal("--pp-schedule interleaved needs --virtual-stages 2 or more (with one chunk per stage it is 1F1B)");
    if (tc->pp < 2) fatal("--pp-schedule interleaved needs --pp > 1");
    if (tc->rematerialize)
        fatal("--pp-rematerialize with --pp-schedule interleaved is not supported: a forward's output is sent "
              "after the next backward, which would have rematerialized into the same work set");
    if (tc->grad_accum % tc->pp != 0)
        fatal("--pp-schedule interleaved: %d micro-batches is not a multiple of --pp %d (the schedule sends the "
              "micro-batches through each chunk in groups of P)", tc->grad_accum, tc->pp);
}

// --pp-schedule zb-h1: what it needs, and what it does not do
static void check_zero_bubble_flags(const TrainConfig* tc) {
    if (tc->pipe_schedule != SCHEDULE_ZBH1) return;
    if (tc->pp < 2) fatal("--pp-schedule zb-h1 needs --pp > 1");
    if (tc->grad_accum < tc->pp)
        fatal("--pp-schedule zb-h1: %d micro-batches, fewer than --pp %d (the deferred weight gradients fill the "
              "pipeline's drain only when every stage has a micro-batch in flight)", tc->grad_accum, tc->pp);
    if (tc->recompute || tc->rematerialize)
        fatal("--pp-schedule zb-h1 with %s is not supported: a deferred weight gradient reads the layer's activations "
              "after its backward, which recomputes them into a work set the next action overwrites",
              tc->recompute ? "--recompute" : "--pp-rematerialize");
}

// --model-preset: its sizes where no size flag was given, counted as given (a --model file or a checkpoint
// must have them), and its data where no data flag was. A run that trains needs that data made first.
static void apply_model_preset(TrainConfig* tc, const FlagsSeen* seen) {
    const ModelPreset* p = seen->preset;
    if (!p) return;
    if (!(tc->arch_given & GIVEN_L)) tc->arch.L = p->arch.L;
    if (!(tc->arch_given & GIVEN_C)) tc->arch.C = p->arch.C;
    if (!(tc->arch_given & GIVEN_NH)) tc->arch.NH = p->arch.NH;
    if (!(tc->arch_given & GIVEN_V)) tc->arch.V = p->arch.V;
    if (!(tc->arch_given & GIVEN_MAXT)) tc->arch.maxT = p->arch.maxT;
    tc->arch_given = GIVEN_ALL_SIZES;
    if (!(seen->data_given & GIVEN_TRAIN)) tc->train_data = p->train_data;
    if (!(seen->data_given & GIVEN_VAL)) tc->val_data = p->val_data;
    if (!(seen->data_given & GIVEN_TOKENIZER)) tc->tokenizer = p->tokenizer;
    struct stat st;
    int trains = !tc->plan && !tc->print_schedule && !tc->encode_file;
    if (trains && !(seen->data_given & GIVEN_TRAIN) && stat(p->train_data, &st) != 0)
        fatal("--model-preset %s trains on %s, which does not exist: make it with %s (or give --train-data)", p->name,
              p->train_data, p->made_by);
}

// What one flag means depends on another: conflicts, --micro-batches turned into B and grad_accum, the
// checkpoint folder of a resumed run, a model preset, and a model from the command line's sizes.
static void check_flag_combinations(TrainConfig* tc, const FlagsSeen* seen) {
    apply_model_preset(tc, seen);
    if (tc->model_file && tc->resume) fatal("--resume loads the model from the checkpoint; do not also give --model");
    if (tc->resume && tc->resume_if_present) fatal("give --resume or --resume-if-present, not both");
    // a resumed run saves where it resumed from, so that the next resume finds its newest checkpoint
    if (!seen->checkpoint_dir_given && (tc->resume || tc->resume_if_present))
        tc->checkpoint_dir = tc->resume ? tc->resume : tc->resume_if_present;
    if (seen->micro_batches > 0) {  // B sequences per step, in M micro-batches of B/M: gradient accumulation over M
        if (tc->grad_accum != 1) fatal("give --micro-batches or --grad-accum, not both");
        if (tc->B % seen->micro_batches != 0)
            fatal("--batch-size %d does not split into %d micro-batches (it must be a multiple)", tc->B,
                  seen->micro_batches);
        tc->B /= seen->micro_batches;
        tc->grad_accum = seen->micro_batches;
    }
    if (tc->pp > 1 && tc->zero == 2)
        fatal("--zero 2 with --pp is not supported: a pipeline accumulates each layer's gradients over all its "
              "micro-batches (and the tied wte's over both end stages) before they are final, so sharding them would "
              "mean a reduce-scatter per micro-batch; use --zero 1, which shards the optimizer state");
    if (tc->pp > 1 && tc->zero == 3)
        fatal("--zero 3 with --pp is not supported: every micro-batch in flight would gather each of the stage's "
              "layers again for its forward and its backward; use --zero 1, which shards the optimizer state");
    if (tc->pp == 1 && tc->rematerialize) fatal("--pp-rematerialize needs --pp > 1");
    check_interleaved_flags(tc);
    check_zero_bubble_flags(tc);
    if (tc->recompute_segment > 1 && tc->recompute != 3)
        fatal("--recompute-segment %d needs --recompute 3 (segments are of whole layers, recomputed from their "
              "checkpoints)", tc->recompute_segment);
    // --print-schedule and --plan work out every stage's schedule in this one process (P x 2M actions, 3M with
    // ZB-H1, and printed a timeline line of about 3(M + P) slots per stage): bounded, so that a huge --pp or
    // --micro-batches gets an answer at once, not a loop of hours or gigabytes of text
    if (tc->print_schedule && (tc->pp > MAX_PRINTED_STAGES || tc->grad_accum > MAX_PRINTED_MICRO_BATCHES))
        fatal("--print-schedule prints at most %d stages and %d micro-batches (got --pp %d, %d micro-batches)",
              MAX_PRINTED_STAGES, MAX_PRINTED_MICRO_BATCHES, tc->pp, tc->grad_accum);
    if (tc->plan && (long long)tc->pp * tc->grad_accum * tc->virtual_stages > MAX_PLANNED_ACTIONS)
        fatal("--plan: --pp %d x %d micro-batches x %d chunks is more than the %d stage micro-batches it plans (a "
              "pipeline of that many micro-batches per stage is no configuration to run)", tc->pp, tc->grad_accum,
              tc->virtual_stages, MAX_PLANNED_ACTIONS);
    char why[256];
    if (loss_scaler_settings_error(&tc->scaler, why, sizeof(why))) fatal("%s", why);
    fault_plan_check(&tc->fault, tc->steps);
    if (tc->prompt && (tc->tokenizer == NULL || tc->tokenizer[0] == '\0' || tc->sample_every == 0))
        fatal("--prompt needs sampling on: a --tokenizer and --sample-every above 0");
    tc->arch.Vp = padded_vocab(tc->arch.V);
    if (!tc->model_file && !tc->resume) validate_config(&tc->arch, "command line");
    if (!tc->model_file && !tc->resume && tc->T > tc->arch.maxT)
        fatal("sequence length T=%d is longer than maxT=%d", tc->T, tc->arch.maxT);
}

static void parse_args(TrainConfig* tc, int argc, char** argv) {
    default_train_config(tc);
    tc->argc = argc;
    tc->argv = argv;
    FlagsSeen seen = {.micro_batches = 0, .checkpoint_dir_given = NULL, .preset = NULL, .data_given = 0};
    for (int i = 1; i < argc; i++) {
        const char* f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
            print_usage();
            exit(0);
        }
        if (strcmp(f, "--help-testing") == 0) {
            fault_print_usage();
            exit(0);
        }
        if (strncmp(f, "--", 2) != 0) fatal("unexpected argument '%s' (flags start with --; see --help)", f);
        if (!strcmp(f, "--plan")) {
            tc->plan = 1;
            continue;
        }
        if (!strcmp(f, "--print-schedule")) {
            tc->print_schedule = 1;
            continue;
        }
        if (!strcmp(f, "--allow-data-change")) {
            tc->allow_data_change = 1;
            continue;
        }
        if (i + 1 >= argc) fatal("flag %s needs a value (see --help)", f);
        const char* v = argv[++i];
        if (!parse_data_model_flag(tc, &seen, f, v) && !parse_parallel_flag(tc, &seen, f, v) &&
            !parse_precision_memory_flag(tc, f, v) && !parse_optimization_flag(tc, f, v) &&
            !parse_output_flag(tc, &seen, f, v) && !parse_testing_flag(tc, f, v))
            fatal("unknown flag %s (see --help)", f);
    }
    check_flag_combinations(tc, &seen);
}

// --resume-if-present DIR: a requeued job's fixed command line. If DIR holds a complete checkpoint, the
// run resumes from it (as --resume DIR); otherwise it starts fresh (from --model, or from scratch) and
// says so. Every rank must see the same folder: the ranks compare what they found.
static void resolve_resume_if_present(TrainConfig* tc, Comm* comm) {
    if (!tc->resume_if_present) return;
    long long step = newest_complete_checkpoint(tc->resume_if_present);
    double found[2] = {(double)step, -(double)step};  // the largest and (negated) the smallest over the ranks
    comm_all_reduce_host(comm, &comm->world, found, 2, REDUCE_MAX);
    double hi = found[0], lo = -found[1];
    if (lo != hi)
        fatal("--resume-if-present '%s': the ranks see different checkpoints (newest complete: step %.0f on some, "
              "%.0f on others); the folder must be shared", tc->resume_if_present, lo, hi);
    if (step >= 0) {
        tc->resume = tc->resume_if_present;
        tc->model_file = NULL;  // the checkpoint holds the model
    } else if (comm->world_rank == 0) {
        printf("--resume-if-present: no complete checkpoint in '%s': starting %s\n", tc->resume_if_present,
               tc->model_file ? "from --model" : "from scratch");
    }
}

// The modes that print and exit without ranks or training: --encode (llmc/run/sampling.h), --print-schedule
// (every stage's schedule is a function of P, M and the schedule: llmc/pipeline.h), --plan. Returns
// whether one ran.
static int run_tool(const TrainConfig* tc, PlanRank plan_rank) {
    if (tc->encode_file) encode_file(tc);
    else if (tc->print_schedule) pipeline_print_schedule(tc->pipe_schedule, tc->pp, tc->grad_accum, tc->virtual_stages);
    else if (tc->plan)
        print_plan(plan_rank, tc,
                   tc->plan_precision ? tc->plan_precision : BF16_BUILD ? "bf16" : FP16_BUILD ? "fp16" : "fp32",
                   tc->device_memory);
    else return 0;
    return 1;
}
