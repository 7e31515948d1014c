/*
 * report.h: what a run reports: the configuration record that starts the log (and each resume's), and
 * the line each finished step prints (loss, norm, learning rate, time, throughput, MFU, elapsed, ETA).
 */
#pragma once

#include <math.h>  // isfinite

#include "../comm.h"      // Comm, ENGINE_*
#include "dataloader.h"   // DataLoader
#include "../pipeline.h"  // schedule_name
#include "../device.h"    // device_name, TARGET_NAME, PRECISION_NAME
#include "logger.h"       // Logger, logger_config_begin, json_string
#include "config.h"       // TrainConfig
#include "../matmul.h"    // cpu_blas_linked

// The log's first line (and one per resume): the command line and what it resolved to (llmc/run/logger.h).
static void log_run_config(Logger* lg, const TrainConfig* tc, const Comm* comm, const GPT2Config* c,
                           size_t num_parameters, long long resumed_from) {
    if (!logger_config_begin(lg, tc->argc, tc->argv)) return;
    char device[256];
    device_name(device, sizeof(device));
    FILE* f = lg->f;
    fprintf(f, ", \"target\": \"%s\", \"precision\": \"%s\", \"device\": ", TARGET_NAME, PRECISION_NAME);
    json_string(f, device);
    fprintf(f, ", \"world\": %d, \"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero\": %d", comm->world_size, comm->dp,
            comm->tp, comm->pp, tc->zero);
    fprintf(f, ", \"model\": {\"L\": %d, \"C\": %d, \"NH\": %d, \"V\": %d, \"Vp\": %d, \"maxT\": %d, "
            "\"parameters\": %zu}", c->L, c->C, c->NH, c->V, c->Vp, c->maxT, num_parameters);
    fprintf(f, ", \"batch\": {\"B\": %d, \"T\": %d, \"grad_accum\": %d, \"tokens_per_step\": %lld}", tc->B, tc->T,
            tc->grad_accum, (long long)comm->dp * tc->B * tc->T * tc->grad_accum);
    fprintf(f, ", \"steps\": %lld, \"lr\": %g, \"warmup\": %d, \"lr_schedule\": \"%s\", \"seed\": %llu", tc->steps,
            tc->opt.lr, tc->warmup, tc->lr_schedule, (unsigned long long)tc->seed);
    if (TARGET_IS_CPU) fprintf(f, ", \"cpu_matmul\": \"%s\"", tc->kernels.cpu_blas ? "blas" : "reference");
    if (resumed_from >= 0) fprintf(f, ", \"resumed_from\": %lld", resumed_from);
    logger_config_end(lg);
}

// hours:minutes:seconds, or minutes:seconds under an hour
static void format_duration(double seconds, char* buf, size_t cap) {
    long long s = seconds > 0 && isfinite(seconds) ? (long long)(seconds + 0.5) : 0;
    if (s >= 3600) snprintf(buf, cap, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, cap, "%lld:%02lld", s / 60, s % 60);
}

// The line of a finished step: loss, norm, lr, time, throughput (MFU on a known GPU), the time since
// the loop started and the time left to the last step of this run (--stop-after or --steps), at the
// mean pace of the steps so far.
static void print_step_line(const TrainConfig* tc, long long step, long long start_step, double loop_start, float loss,
                            float norm, float lr, double ms, double tokens_per_s, double mfu) {
    long long end = tc->stop_after > 0 && tc->stop_after < tc->steps ? tc->stop_after : tc->steps;
    double elapsed = wall_seconds() - loop_start;
    char el[32], eta[32];
    format_duration(elapsed, el, sizeof(el));
    format_duration(elapsed / (double)(step - start_step) * (double)(end - step), eta, sizeof(eta));
    printf("step %5lld/%lld | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s", step, tc->steps, loss, norm, lr,
           ms, tokens_per_s);
    if (mfu > 0) printf(" | MFU %.1f%%", mfu);
    printf(" | %s elapsed, ETA %s\n", el, eta);
}

// The start-up lines (main rank): the target, the grid, the threads, the model, the batch, the training data
// (NULL: none read) and the pipeline.
static void print_run_header(const TrainConfig* tc, const Comm* comm, const GPT2Config* c, size_t num_parameters,
                             size_t tokens_per_step, const DataLoader* train) {
    const char* engine = comm->engine == ENGINE_NCCL ? "NCCL" : comm->engine == ENGINE_MPI ? "MPI" : "none";
    printf("target %s, precision %s, %d rank(s): dp=%d tp=%d pp=%d, ZeRO-%d, engine %s\n", TARGET_NAME, PRECISION_NAME,
           comm->world_size, comm->dp, comm->tp, comm->pp, tc->zero, engine);
#if defined(LLMC_CPU) && defined(_OPENMP)
    printf("threads: %d OpenMP thread(s) per rank (OMP_NUM_THREADS %s), matmuls: %s\n", omp_get_max_threads(),
           getenv("OMP_NUM_THREADS") ? "as set" : "unset: the node's cores / its ranks",
           tc->kernels.cpu_blas ? "OpenBLAS (--cpu-matmul blas)" : "reference GEMM (--cpu-matmul reference)");
#endif
#ifdef LLMC_CPU
    if (!cpu_blas_linked)  // (llmc/matmul.h)
        printf("note: this build has no OpenBLAS (NO_BLAS=1, or libopenblas-openmp-dev missing when it was built): "
               "its matmuls run the slower reference GEMM\n");
#endif
#ifndef LLMC_CPU
    printf("kernels: %s attention (--attention), fused kernels %s (--fused-kernels)\n",
           tc->kernels.flash_attention ? "flash" : "classic", tc->kernels.fused ? "on" : "off");
#endif
    printf("model: L=%d C=%d NH=%d V=%d (padded %d) maxT=%d, %zu parameters\n", c->L, c->C, c->NH, c->V, c->Vp, c->maxT,
           num_parameters);
    printf("batch: B=%d T=%d per rank, grad_accum=%d (%zu tokens per step), %lld steps\n", tc->B, tc->T, tc->grad_accum,
           tokens_per_step, tc->steps);
    if (train)
        printf("train data: %lld tokens (%lld global micro-batches per epoch, shuffle %s)\n", train->total_tokens,
               train->n_batches, tc->shuffle ? "on" : "off");
    if (comm->pp > 1) {
        printf("pipeline: %d stages, schedule %s, %d micro-batches", comm->pp, schedule_name(tc->pipe_schedule),
               tc->grad_accum);
        if (tc->virtual_stages > 1) printf(", %d chunks of layers per stage", tc->virtual_stages);
        printf("%s\n", tc->rematerialize ? ", activations rematerialized in backward" : "");
    }
}

// The log (--log, main rank), continued on resume from start_step, and its configuration record
static void open_run_log(Logger* lg, const TrainConfig* tc, const Comm* comm, const GPT2Config* c,
                         size_t num_parameters, long long start_step) {
    if (comm->world_rank == 0 && tc->resume) logger_open_resumed(lg, tc->log_file, start_step);
    else if (comm->world_rank == 0) logger_open(lg, tc->log_file, 0);
    log_run_config(lg, tc, comm, c, num_parameters, tc->resume ? start_step : -1);
}
