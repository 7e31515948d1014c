/*
 * stop_signal.h: stopping a run cleanly on SIGINT, SIGTERM or SIGUSR1 (Ctrl-C, `kill`, a scheduler's
 * notice before its time limit: Slurm's `--signal=USR1@120`).
 *
 * The handler only records which signal came (a sig_atomic_t: nothing else is safe in a handler). The
 * training loop asks stop_signal_agreed() once per step, after the step: a max all-reduce of that record
 * over all ranks (one double per step; a signal may reach only one rank, e.g. `kill` of one process),
 * so that every rank stops after the same step. The loop then saves a checkpoint as --stop-after would
 * and the program exits with EXIT_STOPPED_BY_SIGNAL. Further signals while finishing the step or saving
 * change nothing (the record is only read at the next step boundary, which never comes); a SIGKILL at
 * that point still cannot corrupt the previous checkpoint, as every save is atomic (llmc/run/atomic_file.h).
 *
 * For tests, stop_signal_wait() holds every rank after a given step until a signal has come, so that a
 * test signals a run at a known step instead of racing a run that may end first (--fault-wait-signal).
 */
#pragma once

#include <signal.h>

#include "../comm.h"     // comm_all_reduce_host: the ranks agree on a stop
#include "checkpoint.h"  // check_checkpoint_dir_owner, CHECKPOINT_NAME_MAX: the checkpoint a signal asks for
#include "config.h"      // TrainConfig

// the exit code of a run stopped by a signal after saving its checkpoint (0: finished, 1: error)
#define EXIT_STOPPED_BY_SIGNAL 3

// Process-wide because a signal is: the handler can reach nothing else (the signal number, 0: none).
static volatile sig_atomic_t stop_signal_received = 0;
static int stop_signal_ended_run = 0;  // set when the training loop stopped for one (main's exit code)

static void stop_signal_handler(int sig) { stop_signal_received = sig; }

// Installs the handler for SIGINT, SIGTERM and SIGUSR1 (SA_RESTART: an interrupted read or write resumes).
static void stop_signal_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = stop_signal_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    const int signals[3] = {SIGINT, SIGTERM, SIGUSR1};
    for (int i = 0; i < 3; i++)
        if (sigaction(signals[i], &sa, NULL) != 0)
            fatal("cannot install the handler of signal %d: %s", signals[i], strerror(errno));
}

// Collective over all ranks, once per step: the number of a stop signal that reached any rank (the
// largest, if several did), or 0. Every rank gets the same answer.
static int stop_signal_agreed(Comm* comm) {
    double sig = (double)stop_signal_received;
    comm_all_reduce_host(comm, &comm->world, &sig, 1, REDUCE_MAX);
    return (int)sig;
}

// Testing (--fault-wait-signal): every rank waits, after `step`, until a stop signal has reached any of
// them, and returns its number. The ranks ask together every 10 ms, the same number of times each, so
// all of them leave the wait after the same agreement (or all give up after max_seconds).
static int stop_signal_wait(Comm* comm, long long step, double max_seconds) {
    for (long long i = 0; i < (long long)(max_seconds * 100); i++) {
        int sig = stop_signal_agreed(comm);
        if (sig) return sig;
        usleep(10000);
    }
    fatal("--fault-wait-signal: no stop signal reached any rank within %.0f s of step %lld", max_seconds, step);
}

static const char* stop_signal_name(int sig) {
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

// A signal stops the run after the current step with a checkpoint (above). Its folder was
// checked at the start only if the run meant to save: otherwise it is checked now, before the save.
static void prepare_signal_checkpoint(const TrainConfig* tc, uint64_t run_id, long long start_step) {
    if (tc->save_every > 0 || tc->stop_after > 0) return;
    check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir", 1, CHECKPOINT_NAME_MAX);
    check_checkpoint_dir_owner(tc->checkpoint_dir, run_id, start_step);
}

// After the checkpoint of a run stopped by a signal: one line saying so, and the exit code to come.
static void report_signal_stop(const TrainConfig* tc, Comm* comm, int sig, long long step) {
    stop_signal_ended_run = 1;
    if (comm->world_rank == 0)
        printf("stopped by %s after step %lld: checkpoint saved in '%s'; continue with --resume %s (exit code %d)\n",
               stop_signal_name(sig), step, tc->checkpoint_dir, tc->checkpoint_dir, EXIT_STOPPED_BY_SIGNAL);
}
