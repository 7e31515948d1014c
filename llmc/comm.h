/*
 * comm.h: ranks, process groups and collectives: one interface over two engines. The header the model
 * includes; it hands each operation to the engine of the run. The engines and the start-up live in
 * llmc/comm/ (types.h, what they share; mpi_engine.h, staging.h; nccl_engine.h, rendezvous.h,
 * liveness.h; launch.h), machinery a reader need not open to follow the training.
 *
 * The world of W ranks is a grid dp x tp x pp. Rank order: tp varies fastest, then dp, then pp, so
 *     world_rank = tp_rank + tp * (dp_rank + dp * pp_rank)
 * and a tensor-parallel group (consecutive ranks) sits inside one node. A process group is the set of
 * ranks that differ in one coordinate only: the DP group of a rank is every rank with its tp_rank and
 * pp_rank, and so on.
 *
 * One small API: all_reduce (sum, avg, max), reduce_scatter (sum), all_gather, send, recv,
 * barrier, over buffers in device memory (host memory on the CPU target), of type floatX or float.
 * Every operation is described by one CommOp and handed to the engine of the run:
 *   NCCL  (comm/nccl_engine.h) GPU buffers, one GPU per rank, the production path. Every group has its own
 *         communication stream; an operation is queued on its group's stream after the work already
 *         queued on the main stream, so it overlaps what the main stream does next. comm_join() waits
 *         for every group's operations, comm_join_group() for one group's only: a tensor-parallel
 *         all-reduce is joined without waiting for the data-parallel buckets queued before it.
 *   MPI   (comm/mpi_engine.h) the CPU target, and the GPU target when ranks share a GPU (NCCL refuses that):
 *         on the GPU, each buffer is copied whole to host memory as float and back (mpi_run_host_copy),
 *         or with LLMC_MPI_STAGE_BYTES through pinned host buffers in pieces (comm/staging.h), sums in
 *         float, everything else as bytes. Calls complete before they return.
 * Launch (comm/launch.h): mpirun (Open MPI); or, for the GPU target, without MPI through RANK /
 * WORLD_SIZE / LOCAL_RANK (torchrun) or, in a task of srun, SLURM_PROCID / SLURM_STEP_NUM_TASKS /
 * SLURM_LOCALID, with the NCCL id passed through a file in a shared folder (--nccl-id-dir) or over TCP
 * at MASTER_ADDR:MASTER_PORT (llmc/comm/rendezvous.h). Under mpirun the engine is chosen from the GPUs'
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
 * thread ends it (llmc/comm/watchdog.h).
 */
#pragma once

#include "comm/types.h"        // Comm, Group, CommOp, DType, ReduceOp, Engine; dtype_size
#include "comm/mpi_engine.h"   // mpi_post, mpi_flush, mpi_flush_group, mpi_all_reduce_host
#include "comm/nccl_engine.h"  // nccl_run, nccl_wait, nccl_wait_group, nccl_main_waits, nccl_all_reduce_host
#include "comm/launch.h"       // comm_init, comm_finalize, check_omp_threads: start-up and shutdown
#include "device.h"            // device_copy
#include "comm/watchdog.h"     // watchdog_waiting_io

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

// The main stream's later work waits for the operations of group g posted so far, while the host goes on
// without waiting (--fused-kernels' optimizer step: a sum across ranks feeds the next kernel directly,
// llmc/step_outputs.h). NCCL: an event on the group's stream; MPI: its operations have completed by now
// (strict mode runs the group's queued ones here). A peer that never answers holds the main stream, and
// the host's next blocking CUDA call ends under the watchdog (llmc/comm/watchdog.h).
static void comm_main_waits(Comm* c, Group* g) {
    if (g->size <= 1) return;
    if (c->engine == ENGINE_NCCL) nccl_main_waits(c, g);
    mpi_flush_group(c, g);
}

// A fence: a mark after the operations of group g posted so far, which the main stream waits for later,
// while other operations are posted in between (ZeRO-2's gradient buffers, ZeRO-3's gathered ones: a
// buffer is written again only once the communication that reads or fills it is done). NCCL: an event
// recorded on the group's stream, and only the main stream waits for it (the host goes on); MPI: the
// operations have completed by the wait, except in strict mode (llmc/comm.h), where the group's join there
// runs the queued ones. Zero-initialized it is unmarked; comm_fence_free releases it.
typedef struct {
    int marked;  // marked and not yet waited for
#ifdef HAVE_NCCL
    cudaEvent_t event;  // (created at the first mark)
#endif
} CommFence;

static void comm_fence_mark(Comm* c, Group* g, CommFence* f) {
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        if (f->event == NULL) cudaCheck(cudaEventCreateWithFlags(&f->event, cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(f->event, g->stream));
    }
#endif
    (void)c;
    (void)g;
    f->marked = 1;
}

// The main stream waits for what was posted before the mark (nothing when unmarked); `what` names the wait
// for the watchdog's message.
static void comm_fence_wait(Comm* c, Group* g, CommFence* f, const char* what) {
    if (!f->marked) return;
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) cudaCheckBlocking(what, cudaStreamWaitEvent(main_stream, f->event, 0));
#endif
    (void)what;
    if (c->engine != ENGINE_NCCL) comm_join_group(c, g);
    f->marked = 0;
}

static void comm_fence_free(CommFence* f) {
#ifdef HAVE_NCCL
    if (f->event != NULL) cudaCheck(cudaEventDestroy(f->event));
#endif
    memset(f, 0, sizeof(*f));
}

// The wait before what only kernels read (a tensor-parallel sum): with c->kernels_wait the main stream's
// (comm_main_waits), otherwise the host's too (comm_join_group), as the CPU target's loops need.
static void comm_join_for_kernels(Comm* c, Group* g) {
    if (c->kernels_wait) comm_main_waits(c, g);
    else comm_join_group(c, g);
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
    comm_post(c, (CommOp){.kind = OP_REDUCE_SCATTER, .g = g, .send = send, .recv = recv, .n = count, .t = t,
                          .op = REDUCE_SUM, .peer = -1, .recv_peer = -1});
}

// buf holds count elements per rank; each rank's own part (at rank*count) is gathered into everyone's buf
static void comm_all_gather(Comm* c, Group* g, void* buf, size_t count, DType t) {
    if (g->size == 1) return;
    comm_post(c, (CommOp){.kind = OP_ALL_GATHER, .g = g, .send = buf, .recv = buf, .n = count, .t = t, .op = REDUCE_SUM,
                          .peer = -1, .recv_peer = -1});
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
static void comm_sendrecv(Comm* c, Group* g, const void* sendbuf, int send_peer, void* recvbuf, int recv_peer, size_t n,
                          DType t) {
    comm_post(c, (CommOp){.kind = OP_SENDRECV, .g = g, .send = sendbuf, .recv = recvbuf, .n = n, .t = t,
                          .op = REDUCE_SUM, .peer = send_peer, .recv_peer = recv_peer});
}

// Host scalars (losses, squared norms, flags), reduced across the group; blocking on both engines, and
// after everything posted before it (as on the NCCL stream).
static void comm_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    if (g->size <= 1) return;
    if (c->engine == ENGINE_NCCL) nccl_all_reduce_host(c, g, values, n, op);
    else mpi_all_reduce_host(c, g, values, n, op);
}

// Sums a host array of floats over group g, in place, through a device buffer (the engines reduce device
// buffers; comm_all_reduce_host is for a few doubles)
static void comm_sum_host_floats(Comm* c, Group* g, float* values, size_t n) {
    float* dev = (float*)device_malloc(n * sizeof(float));
    copy_to_device(dev, values, n * sizeof(float));
    comm_all_reduce(c, g, dev, n, DT_FLOAT, REDUCE_SUM);
    comm_join(c);
    copy_to_host(values, dev, n * sizeof(float));
    device_free(dev);
}

static void comm_barrier(Comm* c, Group* g) {
    double x = 0.0;
    comm_all_reduce_host(c, g, &x, 1, REDUCE_SUM);
}

// A barrier where ranks wait for one another's file I/O (a checkpoint being written, a model being
// read): under the long --io-timeout, since writing gigabytes to network storage is no dead peer.
static void comm_barrier_io(Comm* c, Group* g) {
    c->waiting_io = 1;
    watchdog_waiting_io(1);  // (the NCCL engine's watchdog, llmc/comm/watchdog.h, runs on another thread)
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
    printf("communication, %s engine: %.0f operations, %.1f MB in %.3f s per rank: %.3g GB/s\n",
           c->engine == ENGINE_NCCL ? "NCCL" : "MPI", v[2] / c->world_size, v[0] / c->world_size / 1e6,
           v[1] / c->world_size, v[1] > 0 ? v[0] / v[1] / 1e9 : 0.0);
}

// A one-rank world, for single-process runs, the planner and tests (the caller keeps it).
static Comm comm_single(void) {
    Comm single;
    memset(&single, 0, sizeof(single));
    single.world_size = single.dp = single.tp = single.pp = 1;
    single.world.size = single.dp_group.size = single.tp_group.size = single.pp_group.size = single.emb_group.size = 1;
    return single;
}

// Ends the run on a verdict that every rank reaches alike from the same values: every rank ends here
// together, without an abort, and rank 0 says why in one line ("error: <msg>").
[[noreturn]] static void end_every_rank(Comm* comm, const char* msg) {
    fflush(stdout);
    if (comm->world_rank == 0) {
        fprintf(stderr, "error: %s\n", msg);
        fflush(stderr);
    }
    comm_finalize(comm);
    exit(1);
}

// The run diverged (a non-finite loss, gradient norm or parameter). Every rank reaches the same verdict
// from the same reduced values, so every rank ends here together, without saving: the newest checkpoint
// stays the last good one.
[[noreturn]] static void end_diverged(Comm* comm, long long step, const char* what, int applied) {
    char msg[512];
    snprintf(msg, sizeof(msg), "training diverged at step %lld: %s; %snothing after step %lld was saved", step, what,
             applied ? "" : "the step was not applied and ", step - 1);
    end_every_rank(comm, msg);
}

// A non-finite mean loss of `step` ends the run, the step not applied (the loss is the mean over all
// ranks: every rank ends alike).
static void end_if_loss_diverged(Comm* comm, long long step, double loss) {
    char why[64];
    snprintf(why, sizeof(why), "the loss is %g", loss);
    if (!isfinite(loss)) end_diverged(comm, step, why, 0);
}
