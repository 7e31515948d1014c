/*
 * comm.h: ranks, process groups and collectives, over two engines.
 *
 * The world of W ranks is a grid dp x tp x pp. Rank order: tp varies fastest, then dp, then pp, so
 *     world_rank = tp_rank + tp * (dp_rank + dp * pp_rank)
 * and a tensor-parallel group (consecutive ranks) sits inside one node. A process group is the set of
 * ranks that differ in one coordinate only: the DP group of a rank is every rank with its tp_rank and
 * pp_rank, and so on.
 *
 * One small API: all_reduce (sum, avg, max), reduce_scatter (sum), all_gather, broadcast, send, recv,
 * barrier, over buffers in device memory (host memory on the CPU target), of type floatX or float.
 * Two engines:
 *   NCCL  GPU buffers, one GPU per rank, the production path. Collectives are queued on a
 *         communication stream after the work already queued on the main stream, so they overlap what
 *         the main stream does next; comm_join() waits for them.
 *   MPI   the CPU target, and the GPU target when ranks share a GPU (NCCL refuses that): data is staged
 *         through host memory, in float. Calls complete before they return.
 * Launch: mpirun (Open MPI); or, for the GPU target, without MPI through RANK / WORLD_SIZE / LOCAL_RANK
 * (torchrun) or, in a task of srun, SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID, with the NCCL id
 * passed through a file in a shared folder (--nccl-id-dir). Under mpirun the engine is chosen from the
 * GPUs' UUIDs within each node and agreed by all ranks. On the CPU target each rank defaults to
 * cores / local ranks OpenMP threads.
 *
 * Strict mode (LLMC_COMM_STRICT=1, for tests): the MPI engine honours NCCL's buffer contract to the
 * letter. A send or collective is only queued when it is called; comm_join() (or a blocking host
 * collective) runs the queue in order. So a send reads its buffer at the join, not when it was posted,
 * and a receiver sees its data only after the join: a buffer written while it still belongs to the
 * communication (fine under blocking MPI, a silent race under NCCL) gives wrong results in the tests.
 *
 * Failure: any error on any rank goes through fatal(), which under MPI calls MPI_Abort so mpirun ends
 * every rank; a rank that dies is noticed by mpirun, which ends the others. A rank that neither dies nor
 * answers (stopped, hung) makes no error anywhere, so every wait on other ranks has a deadline
 * (--comm-timeout; waits around file I/O --io-timeout): the MPI engine polls non-blocking MPI calls, the
 * NCCL engine polls the stream and every communicator's asynchronous error state (creation and
 * splitting are non-blocking too), and a wait past its deadline ends the run with one line naming it.
 */
#pragma once

#include "device.h"
#include <sched.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef USE_MPI
#include <mpi.h>
#endif
// NCCL: on the GPU target unless built with -DNO_NCCL (the Makefile does that when nccl.h is missing);
// without it, ranks communicate through the MPI engine
#if !defined(LLMC_CPU) && !defined(NO_NCCL)
#define HAVE_NCCL 1
#include <nccl.h>
#endif

typedef enum { REDUCE_SUM, REDUCE_AVG, REDUCE_MAX } ReduceOp;
typedef enum { DT_FLOATX, DT_FLOAT } DType;
typedef enum { ENGINE_NONE, ENGINE_MPI, ENGINE_NCCL } Engine;

typedef struct {
    int rank, size;  // this rank's index in the group, and the group's size
    const char* name;  // for messages: "world", "DP", "TP", "PP", "embedding"
#ifdef USE_MPI
    MPI_Comm mpi;
#endif
#ifdef HAVE_NCCL
    ncclComm_t nccl;
#endif
} Group;

// an MPI-engine operation queued by strict mode until the next join
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
} QueuedOp;

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
    QueuedOp* queue;  // strict mode: the operations posted since the last join, in order
    int queued, queue_cap;
#ifdef HAVE_NCCL
    cudaStream_t stream;  // NCCL work runs here
    cudaEvent_t event;    // orders it after the main stream's work
#endif
} Comm;

static Comm* g_comm = NULL;  // for fatal(): abort every rank

static size_t dtype_size(DType t) { return t == DT_FLOATX ? sizeof(floatX) : sizeof(float); }

// ----------------------------------------------------------------------------------------------------
// checks

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
#endif

// the deadline of the wait in progress: --io-timeout around file I/O, --comm-timeout otherwise (0: none)
static double comm_deadline_s(const Comm* c) { return c->waiting_io ? c->io_timeout_s : c->timeout_s; }
static const char* comm_deadline_flag(const Comm* c) { return c->waiting_io ? "--io-timeout" : "--comm-timeout"; }

#ifdef USE_MPI
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
#endif

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
            fatal("rank %d: NCCL failed while waiting for %s: %s", c->world_rank, what, ncclGetErrorString(r != ncclSuccess ? r : e));
        }
    }
    double limit = comm_deadline_s(c);
    if (limit > 0 && wall_seconds() - start > limit) {
        nccl_abort_all(c);
        fatal("rank %d: %s did not complete within %.0f s (%s): a peer rank is stopped, hung or gone", c->world_rank, what, limit,
              comm_deadline_flag(c));
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

// Waits for the communication stream, watching every communicator for errors and the deadline: a
// collective that never completes must end the run, not hang it.
static void nccl_wait(Comm* c) {
    double start = wall_seconds();
    for (;;) {
        int busy = nccl_watch(c, "communication (a collective, send or receive)", start);
        cudaError_t q = cudaStreamQuery(c->stream);
        if (q == cudaSuccess && !busy) return;
        if (q != cudaSuccess && q != cudaErrorNotReady) cudaCheck(q);
        usleep(100);
    }
}
#endif

// fatal() calls this first (through g_comm): under MPI, take every rank down with this one
static void comm_abort_all(void) {
#ifdef USE_MPI
    if (g_comm && g_comm->mpi_initialized && g_comm->world_size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
}

// ----------------------------------------------------------------------------------------------------
// setup

// an invalid group (this rank is not a member), for emb_group on the middle pipeline stages
static int group_valid(const Group* g) { return g->size > 0; }

static int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v ? atoi(v) : fallback;
}

// CPU target: the ranks of one node share its cores. Unless OMP_NUM_THREADS says otherwise, each rank
// runs (the cores it may use) / (ranks on the node) OpenMP threads, at least 1: OpenMP's default, every
// core per rank, oversubscribes the node local_size times over and runs several times slower.
static void set_default_threads(int local_size) {
#if defined(LLMC_CPU) && defined(_OPENMP)
    if (getenv("OMP_NUM_THREADS") != NULL) return;
    cpu_set_t mask;
    long cores = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : sysconf(_SC_NPROCESSORS_ONLN);
    long threads = cores / local_size;
    omp_set_num_threads(threads > 0 ? (int)threads : 1);
#else
    (void)local_size;
#endif
}

static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") || getenv("MPI_LOCALNRANKS");
}

#ifdef HAVE_NCCL
// torchrun/Slurm-style launch without MPI: rank 0 writes the NCCL id into a file of the shared folder,
// the others poll for it. The file's name carries the launch's identity where the launcher gives one
// (torchrun's run id, Slurm's job and step), its content the world size and the time it was written: a
// file left by an earlier run (a crash skips the removal at the end) is never taken for this run's.
typedef struct {
    uint32_t magic;  // NCCL_ID_MAGIC
    int world_size;
    double written;  // seconds since the epoch (the clocks of the nodes agree to well under a minute)
    ncclUniqueId id;
} NcclIdFile;
#define NCCL_ID_MAGIC 0x4e43434cu
static char nccl_id_path[4300];  // rank 0 removes the file at the end

static void nccl_id_file_name(const char* dir) {
    const char* run = getenv("TORCHELASTIC_RUN_ID");
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    char tag[200] = "";
    if (run && strcmp(run, "none") != 0) snprintf(tag, sizeof(tag), "_%s", run);
    else if (job && step) snprintf(tag, sizeof(tag), "_%s.%s", job, step);
    for (char* t = tag; *t; t++)
        if (*t == '/') *t = '_';
    snprintf(nccl_id_path, sizeof(nccl_id_path), "%s/nccl_id%s", dir, tag);
}

static ncclUniqueId nccl_id_through_file(Comm* c, const char* dir) {
    NcclIdFile rec;
    nccl_id_file_name(dir);
    const char* path = nccl_id_path;
    double entered = (double)time(NULL);
    if (c->world_rank == 0) {
        char tmp[4400];
        memset(&rec, 0, sizeof(rec));
        rec.magic = NCCL_ID_MAGIC, rec.world_size = c->world_size, rec.written = entered;
        ncclCheck(ncclGetUniqueId(&rec.id));
        snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());  // written whole, then renamed: never half-read
        FILE* f = fopen_check(tmp, "wb");
        fwrite_check(&rec, sizeof(rec), 1, f, tmp);
        if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) fatal("cannot write '%s': %s", tmp, strerror(errno));
        if (rename(tmp, path) != 0) fatal("cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        return rec.id;
    }
    // a file written before this rank started, by more than the launch skew the deadline allows, is stale
    double skew = c->timeout_s > 0 ? c->timeout_s : 600.0, start = wall_seconds();
    for (;;) {
        FILE* f = fopen(path, "rb");
        int got = f && fread(&rec, sizeof(rec), 1, f) == 1;
        if (f) fclose(f);
        if (got && rec.magic == NCCL_ID_MAGIC && rec.world_size == c->world_size && rec.written >= entered - skew) return rec.id;
        if (c->timeout_s > 0 && wall_seconds() - start > c->timeout_s)
            fatal("rank %d: no NCCL id of this run appeared in '%s' within %.0f s (--comm-timeout; is rank 0 running? is the folder "
                  "shared?%s)", c->world_rank, path, c->timeout_s, got ? " the file there is from an earlier run or another world size" : "");
        usleep(100000);
    }
}
#endif

#if defined(HAVE_NCCL) && defined(USE_MPI)
// Whether any two ranks of one node use the same GPU (compared by UUID: with per-rank
// CUDA_VISIBLE_DEVICES every rank sees one "device 0", yet they differ), agreed over the world in one
// all-reduce, which also checks that every rank asked for the same engine.
static int mpi_agree_engine(Comm* c, const char* engine) {
    int dev;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    MPI_Comm local;
    int local_rank, local_size;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->world_rank, MPI_INFO_NULL, &local));
    mpiCheck(MPI_Comm_rank(local, &local_rank));
    mpiCheck(MPI_Comm_size(local, &local_size));
    char* uuids = (char*)malloc_check((size_t)local_size * 16);
    MPI_Request r;
    mpiCheck(MPI_Iallgather(prop.uuid.bytes, 16, MPI_BYTE, uuids, 16, MPI_BYTE, local, &r));
    Group node = {local_rank, local_size, "node-local", local};
    mpiWait(c, &r, 1, "an all-gather of the GPU ids", &node);
    int mine = 0;
    for (int i = 0; i < local_size; i++)
        if (i != local_rank && memcmp(uuids + 16 * i, prop.uuid.bytes, 16) == 0) mine = 1;
    free(uuids);
    mpiCheck(MPI_Comm_free(&local));
    int code = strcmp(engine, "nccl") == 0 ? 2 : strcmp(engine, "mpi") == 0 ? 1 : 0;
    int v[3] = {mine, code, -code};
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r));
    mpiWait(c, &r, 1, "the choice of the engine", &c->world);
    if (v[1] != -v[2]) fatal("--comm differs between ranks (every rank must run the same job)");
    return v[0];
}
#endif

// engine: "auto", "mpi" or "nccl". dp: 0 means world_size / (tp * pp). timeout_s, io_timeout_s: the
// deadlines of waits on other ranks, and of waits around file I/O (seconds, 0: none).
static void comm_init(Comm* c, int* argc, char*** argv, int dp, int tp, int pp, const char* engine, const char* nccl_id_dir,
                      double timeout_s, double io_timeout_s) {
    memset(c, 0, sizeof(*c));
    c->tp = tp;
    c->pp = pp;
    c->world_size = 1;
    int use_mpi = 0;
    if (launched_by_mpirun()) {
#ifdef USE_MPI
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
        use_mpi = 1;
#else
        fatal("launched by mpirun, but this build has no MPI (install libopenmpi-dev and rebuild)");
#endif
    } else if (getenv("WORLD_SIZE")) {  // torchrun
        c->world_size = env_int("WORLD_SIZE", 1);
        c->world_rank = env_int("RANK", 0);
        c->local_rank = env_int("LOCAL_RANK", 0);
        c->local_size = env_int("LOCAL_WORLD_SIZE", 1);
    } else if (getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID")) {
        // a task of srun: Slurm's variables describe this step. (A batch script's single process sees
        // the allocation's SLURM_NTASKS and SLURM_PROCID too, but no step: it runs as one rank.)
        c->world_size = env_int("SLURM_STEP_NUM_TASKS", env_int("SLURM_NTASKS", 1));
        c->world_rank = env_int("SLURM_PROCID", 0);
        c->local_rank = env_int("SLURM_LOCALID", 0);
        c->local_size = c->world_size;  // (an upper bound: only for the default thread count)
    }
    if (c->world_rank < 0 || c->world_rank >= c->world_size) fatal("rank %d is outside the world size %d", c->world_rank, c->world_size);
    set_default_threads(c->local_size > 0 ? c->local_size : 1);
    (void)argc, (void)argv;

    // grid
    if (c->world_size % (c->tp * c->pp) != 0)
        fatal("world size %d is not divisible by tp x pp = %d x %d", c->world_size, c->tp, c->pp);
    c->dp = dp > 0 ? dp : c->world_size / (c->tp * c->pp);
    if (c->dp * c->tp * c->pp != c->world_size)
        fatal("world size %d does not equal dp x tp x pp = %d x %d x %d", c->world_size, c->dp, c->tp, c->pp);
    c->tp_rank = c->world_rank % c->tp;
    c->dp_rank = (c->world_rank / c->tp) % c->dp;
    c->pp_rank = c->world_rank / (c->tp * c->dp);
    c->world.name = "world", c->dp_group.name = "DP", c->tp_group.name = "TP", c->pp_group.name = "PP", c->emb_group.name = "embedding";
    c->timeout_s = timeout_s, c->io_timeout_s = io_timeout_s;
    c->world.rank = c->world_rank;
    c->world.size = c->world_size;
    c->dp_group.rank = c->dp_rank;
    c->dp_group.size = c->dp;
    c->tp_group.rank = c->tp_rank;
    c->tp_group.size = c->tp;
    c->pp_group.rank = c->pp_rank;
    c->pp_group.size = c->pp;
    int in_emb = c->pp_rank == 0 || c->pp_rank == c->pp - 1;
    c->emb_group.rank = in_emb ? (c->pp_rank == 0 ? 0 : 1) : -1;
    c->emb_group.size = in_emb ? (c->pp == 1 ? 1 : 2) : 0;
    if (c->world_size == 1) {
        c->engine = ENGINE_NONE;
        return;
    }

    // device, then engine
#ifndef LLMC_CPU
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    if (devices == 0) fatal("no GPU found");
    cudaCheck(cudaSetDevice(c->local_rank % devices));
#endif
#ifndef HAVE_NCCL
    if (strcmp(engine, "nccl") == 0) fatal("--comm nccl: this build has no NCCL (the CPU target, or nccl.h was not found)");
    if (!use_mpi) fatal("several ranks need mpirun in a build without NCCL");
    c->engine = ENGINE_MPI;
#else
    // Under mpirun the ranks compare the GPUs they use (by UUID, within each node) and agree on the
    // engine in one collective. Without MPI there is nothing to compare with before NCCL exists: NCCL it
    // is, and NCCL itself refuses a GPU used twice (an error, within the deadline).
    int sharing = 0;
#ifdef USE_MPI
    if (use_mpi) sharing = mpi_agree_engine(c, engine);
#endif
    if (strcmp(engine, "nccl") == 0) {
        if (sharing) fatal("--comm nccl: ranks on one node share a GPU; NCCL needs one GPU per rank (use --comm mpi)");
        c->engine = ENGINE_NCCL;
    } else if (strcmp(engine, "mpi") == 0) {
        c->engine = ENGINE_MPI;
    } else {
        c->engine = sharing ? ENGINE_MPI : ENGINE_NCCL;
    }
    if (c->engine == ENGINE_MPI && !use_mpi) fatal("the MPI engine needs a launch by mpirun");
    if (c->engine == ENGINE_NCCL) {
        ncclUniqueId id;
        if (use_mpi) {
#ifdef USE_MPI
            if (c->world_rank == 0) ncclCheck(ncclGetUniqueId(&id));
            mpiCheck(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
#endif
        } else {
            if (nccl_id_dir == NULL) fatal("launching without mpirun needs --nccl-id-dir (a folder every rank can read)");
            id = nccl_id_through_file(c, nccl_id_dir);
        }
        // non-blocking communicators: creation and splitting return at once, and are polled against the
        // deadline (a peer that never joins would otherwise block here forever)
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        ncclCall(c, ncclCommInitRankConfig(&c->world.nccl, c->world_size, id, c->world_rank, &config), "creating the NCCL communicator");
        nccl_settle(c, "creating the NCCL communicator (every rank must join)");
        ncclCall(c, ncclCommSplit(c->world.nccl, c->tp_rank + c->tp * c->pp_rank, c->dp_rank, &c->dp_group.nccl, &config), "splitting the DP group");
        nccl_settle(c, "splitting the DP group");
        ncclCall(c, ncclCommSplit(c->world.nccl, c->dp_rank + c->dp * c->pp_rank, c->tp_rank, &c->tp_group.nccl, &config), "splitting the TP group");
        nccl_settle(c, "splitting the TP group");
        ncclCall(c, ncclCommSplit(c->world.nccl, c->tp_rank + c->tp * c->dp_rank, c->pp_rank, &c->pp_group.nccl, &config), "splitting the PP group");
        nccl_settle(c, "splitting the PP group");
        ncclCall(c, ncclCommSplit(c->world.nccl, in_emb ? c->tp_rank + c->tp * c->dp_rank : NCCL_SPLIT_NOCOLOR, c->pp_rank,
                                  &c->emb_group.nccl, &config), "splitting the embedding group");
        nccl_settle(c, "splitting the embedding group");
        cudaCheck(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&c->event, cudaEventDisableTiming));
    }
#endif
    const char* strict = getenv("LLMC_COMM_STRICT");
    c->strict = c->engine == ENGINE_MPI && strict != NULL && strcmp(strict, "0") != 0;
#ifdef USE_MPI
    if (use_mpi) {
        c->world.mpi = MPI_COMM_WORLD;
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + c->tp * c->pp_rank, c->dp_rank, &c->dp_group.mpi));
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->dp_rank + c->dp * c->pp_rank, c->tp_rank, &c->tp_group.mpi));
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + c->tp * c->dp_rank, c->pp_rank, &c->pp_group.mpi));
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, in_emb ? c->tp_rank + c->tp * c->dp_rank : MPI_UNDEFINED, c->pp_rank, &c->emb_group.mpi));
    }
#endif
}

static void mpi_flush(Comm* c);
static void comm_finalize(Comm* c) {
    mpi_flush(c);
    free(c->queue);
    c->queue = NULL;
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        nccl_wait(c);
        // finalize (non-blocking: polled against the deadline), then free, children before the world
        ncclComm_t comms[5];
        int n = nccl_comms(c, comms);
        for (int i = 0; i < n; i++) ncclCall(c, ncclCommFinalize(comms[i]), "finishing the NCCL communicators");
        nccl_settle(c, "finishing the NCCL communicators");
        c->world.nccl = c->dp_group.nccl = c->tp_group.nccl = c->pp_group.nccl = c->emb_group.nccl = NULL;
        for (int i = 0; i < n; i++) ncclCheck(ncclCommDestroy(comms[i]));
        if (c->world_rank == 0 && nccl_id_path[0]) remove(nccl_id_path);  // every rank has read it long ago
    }
#endif
#ifdef USE_MPI
    if (c->mpi_initialized) {
        if (c->world_size > 1) {
            MPI_Comm_free(&c->dp_group.mpi);
            MPI_Comm_free(&c->tp_group.mpi);
            MPI_Comm_free(&c->pp_group.mpi);
            if (group_valid(&c->emb_group)) MPI_Comm_free(&c->emb_group.mpi);
        }
        MPI_Finalize();
    }
#endif
    g_comm = NULL;
}

// ----------------------------------------------------------------------------------------------------
// staging for the MPI engine on the GPU target: device data <-> host float buffers

#if defined(USE_MPI)
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
#endif

#ifdef HAVE_NCCL
// queue NCCL work after what the main stream has queued so far
static void comm_stream_follow_main(Comm* c) {
    cudaCheck(cudaEventRecord(c->event, main_stream));
    cudaCheck(cudaStreamWaitEvent(c->stream, c->event, 0));
}
#endif

// ----------------------------------------------------------------------------------------------------
// the MPI engine: one operation, run now (blocking), or at the next join in strict mode

#ifdef USE_MPI
static void mpi_run(const Comm* c, const QueuedOp* q) {
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
#endif

// MPI engine: run the operation now, or in strict mode queue it for the join
static void mpi_post(Comm* c, QueuedOp q) {
#ifdef USE_MPI
    if (!c->strict) {
        mpi_run(c, &q);
        return;
    }
    if (c->queued == c->queue_cap) {
        c->queue_cap = c->queue_cap ? 2 * c->queue_cap : 64;
        c->queue = (QueuedOp*)realloc(c->queue, c->queue_cap * sizeof(QueuedOp));
        if (c->queue == NULL) fatal("out of host memory for the communication queue");
    }
    c->queue[c->queued++] = q;
#else
    (void)c, (void)q;
#endif
}

// strict mode: run what was posted since the last join, in order (as the NCCL stream would)
static void mpi_flush(Comm* c) {
#ifdef USE_MPI
    for (int i = 0; i < c->queued; i++) mpi_run(c, &c->queue[i]);
#endif
    c->queued = 0;
}

// Waits until all communication queued so far is done, so that work queued next on the main stream
// sees its results (the MPI engine's calls complete before returning, except in strict mode). The host
// polls the communication stream with a timeout rather than blocking in CUDA, so a collective that never
// completes (a dead peer) ends the run with an error instead of a hang. The main stream's kernels are
// already queued, so the GPU keeps overlapping them with the communication while the host waits.
static void comm_join(Comm* c) {
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) nccl_wait(c);
#endif
    mpi_flush(c);
}

// ----------------------------------------------------------------------------------------------------
// collectives on device buffers

static void comm_all_reduce(Comm* c, Group* g, void* buf, size_t n, DType t, ReduceOp op) {
    if (g->size <= 1) return;
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCall(c, ncclAllReduce(buf, buf, n, nccl_type(t), nccl_op(op), g->nccl, c->stream), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_ALL_REDUCE, g, buf, buf, n, t, op, -1, -1});
}

// recv (count) on rank r = sum over ranks of send[r*count .. (r+1)*count); recv may be send + r*count
static void comm_reduce_scatter(Comm* c, Group* g, const void* send, void* recv, size_t count, DType t) {
    if (g->size == 1) {
        if (recv != send) {
#ifdef LLMC_CPU
            memmove(recv, send, count * dtype_size(t));
#else
            cudaCheck(cudaMemcpyAsync(recv, send, count * dtype_size(t), cudaMemcpyDeviceToDevice, main_stream));
#endif
        }
        return;
    }
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCall(c, ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, g->nccl, c->stream), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_REDUCE_SCATTER, g, send, recv, count, t, REDUCE_SUM, -1, -1});
}

// buf holds count elements per rank; each rank's own part (at rank*count) is gathered into everyone's buf
static void comm_all_gather(Comm* c, Group* g, void* buf, size_t count, DType t) {
    if (g->size == 1) return;
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCall(c, ncclAllGather((char*)buf + g->rank * count * dtype_size(t), buf, count, nccl_type(t), g->nccl, c->stream), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_ALL_GATHER, g, buf, buf, count, t, REDUCE_SUM, -1, -1});
}

static void comm_broadcast(Comm* c, Group* g, void* buf, size_t n, DType t, int root) {
    if (g->size == 1) return;
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCall(c, ncclBroadcast(buf, buf, n, nccl_type(t), root, g->nccl, c->stream), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_BROADCAST, g, buf, buf, n, t, REDUCE_SUM, root, -1});
}

static void comm_send(Comm* c, Group* g, const void* buf, size_t n, DType t, int peer) {
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCall(c, ncclSend(buf, n, nccl_type(t), peer, g->nccl, c->stream), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_SEND, g, buf, NULL, n, t, REDUCE_SUM, peer, -1});
}

static void comm_recv(Comm* c, Group* g, void* buf, size_t n, DType t, int peer) {
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCall(c, ncclRecv(buf, n, nccl_type(t), peer, g->nccl, c->stream), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_RECV, g, NULL, buf, n, t, REDUCE_SUM, -1, peer});
}

// Sends sendbuf to send_peer while receiving recvbuf from recv_peer (both n elements, ranks in group g).
// Pairing the two is what keeps a pipeline's neighbours from both blocking in a send to each other.
static void comm_sendrecv(Comm* c, Group* g, const void* sendbuf, int send_peer, void* recvbuf, int recv_peer, size_t n, DType t) {
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        comm_stream_follow_main(c);
        ncclCheck(ncclGroupStart());
        ncclCheck(ncclSend(sendbuf, n, nccl_type(t), send_peer, g->nccl, c->stream));
        ncclCheck(ncclRecv(recvbuf, n, nccl_type(t), recv_peer, g->nccl, c->stream));
        ncclCall(c, ncclGroupEnd(), "queueing communication");
        return;
    }
#endif
    mpi_post(c, (QueuedOp){OP_SENDRECV, g, sendbuf, recvbuf, n, t, REDUCE_SUM, send_peer, recv_peer});
}

// Host scalars (losses, squared norms, flags), reduced across the group; blocking on both engines, and
// after everything posted before it (as on the NCCL stream).
static void comm_all_reduce_host(Comm* c, Group* g, double* values, int n, ReduceOp op) {
    if (g->size <= 1) return;
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        static double* dev = NULL;
        if (dev == NULL) dev = (double*)device_malloc(64 * sizeof(double));
        check_internal(n <= 64, "too many host scalars");
        copy_to_device(dev, values, n * sizeof(double));
        comm_stream_follow_main(c);
        ncclCall(c, ncclAllReduce(dev, dev, n, ncclDouble, nccl_op(op), g->nccl, c->stream), "queueing communication");
        nccl_wait(c);
        copy_to_host(values, dev, n * sizeof(double));
        return;
    }
#endif
#ifdef USE_MPI
    mpi_flush(c);
    MPI_Request r;
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, mpi_op(op), g->mpi, &r));
    mpiWait(c, &r, 1, "an all-reduce of host values", g);
    if (op == REDUCE_AVG)
        for (int i = 0; i < n; i++) values[i] /= g->size;
#endif
    (void)c, (void)values, (void)n, (void)op;
}

static void comm_barrier(Comm* c, Group* g) {
    double x = 0.0;
    comm_all_reduce_host(c, g, &x, 1, REDUCE_SUM);
}

// A barrier where ranks wait for one another's file I/O (a checkpoint being written, a model being
// read): under the long --io-timeout, since writing gigabytes to network storage is no dead peer.
static void comm_barrier_io(Comm* c, Group* g) {
    c->waiting_io = 1;
    comm_barrier(c, g);
    c->waiting_io = 0;
}
