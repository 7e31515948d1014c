/*
 * run_identity.h: a run's identity and its ownership of the checkpoint folder. A run that starts from
 * scratch draws a random id, which its checkpoints keep through every resume (llmc/state_file.h); a run
 * saves into a folder only if the checkpoints there are its own and none is from its future (a rollback).
 * Also the start-up check of every output path, and the checkpoint a stop signal asks for.
 */
#pragma once

#include "checkpoint.h"   // checkpoint_steps, checkpoint_complete, delete_checkpoint_files
#include "comm.h"         // Comm, comm_all_reduce_host
#include "run_config.h"   // TrainConfig
#include "stop_signal.h"  // stop_signal_name, EXIT_STOPPED_BY_SIGNAL

// A random identity for a run that starts from scratch (kept in its checkpoints and through every
// resume, see llmc/state_file.h): drawn by rank 0, shared with every rank in 16-bit pieces (exact as
// doubles). Never 0, which stands for "unknown" (version 1 state files).
static uint64_t new_run_id(Comm* comm) {
    uint64_t id = 0;
    if (comm->world_rank == 0) {
        FILE* f = fopen("/dev/urandom", "rb");
        if (f == NULL || fread(&id, sizeof(id), 1, f) != 1) id = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
        if (f != NULL) fclose(f);
        if (id == 0) id = 1;
    }
    double parts[4];
    for (int i = 0; i < 4; i++) parts[i] = (double)((id >> (16 * i)) & 0xffff);
    comm_all_reduce_host(comm, &comm->world, parts, 4, REDUCE_SUM);  // the other ranks add 0
    id = 0;
    for (int i = 0; i < 4; i++) id |= (uint64_t)parts[i] << (16 * i);
    return id;
}

// A run saves into its checkpoint folder only if every checkpoint already there is its own: after
// another run's checkpoints, a later --resume would continue whichever run saved the newest step. Nor
// may the folder hold a complete checkpoint of its own run after start_step, the step it starts from:
// that is a later part of the same run (a rollback resumes an older copy into the original folder), which
// its saves would overwrite step by step with another branch, leaving a mix whose newest step a later
// --resume would continue. An incomplete one after start_step is what a crash during a save left (a
// requeue resumes from the step before it): no resume can read it, and this run writes that step anew.
//
// An incomplete checkpoint of another run is no checkpoint either: no resume can read it, so no later
// --resume can continue that run from it. It is what a kill during a run's first save leaves (a fresh
// start draws a new run id, so its requeue finds "another run's" files); refusing it would refuse that
// requeue forever. It is deleted instead of being left: were this run to save the same step and be
// killed midway, that run's files mixed with this one's could look complete (a resume then refuses
// them, and the folder is stuck again). Deleting is safe because it happens only when the folder holds
// no complete checkpoint of another run (else this run is refused, and nothing is touched): that run
// has nothing here to continue from. (A second job saving into the same folder at the same time is
// not something a start-up check can prevent, nor was it before.) With `clean` 0 nothing is deleted and
// the first conflict is returned in msg (NULL: none), for a warning.
static const char* checkpoint_dir_conflict(const char* dir, uint64_t run_id, long long start_step, int clean, char* msg, size_t cap) {
    long long* steps;
    int n = checkpoint_steps(dir, &steps), n_debris = 0;
    long long* debris = (long long*)malloc_check((n > 0 ? n : 1) * sizeof(long long));
    const char* conflict = NULL;
    for (int i = 0; i < n && conflict == NULL; i++) {  // newest first
        char path[4200];
        int header[HEADER_INTS];
        long long size;
        snprintf(path, sizeof(path), "%s/state_%08lld_00000.bin", dir, steps[i]);
        FILE* f = open_with_header(path, STATE_MAGIC, "training state file", header, &size);
        fclose(f);
        uint64_t id = header[1] >= 2 ? get_u64(header + 33) : 0;
        int complete = checkpoint_complete(dir, steps[i]);
        if (!complete && id != run_id) debris[n_debris++] = steps[i];
        else if (complete && id != run_id)
            snprintf(msg, cap, "--checkpoint-dir '%s' holds checkpoints of another run (step %lld): continue that run with --resume, "
                     "or save into another folder", dir, steps[i]), conflict = msg;
        else if (complete && steps[i] > start_step)
            snprintf(msg, cap, "--checkpoint-dir '%s' holds checkpoints of this run after step %lld, where it resumes (the newest: "
                     "step %lld): its saves would mix a second branch into them, and the next --resume there would continue the old "
                     "branch's newest step; save into another --checkpoint-dir, or move or delete the checkpoints after step %lld",
                     dir, start_step, steps[i], start_step), conflict = msg;
    }
    if (conflict == NULL && clean)
        for (int i = 0; i < n_debris; i++) {
            printf("--checkpoint-dir '%s': deleting the incomplete checkpoint of step %lld that another run's interrupted save left\n",
                   dir, debris[i]);
            delete_checkpoint_files(dir, debris[i]);
        }
    free(steps), free(debris);
    return conflict;
}

// Refuses a run's saving into dir when checkpoint_dir_conflict finds a conflict; else clears the debris.
static void check_checkpoint_dir_owner(const char* dir, uint64_t run_id, long long start_step) {
    char msg[1600];
    if (checkpoint_dir_conflict(dir, run_id, start_step, 1, msg, sizeof(msg))) fatal("%s", msg);
}

// Every output path fails now if it cannot be written, not at its first write after hours of training.
// A run that trains can be stopped by a signal, which saves a checkpoint into --checkpoint-dir even
// without --save-every: found unusable only then, after hours of training, the run would end with
// nothing saved. So the folder is checked for every run that trains; it is created only for a run that
// means to save (the default "checkpoints" of a run that is never stopped is never made).
static void check_output_paths(const TrainConfig* tc, int main_rank) {
    if (tc->save_every > 0 || tc->stop_after > 0) check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir", 1, CHECKPOINT_NAME_MAX);
    else if (tc->steps > 0) check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir (where a stop signal saves)", 2, CHECKPOINT_NAME_MAX);
    if (tc->save_model && main_rank) check_writable_file(tc->save_model, "--save-model", strlen(".tmp"));
    if (tc->trace) check_writable_file(tc->trace, "--trace", strlen(".rank") + 7);  // every rank writes its part next to it
}

// A signal stops the run after the current step with a checkpoint (llmc/stop_signal.h). Its folder was
// checked at the start only if the run meant to save: otherwise it is checked now, before the save.
static void prepare_signal_checkpoint(const TrainConfig* tc, uint64_t run_id, long long start_step) {
    if (tc->save_every > 0 || tc->stop_after > 0) return;
    check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir", 1, CHECKPOINT_NAME_MAX);
    check_checkpoint_dir_owner(tc->checkpoint_dir, run_id, start_step);
}

// After the checkpoint of a run stopped by a signal: one line saying so, and the exit code to come.
static void report_signal_stop(const TrainConfig* tc, Comm* comm, int sig, long long step) {
    stop_signal_ended_run = 1;
    if (comm->world_rank == 0)
        printf("stopped by %s after step %lld: checkpoint saved in '%s'; continue with --resume %s (exit code %d)\n",
               stop_signal_name(sig), step, tc->checkpoint_dir, tc->checkpoint_dir, EXIT_STOPPED_BY_SIGNAL);
}

// Before the loop, for the checkpoint folder: a run that means to save (--save-every, --stop-after) must own
// it (check_checkpoint_dir_owner; its saves begin after start_step, where it resumes); a run that saves only
// if a stop signal comes is warned now of a conflict that would refuse that save then.
static void claim_checkpoint_dir(const TrainConfig* tc, uint64_t run_id, long long start_step, int main_rank) {
    if (tc->save_every > 0 || tc->stop_after > 0) {
        check_checkpoint_dir_owner(tc->checkpoint_dir, run_id, start_step);
    } else if (tc->steps > 0 && main_rank) {
        char msg[1600];
        if (checkpoint_dir_conflict(tc->checkpoint_dir, run_id, start_step, 0, msg, sizeof(msg)))
            fprintf(stderr, "warning: a stop signal could not checkpoint this run: %s\n", msg);
    }
}
