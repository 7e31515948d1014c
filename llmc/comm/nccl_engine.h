/*
 * comm/nccl_engine.h: the NCCL engine of llmc/comm.h (GPU target, one GPU per rank), and its start-up.
 *
 * Every operation is queued on its group's communication stream (Group.stream: world, DP, TP, PP and
 * embedding each have one) after the work the main stream has queued so far (an event orders them), so
 * it overlaps whatever the main stream does next, and the groups' operations overlap one another; the
 * join polls every stream (nccl_wait) or one group's (nccl_wait_group). The communicators are
 * non-blocking: creation, splitting and every enqueue may return ncclInProgress and are polled, with
 * each communicator's asynchronous error state, against the deadline, so a peer that died or stopped
 * ends the run with one line instead of a hang.
 *
 * Start-up: the ranks share NCCL's unique id (rank 0 draws it) through MPI when launched by mpirun, else
 * through a file in a shared folder (--nccl-id-dir) or, without one, over TCP at MASTER_ADDR:MASTER_PORT
 * as torchrun sets them (rendezvous.h), then create the world's communicator and split
 * the DP, TP, PP and embedding groups from it. Launched so, without mpirun to end the job when a rank
 * dies, every rank also keeps a connection to rank 0 (liveness.h), by which a wait around file I/O
 * learns at once that a peer has ended instead of waiting out --io-timeout. A build without NCCL gets the
 * placeholders at the bottom.
 */
#pragma once

#include <ctype.h>  // isalnum

#include "../common.h"   // fatal, check_internal, wall_seconds, fopen_check, fwrite_check, realloc_check
#include "../device.h"   // cudaCheck, main_stream, device_malloc, copy_to_device, copy_to_host
#include "watchdog.h"    // watchdog_start, watchdog_stop, watchdog_communicating
#include "liveness.h"    // liveness_*: every rank's connection to rank 0, launched without mpirun
#include "mpi_engine.h"  // mpi_broadcast_bytes: the NCCL id to every rank under mpirun
#include "rendezvous.h"  // rendezvous_from_env, launch_identity: the NCCL id without mpirun
#include "types.h"       // Comm, Group, CommOp, DType, ReduceOp, HAVE_NCCL, COMM_HOST_MAX, comm_deadline_s

#ifdef HAVE_NCCL

static void nccl_check(ncclResult_t r, const char* file, int line) {
    if (r != ncclSuccess) fatal("NCCL error at %s:%d: %s", file, line, ncclGetErrorString(r));
}
#define ncclCheck(r) nccl_check((r), __FILE__, __LINE__)
static ncclDataType_t nccl_type(DType t) {
#if defined(ENABLE_BF16)
    if (t == DT_FLOATX) return ncclBfloat16;
#elif defined(ENABLE_FP16)
    if (t == DT_FLOATX) return ncclHalf;
#endif
    return ncclFloat;
}
static ncclRedOp_t nccl_op(ReduceOp op) { return op == REDUCE_MAX ? ncclMax : op == REDUCE_AVG ? ncclAvg : ncclSum; }

// every communicator this rank holds: the world and the groups split from it, each with its own error
// state (aborting the world does not abort its children)
static int nccl_comms(Comm* c, ncclComm_t* out) {
    int n = 0;
    Group* groups[5] = {&c->dp_group, &c->tp_group, &c->pp_group, &c->emb_group, &c->world};  // children first
    for (int i = 0; i < 5; i++)
        if (groups[i]->nccl != NULL) out[n++] = groups[i]->nccl;
    return n;
}

static void nccl_abort_all(Comm* c) {
    ncclComm_t comms[5];
    int n = nccl_comms(c, comms);
    for (int i = 0; i < n; i++) ncclCommAbort(comms[i]);
    c->world.nccl = c->dp_group.nccl = c->tp_group.nccl = c->pp_group.nccl = c->emb_group.nccl = NULL;
}

// The watchdog's abort (llmc/comm/watchdog.h), from its thread: the main thread is held inside a CUDA call
// and never reads the communicators again
static void nccl_watchdog_abort(void* c) { nccl_abort_all((Comm*)c); }

// One look at every communicator: an asynchronous error (a peer that died, a network failure) or the
// deadline passed since `start` ends the run (all communicators aborted first, so no NCCL kernel keeps
// the GPU). Returns 1 while a non-blocking NCCL call (creation, split, an enqueue) is still in progress.
static int nccl_watch(Comm* c, const char* what, double start) {
    ncclComm_t comms[5];
    int n = nccl_comms(c, comms), in_progress = 0;
    for (int i = 0; i < n; i++) {
        ncclResult_t e;
        ncclResult_t r = ncclCommGetAsyncError(comms[i], &e);
        if (r == ncclSuccess && e == ncclInProgress) in_progress = 1;
        else if (r != ncclSuccess || e != ncclSuccess) {
            nccl_abort_all(c);
            fatal("rank %d: NCCL failed while waiting for %s: %s", c->world_rank, what,
                  ncclGetErrorString(r != ncclSuccess ? r : e));
        }
    }
    // Around file I/O the deadline is long (--io-timeout): a peer whose process ended is noticed through
    // its connection (launches without mpirun; under mpirun, mpirun ends the job). Only there: at the
    // end of a run rank 0 may leave while a peer still polls its last collective, and what is no error.
    int gone = c->waiting_io ? liveness_lost() : -1;
    if (gone >= 0) {
        nccl_abort_all(c);
        fatal("rank %d: rank %d has ended (its connection closed) while this rank waited for %s around file I/O",
              c->world_rank, gone, what);
    }
    double limit = comm_deadline_s(c);
    if (limit > 0 && wall_seconds() - start > limit) {
        nccl_abort_all(c);
        fatal("rank %d: %s did not complete within %.0f s (%s): a peer rank is stopped, hung or gone", c->world_rank,
              what, limit, comm_deadline_flag(c));
    }
    return in_progress;
}

// until every non-blocking NCCL call on this rank's communicators has finished (or the deadline)
static void nccl_settle(Comm* c, const char* what) {
    double start = wall_seconds();
    while (nccl_watch(c, what, start)) usleep(100);
}

// A call on a non-blocking communicator may return ncclInProgress: it finishes in the background, and
// the communicator takes the next call only after that
static void nccl_call(Comm* c, ncclResult_t r, const char* what, const char* file, int line) {
    if (r == ncclInProgress) nccl_settle(c, what);
    else nccl_check(r, file, line);
}
#define ncclCall(c, call, what) nccl_call((c), (call), (what), __FILE__, __LINE__)

// While counting (CommStats): an event on the communication stream before and after each operation
static void nccl_time_mark(Comm* c, cudaStream_t stream) {
    if (c->timed == c->timing_cap) {
        int cap = c->timing_cap ? 2 * c->timing_cap : 64;
        c->timing = (cudaEvent_t*)realloc_check(c->timing, cap * sizeof(cudaEvent_t));
        for (int i = c->timing_cap; i < cap; i++) cudaCheck(cudaEventCreate(&c->timing[i]));
        c->timing_cap = cap;
    }
    cudaCheck(cudaEventRecord(c->timing[c->timed++], stream));
}

// every stream is idle: add up the time between each pair of marks
static void nccl_collect_times(Comm* c) {
    for (int i = 0; i + 1 < c->timed; i += 2) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, c->timing[i], c->timing[i + 1]));
        c->stats.seconds += 1e-3 * ms;
    }
    c->timed = 0;
}

// every group of this rank, for the streams (children first, as nccl_comms)
static int nccl_groups(Comm* c, Group** out) {
    Group* groups[5] = {&c->dp_group, &c->tp_group, &c->pp_group, &c->emb_group, &c->world};
    for (int i = 0; i < 5; i++) out[i] = groups[i];
    return 5;
}

// Waits for the communication streams of `groups`, watching every communicator for errors and the
// deadline: a collective that never completes must end the run, not hang it.
static void nccl_wait_streams(Comm* c, Group** groups, int n) {
    double start = wall_seconds();
    for (int i = 0; i < n;) {
        int busy = nccl_watch(c, "communication (a collective, send or receive)", start);
        cudaError_t q = cudaStreamQuery(groups[i]->stream);
        if (q == cudaSuccess && !busy) {
            i++;  // this stream is done: on to the next
            continue;
        }
        if (q != cudaSuccess && q != cudaErrorNotReady) cudaCheck(q);
        usleep(100);
    }
}

static void nccl_wait(Comm* c) {
    Group* groups[5];
    nccl_wait_streams(c, groups, nccl_groups(c, groups));
    watchdog_communicating(0);  // nothing outstanding: a long blocking call now is no peer's doing
    nccl_collect_times(c);  // (only when every stream is idle)
}

static void nccl_wait_group(Comm* c, Group* g) { nccl_wait_streams(c, &g, 1); }

// the main stream's later work waits for group g's operations queued so far; the host goes on at once (on a
// GPU: the emulation carries the operations out here, hence the watchdog, as zero2_layer_begins's wait)
static void nccl_main_waits(Comm* c, Group* g) {
    cudaCheck(cudaEventRecord(c->event, g->stream));
    cudaCheckBlocking("the main stream's wait for a collective", cudaStreamWaitEvent(main_stream, c->event, 0));
}

// ----------------------------------------------------------------------------------------------------
// operations

// queue NCCL work of group g after what the main stream has queued so far
static void comm_stream_follow_main(Comm* c, Group* g) {
    cudaCheck(cudaEventRecord(c->event, main_stream));
    cudaCheck(cudaStreamWaitEvent(g->stream, c->event, 0));
}

static void nccl_enqueue(Comm* c, const CommOp* q) {
    ncclComm_t g = q->g->nccl;
    cudaStream_t stream = q->g->stream;
    ncclDataType_t t = nccl_type(q->t);
    const char* what = "queueing communication";
    switch (q->kind) {
        case OP_ALL_REDUCE:
            ncclCall(c, ncclAllReduce(q->recv, q->recv, q->n, t, nccl_op(q->op), g, stream), what);
            break;
        case OP_REDUCE_SCATTER:
            ncclCall(c, ncclReduceScatter(q->send, q->recv, q->n, t, ncclSum, g, stream), what);
            break;
        case OP_ALL_GATHER:  // this rank's part is already in place
            ncclCall(c,
                     ncclAllGather((char*)q->recv + q->g->rank * q->n * dtype_size(q->t), q->recv, q->n, t, g, stream),
                     what);
            break;
        case OP_SEND:
            ncclCall(c, ncclSend(q->send, q->n, t, q->peer, g, stream), what);
            break;
        case OP_RECV:
            ncclCall(c, ncclRecv(q->recv, q->n, t, q->recv_peer, g, stream), what);
            break;
        case OP_SENDRECV:  // one group, so neither side blocks in its send
            ncclCheck(ncclGroupStart());
            ncclCheck(ncclSend(q->send, q->n, t, q->peer, g, stream));
            ncclCheck(ncclRecv(q->recv, q->n, t, q->recv_peer, g, stream));
            ncclCall(c, ncclGroupEnd(), what);
            break;
    }
}

static void nccl_run(Comm* c, const CommOp* q) {
    watchdog_communicating(1);
    comm_stream_follow_main(c, q->g);
    int timed = c->stats.on;
    if (timed) nccl_time_mark(c, q->g->stream);
    nccl_enqueue(c, q);
    if (timed) {
        nccl_time_mark(c, q->g->stream);
        c->stats.bytes += comm_op_bytes(q);
        c->stats.ops++;
    }
}

// host scalars through a small device buffer, after everything posted before (every stream is waited for)
static void nccl_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    static double* dev = NULL;
    if (dev == NULL) dev = (double*)device_malloc(COMM_HOST_MAX * sizeof(double));
    check_internal(n <= COMM_HOST_MAX, "too many host scalars");
    copy_to_device(dev, values, n * sizeof(double));
    comm_stream_follow_main(c, g);
    watchdog_communicating(1);
    ncclCall(c, ncclAllReduce(dev, dev, n, ncclDouble, nccl_op(op), g->nccl, g->stream), "queueing communication");
    nccl_wait(c);
    copy_to_host(values, dev, n * sizeof(double));
}

// ----------------------------------------------------------------------------------------------------
// start-up and shutdown

// torchrun/Slurm-style launch without MPI: rank 0 writes the NCCL id into a file of the shared folder,
// the others poll for it. The file's name carries the launch's identity where the launcher gives one
// (torchrun's run id and restart count, Slurm's job and step), its content the world size and the time it
// was written: a file left by an earlier run or attempt (a crash skips the removal at the end) is never
// taken for this one's. (A restart comes within seconds, well inside the time check: only the name
// tells the attempts apart.)
typedef struct {
    uint32_t magic;  // NCCL_ID_MAGIC
    int world_size;
    double written;  // seconds since the epoch (the clocks of the nodes agree to well under a minute)
    ncclUniqueId id;
    char host[256];     // where the others reach rank 0: its host name, then its addresses (liveness_addresses)
    int32_t live_port;
} NcclIdFile;
#define NCCL_ID_MAGIC 0x4e43434cu
static char nccl_id_path[4300];  // rank 0 removes the file at the end

static void nccl_id_file_name(const char* dir) {
    char tag[200];
    launch_identity(tag, sizeof(tag));  // (rendezvous.h)
    for (char* t = tag; *t; t++)  // a file name, whatever the launcher's id holds
        if (!isalnum((unsigned char)*t) && *t != '.' && *t != '-') *t = '_';
    snprintf(nccl_id_path, sizeof(nccl_id_path), "%s/nccl_id%s%s", dir, tag[0] ? "_" : "", tag);
}

static ncclUniqueId nccl_id_through_file(Comm* c, const char* dir, int live_port, char* host, size_t host_n,
                                         int* port) {
    NcclIdFile rec;
    nccl_id_file_name(dir);
    const char* path = nccl_id_path;
    double entered = (double)time(NULL);
    if (c->world_rank == 0) {
        char tmp[4400];
        memset(&rec, 0, sizeof(rec));
        rec.magic = NCCL_ID_MAGIC;
        rec.world_size = c->world_size;
        rec.written = entered;
        rec.live_port = live_port;
        liveness_addresses(rec.host, sizeof(rec.host));
        ncclCheck(ncclGetUniqueId(&rec.id));
        snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());  // written whole, then renamed: never half-read
        FILE* f = fopen_check(tmp, "wb");
        fwrite_check(&rec, sizeof(rec), 1, f, tmp);
        if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0)
            fatal("cannot write '%s': %s", tmp, strerror(errno));
        if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        return rec.id;
    }
    // a file written before this rank started, by more than the launch skew the deadline allows, is stale
    double skew = c->timeout_s > 0 ? c->timeout_s : 600.0, start = wall_seconds();
    for (;;) {
        FILE* f = fopen(path, "rb");
        int got = f && fread(&rec, sizeof(rec), 1, f) == 1;
        if (f) fclose(f);
        if (got && rec.magic == NCCL_ID_MAGIC && rec.world_size == c->world_size && rec.written >= entered - skew) {
            rec.host[sizeof(rec.host) - 1] = 0;
            snprintf(host, host_n, "%s", rec.host);
            *port = rec.live_port;
            return rec.id;
        }
        if (c->timeout_s > 0 && wall_seconds() - start > c->timeout_s)
            fatal("rank %d: no NCCL id of this run appeared in '%s' within %.0f s (--comm-timeout; is rank 0 running? "
                  "is the folder shared?%s)", c->world_rank, path, c->timeout_s,
                  got ? " the file there is from an earlier run or another world size" : "");
        usleep(100000);
    }
}

// NCCL's unique id, drawn by rank 0 and shared with every rank. Without mpirun, rank 0's liveness port
// travels with it: *host, *port say where the other ranks connect (liveness.h; *port 0: under mpirun).
static ncclUniqueId nccl_unique_id(Comm* c, int use_mpi, const char* nccl_id_dir, char* host, size_t host_n,
                                   int* live_port) {
    ncclUniqueId id;
    if (use_mpi) {
        if (c->world_rank == 0) ncclCheck(ncclGetUniqueId(&id));
        mpi_broadcast_bytes(c, &id, sizeof(id));
        return id;
    }
    if (nccl_id_dir == NULL && (!getenv("MASTER_ADDR") || !getenv("MASTER_PORT")))
        fatal("launching without mpirun needs MASTER_ADDR and MASTER_PORT, or --nccl-id-dir (a shared folder)");
    char err[1024];
    int port = c->world_rank == 0 ? liveness_listen(err, sizeof(err)) : 0;
    if (port < 0) fatal("%s", err);
    if (nccl_id_dir == NULL) {  // torchrun's way: over TCP, to MASTER_ADDR
        struct { ncclUniqueId id; int32_t live_port; } blob;
        memset(&blob, 0, sizeof(blob));
        if (c->world_rank == 0) {
            ncclCheck(ncclGetUniqueId(&blob.id));
            blob.live_port = port;
        }
        if (rendezvous_from_env(c->world_rank, c->world_size, &blob, sizeof(blob), c->timeout_s, err, sizeof(err)) != 0)
            fatal("%s", err);
        id = blob.id;
        port = blob.live_port;
        snprintf(host, host_n, "%s", getenv("MASTER_ADDR"));
    } else {
        id = nccl_id_through_file(c, nccl_id_dir, port, host, host_n, &port);
    }
    *live_port = port;
    return id;
}

// the 16-byte UUID of this rank's GPU, by which ranks find out whether they share one
static void gpu_uuid(char out[16]) {
    int dev;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    memcpy(out, prop.uuid.bytes, 16);
}

// The world's communicator, the groups split from it, their streams and the event. Non-blocking
// communicators: creation and splitting return at once, and are polled against the deadline (a peer that
// never joins would otherwise block here forever).
static void nccl_start(Comm* c, int use_mpi, const char* nccl_id_dir) {
    char host[256] = "", err[1024];
    int live_port = 0;
    ncclUniqueId id = nccl_unique_id(c, use_mpi, nccl_id_dir, host, sizeof(host), &live_port);
    int in_emb = group_valid(&c->emb_group);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclCall(c, ncclCommInitRankConfig(&c->world.nccl, c->world_size, id, c->world_rank, &config),
             "creating the NCCL communicator");
    nccl_settle(c, "creating the NCCL communicator (every rank must join)");
    if (live_port > 0) {  // (every rank has joined: a rank that never came was named just above)
        int r = c->world_rank == 0 ? liveness_accept(c->world_size, c->timeout_s, err, sizeof(err))
                                   : liveness_connect(host, live_port, c->world_rank, c->timeout_s, err, sizeof(err));
        if (r != 0) fatal("%s", err);
    }
    ncclCall(c, ncclCommSplit(c->world.nccl, c->tp_rank + c->tp * c->pp_rank, c->dp_rank, &c->dp_group.nccl, &config),
             "splitting the DP group");
    nccl_settle(c, "splitting the DP group");
    ncclCall(c, ncclCommSplit(c->world.nccl, c->dp_rank + c->dp * c->pp_rank, c->tp_rank, &c->tp_group.nccl, &config),
             "splitting the TP group");
    nccl_settle(c, "splitting the TP group");
    ncclCall(c, ncclCommSplit(c->world.nccl, c->tp_rank + c->tp * c->dp_rank, c->pp_rank, &c->pp_group.nccl, &config),
             "splitting the PP group");
    nccl_settle(c, "splitting the PP group");
    ncclCall(c, ncclCommSplit(c->world.nccl, in_emb ? c->tp_rank + c->tp * c->dp_rank : NCCL_SPLIT_NOCOLOR, c->pp_rank,
                              &c->emb_group.nccl, &config), "splitting the embedding group");
    nccl_settle(c, "splitting the embedding group");
    Group* groups[5];
    for (int i = 0, n = nccl_groups(c, groups); i < n; i++)
        cudaCheck(cudaStreamCreateWithFlags(&groups[i]->stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&c->event, cudaEventDisableTiming));
    // a host blocked inside CUDA behind communication never gets back to nccl_watch: the watchdog ends it
    watchdog_start(c->world_rank, c->timeout_s, c->io_timeout_s, nccl_watchdog_abort, c);
}

// finalize (non-blocking: polled against the deadline), then free, children before the world
static void nccl_finish(Comm* c) {
    watchdog_stop();  // (before the communicators it would abort are freed)
    nccl_wait(c);
    ncclComm_t comms[5];
    int n = nccl_comms(c, comms);
    for (int i = 0; i < n; i++) ncclCall(c, ncclCommFinalize(comms[i]), "finishing the NCCL communicators");
    nccl_settle(c, "finishing the NCCL communicators");
    c->world.nccl = c->dp_group.nccl = c->tp_group.nccl = c->pp_group.nccl = c->emb_group.nccl = NULL;
    for (int i = 0; i < n; i++) ncclCheck(ncclCommDestroy(comms[i]));
    if (c->world_rank == 0 && nccl_id_path[0]) remove(nccl_id_path);  // every rank has read it long ago
    liveness_close();  // (after the last collective: no rank waits on another any more)
    for (int i = 0; i < c->timing_cap; i++) cudaCheck(cudaEventDestroy(c->timing[i]));
    free(c->timing);
    c->timing = NULL;
    c->timing_cap = 0;
    Group* groups[5];
    for (int i = 0, m = nccl_groups(c, groups); i < m; i++) {
        cudaCheck(cudaStreamDestroy(groups[i]->stream));
        groups[i]->stream = NULL;
    }
    cudaCheck(cudaEventDestroy(c->event));
}

#else  // a build without NCCL: the engine is never ENGINE_NCCL, so none of these runs

#define NCCL_MISSING() check_internal(0, "the NCCL engine in a build without NCCL")
static void nccl_run(Comm* c, const CommOp* q) {
    (void)c; (void)q;
    NCCL_MISSING();
}
static void nccl_wait(Comm* c) {
    (void)c;
    NCCL_MISSING();
}
static void nccl_wait_group(Comm* c, Group* g) {
    (void)c; (void)g;
    NCCL_MISSING();
}
static void nccl_main_waits(Comm* c, Group* g) {
    (void)c; (void)g;
    NCCL_MISSING();
}
static void nccl_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    (void)c; (void)g; (void)values; (void)n; (void)op;
    NCCL_MISSING();
}
static void gpu_uuid(char out[16]) { memset(out, 0, 16); }
static void nccl_start(Comm* c, int use_mpi, const char* nccl_id_dir) {
    (void)c; (void)use_mpi; (void)nccl_id_dir;
    NCCL_MISSING();
}
static void nccl_finish(Comm* c) {
    (void)c;
    NCCL_MISSING();
}

#endif
