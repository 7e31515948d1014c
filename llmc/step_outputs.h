/*
 * step_outputs.h: what an optimizer step produces, behind one interface with two executors, the way
 * comm.h puts two engines behind one call. The step's outputs are
 *   - each micro-batch's mean loss                                 step_outputs_loss (after its forward)
 *   - the update's verdict: the gradient norm, AdamW's gradient factor (clipping and 1 / the loss scale),
 *     and whether the step is skipped (an overflow under loss scaling) or the run has diverged
 *                                                                  step_outputs_verdict (before AdamW)
 *   - the step's mean loss, norm and skip, on the host              step_outputs_fetch (after the update)
 * and the trainer calls the same three functions whichever executor runs them:
 *
 *   host executor (the CPU target; the GPU with --fused-kernels 0): each micro-batch's losses are copied
 *     to the host and averaged there; before the update the host sums the squared norm across ranks
 *     (grad_sumsq_on_host), asks the loss scaler, computes the clip factor and decides; a skipped or
 *     diverged step launches no AdamW at all. Plain, and every rank's host waits for its GPU each time.
 *   device executor (--fused-kernels 1 on the GPU target): nothing waits before AdamW. The means stay on
 *     the device; the device decides, in the main stream's order, and the host learns the outcome after:
 *       the loss     the mean of the step's M means (step_loss_kernel)
 *       the verdict  the norm's two group sums (llmc/global_norm.h), summed across ranks by collectives on
 *                    the device, after each of which the main stream (not the host) waits (comm_main_waits);
 *                    then one thread computes
 *                      norm      = sqrt(sumsq) / loss scale                  (of the unscaled gradients)
 *                      nonfinite = sumsq or the loss is inf or NaN             (then a max over the world)
 *                      factor    = min(1, grad_clip / (norm + 1e-6)) / loss scale  (clip_grad_norm_'s)
 *                    which AdamW reads (adamw_update_ranges' verdict): nonfinite skips the update, so a
 *                    skipped or diverged step leaves parameters and optimizer state untouched
 *       the fetch    the report to the host in one copy, the step's one wait; the host then moves the loss
 *                    scaler with the verdict (loss_scaler_update, as loss_scaler_check does before the
 *                    update on the host executor) and the trainer ends a diverged run
 * Both give the same verdict; the CPU target always runs the host executor (its results with
 * --fused-kernels must stay identical); the CPU branches below are the kernels' loops written plainly, as
 * in the layer headers.
 *
 * Precision: the device's collectives carry float where the host executor sums doubles. What each rank
 * contributes is already a double sum of float block partials, rounded once; the terms are non-negative,
 * so a float sum over R ranks is off by at most (R - 1) x 2^-24 relative (no cancellation magnifies it),
 * and the norm by half that, below the error of the float block partials the norm kernel sums on both
 * paths. On one rank nothing is added in float. The DP mean of the loss likewise. The squared norm has
 * float's range there: a norm above 1.8e19 counts as non-finite (the host executor reports it and clips).
 *
 * The list of the host synchronizations left in a step on the device executor is at the end of this file.
 */
#pragma once

#include "classifier.h"   // loss_mean: a micro-batch's mean loss on the device
#include "comm.h"         // comm_all_reduce, comm_main_waits: sums across ranks that the host does not wait for
#include "device.h"       // device_malloc, copy_to_host, launches
#include "global_norm.h"  // NormParts, norm_parts_sum(_on_device): the squared norm's group sums
#include "loss_scaler.h"  // LossScaler, loss_scaler_check, loss_scaler_update

// the device executor's report: its floats, in device memory
enum {
    REPORT_LOSS,         // this rank's mean loss over its micro-batches (0 but on the last stage), then summed over
                         // PP and DP
    REPORT_SUMSQ_REPL,   // the squared norm of the replicated gradients this rank owns, then summed over PP (and DP
                         // with ZeRO)
    REPORT_SUMSQ_SPLIT,  // the same of the tensors split by TP, first summed over TP
    REPORT_NONFINITE,    // 1: the squared norm or the loss is inf or NaN on some rank, and AdamW skips the step; else 0
    REPORT_GRAD_SCALE,   // AdamW's gradient factor (with REPORT_NONFINITE: adamw_update_ranges' verdict, in that order)
    REPORT_NORM,         // the gradient norm before clipping (of the unscaled gradients)
    REPORT_FLOATS
};
static_assert(REPORT_FLOATS == 6, "llmc/run/memory_plan.h plans 6 floats for the step report");

typedef struct {
    int on_device;  // the device executor (--fused-kernels on the GPU); 0: the host executor
    int n_losses;   // the micro-batch losses this rank has given so far this step (0 but on the last stage)
    // host executor: the step so far, and the verdict it reached
    float* host;        // (host_cap) a micro-batch's per-position losses, brought to the host
    size_t host_cap;
    double loss_sum;    // the micro-batches' mean losses, added in micro-batch order
    double loss;        // the step's mean loss over the DP ranks
    float norm;         // the gradient norm (INFINITY: skipped; non-finite: diverged)
    int skipped;        // the step was skipped on an overflow under loss scaling
    // device executor
    float* means;               // (cap) each micro-batch's mean loss, on the device
    int cap;
    float* report;              // (REPORT_FLOATS) on the device, allocated at the first step (planned as kernel
                                // scratch)
    float fetched[REPORT_FLOATS];  // step_outputs_fetch's copy
} StepOutputs;

// What the update does with the step's gradients (step_outputs_verdict).
typedef struct {
    int apply;               // launch AdamW (host executor: 0 when the step is skipped or the run has diverged)
    float grad_scale;        // AdamW's gradient factor, decided on the host
    const float* on_device;  // device executor: (nonfinite, factor) on the device, which AdamW reads instead
} UpdateVerdict;

// the verdict from the summed report r (see the top), on the device or the CPU
#ifdef LLMC_CPU
#define REPORT_FN static inline
#else
#define REPORT_FN __host__ __device__ static inline
#endif
REPORT_FN void step_verdict(float* r, float scale, float grad_clip) {
    double sumsq = (double)r[REPORT_SUMSQ_REPL] + r[REPORT_SUMSQ_SPLIT];
    float norm = (float)sqrt(sumsq) / scale;  // (as the host executor computes it)
    float clip = grad_clip > 0.0f ? grad_clip / (norm + 1e-6f) : 1.0f;
    r[REPORT_NORM] = norm;
    r[REPORT_NONFINITE] = isfinite(sumsq) && isfinite(r[REPORT_LOSS]) ? 0.0f : 1.0f;
    r[REPORT_GRAD_SCALE] = (clip < 1.0f ? clip : 1.0f) / scale;
}

// the mean of M losses (M = 0: 0), added in double in micro-step order, as the host executor adds them
REPORT_FN float mean_loss(const float* means, int M) {
    double sum = 0.0;
    for (int m = 0; m < M; m++) sum += means[m];
    return M > 0 ? (float)(sum / M) : 0.0f;
}

#ifndef LLMC_CPU
#define STEP_REPORT_THREADS 1  // a few scalars: one thread
__global__ void __launch_bounds__(STEP_REPORT_THREADS) step_loss_kernel(float* r, const float* means, int M) {
    r[REPORT_LOSS] = mean_loss(means, M);
}
__global__ void __launch_bounds__(STEP_REPORT_THREADS) step_verdict_kernel(float* r, float scale, float grad_clip) {
    step_verdict(r, scale, grad_clip);
}
#endif

// The start of a step of M micro-batches.
static void step_outputs_begin(StepOutputs* s, int M) {
    s->n_losses = 0;
    s->loss_sum = 0.0;
    if (!s->on_device || s->cap >= M) return;
    device_free(s->means);  // (room for a step's M means, grown when a step has more micro-batches)
    s->means = (float*)device_malloc((size_t)M * sizeof(float));
    s->cap = M;
}

static void step_outputs_free(StepOutputs* s) {
    device_free(s->means);
    device_free(s->report);
    free(s->host);
    s->means = NULL;
    s->report = NULL;
    s->host = NULL;
    s->host_cap = 0;
}

// The mean of N per-position losses on the device, through the host: `host` (N floats) receives them
// and they are added in double, in order (what the device's loss_mean computes on the CPU target).
static float mean_loss_on_host(float* host, const float* losses, size_t N) {
    copy_to_host(host, losses, N * sizeof(float));
    float mean;
    loss_mean_cpu(&mean, host, (int)N);
    return mean;
}

// Micro-batch m's mean loss, from its per-position losses (N) on the device.
static void step_outputs_loss(StepOutputs* s, int m, const float* losses, int N) {
    if (s->on_device) {
        loss_mean(s->means + m, losses, N);
    } else {
        if (s->host_cap < (size_t)N) {  // (grown to the largest micro-batch)
            free(s->host);
            s->host = (float*)malloc_check((size_t)N * sizeof(float));
            s->host_cap = (size_t)N;
        }
        s->loss_sum += mean_loss_on_host(s->host, losses, (size_t)N);
    }
    s->n_losses++;
}

// The squared norm of all the model's gradients (with a loss scaler: of scale x gradients), through the
// host, the same on every rank: tensors split by TP are summed over the TP group, replicated ones counted
// once; the stages' tensors are summed over the PP group; with ZeRO the owned parts over the DP group.
// parts: this rank's owned ranges (`scratch`: their partial sums; `batched`: --fused-kernels' batched
// launches); tp: the TP group's size; zero_stage: the run's ZeRO stage.
static double grad_sumsq_on_host(NormParts* parts, Comm* comm, Scratch* scratch, int tp, int zero_stage, int batched) {
    double sums[2];  // [replicated, split by TP]
    norm_parts_sum(parts, sums, scratch, batched);
    if (tp > 1) comm_all_reduce_host(comm, &comm->tp_group, &sums[1], 1, REDUCE_SUM);
    double sumsq = sums[1] + sums[0];
    comm_all_reduce_host(comm, &comm->pp_group, &sumsq, 1, REDUCE_SUM);  // PP: every stage's own tensors
    if (zero_stage > 0) comm_all_reduce_host(comm, &comm->dp_group, &sumsq, 1, REDUCE_SUM);
    return sumsq;
}

// The host executor's verdict. The step's mean loss first: the mean of this rank's micro-batch losses (the
// last stage's; 0 on the others), summed over the PP group and averaged over the DP group; a non-finite
// loss updates nothing (the trainer ends the run). Then the squared norm; an overflow under loss scaling
// skips the step on every rank; a non-finite norm without it updates nothing either (diverged).
static UpdateVerdict host_verdict(StepOutputs* s, Comm* comm, NormParts* parts, Scratch* scratch, int tp,
                                  int zero_stage, LossScaler* scaler, float grad_clip, int batched) {
    UpdateVerdict v = {.apply = 0, .grad_scale = 1.0f, .on_device = NULL};
    double mean = s->n_losses > 0 ? s->loss_sum / s->n_losses : 0.0;
    comm_all_reduce_host(comm, &comm->pp_group, &mean, 1, REDUCE_SUM);  // (the last stage has the loss)
    comm_all_reduce_host(comm, &comm->dp_group, &mean, 1, REDUCE_AVG);
    s->loss = (float)mean;
    s->skipped = 0;
    s->norm = NAN;
    if (!isfinite(s->loss)) return v;
    float scale = scaler ? loss_scale(scaler) : 1.0f;  // the scale backward ran with (the check may change it)
    double sumsq = grad_sumsq_on_host(parts, comm, scratch, tp, zero_stage, batched);
    if (loss_scaler_check(scaler, comm, sumsq)) {
        s->skipped = 1;
        s->norm = INFINITY;
        return v;
    }
    s->norm = (float)sqrt(sumsq) / scale;
    if (!isfinite(s->norm)) return v;
    float clip_coef = grad_clip > 0.0f ? grad_clip / (s->norm + 1e-6f) : 1.0f;
    v.apply = 1;
    v.grad_scale = (clip_coef < 1.0f ? clip_coef : 1.0f) / scale;
    return v;
}

// The device executor's verdict, queued after backward, before AdamW: the mean of this rank's losses, the
// squared norm of the gradient ranges `parts` (`scratch`: their partial sums), summed across ranks as
// grad_sumsq_on_host sums it (TP: the split tensors; PP: every stage's own; DP with ZeRO stage > 0: the
// owned parts) together with the loss (PP: the last stage's; DP: every rank's), then the verdict for the
// loss scale and the clip threshold `grad_clip`, the same on every rank (the max of the flag over the
// world: an overflow on one rank skips the step everywhere).
static UpdateVerdict device_verdict(StepOutputs* s, Comm* c, NormParts* parts, Scratch* scratch, int zero_stage,
                                    LossScaler* scaler, float grad_clip) {
    float scale = scaler ? loss_scale(scaler) : 1.0f;
    if (s->report == NULL) {
        s->report = (float*)device_malloc(REPORT_FLOATS * sizeof(float));
        device_memset_zero(s->report, REPORT_FLOATS * sizeof(float));
    }
    float* d = s->report;
#ifdef LLMC_CPU
    d[REPORT_LOSS] = mean_loss(s->means, s->n_losses);
    double sums[2];
    norm_parts_sum(parts, sums, scratch, 0);
    d[REPORT_SUMSQ_REPL] = (float)sums[0];
    d[REPORT_SUMSQ_SPLIT] = (float)sums[1];
#else
    step_loss_kernel<<<1, STEP_REPORT_THREADS, 0, main_stream>>>(d, s->means, s->n_losses);
    launchCheck();
    norm_parts_sum_on_device(parts, d + REPORT_SUMSQ_REPL, scratch);  // groups 0 and 1: the replicated, the split
#endif
    comm_all_reduce(c, &c->tp_group, d + REPORT_SUMSQ_SPLIT, 1, DT_FLOAT, REDUCE_SUM);
    comm_main_waits(c, &c->tp_group);
    comm_all_reduce(c, &c->pp_group, d + REPORT_LOSS, 3, DT_FLOAT, REDUCE_SUM);  // the loss and both sums
    comm_main_waits(c, &c->pp_group);
    comm_all_reduce(c, &c->dp_group, d + REPORT_LOSS, zero_stage > 0 ? 3 : 1, DT_FLOAT, REDUCE_SUM);
    comm_main_waits(c, &c->dp_group);
#ifdef LLMC_CPU
    step_verdict(d, scale, grad_clip);
#else
    step_verdict_kernel<<<1, STEP_REPORT_THREADS, 0, main_stream>>>(d, scale, grad_clip);
    launchCheck();
#endif
    comm_all_reduce(c, &c->world, d + REPORT_NONFINITE, 1, DT_FLOAT, REDUCE_MAX);
    comm_main_waits(c, &c->world);
    UpdateVerdict v = {.apply = 1, .grad_scale = 1.0f, .on_device = d + REPORT_NONFINITE};  // (AdamW skips on it)
    return v;
}

// The update's verdict, after the step's micro-batches, before AdamW: one of the two executors above.
// tp: the TP group's size; `batched`: --fused-kernels' launches of the norm's sums.
static UpdateVerdict step_outputs_verdict(StepOutputs* s, Comm* comm, NormParts* parts, Scratch* scratch, int tp,
                                          int zero_stage, LossScaler* scaler, float grad_clip, int batched) {
    if (s->on_device) return device_verdict(s, comm, parts, scratch, zero_stage, scaler, grad_clip);
    return host_verdict(s, comm, parts, scratch, tp, zero_stage, scaler, grad_clip, batched);
}

// After the update (and whatever follows it on the main stream): *loss = the step's mean loss over the
// DP ranks (non-finite: the run has diverged, AdamW left everything as it was, and the scaler is not
// moved); *skipped = 1 and INFINITY for a step skipped on an overflow, else the norm, non-finite when the
// run diverged without a scaler. The device executor copies its report here, the step's one wait, and
// moves the loss scaler `scaler` (NULL: none) with the verdict.
static float step_outputs_fetch(StepOutputs* s, LossScaler* scaler, int dp, double* loss, int* skipped) {
    if (!s->on_device) {
        *loss = s->loss;
        *skipped = s->skipped;
        return s->norm;
    }
    copy_to_host(s->fetched, s->report, sizeof(s->fetched));
    double mean = (double)s->fetched[REPORT_LOSS] / dp;
    *loss = mean;
    *skipped = 0;
    if (!isfinite(mean)) return NAN;
    int nonfinite = s->fetched[REPORT_NONFINITE] != 0.0f;
    if (scaler && loss_scaler_update(scaler, nonfinite)) {
        *skipped = 1;
        return INFINITY;
    }
    float norm = s->fetched[REPORT_NORM];
    return nonfinite && isfinite(norm) ? INFINITY : norm;
}

/*
 * The host synchronizations left in one training step with --fused-kernels 1 on the GPU (NCCL engine; not
 * counting --trace, evaluation, sampling and checkpoint steps), by where they are and why:
 *   per micro-batch
 *     train_gpt.cu stage_token_ids: device_event_wait(ids_copied) before the activation
 *         set's pinned ids are rewritten: the copy of the previous micro-batch's ids from them has run, i.e.
 *         the GPU has begun that micro-batch. The host stays at most one micro-batch per set ahead; no
 *         drain. Could go with two pinned buffers per set, used in turn.
 *     llmc/encoder.h encoder_backward: host_staging_get's event wait (llmc/device.h), the same for the
 *         token grouping's pinned buffer. Could go the same way, or with the grouping made on the device.
 *     llmc/tensor_parallel.h tp_sum, vocab_parallel_cross_entropy (TP only): after each TP all-reduce
 *         only the main stream waits (comm_join_for_kernels, Comm.kernels_wait), since only kernels read
 *         the sums: no drain.
 *     llmc/pipeline.h pipe_sendrecv (PP only): comm_join after a receive, a send-receive and a send from a
 *         shared buffer. The receives could become comm_main_waits; the sends would need an event before
 *         their buffer's next writer.
 *     train_gpt.cu gpt2_backward, last lines: with one stage, comm_main_waits(dp_group): the main stream,
 *         not the host, waits for the DP reductions (ZeRO-2/3's accumulation of the reduced parts follows
 *         on the stream), so the host goes on to queue the next micro-batch or the update: no drain. With
 *         PP it stays comm_join, a drain (the pipeline's sends may still read their buffers).
 *     train_gpt.cu pipeline_step, sum_tied_embedding_grads (PP only): comm_join after the last exchange,
 *         after the tied wte's sum and after its bucket's reduction: as gpt2_backward's with PP.
 *   per step
 *     train_gpt.cu gpt2_update: comm_join after zero_gather_params. AdamW is queued by then, so the GPU
 *         does not idle: with ZeRO the host waits for the parameters' all-gather, without it for the
 *         update's small collectives. Could go (comm_main_waits), leaving the next one alone.
 *     step_outputs_fetch: the copy of the report, the one wait that remains by design (loss, norm, verdict).
 *     train_gpt.cu train_step: device_synchronize for the step's time: the stream is idle by then.
 *     llmc/run/stop_signal.h stop_signal_agreed (more than one rank): a blocking all-reduce over the world
 *         after the step, through the host (NCCL: copies both ways). Could ride in the next step's report.
 *     The MPI engine (ranks sharing a GPU): every collective copies through the host and waits
 *         (llmc/comm/mpi_engine.h), the update's four small ones included.
 *   once or rarely: the first step's cudaMalloc of kernel scratch and of the report, and the upload of
 *     the norm's range table (norm_parts_sum_on_device); a growing buffer's free (step_outputs_begin,
 *     host_staging_get); report_step's device memory query after the first applied step; the testing
 *     flags' injected inf (--fault-inf-*).
 */
