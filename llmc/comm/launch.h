/*
 * comm/launch.h: start-up and shutdown of llmc/comm.h: who am I, which grid, which engine.
 *
 * comm_init finds this rank's place from the launcher (mpirun; torchrun's RANK / WORLD_SIZE /
 * LOCAL_RANK, also where srun or mpirun started torchrun; a task of srun's SLURM_PROCID /
 * SLURM_STEP_NUM_TASKS / SLURM_LOCALID), lays the ranks out
 * on the dp x tp x pp grid (tp fastest, then dp, then pp), picks this rank's GPU and the engine, and
 * creates the groups in that engine (mpi_engine.h, nccl_engine.h). comm_finalize undoes it, after the
 * communication in flight is done.
 */
#pragma once

#include <limits.h>  // INT_MIN, INT_MAX
#include <sched.h>   // sched_getaffinity, CPU_COUNT

#include "../common.h"    // fatal, errno
#include "../device.h"    // cudaCheck (the GPU target)
#include "mpi_engine.h"   // mpi_start, mpi_agree_engine, mpi_split_groups, mpi_flush, mpi_finish
#include "nccl_engine.h"  // nccl_start, nccl_finish, gpu_uuid
#include "staging.h"      // stage_bytes_setting, staging_free
#include "types.h"        // Comm, Engine, NCCL_BUILT, g_comm

// A launcher's variable that holds a count or an index. Not atoi: RANK=abc would read as rank 0, and
// two ranks 0 end with a message about something else (the port already in use, a rank that never joins).
static int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    if (v == NULL) return fallback;
    char* end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < INT_MIN || x > INT_MAX)
        fatal("%s is '%s': not a number", name, v);
    return (int)x;
}

// CPU target: the ranks of one node share its cores. Unless OMP_NUM_THREADS says otherwise, each rank
// runs (the cores it may use) / (ranks on the node) OpenMP threads, at least 1: OpenMP's default, every
// core per rank, oversubscribes the node local_size times over and runs several times slower.
#if defined(LLMC_CPU) && defined(_OPENMP)
#include <omp.h>  // omp_set_num_threads
static void set_default_threads(int local_size) {
    if (getenv("OMP_NUM_THREADS") != NULL) return;
    cpu_set_t mask;
    long cores = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : sysconf(_SC_NPROCESSORS_ONLN);
    long threads = cores / local_size;
    omp_set_num_threads(threads > 0 ? (int)threads : 1);
}

// OMP_NUM_THREADS as given is taken, but bounded: OpenMP starts that many threads at the first parallel
// loop, and some ten thousand of them exhaust the process's memory maps and crash it inside the OpenMP
// runtime (a segfault, not an error). No machine this runs on has as many cores per rank as the bound.
// A list ("8,2", threads per nesting level) is bounded by its first, the only level used here. (A value
// that is no number is the runtime's to report: it warns and uses its default.)
enum { MAX_OMP_THREADS = 1024 };
static void check_omp_threads(void) {
    const char* v = getenv("OMP_NUM_THREADS");
    if (v == NULL) return;
    char* end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (end == v || (*end != '\0' && *end != ',')) return;
    if (errno == ERANGE || n > MAX_OMP_THREADS)
        fatal("OMP_NUM_THREADS=%ld is more than %d threads per rank (this machine has %ld cores): set it to at most "
              "the cores per rank, or unset it", n, MAX_OMP_THREADS, sysconf(_SC_NPROCESSORS_ONLN));
}
#else
static void set_default_threads(int local_size) { (void)local_size; }  // (the GPU target: one host thread)
static void check_omp_threads(void) {}
#endif

// Whether this process is an MPI rank: started by mpirun (Open MPI's OMPI_COMM_WORLD_*, the PMI_* of
// MPICH's Hydra and of srun --mpi=pmi2, the PMIX_RANK of srun --mpi=pmix). A launcher's variables pass to
// everything it starts: when srun or mpirun runs torchrun, torchrun's workers see them beside torchrun's
// own RANK / WORLD_SIZE / LOCAL_RANK. Those are the more specific (they describe this process; the MPI
// ones, the torchrun that started it), so they decide, and MPI is not started: under PMIx it would make
// each worker a world of its own, training alone. Unless they contradict an MPI world of several
// processes, whose size is known (Open MPI, PMI; PMIx tells it only through its library): a torchrun in
// each makes WORLD_SIZE = processes x LOCAL_WORLD_SIZE and sets RANK; anything else is a WORLD_SIZE left
// in the environment (a shell, a job script) with no telling which world is meant, and the launch is
// refused, in one line from MPI rank 0 (the others end without one).
static int launched_by_mpirun(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("PMIX_RANK") && !getenv("MPI_LOCALNRANKS"))
        return 0;
    if (!getenv("WORLD_SIZE")) return 1;
    const char* size_var = getenv("OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE"
                                                          : getenv("PMI_SIZE") ? "PMI_SIZE" : NULL;
    int processes = size_var ? env_int(size_var, 1) : 1;
    int world = env_int("WORLD_SIZE", 1), local = env_int("LOCAL_WORLD_SIZE", 1);
    if (processes <= 1 || (world == processes * local && getenv("RANK"))) return 0;  // torchrun's world
    if (env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", 0)) != 0) {
        sleep(2);  // (rank 0 says why first: mpirun ends the other processes once one exits with an error)
        exit(1);
    }
    if (world != processes * local)
        fatal("the launchers disagree: %s=%d MPI processes, but WORLD_SIZE=%d is not %d x LOCAL_WORLD_SIZE=%d, as a "
              "torchrun in each would make: unset the variables of the launcher not in use",
              size_var, processes, world, processes, local);
    fatal("the launchers disagree: %s=%d MPI processes, and WORLD_SIZE=%d without torchrun's RANK: unset the variables "
          "of the launcher not in use", size_var, processes, world);
}

// This rank's place in the world and on its node, from the launcher (one rank when there is none).
// Returns whether MPI was started.
static int comm_discover_ranks(Comm* c, int* argc, char*** argv) {
    c->world_size = 1;
    if (launched_by_mpirun()) {
        mpi_start(c, argc, argv);
        return 1;
    }
    if (getenv("WORLD_SIZE")) {  // torchrun
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
    return 0;
}

// the grid: this rank's coordinates and the size and rank of each of its groups
static void comm_set_grid(Comm* c, int dp) {
    if (c->world_size % (c->tp * c->pp) != 0)
        fatal("world size %d is not divisible by tp x pp = %d x %d", c->world_size, c->tp, c->pp);
    c->dp = dp > 0 ? dp : c->world_size / (c->tp * c->pp);
    if (c->dp * c->tp * c->pp != c->world_size)
        fatal("world size %d does not equal dp x tp x pp = %d x %d x %d", c->world_size, c->dp, c->tp, c->pp);
    c->tp_rank = c->world_rank % c->tp;
    c->dp_rank = (c->world_rank / c->tp) % c->dp;
    c->pp_rank = c->world_rank / (c->tp * c->dp);
    c->world.name = "world";
    c->dp_group.name = "DP";
    c->tp_group.name = "TP";
    c->pp_group.name = "PP";
    c->emb_group.name = "embedding";
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
}

// GPU target: the ranks of a node take its GPUs in turn (more ranks than GPUs: they share)
static void comm_select_gpu(int local_rank) {
#ifndef LLMC_CPU
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    if (devices == 0) fatal("no GPU found");
    cudaCheck(cudaSetDevice(local_rank % devices));
#else
    (void)local_rank;
#endif
}

// engine: "auto", "mpi" or "nccl". Under mpirun the ranks compare the GPUs they use (by UUID, within
// each node) and agree on the engine in one collective. Without MPI there is nothing to compare with
// before NCCL exists: NCCL it is, and NCCL itself refuses a GPU used twice (an error, within the deadline).
static Engine comm_choose_engine(Comm* c, const char* engine, int use_mpi) {
    if (!NCCL_BUILT) {
        if (strcmp(engine, "nccl") == 0)
            fatal("--comm nccl: this build has no NCCL (the CPU target, or nccl.h was not found)");
        if (!use_mpi)  // (named: under mpirun too, torchrun's variables count, see launched_by_mpirun)
            fatal("several ranks need mpirun in a build without NCCL (%s says %d)",
                  getenv("WORLD_SIZE") ? "torchrun's WORLD_SIZE" : "srun's SLURM_STEP_NUM_TASKS", c->world_size);
        return ENGINE_MPI;
    }
    int sharing = 0;
    if (use_mpi) {
        char uuid[16];
        gpu_uuid(uuid);
        sharing = mpi_agree_engine(c, uuid, engine);
    }
    Engine e = sharing ? ENGINE_MPI : ENGINE_NCCL;
    if (strcmp(engine, "nccl") == 0) {
        if (sharing) fatal("--comm nccl: ranks on one node share a GPU; NCCL needs one GPU per rank (use --comm mpi)");
        e = ENGINE_NCCL;
    } else if (strcmp(engine, "mpi") == 0) {
        e = ENGINE_MPI;
    }
    if (e == ENGINE_MPI && !use_mpi) fatal("the MPI engine needs a launch by mpirun");
    return e;
}

// dp: 0 means world_size / (tp * pp). timeout_s, io_timeout_s: the deadlines of waits on other ranks,
// and of waits around file I/O (seconds, 0: none).
static void comm_init(Comm* c, int* argc, char*** argv, int dp, int tp, int pp, const char* engine,
                      const char* nccl_id_dir, double timeout_s, double io_timeout_s) {
    memset(c, 0, sizeof(*c));
    c->tp = tp;
    c->pp = pp;
    c->timeout_s = timeout_s;  // (MPI_Init already waits under --comm-timeout)
    c->io_timeout_s = io_timeout_s;
    int use_mpi = comm_discover_ranks(c, argc, argv);
    if (c->world_rank < 0 || c->world_rank >= c->world_size)
        fatal("rank %d is outside the world size %d", c->world_rank, c->world_size);
    set_default_threads(c->local_size > 0 ? c->local_size : 1);
    comm_set_grid(c, dp);
    if (c->world_size == 1) {
        c->engine = ENGINE_NONE;
        return;
    }
    comm_select_gpu(c->local_rank);
    c->engine = comm_choose_engine(c, engine, use_mpi);
    if (c->engine == ENGINE_NCCL) nccl_start(c, use_mpi, nccl_id_dir);
    const char* strict = getenv("LLMC_COMM_STRICT");
    c->strict = c->engine == ENGINE_MPI && strict != NULL && strcmp(strict, "0") != 0;
    if (c->engine == ENGINE_MPI) c->stage_bytes = stage_bytes_setting();
    if (use_mpi) mpi_split_groups(c);
}

static void comm_finalize(Comm* c) {
    mpi_flush(c);
    free(c->queue);
    c->queue = NULL;
    staging_free(c->staging);
    c->staging = NULL;
    for (int i = 0; i < 2; i++) {
        free(c->host_copy[i].ptr);
        c->host_copy[i].ptr = NULL;
        c->host_copy[i].cap = 0;
    }
    if (c->engine == ENGINE_NCCL) nccl_finish(c);
    mpi_finish(c);
    g_comm = NULL;
}
