/*
 * comm/mpi_engine.h: the MPI engine of llmc/comm.h, and the MPI side of the launch.
 *
 * The engine of the CPU target, and of the GPU target when ranks share a GPU (NCCL refuses two ranks on
 * one GPU): every operation runs on host memory, through MPI's non-blocking calls polled against the
 * deadline (mpi_wait). On the CPU target the buffers are host memory already (mpi_run_direct); on the
 * GPU target each operation's buffer is copied whole to host memory and back (mpi_run_host_copy), or, with
 * LLMC_MPI_STAGE_BYTES set, staged through pinned host buffers in pieces, the copies of one piece
 * overlapping the transfer of another (mpi_run_staged, staging.h; byte for byte the whole-buffer copies'
 * results on an H200). An operation completes before its call returns, except in strict mode, where
 * mpi_post queues it and the join (mpi_flush) runs the queue in order. Each operation's bytes and time are
 * counted while c->stats.on (comm_print_stats).
 *
 * Also here: MPI's part of the start-up (MPI_Init, the node-local ranks, the choice of the engine, the
 * group communicators) and of the shutdown. A build without MPI gets the placeholders at the bottom.
 */
#pragma once

#include <limits.h>  // INT_MAX
#include <math.h>    // ceil
#include <signal.h>  // sigaction, alarm: MPI_Init's deadline
#include <unistd.h>  // usleep, write, _exit

#include "../common.h"  // fatal, fatal_hook, wall_seconds, malloc_check, realloc_check, host_scratch
#include "../device.h"  // download_floats, upload_floats, copy_to_host, copy_to_device
#include "staging.h"    // Staging, StagePlan, stage_*: the pieces through pinned host buffers
#include "types.h"      // Comm, Group, CommOp, ReduceOp, dtype_size, comm_deadline_s, g_comm

#ifdef USE_MPI

static void mpi_check(int err, const char* file, int line) {
    if (err != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(err, msg, &len);
        fatal("MPI error at %s:%d: %s", file, line, msg);
    }
}
#define mpiCheck(err) mpi_check((err), __FILE__, __LINE__)
static MPI_Op mpi_op(ReduceOp op) { return op == REDUCE_MAX ? MPI_MAX : MPI_SUM; }

// The MPI engine's watchdog: every MPI call is non-blocking, and its requests are polled here against
// the deadline. A peer that is stopped (SIGSTOP), hung or on another path makes no MPI error at all, so
// without a deadline the job would wait forever; after it, this rank ends the job with one line.
#define mpiWait(c, reqs, n, what, g) mpi_wait((c), (reqs), (n), (what), (g), __FILE__, __LINE__)
static void mpi_wait(const Comm* c, MPI_Request* reqs, int n, const char* what, const Group* g, const char* file,
                     int line) {
    double start = wall_seconds(), limit = comm_deadline_s(c), last = start;
    for (long spins = 0;; spins++) {
        int done = 0;
        mpi_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), file, line);
        if (done) return;
        double now = wall_seconds();
        if (now - last > 1.0) start += now - last;  // this rank itself was stopped: that time is not the peers'
        last = now;
        if (limit > 0 && now - start > limit)
            fatal("rank %d: %s in the %s group did not complete within %.0f s (%s): a peer rank is stopped, hung "
                  "or gone", c->world_rank, what, g->name, limit, comm_deadline_flag(c));
        if (spins > 1000) usleep(50);  // after a moment of spinning, leave the core to the other ranks
    }
}

// ----------------------------------------------------------------------------------------------------
// one operation, run now (blocking)

static const char* mpi_op_names[] = {"an all-reduce", "a reduce-scatter", "an all-gather", "a send", "a receive",
                                     "a send-receive"};

// The MPI call of an operation on host memory, waited for against the deadline. data: the buffer it
// works on in place (a send's source, a receive's destination); received: a send-receive's destination.
// count elements of type (per rank for the block collectives).
static void mpi_transfer_part(Comm* c, const CommOp* q, void* data, void* received, MPI_Datatype type, int count) {
    Group* g = q->g;
    MPI_Request r[2];
    int requests = 1;
    switch (q->kind) {
        case OP_ALL_REDUCE:
            mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op(q->op), g->mpi, r));
            break;
        case OP_REDUCE_SCATTER:  // the sum of this rank's block lands at the start of data
            mpiCheck(MPI_Ireduce_scatter_block(MPI_IN_PLACE, data, count, type, MPI_SUM, g->mpi, r));
            break;
        case OP_ALL_GATHER:
            mpiCheck(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, count, type, g->mpi, r));
            break;
        case OP_SEND:
            mpiCheck(MPI_Isend(data, count, type, q->peer, 0, g->mpi, r));
            break;
        case OP_RECV:
            mpiCheck(MPI_Irecv(data, count, type, q->recv_peer, 0, g->mpi, r));
            break;
        case OP_SENDRECV:
            mpiCheck(MPI_Irecv(received, count, type, q->recv_peer, 0, g->mpi, &r[0]));
            mpiCheck(MPI_Isend(data, count, type, q->peer, 0, g->mpi, &r[1]));
            requests = 2;
            break;
    }
    mpiWait(c, r, requests, mpi_op_names[q->kind], g);
}

// MPI counts are int: an operation of more elements (a full model's gradients beyond 2^31 floats) would
// wrap to a negative or short count. Those whose elements are independent (all-reduce, the
// point-to-point kinds) run as consecutive pieces below INT_MAX, which every rank cuts alike. The block
// collectives (reduce-scatter, all-gather: count per rank, blocks side by side) are refused beyond it
// with one line; their blocks are a ZeRO shard or a TP slice, an eighth of a model or less at dp or tp 8.
static const size_t MPI_PIECE = (size_t)1 << 30;
static void mpi_transfer(Comm* c, const CommOp* q, void* data, void* received, MPI_Datatype type, size_t count) {
    int size;
    MPI_Type_size(type, &size);
    if (count > (size_t)INT_MAX && (q->kind == OP_REDUCE_SCATTER || q->kind == OP_ALL_GATHER))
        fatal("MPI %s of %zu elements per rank: beyond MPI's int count (%d); use more ranks to split it, "
              "or the NCCL engine", mpi_op_names[q->kind], count, INT_MAX);
    size_t done = 0;
    do {  // (an operation of 0 elements still runs once: every rank of the group takes part)
        size_t n = count - done < MPI_PIECE ? count - done : MPI_PIECE;
        mpi_transfer_part(c, q, (char*)data + done * size, received ? (char*)received + done * size : NULL,
                          type, (int)n);
        done += n;
    } while (done < count);
    if (q->kind == OP_ALL_REDUCE && q->op == REDUCE_AVG)
        for (size_t i = 0; i < count; i++) ((float*)data)[i] /= q->g->size;
}

// CPU target: the buffers are host memory (floatX is float), and MPI works on them directly
static void mpi_run_direct(Comm* c, const CommOp* q) {
    int from_send = q->kind == OP_SEND || q->kind == OP_SENDRECV || q->kind == OP_REDUCE_SCATTER;
    void* data = from_send ? (void*)q->send : q->recv;
    mpi_transfer(c, q, data, q->recv, MPI_FLOAT, q->n);
    if (q->kind == OP_REDUCE_SCATTER && q->recv != data) memmove(q->recv, data, q->n * sizeof(float));
}

static int mpi_is_sum(const CommOp* q) { return q->kind == OP_ALL_REDUCE || q->kind == OP_REDUCE_SCATTER; }

// What an operation downloads into the host buffers and uploads from them (staging.h)
static StagePlan mpi_stage_plan(const CommOp* q) {
    const Group* g = q->g;
    StagePlan p;
    memset(&p, 0, sizeof(p));
    p.n = q->n;
    p.elem = dtype_size(q->t);
    p.widths = 1;
    p.convert = mpi_is_sum(q) && p.elem != sizeof(float);  // sums in float; everything else moves as bytes
    p.wire = p.convert ? sizeof(float) : p.elem;
    StageSide send = {.dev = (char*)q->send, .pitch = q->n, .rows = 1, .host_row = 0};
    StageSide recv = {.dev = (char*)q->recv, .pitch = q->n, .rows = 1, .host_row = 0};
    StageSide blocks_in = {.dev = (char*)q->send, .pitch = q->n, .rows = g->size, .host_row = 0};
    StageSide blocks_out = {.dev = (char*)q->recv, .pitch = q->n, .rows = g->size, .host_row = 0};
    StageSide own_block = {.dev = (char*)q->recv + g->rank * q->n * p.elem, .pitch = q->n, .rows = 1,
                           .host_row = (size_t)g->rank};
    switch (q->kind) {
        case OP_ALL_REDUCE: p.down = recv; p.up = recv; break;
        case OP_REDUCE_SCATTER: p.down = blocks_in; p.up = recv; p.widths = g->size; break;
        case OP_ALL_GATHER: p.down = own_block; p.up = blocks_out; p.widths = g->size; break;
        case OP_SEND: p.down = send; p.widths = 2; break;  // point-to-point: 2 widths (a send-receive's both
        case OP_RECV: p.up = recv; p.widths = 2; break;    // halves), so every kind cuts the same pieces
        case OP_SENDRECV: p.down = send; p.up = recv; p.widths = 2; break;  // (its send whole: mpi_run_staged_sendrecv)
    }
    return p;
}

// The pieces of an operation through the host buffers, MPI on piece k while the copies of the pieces around
// it run (staging.h); between stage_begin and stage_end
static void mpi_stage_pieces(Comm* c, const CommOp* q, const StagePlan* p, size_t S, size_t pieces) {
    Staging* st = c->staging;
    int sum = mpi_is_sum(q);
    for (size_t k = 0; p->down.dev && k < pieces && k < STAGE_BUFFERS; k++) stage_download(st, p, S, k);
    for (size_t k = 0; k < pieces; k++) {
        int s = (int)(k % STAGE_BUFFERS);
        if (p->down.dev) stage_wait_download(st, s);
        else if (k >= STAGE_BUFFERS) stage_wait_upload(st, s);  // the host buffer's previous piece has left it
        size_t w;
        stage_piece(p, S, k, &w);
        char* host = st->host[s];
        mpi_transfer(c, q, host, host + w * p->wire, sum ? MPI_FLOAT : MPI_BYTE, sum ? w : w * p->wire);
        if (p->up.dev) stage_upload(st, p, S, k);
        if (p->down.dev && k + STAGE_BUFFERS < pieces) stage_download(st, p, S, k + STAGE_BUFFERS);
    }
}

// A send-receive's send must not wait for its receive: the peer may take the whole message and answer
// only later (GPipe: the next stage receives the last forward output with a plain receive, runs forward
// and backward, and only then sends the gradient this rank receives here). Piece by piece through one
// host buffer, piece k+1 of the send would wait for piece k of the receive: a deadlock once a piece is beyond
// MPI's eager size. So the send half goes whole into host memory and all its pieces are posted at once
// (cut as a send's are, so they match the peer's receive); the receive half runs through the host buffers.
static void mpi_run_staged_sendrecv(Comm* c, const CommOp* q, StagePlan p, size_t S, size_t pieces) {
    Staging* st = c->staging;
    char* out = staging_out(st, p.n * p.elem);
    stage_download_whole(st, out, p.down.dev, p.n * p.elem);
    MPI_Request* sends = (MPI_Request*)malloc_check((pieces > 0 ? pieces : 1) * sizeof(MPI_Request));
    for (size_t k = 0; k < pieces; k++) {
        size_t w, col0 = stage_piece(&p, S, k, &w);
        mpiCheck(MPI_Isend(out + col0 * p.elem, (int)(w * p.wire), MPI_BYTE, q->peer, 0, q->g->mpi, &sends[k]));
    }
    CommOp recv = *q;
    recv.kind = OP_RECV;
    p.down.dev = NULL;
    mpi_stage_pieces(c, &recv, &p, S, pieces);
    mpiWait(c, sends, (int)pieces, mpi_op_names[OP_SENDRECV], q->g);
    free(sends);
}

// LLMC_MPI_STAGE_BYTES set: through the pinned host buffers, piece by piece (staging.h)
static void mpi_run_staged(Comm* c, const CommOp* q) {
    StagePlan p = mpi_stage_plan(q);
    size_t S = stage_width(&p, c->stage_bytes), pieces = (p.n + S - 1) / S;
    size_t need = S * p.widths * p.wire;  // at most stage_bytes, unless one column of every row is more
    c->staging = staging_reserve(c->staging, need > c->stage_bytes ? need : c->stage_bytes);
    stage_begin(c->staging);
    if (q->kind == OP_SENDRECV) mpi_run_staged_sendrecv(c, q, p, S, pieces);
    else mpi_stage_pieces(c, q, &p, S, pieces);
    stage_end(c->staging);
}

#ifndef LLMC_CPU
// GPU target by default, the simple version of mpi_run_staged: the whole buffer copied to host memory as
// float (floatX converted), MPI on it there, the result copied back; synchronous, and what has run on a GPU
static void mpi_run_host_copy(Comm* c, const CommOp* q) {
    size_t n = q->n, blocks = q->kind == OP_REDUCE_SCATTER || q->kind == OP_ALL_GATHER ? n * q->g->size : n;
    int from_send = q->kind == OP_SEND || q->kind == OP_SENDRECV || q->kind == OP_REDUCE_SCATTER;
    float* h = host_scratch(&c->host_copy[0], blocks);
    float* received = q->kind == OP_SENDRECV ? host_scratch(&c->host_copy[1], n) : h;
    const void* src = from_send ? q->send : q->recv;
    if (q->kind != OP_RECV) {
        if (q->t == DT_FLOATX) download_floats(h, (const floatX*)src, blocks);
        else copy_to_host(h, src, blocks * sizeof(float));
    }
    mpi_transfer(c, q, h, received, MPI_FLOAT, n);
    if (q->kind == OP_SEND) return;
    size_t back = q->kind == OP_ALL_GATHER ? blocks : n;  // a reduce-scatter's sum is at the start of h
    if (q->t == DT_FLOATX) upload_floats((floatX*)q->recv, received, back);
    else copy_to_device(q->recv, received, back * sizeof(float));
}
#endif

static void mpi_run(Comm* c, const CommOp* q) {
    double start = wall_seconds();
    if (c->stage_bytes > 0) mpi_run_staged(c, q);
#ifdef LLMC_CPU
    else mpi_run_direct(c, q);
#else
    else mpi_run_host_copy(c, q);
#endif
    if (c->stats.on) {
        c->stats.bytes += comm_op_bytes(q);
        c->stats.seconds += wall_seconds() - start;
        c->stats.ops++;
    }
}

// run the operation now, or in strict mode queue it for the join
static void mpi_post(Comm* c, CommOp q) {
    if (!c->strict) {
        mpi_run(c, &q);
        return;
    }
    if (c->queued == c->queue_cap) {
        c->queue_cap = c->queue_cap ? 2 * c->queue_cap : 64;
        c->queue = (CommOp*)realloc_check(c->queue, c->queue_cap * sizeof(CommOp));
    }
    c->queue[c->queued++] = q;
}

// strict mode: run what was posted since the last join, in order (as the NCCL streams would)
static void mpi_flush(Comm* c) {
    for (int i = 0; i < c->queued; i++) mpi_run(c, &c->queue[i]);
    c->queued = 0;
}

// strict mode: run group g's operations of the queue, in order; the others keep their order in it
static void mpi_flush_group(Comm* c, const Group* g) {
    int kept = 0;
    for (int i = 0; i < c->queued; i++) {
        if (c->queue[i].g == g) mpi_run(c, &c->queue[i]);
        else c->queue[kept++] = c->queue[i];
    }
    c->queued = kept;
}

// host scalars, after everything posted before them
static void mpi_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    mpi_flush(c);
    MPI_Request r;
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, mpi_op(op), g->mpi, &r));
    mpiWait(c, &r, 1, "an all-reduce of host values", g);
    if (op == REDUCE_AVG)
        for (int i = 0; i < n; i++) values[i] /= g->size;
}

// ----------------------------------------------------------------------------------------------------
// start-up and shutdown

// fatal() calls this first (through g_comm): under MPI, take every rank down with this one
static void comm_abort_all(void) {
    if (g_comm && g_comm->mpi_initialized && g_comm->world_size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
}

// MPI_Init waits for every process of the launch, and cannot be polled: a process that never calls it
// (another program in an MPMD launch, or one stopped or hung before it) would keep this one there forever.
// So a timer ends the process at --comm-timeout, with one line written from the signal handler (write
// and _exit only: the handler interrupts MPI, where nothing else is safe).
static char mpi_init_expired_line[256];
static size_t mpi_init_expired_len;
static void mpi_init_expired(int sig) {
    (void)sig;
    ssize_t written = write(2, mpi_init_expired_line, mpi_init_expired_len);
    (void)written;
    _exit(1);
}

// under mpirun: MPI_Init (under --comm-timeout), this rank's place in the world and on its node
static void mpi_start(Comm* c, int* argc, char*** argv) {
    struct sigaction expired = {}, before;
    int timed = c->timeout_s > 0;
    if (timed) {
        snprintf(mpi_init_expired_line, sizeof(mpi_init_expired_line),
                 "error: MPI_Init did not complete within %.0f s (--comm-timeout): a process of this launch never "
                 "started MPI (another program in an MPMD launch, or one stopped or hung before it)\n",
                 ceil(c->timeout_s));
        mpi_init_expired_len = strlen(mpi_init_expired_line);
        expired.sa_handler = mpi_init_expired;
        sigaction(SIGALRM, &expired, &before);
        alarm(c->timeout_s < 1e6 ? (unsigned)ceil(c->timeout_s) : 1000000u);
    }
    mpiCheck(MPI_Init(argc, argv));
    if (timed) {
        alarm(0);
        sigaction(SIGALRM, &before, NULL);
    }
    c->mpi_initialized = 1;
    g_comm = c;
    fatal_hook = comm_abort_all;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &c->world_rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &c->world_size));
    MPI_Comm local;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->world_rank, MPI_INFO_NULL, &local));
    mpiCheck(MPI_Comm_rank(local, &c->local_rank));
    mpiCheck(MPI_Comm_size(local, &c->local_size));
    mpiCheck(MPI_Comm_free(&local));
}

// Whether any two ranks of one node use the same GPU (compared by its 16-byte UUID: with per-rank
// CUDA_VISIBLE_DEVICES every rank sees one "device 0", yet they differ), agreed over the world in one
// all-reduce, which also checks that every rank asked for the same engine.
static int mpi_agree_engine(Comm* c, const char* gpu_uuid, const char* engine) {
    MPI_Comm local;
    int local_rank, local_size;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->world_rank, MPI_INFO_NULL, &local));
    mpiCheck(MPI_Comm_rank(local, &local_rank));
    mpiCheck(MPI_Comm_size(local, &local_size));
    char* uuids = (char*)malloc_check((size_t)local_size * 16);
    MPI_Request r;
    mpiCheck(MPI_Iallgather(gpu_uuid, 16, MPI_BYTE, uuids, 16, MPI_BYTE, local, &r));
    Group node;
    memset(&node, 0, sizeof(node));
    node.rank = local_rank;
    node.size = local_size;
    node.name = "node-local";
    node.mpi = local;
    mpiWait(c, &r, 1, "an all-gather of the GPU ids", &node);
    int mine = 0;
    for (int i = 0; i < local_size; i++)
        if (i != local_rank && memcmp(uuids + 16 * i, gpu_uuid, 16) == 0) mine = 1;
    free(uuids);
    mpiCheck(MPI_Comm_free(&local));
    int code = strcmp(engine, "nccl") == 0 ? 2 : strcmp(engine, "mpi") == 0 ? 1 : 0;
    int v[3] = {mine, code, -code};
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r));
    mpiWait(c, &r, 1, "the choice of the engine", &c->world);
    if (v[1] != -v[2]) fatal("--comm differs between ranks (every rank must run the same job)");
    return v[0];
}

// rank 0's bytes to every rank of the world (the NCCL id)
static void mpi_broadcast_bytes(Comm* c, void* buf, size_t bytes) {
    MPI_Request r;
    mpiCheck(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &r));
    mpiWait(c, &r, 1, "a broadcast of the NCCL id", &c->world);
}

// the communicator of every group (emb_group only on the first and last stage)
static void mpi_split_groups(Comm* c) {
    int in_emb = group_valid(&c->emb_group);
    c->world.mpi = MPI_COMM_WORLD;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + c->tp * c->pp_rank, c->dp_rank, &c->dp_group.mpi));
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->dp_rank + c->dp * c->pp_rank, c->tp_rank, &c->tp_group.mpi));
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + c->tp * c->dp_rank, c->pp_rank, &c->pp_group.mpi));
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, in_emb ? c->tp_rank + c->tp * c->dp_rank : MPI_UNDEFINED, c->pp_rank,
                            &c->emb_group.mpi));
}

static void mpi_finish(Comm* c) {
    if (!c->mpi_initialized) return;
    if (c->world_size > 1) {
        MPI_Comm_free(&c->dp_group.mpi);
        MPI_Comm_free(&c->tp_group.mpi);
        MPI_Comm_free(&c->pp_group.mpi);
        if (group_valid(&c->emb_group)) MPI_Comm_free(&c->emb_group.mpi);
    }
    MPI_Finalize();
}

#else  // a build without MPI: one rank, or (GPU target) NCCL launched by torchrun or Slurm

static void mpi_post(Comm* c, CommOp q) { (void)c; (void)q; }
static void mpi_flush(Comm* c) { c->queued = 0; }
static void mpi_flush_group(Comm* c, const Group* g) {
    (void)g;
    c->queued = 0;
}
static void mpi_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    (void)c; (void)g; (void)values; (void)n; (void)op;
}
static void mpi_start(Comm* c, int* argc, char*** argv) {
    (void)c; (void)argc; (void)argv;
    fatal("launched by mpirun, but this build has no MPI (install libopenmpi-dev and rebuild)");
}
static int mpi_agree_engine(Comm* c, const char* gpu_uuid, const char* engine) {
    (void)c; (void)gpu_uuid; (void)engine;
    return 0;
}
static void mpi_broadcast_bytes(Comm* c, void* buf, size_t bytes) { (void)c; (void)buf; (void)bytes; }
static void mpi_split_groups(Comm* c) { (void)c; }
static void mpi_finish(Comm* c) { (void)c; }

#endif
