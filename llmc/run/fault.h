/*
 * fault.h: fault injection for the tests: one plan, set by the --fault-* flags (train_gpt --help-testing),
 * checked in one place (fault_plan_check), and asked at five named points of a run, all with one call,
 * fault_due(plan, point, world rank, step):
 *
 *   FAULT_KILL          --fault-rank R --fault-step S: rank R dies at step S (SIGKILL), as a crashed node
 *                       would; with --fault-stop 1 it stops there (SIGSTOP): alive, connections open, hung
 *   FAULT_SLOW_SAVE     --fault-slow-save S: rank 0 takes S seconds longer to save (checkpoints, final model)
 *   FAULT_SLOW_SAMPLE   --fault-slow-sample S: every sample takes S seconds longer
 *   FAULT_INF_GRADIENT  --fault-inf-rank R --fault-inf-step S: rank R makes one gradient inf at step S, as
 *                       an FP16 overflow would (the trainer does it: fault_due says when)
 *   FAULT_WAIT_SIGNAL   --fault-wait-signal S: after step S every rank waits (up to 60 s) for a stop signal
 *                       (the trainer does it: fault_due says when)
 * and one setting read where it applies: --fault-clock-skew S, rank r's --trace clock reads r x S seconds
 * ahead (trace_align_clocks must cancel it).
 *
 * The tests of fault tolerance, signals and loss scaling use them. A run without these flags is not
 * changed by them in any way.
 */
#pragma once

#include <signal.h>  // raise, SIGKILL, SIGSTOP
#include <unistd.h>  // usleep

#include "../common.h"  // fatal

typedef struct {
    int rank, step;          // --fault-rank, --fault-step: this world rank kills itself at this step (-1: never)
    int stop;                // --fault-stop: ... or stops itself there (SIGSTOP), as a hung node would
    double slow_save;        // --fault-slow-save: rank 0 takes this many seconds longer to save
    double slow_sample;      // --fault-slow-sample: each sample takes this many seconds longer
    long long wait_signal;   // --fault-wait-signal: after this step every rank waits for a stop signal (-1: never)
    double clock_skew;       // --fault-clock-skew: --trace's clock on rank r reads r times this many seconds ahead
    int inf_rank, inf_step;  // --fault-inf-rank, --fault-inf-step: this rank puts an inf into a gradient at this step
} FaultPlan;

static FaultPlan fault_plan_none(void) {
    FaultPlan f;
    memset(&f, 0, sizeof(f));
    f.rank = f.step = -1;
    f.wait_signal = -1;
    f.inf_rank = f.inf_step = -1;
    return f;
}

// The plan's one constraint on the run: a signal after the last step would stop nothing (the run is done).
static void fault_plan_check(const FaultPlan* f, long long steps) {
    if (f->wait_signal >= steps) fatal("--fault-wait-signal %lld must be below --steps %lld", f->wait_signal, steps);
}

// --help-testing: the lines of the flags above
static void fault_print_usage(void) {
    printf("testing (fault injection: what the tests of fault tolerance, signals and loss scaling use)\n"
           "  --fault-rank R --fault-step S   rank R kills itself at step S\n"
           "  --fault-stop 1        ... stops itself instead (SIGSTOP), as a hung rank would\n"
           "  --fault-slow-save S   rank 0 takes S seconds longer to save each checkpoint and the final model\n"
           "  --fault-slow-sample S  every sample takes S seconds longer (on every rank that samples)\n"
           "  --fault-wait-signal S  after step S every rank waits (up to 60 s) for a stop signal\n"
           "  --fault-clock-skew S  rank r's clock for --trace reads r x S seconds ahead (the trace must not show it)\n"
           "  --fault-inf-rank R --fault-inf-step S   rank R makes a gradient inf at step S\n");
}

// The points of a run where a fault may be due (see the top)
typedef enum { FAULT_KILL, FAULT_SLOW_SAVE, FAULT_SLOW_SAMPLE, FAULT_INF_GRADIENT, FAULT_WAIT_SIGNAL } FaultPoint;

// Whether the plan's fault at `point` is due on this world rank at this step. What needs nothing of the
// caller is done here (dying or stopping, a delay); FAULT_INF_GRADIENT and FAULT_WAIT_SIGNAL are the
// caller's to do when this returns 1.
static int fault_due(const FaultPlan* f, FaultPoint point, int world_rank, long long step) {
    double delay = 0.0;
    switch (point) {
        case FAULT_KILL:
            if (world_rank != f->rank || step != f->step) return 0;
            fprintf(stderr, "rank %d: --fault-rank: %s myself at step %lld\n", world_rank,
                    f->stop ? "stopping" : "killing", step);
            raise(f->stop ? SIGSTOP : SIGKILL);
            return 1;
        case FAULT_SLOW_SAVE: delay = world_rank == 0 ? f->slow_save : 0.0; break;
        case FAULT_SLOW_SAMPLE: delay = f->slow_sample; break;
        case FAULT_INF_GRADIENT: return world_rank == f->inf_rank && step == f->inf_step;
        case FAULT_WAIT_SIGNAL: return step == f->wait_signal;
    }
    if (delay <= 0) return 0;
    usleep((useconds_t)(delay * 1e6));
    return 1;
}
