/*
 * saving.h: what every model file a run writes must pass, and the final model (--save-model). A model
 * that is not finite is never written (the run has diverged: every rank ends, the newest checkpoint
 * stays the last good one); a finite one that bf16 cannot hold is not written as bf16. Checkpoints
 * (train_gpt.cu's save_checkpoint) go through the same check, and through prepare_checkpoint_save.
 */
#pragma once

#include <sys/stat.h>  // mkdir

#include "comm.h"        // Comm, end_diverged, end_every_rank, comm_barrier_io
#include "fault.h"       // fault_delay
#include "model_file.h"  // find_nonfinite_param, find_bf16_overflow_param, model_file_write_version
#include "run_config.h"  // TrainConfig
#include "state_file.h"  // RunState, run_state_error

// Before any model file is written: the whole model after `step` steps (the same on every rank) must be
// finite. (A finite gradient norm does not rule out an update that overflows, e.g. a huge weight decay.)
static void check_finite_before_save(Comm* comm, const GPT2Config* c, const float* master, long long step) {
    char where[160], what[200];
    if (!find_nonfinite_param(c, master, where, sizeof(where))) return;
    snprintf(what, sizeof(what), "parameter %s", where);
    end_diverged(comm, step, what, 1);
}

// --save-model: the final model (file order, the same on every rank), after checking it as a checkpoint's
// is checked, written by rank 0 in --save-model-dtype's version
static void save_final_model(Comm* comm, const TrainConfig* tc, const GPT2Config* c, const float* params) {
    check_finite_before_save(comm, c, params, tc->stop_after > 0 && tc->stop_after < tc->steps ? tc->stop_after : tc->steps);
    char where[160], msg[4400];
    if (tc->save_model_version == 5 && find_bf16_overflow_param(c, params, where, sizeof(where))) {
        // a finite model that bf16 cannot hold: refused as a non-finite one is (the same on every rank),
        // and whatever file is at the path stays as it was
        snprintf(msg, sizeof(msg), "--save-model-dtype bf16: parameter %s is beyond bf16's range (it would round to "
                 "infinity); '%s' was not written (--save-model-dtype fp32 can hold it)", where, tc->save_model);
        end_every_rank(comm, msg);
    }
    if (comm->world_rank == 0) {
        fault_delay(tc->fault.slow_save);  // testing: slow storage
        model_file_write_version(tc->save_model, c, params, tc->save_model_version);
        if (!tc->quiet) printf("wrote %s\n", tc->save_model);
    }
    // The other ranks wait here for rank 0's write, under --io-timeout as a checkpoint's do: going on,
    // they waited in the next collective (finalize, at the latest) under --comm-timeout, and a slow
    // write ended the job, rank 0 with it, halfway through the file.
    comm_barrier_io(comm, &comm->world);
}

// Before a checkpoint is written into dir: a checkpoint that a resume would refuse is not written at all
// (the state is the same on every rank): written, it would become the newest, and --keep-last would
// delete the good ones before it. Then rank 0 makes the folder, for everyone.
static void prepare_checkpoint_save(Comm* comm, const char* dir, const RunState* state) {
    char why[256], msg[400];
    if (run_state_error(state, why, sizeof(why))) {
        snprintf(msg, sizeof(msg), "the checkpoint of step %lld was not written: a resume would refuse its state (%s)", state->step, why);
        end_every_rank(comm, msg);
    }
    if (comm->world_rank == 0 && mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("cannot create checkpoint folder '%s': %s", dir, strerror(errno));
    comm_barrier_io(comm, &comm->world);  // the folder exists for everyone
}
