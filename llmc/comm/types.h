/*
 * comm/types.h: what the communication engines share: the handles each engine keeps per group, the
 * operations' element types and reductions, a process group (Group), one operation as an engine receives
 * it (CommOp), and the state of the run's communication (Comm: this rank's place on the dp x tp x pp grid,
 * its groups, the engine, deadlines, strict mode's queue, the MPI engine's host copies, the counters).
 *
 * The engines (mpi_engine.h, nccl_engine.h), the start-up (launch.h) and llmc/comm.h, the API the model
 * calls, include this header; it includes no engine, so the includes run one way:
 *     types.h  <-  mpi_engine.h (+ staging.h)  <-  nccl_engine.h (+ rendezvous.h, liveness.h)  <-  launch.h  <-  comm.h
 * (llmc/comm.h's comment describes the engines and the launch.)
 */
#pragma once

#include "../device.h"  // floatX, HostScratch (common.h), cudaStream_t and cudaEvent_t on the GPU target

// The engines this build has. MPI: wherever Open MPI was found (the Makefile defines USE_MPI). NCCL: on
// the GPU target unless built with -DNO_NCCL (the Makefile does that when nccl.h is missing); without
// it, ranks communicate through the MPI engine. A build without an engine keeps its handles as
// placeholders, so the types below look the same in every build.
#ifdef USE_MPI
#include <mpi.h>  // MPI_Comm
typedef MPI_Comm MpiHandle;
#else
typedef int MpiHandle;
#endif
#if !defined(LLMC_CPU) && !defined(NO_NCCL)
#define HAVE_NCCL 1
#define NCCL_BUILT 1
#include <nccl.h>  // ncclComm_t
typedef ncclComm_t NcclHandle;
typedef cudaStream_t NcclStream;
#else
#define NCCL_BUILT 0
typedef void* NcclHandle;
typedef void* NcclStream;
#endif

typedef enum { REDUCE_SUM, REDUCE_AVG, REDUCE_MAX } ReduceOp;
// the most scalars one comm_all_reduce_host takes (the NCCL engine reduces them in a device buffer of
// this size; the largest user is the start-up agreement, llmc/run/agreement.h: 2 per item)
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
typedef enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_SEND, OP_RECV, OP_SENDRECV } OpKind;
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
    size_t stage_bytes;        // MPI engine: piece size through pinned host buffers (LLMC_MPI_STAGE_BYTES; 0: not
                               // cut: the buffers directly on the CPU target, whole host copies on the GPU)
    struct Staging* staging;   // its pinned host buffers and copy streams (staging.h)
    HostScratch host_copy[2];  // MPI engine on the GPU, not cut into pieces: the operation's host copies
                               // (mpi_run_host_copy)
    CommStats stats;
    int kernels_wait;  // --fused-kernels on the GPU: what only kernels read next, only the main stream waits for
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
