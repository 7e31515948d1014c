/*
 * comm_mpi.h: the MPI engine of llmc/comm.h, and the MPI side of the launch.
 *
 * The engine of the CPU target, and of the GPU target when ranks share a GPU (NCCL refuses two ranks on
 * one GPU): every operation runs on host memory, through MPI's non-blocking calls polled against the
 * deadline (mpi_wait). On the CPU target the buffers are host memory already; on the GPU target they are
 * staged through host copies in float. An operation completes before its call returns, except in strict
 * mode, where mpi_post queues it and the join (mpi_flush) runs the queue in order.
 *
 * Also here: MPI's part of the start-up (MPI_Init, the node-local ranks, the choice of the engine, the
 * group communicators) and of the shutdown. A build without MPI gets the placeholders at the bottom.
 */
#pragma once

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
static void mpi_wait(const Comm* c, MPI_Request* reqs, int n, const char* what, const Group* g, const char* file, int line) {
    double start = wall_seconds(), limit = comm_deadline_s(c), last = start;
    for (long spins = 0;; spins++) {
        int done = 0;
        mpi_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), file, line);
        if (done) return;
        double now = wall_seconds();
        if (now - last > 1.0) start += now - last;  // this rank itself was stopped: that time is not the peers'
        last = now;
        if (limit > 0 && now - start > limit)
            fatal("rank %d: %s in the %s group did not complete within %.0f s (%s): a peer rank is stopped, hung or gone",
                  c->world_rank, what, g->name, limit, comm_deadline_flag(c));
        if (spins > 1000) usleep(50);  // after a moment of spinning, leave the core to the other ranks
    }
}

// ----------------------------------------------------------------------------------------------------
// staging on the GPU target: device data <-> host float buffers

[[maybe_unused]] static HostScratch staging = {NULL, 0};  // host copies for the MPI engine on the GPU target
// host float view of a device buffer (on the CPU target, the buffer itself when it is float)
static float* stage_in(const void* buf, size_t n, DType t) {
#ifdef LLMC_CPU
    (void)t, (void)n;
    return (float*)buf;
#else
    float* h = host_scratch(&staging, n);
    if (t == DT_FLOATX) download_floats(h, (const floatX*)buf, n);
    else copy_to_host(h, buf, n * sizeof(float));
    return h;
#endif
}
static void stage_out(void* buf, const float* h, size_t n, DType t) {
#ifdef LLMC_CPU
    (void)buf, (void)h, (void)n, (void)t;
#else
    if (t == DT_FLOATX) upload_floats((floatX*)buf, h, n);
    else copy_to_device(buf, h, n * sizeof(float));
#endif
}

// ----------------------------------------------------------------------------------------------------
// one operation, run now (blocking)

static void mpi_run(const Comm* c, const CommOp* q) {
    Group* g = q->g;
    size_t n = q->n;
    float* h;
    MPI_Request r[2];
    switch (q->kind) {
        case OP_ALL_REDUCE:
            h = stage_in(q->recv, n, q->t);
            mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, h, (int)n, MPI_FLOAT, mpi_op(q->op), g->mpi, r));
            mpiWait(c, r, 1, "an all-reduce", g);
            if (q->op == REDUCE_AVG)
                for (size_t i = 0; i < n; i++) h[i] /= g->size;
            stage_out(q->recv, h, n, q->t);
            break;
        case OP_REDUCE_SCATTER:  // in place in a staged copy of send; the result lands in h[0 .. n)
            h = stage_in(q->send, n * g->size, q->t);
            mpiCheck(MPI_Ireduce_scatter_block(MPI_IN_PLACE, h, (int)n, MPI_FLOAT, MPI_SUM, g->mpi, r));
            mpiWait(c, r, 1, "a reduce-scatter", g);
#ifdef LLMC_CPU
            if ((float*)q->recv != h) memmove(q->recv, h, n * sizeof(float));
#else
            stage_out(q->recv, h, n, q->t);
#endif
            break;
        case OP_ALL_GATHER:
            h = stage_in(q->recv, n * g->size, q->t);
            mpiCheck(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, (int)n, MPI_FLOAT, g->mpi, r));
            mpiWait(c, r, 1, "an all-gather", g);
            stage_out(q->recv, h, n * g->size, q->t);
            break;
        case OP_BROADCAST:
            h = stage_in(q->recv, n, q->t);
            mpiCheck(MPI_Ibcast(h, (int)n, MPI_FLOAT, q->peer, g->mpi, r));
            mpiWait(c, r, 1, "a broadcast", g);
            stage_out(q->recv, h, n, q->t);
            break;
        case OP_SEND:
            h = stage_in(q->send, n, q->t);
            mpiCheck(MPI_Isend(h, (int)n, MPI_FLOAT, q->peer, 0, g->mpi, r));
            mpiWait(c, r, 1, "a send", g);
            break;
        case OP_RECV:
#ifdef LLMC_CPU
            h = (float*)q->recv;
#else
            h = host_scratch(&staging, n);
#endif
            mpiCheck(MPI_Irecv(h, (int)n, MPI_FLOAT, q->recv_peer, 0, g->mpi, r));
            mpiWait(c, r, 1, "a receive", g);
            stage_out(q->recv, h, n, q->t);
            break;
        case OP_SENDRECV: {
#ifdef LLMC_CPU
            const float* hs = (const float*)q->send;
            float* hr = (float*)q->recv;
#else
            static HostScratch recv_staging = {NULL, 0};
            const float* hs = stage_in(q->send, n, q->t);
            float* hr = host_scratch(&recv_staging, n);
#endif
            mpiCheck(MPI_Irecv(hr, (int)n, MPI_FLOAT, q->recv_peer, 0, g->mpi, &r[0]));
            mpiCheck(MPI_Isend(hs, (int)n, MPI_FLOAT, q->peer, 0, g->mpi, &r[1]));
            mpiWait(c, r, 2, "a send-receive", g);
            stage_out(q->recv, hr, n, q->t);
            break;
        }
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
        c->queue = (CommOp*)realloc(c->queue, c->queue_cap * sizeof(CommOp));
        if (c->queue == NULL) fatal("out of host memory for the communication queue");
    }
    c->queue[c->queued++] = q;
}

// strict mode: run what was posted since the last join, in order (as the NCCL stream would)
static void mpi_flush(Comm* c) {
    for (int i = 0; i < c->queued; i++) mpi_run(c, &c->queue[i]);
    c->queued = 0;
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

// under mpirun: MPI_Init, this rank's place in the world and on its node
static void mpi_start(Comm* c, int* argc, char*** argv) {
    mpiCheck(MPI_Init(argc, argv));
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
    node.rank = local_rank, node.size = local_size, node.name = "node-local", node.mpi = local;
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
static void mpi_broadcast_bytes(void* buf, size_t bytes) { mpiCheck(MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD)); }

// the communicator of every group (emb_group only on the first and last stage)
static void mpi_split_groups(Comm* c) {
    int in_emb = group_valid(&c->emb_group);
    c->world.mpi = MPI_COMM_WORLD;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + c->tp * c->pp_rank, c->dp_rank, &c->dp_group.mpi));
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->dp_rank + c->dp * c->pp_rank, c->tp_rank, &c->tp_group.mpi));
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + c->tp * c->dp_rank, c->pp_rank, &c->pp_group.mpi));
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, in_emb ? c->tp_rank + c->tp * c->dp_rank : MPI_UNDEFINED, c->pp_rank, &c->emb_group.mpi));
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

static void mpi_post(Comm* c, CommOp q) { (void)c, (void)q; }
static void mpi_flush(Comm* c) { c->queued = 0; }
static void mpi_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) { (void)c, (void)g, (void)values, (void)n, (void)op; }
static void mpi_start(Comm* c, int* argc, char*** argv) {
    (void)c, (void)argc, (void)argv;
    fatal("launched by mpirun, but this build has no MPI (install libopenmpi-dev and rebuild)");
}
static int mpi_agree_engine(Comm* c, const char* gpu_uuid, const char* engine) { return (void)c, (void)gpu_uuid, (void)engine, 0; }
static void mpi_broadcast_bytes(void* buf, size_t bytes) { (void)buf, (void)bytes; }
static void mpi_split_groups(Comm* c) { (void)c; }
static void mpi_finish(Comm* c) { (void)c; }

#endif
