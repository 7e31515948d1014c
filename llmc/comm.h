/*
 * comm.h: ranks, process groups and collectives: one interface over two engines.
 *
 * The world of W ranks is a grid dp x tp x pp. Rank order: tp varies fastest, then dp, then pp, so
 *     world_rank = tp_rank + tp * (dp_rank + dp * pp_rank)
 * and a tensor-parallel group (consecutive ranks) sits inside one node. A process group is the set of
 * ranks that differ in one coordinate only: the DP group of a rank is every rank with its tp_rank and
 * pp_rank, and so on.
 *
 * One small API: all_reduce (sum, avg, max), reduce_scatter (sum), all_gather, broadcast, send, recv,
 * barrier, over buffers in device memory (host memory on the CPU target), of type floatX or float.
 * Every operation is described by one CommOp and handed to the engine of the run:
 *   NCCL  (comm_nccl.h) GPU buffers, one GPU per rank, the production path. Every group has its own
 *         communication stream; an operation is queued on its group's stream after the work already
 *         queued on the main stream, so it overlaps what the main stream does next. comm_join() waits
 *         for every group's operations, comm_join_group() for one group's only: a tensor-parallel
 *         all-reduce is joined without waiting for the data-parallel buckets queued before it.
 *   MPI   (comm_mpi.h) the CPU target, and the GPU target when ranks share a GPU (NCCL refuses that):
 *         on the GPU, each buffer is copied whole to host memory as float and back (mpi_run_host_copy),
 *         or with LLMC_MPI_STAGE_BYTES through pinned host slots in chunks (comm_staging.h), sums in
 *         float, everything else as bytes. Calls complete before they return.
 * Launch (comm_launch.h): mpirun (Open MPI); or, for the GPU target, without MPI through RANK /
 * WORLD_SIZE / LOCAL_RANK (torchrun) or, in a task of srun, SLURM_PROCID / SLURM_STEP_NUM_TASKS /
 * SLURM_LOCALID, with the NCCL id passed through a file in a shared folder (--nccl-id-dir) or over TCP
 * at MASTER_ADDR:MASTER_PORT (llmc/rendezvous.h). Under mpirun the engine is chosen from the GPUs'
 * UUIDs within each node and agreed by all ranks. On the CPU target each rank defaults to cores / local
 * ranks OpenMP threads.
 *
 * Strict mode (LLMC_COMM_STRICT=1, for tests): the MPI engine honours NCCL's buffer contract to the
 * letter. A send or collective is only queued when it is called; comm_join() (or a blocking host
 * collective) runs the queue in order, comm_join_group() the group's operations in it (the others stay
 * queued, as they stay in flight on NCCL's other streams). So a send reads its buffer at the join, not
 * when it was posted, and a receiver sees its data only after the join: a buffer written while it still
 * belongs to the communication (fine under blocking MPI, a silent race under NCCL) gives wrong results
 * in the tests.
 *
 * Failure: any error on any rank goes through fatal(), which under MPI calls MPI_Abort so mpirun ends
 * every rank; a rank that dies is noticed by mpirun, which ends the others. A rank that neither dies nor
 * answers (stopped, hung) makes no error anywhere, so every wait on other ranks has a deadline
 * (--comm-timeout; waits around file I/O --io-timeout): the MPI engine polls non-blocking MPI calls, the
 * NCCL engine polls the streams and every communicator's asynchronous error state (creation and
 * splitting are non-blocking too), and a wait past its deadline ends the run with one line naming it.
 * A host held inside a CUDA call behind NCCL's communication polls nothing: the NCCL engine's watchdog
 * thread ends it (llmc/watchdog.h).
 */
#pragma once

#include "device.h"

// The engines this build has. MPI: wherever Open MPI was found (the Makefile defines USE_MPI). NCCL: on
// the GPU target unless built with -DNO_NCCL (the Makefile does that when nccl.h is missing); without
// it, ranks communicate through the MPI engine. A build without an engine keeps its handles as
// placeholders, so the types below look the same in every build.
#ifdef USE_MPI
#include <mpi.h>
typedef MPI_Comm MpiHandle;
#else
typedef int MpiHandle;
#endif
#if !defined(LLMC_CPU) && !defined(NO_NCCL)
#define HAVE_NCCL 1
#define NCCL_BUILT 1
#include <nccl.h>
typedef ncclComm_t NcclHandle;
typedef cudaStream_t NcclStream;
#else
#define NCCL_BUILT 0
typedef void* NcclHandle;
typedef void* NcclStream;
#endif

typedef enum { REDUCE_SUM, REDUCE_AVG, REDUCE_MAX } ReduceOp;
// the most scalars one comm_all_reduce_host takes (the NCCL engine reduces them in a device buffer of
// this size; the largest user is the start-up agreement, llmc/agreement.h: 2 per item)
#define COMM_HOST_MAX 128
typedef enum { DT_FLOATX, DT_FLOAT } DType;
typedef enum { ENGINE_NONE, ENGINE_MPI, ENGINE_NCCL } Engine;

typedef struct {
    int rank, size;    // this rank's index in the group, and the group's size
    const char* name;  // for messages: "world", "DP", "TP", "PP", "embedding"
    MpiHandle mpi;     // the group's communicator in each engine
    NcclHandle nccl;
    NcclStream stream;  // NCCL: where the group's operations run, in order
} Group;

// One operation of the API, as an engine receives it (and as strict mode queues it until the join)
typedef enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SEND, OP_RECV, OP_SENDRECV } OpKind;
typedef struct {
    OpKind kind;
    Group* g;
    const void* send;  // what the operation reads (for collectives in place, the same as recv)
    void* recv;        // what it writes
    size_t n;          // elements (all_gather, reduce_scatter: per rank)
    DType t;
    ReduceOp op;
    int peer, recv_peer;  // send/recv: the peer; sendrecv: send_peer, recv_peer; broadcast: the root
} CommOp;

// What the engine moved while counting (--trace: the traced steps): the bytes of the operations'
// buffers (all-reduce, broadcast, send, receive: n elements; reduce-scatter, all-gather: n per rank, the
// whole buffer) and the time they took (MPI: inside the calls; NCCL: on the stream, timed by events)
typedef struct {
    int on;
    double bytes, seconds;
    long ops;
} CommStats;

typedef struct {
    int world_rank, world_size, local_rank, local_size;  // local: the ranks on this node
    int dp, tp, pp;                 // grid dimensions
    int dp_rank, tp_rank, pp_rank;  // this rank's coordinates
    Engine engine;                  // ENGINE_NONE when world_size == 1
    int mpi_initialized;
    Group world, dp_group, tp_group, pp_group;
    Group emb_group;  // the first and last pipeline stage of one (dp, tp) position: they share the tied wte
    double timeout_s;     // --comm-timeout: the longest a wait on other ranks may take (0: no limit)
    double io_timeout_s;  // --io-timeout: the same, for waits while a rank reads or writes files
    int waiting_io;       // the current wait is one around file I/O (comm_barrier_io)
    int strict;       // MPI engine: run sends and collectives at the join (LLMC_COMM_STRICT=1)
    CommOp* queue;    // strict mode: the operations posted since the last join, in order
    int queued, queue_cap;
    size_t stage_bytes;        // MPI engine: chunk size through pinned host slots (LLMC_MPI_STAGE_BYTES; 0: not
                               // chunked: the buffers directly on the CPU target, whole host copies on the GPU)
    struct Staging* staging;   // its pinned slots and copy streams (comm_staging.h)
    HostScratch host_copy[2];  // MPI engine on the GPU, not chunked: the operation's host copies (mpi_run_host_copy)
    CommStats stats;
#ifdef HAVE_NCCL
    cudaEvent_t event;    // orders an operation after the main stream's work
    cudaEvent_t* timing;  // while counting: a start and an end event around each operation since the last join
    int timed, timing_cap;
#endif
} Comm;

static Comm* g_comm = NULL;  // for fatal(): abort every rank

static size_t dtype_size(DType t) { return t == DT_FLOATX ? sizeof(floatX) : sizeof(float); }

// the bytes an operation counts for (see CommStats)
static double comm_op_bytes(const CommOp* q) {
    int whole = q->kind == OP_REDUCE_SCATTER || q->kind == OP_ALL_GATHER;
    return (double)q->n * dtype_size(q->t) * (whole ? q->g->size : 1);
}

// an invalid group (this rank is not a member), for emb_group on the middle pipeline stages
static int group_valid(const Group* g) { return g->size > 0; }

// the deadline of the wait in progress: --io-timeout around file I/O, --comm-timeout otherwise (0: none)
static double comm_deadline_s(const Comm* c) { return c->waiting_io ? c->io_timeout_s : c->timeout_s; }
static const char* comm_deadline_flag(const Comm* c) { return c->waiting_io ? "--io-timeout" : "--comm-timeout"; }

// the engines (they see the types above), then start-up and shutdown: comm_init, comm_finalize
#include "comm_mpi.h"
#include "comm_nccl.h"
#include "comm_launch.h"

// ----------------------------------------------------------------------------------------------------
// the API: every call describes its operation and hands it to the engine

static void comm_post(Comm* c, CommOp op) {
    if (c->engine == ENGINE_NCCL) nccl_run(c, &op);
    else mpi_post(c, op);
}

// Waits until all communication queued so far is done, so that work queued next on the main stream
// sees its results (the MPI engine's calls complete before returning, except in strict mode). The host
// polls the communication stream with a timeout rather than blocking in CUDA, so a collective that never
// completes (a dead peer) ends the run with an error instead of a hang. The main stream's kernels are
// already queued, so the GPU keeps overlapping them with the communication while the host waits.
static void comm_join(Comm* c) {
    if (c->engine == ENGINE_NCCL) nccl_wait(c);
    mpi_flush(c);
}

// The same for the operations of one group: what the next operation needs (a tensor-parallel sum),
// while the other groups' operations (data-parallel buckets, pipeline sends) stay in flight.
static void comm_join_group(Comm* c, Group* g) {
    if (c->engine == ENGINE_NCCL) nccl_wait_group(c, g);
    mpi_flush_group(c, g);
}

static void comm_all_reduce(Comm* c, Group* g, void* buf, size_t n, DType t, ReduceOp op) {
    if (g->size <= 1) return;
    comm_post(c, (CommOp){.kind = OP_ALL_REDUCE, .g = g, .send = buf, .recv = buf, .n = n, .t = t, .op = op,
                          .peer = -1, .recv_peer = -1});
}

// recv (count) on rank r = sum over ranks of send[r*count .. (r+1)*count); recv may be send + r*count
static void comm_reduce_scatter(Comm* c, Group* g, const void* send, void* recv, size_t count, DType t) {
    if (g->size == 1) {
        if (recv != send) device_copy(recv, send, count * dtype_size(t));  // (recv is send itself or outside it)
        return;
    }
    comm_post(c, (CommOp){.kind = OP_REDUCE_SCATTER, .g = g, .send = send, .recv = recv, .n = count, .t = t, .op = REDUCE_SUM,
                          .peer = -1, .recv_peer = -1});
}

// buf holds count elements per rank; each rank's own part (at rank*count) is gathered into everyone's buf
static void comm_all_gather(Comm* c, Group* g, void* buf, size_t count, DType t) {
    if (g->size == 1) return;
    comm_post(c, (CommOp){.kind = OP_ALL_GATHER, .g = g, .send = buf, .recv = buf, .n = count, .t = t, .op = REDUCE_SUM,
                          .peer = -1, .recv_peer = -1});
}

static void comm_broadcast(Comm* c, Group* g, void* buf, size_t n, DType t, int root) {
    if (g->size == 1) return;
    comm_post(c, (CommOp){.kind = OP_BROADCAST, .g = g, .send = buf, .recv = buf, .n = n, .t = t, .op = REDUCE_SUM,
                          .peer = root, .recv_peer = -1});
}

static void comm_send(Comm* c, Group* g, const void* buf, size_t n, DType t, int peer) {
    comm_post(c, (CommOp){.kind = OP_SEND, .g = g, .send = buf, .recv = NULL, .n = n, .t = t, .op = REDUCE_SUM,
                          .peer = peer, .recv_peer = -1});
}

static void comm_recv(Comm* c, Group* g, void* buf, size_t n, DType t, int peer) {
    comm_post(c, (CommOp){.kind = OP_RECV, .g = g, .send = NULL, .recv = buf, .n = n, .t = t, .op = REDUCE_SUM,
                          .peer = -1, .recv_peer = peer});
}

// Sends sendbuf to send_peer while receiving recvbuf from recv_peer (both n elements, ranks in group g).
// Pairing the two is what keeps a pipeline's neighbours from both blocking in a send to each other.
static void comm_sendrecv(Comm* c, Group* g, const void* sendbuf, int send_peer, void* recvbuf, int recv_peer, size_t n, DType t) {
    comm_post(c, (CommOp){.kind = OP_SENDRECV, .g = g, .send = sendbuf, .recv = recvbuf, .n = n, .t = t, .op = REDUCE_SUM,
                          .peer = send_peer, .recv_peer = recv_peer});
}

// Host scalars (losses, squared norms, flags), reduced across the group; blocking on both engines, and
// after everything posted before it (as on the NCCL stream).
static void comm_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    if (g->size <= 1) return;
    if (c->engine == ENGINE_NCCL) nccl_all_reduce_host(c, g, values, n, op);
    else mpi_all_reduce_host(c, g, values, n, op);
}

static void comm_barrier(Comm* c, Group* g) {
    double x = 0.0;
    comm_all_reduce_host(c, g, &x, 1, REDUCE_SUM);
}

// A barrier where ranks wait for one another's file I/O (a checkpoint being written, a model being
// read): under the long --io-timeout, since writing gigabytes to network storage is no dead peer.
static void comm_barrier_io(Comm* c, Group* g) {
    c->waiting_io = 1;
    watchdog_waiting_io(1);  // (the NCCL engine's watchdog, llmc/watchdog.h, runs on another thread)
    comm_barrier(c, g);
    watchdog_waiting_io(0);
    c->waiting_io = 0;
}

// The engine's rate over what it counted (CommStats), every rank's bytes over every rank's time: one
// line from rank 0. Collective over the world.
static void comm_print_stats(Comm* c) {
    double v[3] = {c->stats.bytes, c->stats.seconds, (double)c->stats.ops};
    comm_all_reduce_host(c, &c->world, v, 3, REDUCE_SUM);
    if (c->world_rank != 0 || c->engine == ENGINE_NONE) return;
    printf("communication, %s engine: %.0f operations, %.1f MB in %.3f s per rank: %.3g GB/s\n", c->engine == ENGINE_NCCL ? "NCCL" : "MPI",
           v[2] / c->world_size, v[0] / c->world_size / 1e6, v[1] / c->world_size, v[1] > 0 ? v[0] / v[1] / 1e9 : 0.0);
}
