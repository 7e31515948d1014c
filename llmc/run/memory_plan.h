/*
 * memory_plan.h: the memory planner (--plan): what each rank of a configuration will allocate, by
 * category, without allocating it, and with --device-memory the largest micro-batch that fits.
 *
 * The model's own buffers are read off a dry build of one rank (train_gpt.cu's plan_rank builds the
 * model with BuildMode.dry: every size computed, nothing allocated), so the plan cannot drift from the
 * allocation; the scratch the kernels allocate on first use and the CPU target's host copies of loading
 * and saving are counted here. test_gpt holds the plan to what a run allocates, on both targets.
 */
#pragma once

#include "../attention.h"        // attention_flash_validate, attention_cpu_scratch_bytes
#include "../comm.h"             // Comm
#include "../device.h"           // KernelChoice
#include "../encoder.h"          // encoder_scratch_bytes
#include "../model_file.h"       // GPT2Config, model_file_read, validate_config
#include "../param_layout.h"     // Placement
#include "../pipeline.h"         // pipeline_slots
#include "config.h"              // TrainConfig
#include "../tensor_parallel.h"  // validate_tp

typedef struct {
    size_t params, grads, optimizer, activations, workspace;  // what the model allocates up front
    size_t kernel_scratch;  // GPU: cuBLASLt workspace and the layer kernels' scratch; CPU: the matmuls'
                            // transposes, attention's datt rows
    size_t host;            // CPU target only: what the host copies of loading and saving add at the peak
} MemoryPlan;

static size_t plan_total(const MemoryPlan* p) {
    return p->params + p->grads + p->optimizer + p->activations + p->workspace + p->kernel_scratch + p->host;
}

// On the CPU target "device" memory is host memory: the plan is the process's, and counts what the CPU
// build allocates besides the model's buffers. (A CPU build planning bf16 or fp16 plans for a GPU.)
static int plan_is_cpu(size_t elem_bytes) {
#ifdef LLMC_CPU
    return elem_bytes == sizeof(float);
#else
    return 0;
#endif
}

// CPU target: the transposed operand the reference matmuls keep (llmc/matmul.h, the largest weight in
// forward, the largest output gradient in backward; OpenBLAS reads operands in place), the
// vocab-parallel loss's scratch, and the OpenBLAS attention backward's rows of datt (llmc/attention.h)
static size_t cpu_kernel_scratch(const GPT2Config* c, const Placement* pl, int last, int B, int T,
                                 const KernelChoice* kernels) {
    size_t BT = (size_t)B * T, C = c->C, Cl = C / pl->tp, widest = 4 * Cl > C ? 4 * Cl : C;
    if (last && (size_t)c->Vp / pl->tp > widest) widest = c->Vp / pl->tp;
    size_t transposed = kernels->cpu_blas ? 0 : C * widest > BT * widest ? C * widest : BT * widest;
    return (transposed + (pl->tp > 1 ? 3 * BT : 0)) * sizeof(float) + attention_cpu_scratch_bytes(T, kernels);
}

// what a run does besides training, for the CPU target's host copies (see plan_host_copies)
enum { PLAN_RESUMES = 1, PLAN_SAVES_MODEL = 2, PLAN_CHECKPOINTS = 4 };

// CPU target: the host copies of the model that loading and saving make (in file order, see
// gpt2_set_parameters, load_checkpoint, gpt2_export_master, save_checkpoint), while the model's buffers
// are allocated: the extra at the peak, beyond plan_total's other categories. Loading happens before
// the activations and kernel scratch exist, saving after. n: the model's parameters; total: the elements
// of the rank's flat buffer; shard: of its optimizer shard; separate_master: an fp32 master copy is kept
// (or, at ZeRO-3, the parameters are uploaded as a shard: the load makes the shard's host copy either way).
static size_t plan_host_copies(size_t n, size_t total, size_t shard, int separate_master, const Placement* pl,
                               int phases, size_t acts_and_scratch) {
    size_t tp = pl->tp, master = separate_master ? shard : 0;
    size_t load = n + total + master;  // the parameters in file order, and in the memory layout
    if (phases & PLAN_RESUMES) {       // m and v in file order too, and first one shard file's m, v
        size_t resume = 3 * n + total + shard;
        load = resume > 4 * n ? resume : 4 * n;
    }
    size_t save = 0, export_ = n + 2 * total * tp + (pl->pp > 1 ? n : 0);  // the whole master weights
    if (phases & PLAN_SAVES_MODEL) save = export_;
    // a checkpoint then writes the state shard from 4 host copies; the heap keeps the space of the model's
    // file-order copy, freed just before, so both are counted (the measured peak is within the stated
    // tolerance of tests/cli.sh)
    if (phases & PLAN_CHECKPOINTS)
        save = n + (2 * total * tp > 4 * shard ? 2 * total * tp : 4 * shard) + (pl->pp > 1 ? n : 0);
    size_t load_extra = load * sizeof(float) > acts_and_scratch ? load * sizeof(float) - acts_and_scratch : 0;
    return save * sizeof(float) > load_extra ? save * sizeof(float) : load_extra;
}

// the scratch the GPU kernels allocate on first use (the model's KernelScratch, cuBLASLt's workspace)
static size_t gpu_kernel_scratch(const GPT2Config* c, const Placement* pl, int B, int T, size_t elem_bytes,
                                 const KernelChoice* kernels) {
    size_t BT = (size_t)B * T, Cl = c->C / pl->tp, NHl = c->NH / pl->tp,
           widest = 4 * Cl > (size_t)c->C ? 4 * Cl : c->C;
    size_t attention = kernels->flash_attention ? (size_t)B * NHl * T * sizeof(float)     // attention.h: flash's D
                                                : (8 * BT * Cl + (size_t)B * NHl * T * T) * elem_bytes;  // classic
    size_t reductions = 64 * 2 * c->C * 4 + 64 * widest * 4 + 1024 * 4;         // layernorm, bias, norm partials
    // --fused-kernels: 512 LayerNorm partial rows (LNB_BLOCKS); the bias gradients of qkv, attproj and
    // fcproj come from cuBLASLt's epilogues, one vector at a time, and fc's from 128 partial rows of 4C/tp
    // floats (BIAS_VEC_CHUNKS, llmc/matmul.h), in the same scratch, so the larger of the two (where cuBLASLt
    // refused an epilogue, the partial rows of a wider layer would take more than planned); the gradient
    // norm's table of ranges on the device (llmc/global_norm.h: 2 ints a range, and one; a range per tensor
    // owned, at most 12 a layer and 4) and the device executor's report of 6 floats (llmc/step_outputs.h)
    if (kernels->fused) {
        size_t bias = 128 * 4 * Cl * 4 > widest * elem_bytes ? 128 * 4 * Cl * 4 : widest * elem_bytes;
        reductions = 512 * 2 * c->C * 4 + bias + 1024 * 4 + (2 * (12 * (size_t)stage_layer_count(pl) + 4) + 1) * 4 +
                     6 * 4;
    }
    size_t embedding = encoder_scratch_bytes(BT, c->C, kernels->fused) +
                       (pl->tp > 1 ? 3 * BT * 4 : 0);  // encoder, vocab-parallel CE
    return (32 << 20) + attention + reductions + embedding;
}

// The kernel scratch of one rank with elements of `elem_bytes`: the CPU target's own (its build precision)
// or the GPU's
static size_t kernel_scratch_bytes(const GPT2Config* c, const Placement* pl, int last, int B, int T, size_t elem_bytes,
                                   const KernelChoice* kernels) {
    return plan_is_cpu(elem_bytes) ? cpu_kernel_scratch(c, pl, last, B, T, kernels)
                                   : gpu_kernel_scratch(c, pl, B, T, elem_bytes, kernels);
}

// The activation sets of each of stage s's chunks under the run's schedule: one per micro-batch it holds
// at once (one without pipelining); ZB-H1's sets of output gradients kept for the deferred W's; and the
// last stage's sets of the classifier's logits (B x T x V, the largest buffer), one per micro-batch between
// its forward and its backward. That is as many as the slots, but for ZB-H1, whose slots are held until
// the W's: one, as its last stage's backward follows each forward at once (0: one per slot).
typedef struct {
    int n[MAX_VIRTUAL_STAGES];  // [chunk]
    int douts, logits;
} StageSlots;
static StageSlots stage_slots(const TrainConfig* tc, int s) {
    Schedule sched = tc->pipe_schedule;
    int P = tc->pp, M = tc->grad_accum, V = tc->virtual_stages;
    StageSlots slots;
    for (int v = 0; v < V; v++) slots.n[v] = pipeline_slots(sched, P, s, M, V, v);
    slots.douts = pipeline_stash_slots(sched, P, s, M);
    // (the last chunk classifies)
    slots.logits = P > 1 && s == P - 1 ? pipeline_held(sched, P, s, M, V, V - 1, PIPE_F, PIPE_B) : 0;
    check_internal(slots.logits == 0 || slots.n[V - 1] % slots.logits == 0,
                   "micro-batch m's logits set, (m mod slots) mod sets, must be its own");
    return slots;
}

// One rank's plan for micro-batches of (B, T), with the activation sets `slots` (above) and elements of
// elem_bytes: the model built dry (train_gpt.cu's plan_rank). `phases` (PLAN_*): what the run does
// besides training, for the CPU target's host copies (<0: not counted).
typedef MemoryPlan (*PlanRank)(const GPT2Config* c, const Placement* pl, int B, int T, StageSlots slots, int recompute,
                               int segment, int rematerialize, int phases, size_t elem_bytes,
                               const KernelChoice* kernels);

// "layers 0-1" of a stage, or of each of its chunks with --virtual-stages ("layers 0-1, 4-5"), numbers
// `width` wide, and its activation slots: "2 slots", by chunk "3+2 slots", with ZB-H1 "4 slots, 2 sets
// of output gradients".
static void describe_stage(const Placement* pl, StageSlots st, int width, char* layers, char* slots, size_t n) {
    int used = snprintf(layers, n, "layers"), used_slots = 0, total = 0;
    for (int v = 0; v < num_chunks(pl); v++) {
        int l0, l1;
        chunk_layers(pl, v, &l0, &l1);
        used += snprintf(layers + used, n - used, "%s %*d-%*d", v > 0 ? "," : "", width, l0, width, l1 - 1);
        used_slots += snprintf(slots + used_slots, n - used_slots, "%s%d", v > 0 ? "+" : "", st.n[v]);
        total += st.n[v];
    }
    used_slots += snprintf(slots + used_slots, n - used_slots, " slot%s",
                           total > 1 ? "s" : width ? " " : "");  // (aligned in --plan)
    if (st.douts > 0)
        snprintf(slots + used_slots, n - used_slots, ", %d set%s of output gradients", st.douts,
                 st.douts > 1 ? "s" : "");
}

// The plan of every pipeline stage (one rank each; the DP and TP ranks of a stage are alike) for a
// micro-batch of B sequences with elements of `elem_bytes`; returns the largest total.
static size_t plan_stages(PlanRank plan_rank, const GPT2Config* c, const TrainConfig* tc, int dp, int B,
                          size_t elem_bytes, int print) {
    size_t worst = 0;
    for (int s = 0; s < tc->pp; s++) {
        Placement pl = {.zero = tc->zero, .dp = dp, .tp = tc->tp, .pp = tc->pp, .pp_rank = s};
        place_layers(&pl, c->L, tc->pp_split, tc->virtual_stages);
        StageSlots slots = stage_slots(tc, s);
        int phases = (tc->resume ? PLAN_RESUMES : 0) | (tc->save_model ? PLAN_SAVES_MODEL : 0) |
                     (tc->save_every > 0 || tc->stop_after > 0 ? PLAN_CHECKPOINTS : 0);
        MemoryPlan p = plan_rank(c, &pl, B, tc->T, slots, tc->recompute, tc->recompute_segment, tc->rematerialize,
                                 phases, elem_bytes, &tc->kernels);
        size_t total = plan_total(&p);
        worst = total > worst ? total : worst;
        if (print) {
            const double G = 1073741824.0;
            char layers[256], slot_s[256];
            describe_stage(&pl, slots, 2, layers, slot_s, sizeof(layers));
            printf("  stage %2d (%s): parameters %7.3f | gradients %7.3f | optimizer %7.3f | activations %7.3f "
                   "(%s) | workspace %6.3f | kernel scratch %6.3f",
                   s, layers, p.params / G, p.grads / G, p.optimizer / G, p.activations / G, slot_s, p.workspace / G,
                   p.kernel_scratch / G);
            if (plan_is_cpu(elem_bytes)) printf(" | load/save copies %6.3f", p.host / G);
            printf(" | total %7.3f GiB", total / G);
            if (tc->zero > 0) {  // what the sharding changed: the same rank at ZeRO-0 (nothing sharded)
                Placement unsharded = pl;
                unsharded.zero = 0;
                MemoryPlan p0 = plan_rank(c, &unsharded, B, tc->T, slots, tc->recompute, tc->recompute_segment,
                                          tc->rematerialize, phases, elem_bytes, &tc->kernels);
                printf(" (%+ld%% vs ZeRO-0)", lround(100.0 * ((double)total / (double)plan_total(&p0) - 1.0)));
            }
            printf("\n");
        }
    }
    return worst;
}

// --recompute 3: the segment length (--recompute-segment K, sublinear checkpointing) whose worst stage
// needs the least memory: each K from 1 (a checkpoint per layer) to L (one segment) planned
static void print_best_segment(PlanRank plan_rank, const GPT2Config* c, const TrainConfig* tc, int dp,
                               size_t elem_bytes) {
    TrainConfig t = *tc;
    int best = 1;
    size_t best_total = 0, one = 0;
    for (int K = 1; K <= c->L; K++) {
        t.recompute_segment = K;
        size_t total = plan_stages(plan_rank, c, &t, dp, tc->B, elem_bytes, 0);
        if (K == 1) one = total;
        if (K == 1 || total < best_total) {
            best = K;
            best_total = total;
        }
    }
    printf("  --recompute 3: the least memory with --recompute-segment %d: %.3f GiB per rank "
           "(--recompute-segment 1: %.3f)\n", best, best_total / 1073741824.0, one / 1073741824.0);
}

// --plan: prints the per-rank memory of the configuration on the command line and, with
// --device-memory, the largest micro-batch that fits. The world size is dp x tp x pp (--dp defaults to 1).
static void print_plan(PlanRank plan_rank, const TrainConfig* given, const char* precision, double device_memory) {
    GPT2Config c = given->arch;
    if (given->model_file) model_file_read(given->model_file, &c, NULL);
    validate_config(&c, "plan");
    validate_tp(&c, given->tp);
    if (given->T > c.maxT) fatal("sequence length T=%d is longer than maxT=%d", given->T, c.maxT);
    size_t elem_bytes = strcmp(precision, "fp32") == 0 ? 4 : 2;  // the precision planned for
    TrainConfig planned = *given;  // with the attention the planned run would take
    planned.kernels.flash_attention = attention_choice(given->kernels.flash_attention, given->B, given->T, c.C, c.NH,
                                                       elem_bytes, 1);
    const TrainConfig* tc = &planned;
    if (tc->kernels.flash_attention) attention_flash_validate(c.C, c.NH, elem_bytes, 1);
    int dp = tc->dp > 0 ? tc->dp : 1;
    printf("memory plan per rank (%s, GiB): GPT-2 L=%d C=%d NH=%d V=%d maxT=%d, %zu parameters\n",
           plan_is_cpu(elem_bytes) ? "CPU target: host memory" : "device memory", c.L, c.C, c.NH, c.V, c.maxT,
           gpt2_num_parameters(&c));
    char segment[48] = "";
    if (tc->recompute_segment > 1)
        snprintf(segment, sizeof(segment), " (segments of %d layers)", tc->recompute_segment);
    char schedule[48] = "";
    if (tc->pp > 1) snprintf(schedule, sizeof(schedule), " (%s)", schedule_name(tc->pipe_schedule));
    printf("  %d ranks = dp %d x tp %d x pp %d, ZeRO-%d, %s, %s attention, recompute %d%s, micro-batch B=%d T=%d, "
           "%d micro-batch%s per step%s\n",
           dp * tc->tp * tc->pp, dp, tc->tp, tc->pp, tc->zero, precision,
           tc->kernels.flash_attention ? "flash" : "classic", tc->recompute, segment, tc->B, tc->T, tc->grad_accum,
           tc->grad_accum > 1 ? "es" : "", schedule);
    plan_stages(plan_rank, &c, tc, dp, tc->B, elem_bytes, 1);
    if (tc->recompute == 3) print_best_segment(plan_rank, &c, tc, dp, elem_bytes);
    if (device_memory > 0) {
        int lo = 0, hi = 1;  // largest B whose worst stage fits: grow, then bisect
        while (hi <= (1 << 16) && plan_stages(plan_rank, &c, tc, dp, hi, elem_bytes, 0) <= device_memory) {
            lo = hi;
            hi *= 2;
        }
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (plan_stages(plan_rank, &c, tc, dp, mid, elem_bytes, 0) <= device_memory) lo = mid;
            else hi = mid;
        }
        if (lo == 0)
            printf("  with %.1f GiB per device: even a micro-batch of 1 does not fit\n", device_memory / 1073741824.0);
        else
            printf("  with %.1f GiB per device: the largest micro-batch that fits is B=%d\n",
                   device_memory / 1073741824.0, lo);
    }
}

// The start-up line of a pipeline stage's memory per rank (what its model allocated, and the kernels' scratch)
static void print_stage_memory(const MemoryPlan* p, const Placement* pl, StageSlots st) {
    const double M = 1048576.0;
    char layers[256], slots[256];
    describe_stage(pl, st, 0, layers, slots, sizeof(layers));
    printf("memory of stage %d (%s) per rank (MiB): parameters %.2f | gradients %.2f | optimizer state %.2f | "
           "activations %.2f (micro-batch %s) | workspace %.2f | kernel scratch %.2f | total %.2f\n",
           pl->pp_rank, layers, p->params / M, p->grads / M, p->optimizer / M, p->activations / M, slots,
           p->workspace / M, p->kernel_scratch / M, plan_total(p) / M);
}

// GPU target, after the first applied step: what the device reports in use (the CUDA context included)
// against the plan of this rank, on every rank (stages differ)
static void print_device_memory_vs_plan(const MemoryPlan* p, const Comm* comm) {
    char rank[32] = "";
    if (comm->world_size > 1) snprintf(rank, sizeof(rank), ", rank %d", comm->world_rank);
    size_t free_b, total_b;
    device_memory_info(&free_b, &total_b);
    printf("device memory after the first step%s: %.3f GiB in use (cudaMemGetInfo, CUDA context included), "
           "%.3f GiB planned (in use - planned: %+.3f MiB)\n", rank, (total_b - free_b) / 1073741824.0,
           plan_total(p) / 1073741824.0, ((double)(total_b - free_b) - (double)plan_total(p)) / 1048576.0);
}
