/*
 * watchdog.h: ends a rank whose host is stuck inside a CUDA call that waits for communication which
 * never completes (the NCCL engine), as PyTorch's ProcessGroupNCCL watchdog does.
 *
 * The NCCL engine never blocks in CUDA while it waits for other ranks: it polls the streams and the
 * communicators against --comm-timeout (llmc/comm/nccl_engine.h). Other calls do wait for the GPU: a copy to or from
 * the host and device_synchronize (cudaStreamSynchronize), an event, cudaFree. Once the main stream has
 * been made to wait for a communication stream (ZeRO-2's layer buffers, zero.h), such a call waits for
 * that communication too, and if a peer rank is stopped or hung it never returns: the host never gets
 * back to a poll, nothing is aborted, and the run hangs for good.
 *
 * So the main thread marks every call that can block on the GPU (watchdog_enter before it,
 * watchdog_leave after), naming it for the message. A thread started with the NCCL engine
 * (watchdog_start; watchdog_stop before the communicators are finalized) looks every 100 ms: when the
 * main thread has been inside one call longer than the deadline (--comm-timeout; --io-timeout while the
 * ranks wait around file I/O) while communication is outstanding (posted, not yet joined: a long wait
 * with none is the GPU's own work), it prints the line the engine's own deadline prints, aborts every
 * communicator (ncclCommAbort may be called from any thread; it makes NCCL's kernels return and frees
 * the GPU) and ends the process with _exit(1): not exit(), since the main thread is inside the CUDA
 * runtime, and exit's handlers (the runtime's teardown, MPI's, destructors) would run beside it and may
 * block or crash. Under mpirun, mpirun then ends the other ranks.
 *
 * Atomics only, on the main thread's side: the marks sit around every copy of a step, and must neither
 * take a lock (the watchdog never waits on the main thread) nor cost anything next to a kernel launch.
 * The watchdog makes no CUDA call at all: the CUDA emulation (dev/emulate/emulate.h) is not thread-safe,
 * and ending the process needs none.
 *
 * The GPU target only (on the CPU target the marks are empty), and NCCL is the engine's business: it
 * hands watchdog_start the function that aborts its communicators, so this header, which device.h
 * includes, needs no nccl.h.
 */
#pragma once

#include "../common.h"  // fatal, wall_seconds

#ifndef LLMC_CPU
#include <pthread.h>

#include <atomic>

typedef struct {
    // the main thread's marks. call: the number of the blocking call it is in (0: none; -1: the watchdog
    // has taken it, and ends the process), what: its name, since: when it began (wall_seconds)
    std::atomic<long> call;
    std::atomic<const char*> what;
    std::atomic<double> since;
    std::atomic<int> communicating;  // communication has been posted and not joined since
    std::atomic<int> waiting_io;     // the ranks wait around file I/O: --io-timeout applies
    long calls;                      // (the main thread's own count, for the numbers)
    // set by watchdog_start before the thread runs, read-only after
    int rank, running;
    double timeout_s, io_timeout_s;
    void (*abort)(void*);  // aborts every communicator, called with abort_arg
    void* abort_arg;
    // for watchdog_stop: wakes the thread at once
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stop;
} Watchdog;

// Process-wide, as the main thread and the CUDA calls it marks are (zero-initialized: nothing marked).
static Watchdog g_watchdog;

static inline void watchdog_enter(const char* what) {
    Watchdog* w = &g_watchdog;
    w->since.store(wall_seconds());
    w->what.store(what);
    w->call.store(++w->calls);  // last: the watchdog reads the name and the time only of a numbered call
}

static inline void watchdog_leave(void) {
    // The watchdog takes a call by swapping its number for -1: whichever comes first wins, so the main
    // thread either goes on (the watchdog will find no call) or, should the call return now (the abort
    // may make it), waits here until the watchdog has ended the process.
    if (g_watchdog.call.exchange(0) == -1)
        for (;;) pause();
}

// the NCCL engine: communication was posted (1), or every stream has been joined (0)
static inline void watchdog_communicating(int on) { g_watchdog.communicating.store(on); }
static inline void watchdog_waiting_io(int on) { g_watchdog.waiting_io.store(on); }

// One look: the main thread inside one call past the deadline, with communication outstanding, ends
// the process.
static void watchdog_check(Watchdog* w) {
    long call = w->call.load();
    if (call <= 0 || !w->communicating.load()) return;
    int io = w->waiting_io.load();
    double limit = io ? w->io_timeout_s : w->timeout_s;
    const char* what = w->what.load();
    double since = w->since.load();
    if (limit <= 0 || wall_seconds() - since <= limit || w->call.load() != call) return;  // (a call begun since)
    long expected = call;
    if (!w->call.compare_exchange_strong(expected, -1)) return;  // the main thread has just left it
    fflush(stdout);
    fprintf(stderr, "error: rank %d: %s did not complete within %.0f s (%s): a peer rank is stopped, hung or gone\n",
            w->rank, what, limit, io ? "--io-timeout" : "--comm-timeout");
    fflush(stderr);
    w->abort(w->abort_arg);
    _exit(1);
}

static void* watchdog_main(void* arg) {
    Watchdog* w = (Watchdog*)arg;
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 100000000L;  // every 100 ms
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->wake, &w->lock, &t);
        if (!w->stop) watchdog_check(w);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

// Starts the watchdog. Deadlines as Comm's (0: none); abort(abort_arg) aborts every communicator, from
// the watchdog's thread while the main thread is held inside a CUDA call (so it touches nothing the main
// thread does), and must make no CUDA call.
static void watchdog_start(int rank, double timeout_s, double io_timeout_s, void (*abort)(void*), void* abort_arg) {
    Watchdog* w = &g_watchdog;
    check_internal(!w->running, "watchdog_start");
    w->rank = rank;
    w->timeout_s = timeout_s;
    w->io_timeout_s = io_timeout_s;
    w->stop = 0;
    w->abort = abort;
    w->abort_arg = abort_arg;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    int err = pthread_create(&w->thread, NULL, watchdog_main, w);
    if (err != 0) fatal("cannot start the watchdog thread: %s", strerror(err));
    w->running = 1;
}

static void watchdog_stop(void) {
    Watchdog* w = &g_watchdog;
    if (!w->running) return;
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    w->running = 0;
}

#else  // the CPU target: no GPU to be stuck in
static inline void watchdog_enter(const char* what) { (void)what; }
static inline void watchdog_leave(void) {}
static inline void watchdog_communicating(int on) { (void)on; }
static inline void watchdog_waiting_io(int on) { (void)on; }
#endif
