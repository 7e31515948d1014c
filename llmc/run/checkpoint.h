/*
 * checkpoint.h: the checkpoint folder and what is written into it.
 *   - which steps the folder holds, whether a checkpoint is complete, the newest one to resume from, and
 *     --keep-last's pruning of older ones;
 *   - the run's identity and its ownership of the folder: a run that starts from scratch draws a random
 *     id, which its checkpoints keep through every resume (llmc/run/state_file.h); a run saves into a
 *     folder only if the checkpoints there are its own and none is from its future (a rollback); and the
 *     start-up check of every output path;
 *   - what every model file a run writes must pass, and the final model (--save-model): a model that is
 *     not finite is never written (the run has diverged: every rank ends, the newest checkpoint stays the
 *     last good one); a finite one that bf16 cannot hold is not written as bf16.
 * train_gpt.cu's save_checkpoint writes a checkpoint (it reads the model) through the checks here.
 *
 * A checkpoint of step S is the model file model_<S>.bin (llmc/model_file.h, version 3: the fp32 master
 * weights) and the state shards state_<S>_<shard>.bin (llmc/run/state_file.h), <S> at least 8 digits and
 * <shard> 5. A save writes the model, then the shards, each atomically (llmc/run/atomic_file.h), so a
 * checkpoint whose files are all there is whole.
 */
#pragma once

#include <dirent.h>
#include <sys/stat.h>  // mkdir

#include "../comm.h"        // Comm, comm_all_reduce_host, end_diverged, end_every_rank, comm_barrier_io
#include "../common.h"      // fatal, checked file calls
#include "../model_file.h"  // model_file_read, find_nonfinite_param, model_file_write_version
#include "config.h"         // TrainConfig
#include "fault.h"          // fault_due
#include "state_file.h"     // RunState, state_file_read, ranges_cover, run_state_error

// The longest name written into a checkpoint folder, with its slash: "/state_<step>_<shard>.bin.tmp",
// the step up to 18 digits (checkpoint_steps), the shard 5. Start-up checks that the folder's path and it
// fit (check_writable_dir).
#define CHECKPOINT_NAME_MAX (strlen("/state__.bin.tmp") + 18 + 5)

static int compare_steps_descending(const void* a, const void* b) {
    long long x = *(const long long*)a, y = *(const long long*)b;
    return x > y ? -1 : x < y;
}

// The step in a checkpoint file's name: model_<step>.bin or state_<step>_<shard>.bin, with or without
// the ".tmp" of an unfinished write; -1 for any other name. Only the exact names this program writes
// count (the step as "%08lld" writes it, the shard as "%05d"), so that --keep-last and the clean-up of
// an interrupted save never delete a file that merely looks like a checkpoint: "model_5.bin",
// "model_000000005.bin", "model_00000005.bin.bak" or "state_00000005_1.bin" are the user's, not ours.
// *shard: the state shard (-1 for a model file); *tmp: whether the name ends in ".tmp".
static long long checkpoint_file_step(const char* name, int* shard, int* tmp) {
    int is_state = strncmp(name, "state_", 6) == 0;
    if (!is_state && strncmp(name, "model_", 6) != 0) return -1;
    const char* p = name + 6;
    size_t digits = 0;
    while (p[digits] >= '0' && p[digits] <= '9') digits++;
    if (digits < 8 || digits > 18 || (digits > 8 && p[0] == '0')) return -1;  // not what "%08lld" writes
    long long step = strtoll(p, NULL, 10);
    p += digits;
    *shard = -1;
    if (is_state) {
        if (p[0] != '_') return -1;
        p++;
        for (digits = 0; p[digits] >= '0' && p[digits] <= '9'; digits++) {}
        if (digits < 5 || digits > 8 || (digits > 5 && p[0] == '0')) return -1;  // not what "%05d" writes
        *shard = (int)strtol(p, NULL, 10);
        if (*shard >= (1 << 24)) return -1;  // more shards than a checkpoint can have
        p += digits;
    }
    *tmp = strcmp(p, ".bin.tmp") == 0;
    return *tmp || strcmp(p, ".bin") == 0 ? step : -1;
}

// The steps of the checkpoints in dir (those with a first state shard, state_<step>_00000.bin, by its
// exact name: checkpoint_file_step), newest first; *steps is malloc'ed. The folder is listed with
// readdir, not matched with a glob pattern, so any character in its name is taken literally ("ck[1]"),
// and steps are compared as numbers (names of steps at or above 1e8 have more than 8 digits). A folder
// that does not exist holds none.
static int checkpoint_steps(const char* dir, long long** steps) {
    int n = 0, cap = 16;
    *steps = (long long*)malloc_check(cap * sizeof(long long));
    DIR* d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) return 0;
        fatal("cannot list checkpoint folder '%s': %s", dir, strerror(errno));
    }
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        int shard, tmp;
        long long step = checkpoint_file_step(e->d_name, &shard, &tmp);
        if (step < 0 || shard != 0 || tmp) continue;
        if (n == cap) *steps = (long long*)realloc_check(*steps, (cap *= 2) * sizeof(long long));
        (*steps)[n++] = step;
    }
    closedir(d);
    qsort(*steps, n, sizeof(long long), compare_steps_descending);
    return n;
}

// Whether the checkpoint of `step` in dir is complete: its model file and every state shard (as many as
// its first shard says) are there. (A save writes the model, then the shards, each atomically.)
static int checkpoint_complete(const char* dir, long long step) {
    char path[4200];
    int header[HEADER_INTS];
    long long size;
    snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, step);
    if (access(path, R_OK) != 0) return 0;
    snprintf(path, sizeof(path), "%s/state_%08lld_00000.bin", dir, step);
    FILE* f = open_with_header(path, STATE_MAGIC, "training state file", header, &size);
    fclose(f);
    if (header[23] < 1 || header[23] > (1 << 24)) fatal("'%s': bad number of shards %d", path, header[23]);
    for (int s = 1; s < header[23]; s++) {
        snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, step, s);
        if (access(path, R_OK) != 0) return 0;
    }
    return 1;
}

// Whether the checkpoint of `step` in dir is complete and its first state shard's run fields are in
// range (run_state_error: what a resume checks of them), so that a resume would not refuse it for its
// header. One header read, cheap enough for --keep-last to ask of every checkpoint it keeps.
static int checkpoint_resumable(const char* dir, long long step) {
    if (!checkpoint_complete(dir, step)) return 0;
    char path[4200], why[256];
    int header[HEADER_INTS];
    long long size;
    snprintf(path, sizeof(path), "%s/state_%08lld_00000.bin", dir, step);
    FILE* f = open_with_header(path, STATE_MAGIC, "training state file", header, &size);
    fclose(f);
    RunState s;
    uint64_t n, n_ranges;
    state_header_decode(header, &s, &n, &n_ranges);
    return run_state_error(&s, why, sizeof(why)) == NULL;
}

// The step of the newest complete checkpoint in dir, or -1 if there is none (or no such folder).
static long long newest_complete_checkpoint(const char* dir) {
    long long* steps;
    int n = checkpoint_steps(dir, &steps);
    long long found = -1;
    for (int i = 0; i < n && found < 0; i++)
        if (checkpoint_complete(dir, steps[i])) found = steps[i];
    free(steps);
    return found;
}

// Deletes every file of the checkpoint of `step` in dir (model, state shards, and the ".tmp" files of an
// unfinished write). Several ranks may delete the same files of a shared folder: one already gone is no
// error. A file that cannot be deleted is reported, and the caller goes on.
static void delete_checkpoint_files(const char* dir, long long step) {
    DIR* d = opendir(dir);
    if (d == NULL) fatal("cannot list checkpoint folder '%s': %s", dir, strerror(errno));
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        int shard, tmp;
        if (checkpoint_file_step(e->d_name, &shard, &tmp) != step) continue;
        char path[4400];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT)
            fprintf(stderr, "warning: cannot delete '%s': %s\n", path, strerror(errno));
    }
    closedir(d);
}

// Whether `step` is in the sorted list steps[0..n)
static int step_listed(const long long* steps, int n, long long step) {
    return n > 0 && bsearch(&step, steps, n, sizeof(long long), compare_steps_descending) != NULL;
}

// --keep-last: after the checkpoint of step `saved` is complete, keeps it and the keep-1 newest
// resumable checkpoints before it, and deletes every checkpoint file of an older step (all its shards,
// and what an interrupted save left). Newer steps (left by a run that crashed before a resume) are not
// touched. Only resumable checkpoints count as kept, and nothing is deleted unless the one just saved
// reads back as resumable: pruning never removes the last checkpoint a resume would accept. A file that
// cannot be deleted is reported and training goes on: it costs space, not correctness.
// What is deleted is only what a save of ours writes: files named exactly so (checkpoint_file_step),
// and of those a model file only where its step has a state shard too. A model_<step>.bin alone is not
// a checkpoint (a save writes the model first, but so may a user's --save-model into the folder), and
// a model lost is worse than the space kept; a ".tmp" of our exact name is an unfinished write of ours.
static void prune_checkpoints(const char* dir, long long saved, int keep) {
    if (!checkpoint_resumable(dir, saved)) {  // (a save checks its state first: this is the read-back)
        fprintf(stderr, "warning: --keep-last: the checkpoint of step %lld in '%s' does not read back as "
                "resumable; nothing deleted\n", saved, dir);
        return;
    }
    long long* steps;
    int n = checkpoint_steps(dir, &steps), kept = 1;  // the one just saved
    long long oldest_kept = saved;
    for (int i = 0; i < n && kept < keep; i++)  // newest first
        if (steps[i] < saved && checkpoint_resumable(dir, steps[i])) {
            oldest_kept = steps[i];
            kept++;
        }
    free(steps);
    // the older steps with a state shard of any number (written, or being written: a rank's shard may
    // land before the first one), listed before anything is deleted
    int n_state = 0, cap = 16, shard, tmp;
    long long* state_steps = (long long*)malloc_check(cap * sizeof(long long));
    DIR* d = opendir(dir);
    if (d == NULL) fatal("cannot list checkpoint folder '%s': %s", dir, strerror(errno));
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        long long step = checkpoint_file_step(e->d_name, &shard, &tmp);
        if (step < 0 || step >= oldest_kept || shard < 0) continue;
        if (n_state == cap) state_steps = (long long*)realloc_check(state_steps, (cap *= 2) * sizeof(long long));
        state_steps[n_state++] = step;
    }
    qsort(state_steps, n_state, sizeof(long long), compare_steps_descending);
    rewinddir(d);
    long long deleted_newest = -1;
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        long long step = checkpoint_file_step(e->d_name, &shard, &tmp);
        if (step < 0 || step >= oldest_kept || (!tmp && !step_listed(state_steps, n_state, step))) continue;
        char path[4400];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) fprintf(stderr, "warning: --keep-last: cannot delete '%s': %s\n", path, strerror(errno));
        else if (step > deleted_newest) deleted_newest = step;
    }
    closedir(d);
    free(state_steps);
    if (deleted_newest >= 0)
        printf("--keep-last %d: deleted the checkpoints before step %lld in '%s'\n", keep, oldest_kept, dir);
}
// Reads the newest complete checkpoint in dir: its model file into *params (file order) and the
// optimizer state of all its shards into *m, *v (file order). A checkpoint whose files are not all
// there (a crash during a save) is skipped for the one before it. Every shard must be the one its name
// says, of the same checkpoint and run, and together the shards must cover the model (version 2:
// exactly once; see llmc/run/state_file.h).
static void load_checkpoint(const char* dir, RunState* state, GPT2Config* config, float** params, float** m,
                            float** v) {
    char path[4200], first_path[4200], why[256];
    long long* steps;
    int n_steps = checkpoint_steps(dir, &steps);
    if (n_steps == 0) fatal("no checkpoint (state_*_00000.bin) found in '%s'", dir);
    for (int i = 0; i < n_steps; i++) {
        long long step = steps[i];
        snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, step);
        if (access(path, R_OK) != 0) {
            printf("checkpoint at step %lld in '%s' is incomplete; trying an older one\n", step, dir);
            continue;
        }
        // the model's sizes first (its header, checked against its length): every shard must have the
        // same, so no shard can size the moment arrays, or write past them, beyond what the model needs
        GPT2Config model_config;
        model_file_read(path, &model_config, NULL);
        int complete = 1;
        *m = *v = NULL;
        RunState first;
        RangeList covered = {.pairs = NULL, .n = 0, .cap = 0};
        snprintf(first_path, sizeof(first_path), "%s/state_%08lld_00000.bin", dir, step);
        state_file_read(first_path, &model_config, &first, m, v, &covered);
        for (int s = 1; complete && s < first.num_shards; s++) {
            snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, step, s);
            complete = access(path, R_OK) == 0;
        }
        if (!complete) {
            printf("checkpoint at step %lld in '%s' is incomplete; trying an older one\n", step, dir);
            free(*m);
            free(*v);
            free(covered.pairs);
            continue;
        }
        for (int s = 0; s < first.num_shards; s++) {
            snprintf(path, sizeof(path), "%s/state_%08lld_%05d.bin", dir, step, s);
            if (s > 0) state_file_read(path, &model_config, state, m, v, &covered);
            else *state = first;
            if (state->shard != s || state->step != step)
                fatal("'%s' holds shard %d of step %lld, not what its name says (a copied or renamed file?)", path,
                      state->shard, state->step);
            if (state->model_hash != first.model_hash || state->num_shards != first.num_shards ||
                state->run_id != first.run_id || state->version != first.version || state->data_hash != first.data_hash)
                fatal("'%s' does not belong to the same checkpoint as '%s'", path, first_path);
        }
        if (!ranges_cover(&covered, gpt2_num_parameters(&first.config), first.version >= 2, why, sizeof(why)))
            fatal("the optimizer state shards of step %lld in '%s' do not cover the model: %s", step, dir, why);
        free(covered.pairs);
        *state = first;
        snprintf(path, sizeof(path), "%s/model_%08lld.bin", dir, step);
        uint64_t hash = model_file_read(path, config, params);
        if (hash != state->model_hash)
            fatal("'%s' is not the model saved with its state file (checksum mismatch)", path);
        if (memcmp(config, &state->config, sizeof(*config)) != 0)
            fatal("'%s' does not match the sizes in its state file", path);
        free(steps);
        return;
    }
    fatal("no complete checkpoint found in '%s'", dir);
}

// ----------------------------------------------------------------------------------------------------
// the run's identity and its ownership of the folder

// A random identity for a run that starts from scratch (kept in its checkpoints and through every
// resume, see llmc/run/state_file.h): drawn by rank 0, shared with every rank in 16-bit pieces (exact as
// doubles). Never 0, which stands for "unknown" (version 1 state files).
static uint64_t new_run_id(Comm* comm) {
    uint64_t id = 0;
    if (comm->world_rank == 0) {
        FILE* f = fopen("/dev/urandom", "rb");
        if (f == NULL || fread(&id, sizeof(id), 1, f) != 1)
            id = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
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
static const char* checkpoint_dir_conflict(const char* dir, uint64_t run_id, long long start_step, int clean, char* msg,
                                           size_t cap) {
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
        else if (complete && id != run_id) {
            snprintf(msg, cap, "--checkpoint-dir '%s' holds checkpoints of another run (step %lld): continue that "
                     "run with --resume, or save into another folder", dir, steps[i]);
            conflict = msg;
        } else if (complete && steps[i] > start_step) {
            snprintf(msg, cap, "--checkpoint-dir '%s' holds checkpoints of this run after step %lld, where it "
                     "resumes (the newest: step %lld): its saves would mix a second branch into them, and the next "
                     "--resume there would continue the old branch's newest step; save into another "
                     "--checkpoint-dir, or move or delete the checkpoints after step %lld",
                     dir, start_step, steps[i], start_step);
            conflict = msg;
        }
    }
    if (conflict == NULL && clean)
        for (int i = 0; i < n_debris; i++) {
            printf("--checkpoint-dir '%s': deleting the incomplete checkpoint of step %lld that another run's "
                   "interrupted save left\n", dir, debris[i]);
            delete_checkpoint_files(dir, debris[i]);
        }
    free(steps);
    free(debris);
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
    if (tc->save_every > 0 || tc->stop_after > 0)
        check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir", 1, CHECKPOINT_NAME_MAX);
    else if (tc->steps > 0)
        check_writable_dir(tc->checkpoint_dir, "--checkpoint-dir (where a stop signal saves)", 2, CHECKPOINT_NAME_MAX);
    if (tc->save_model && main_rank) check_writable_file(tc->save_model, "--save-model", strlen(".tmp"));
    if (tc->trace)  // every rank writes its part next to it
        check_writable_file(tc->trace, "--trace", strlen(".rank") + 7);
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

// ----------------------------------------------------------------------------------------------------
// the model files a run writes

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
    check_finite_before_save(comm, c, params,
                             tc->stop_after > 0 && tc->stop_after < tc->steps ? tc->stop_after : tc->steps);
    char where[160], msg[4400];
    if (tc->save_model_version == 5 && find_bf16_overflow_param(c, params, where, sizeof(where))) {
        // a finite model that bf16 cannot hold: refused as a non-finite one is (the same on every rank),
        // and whatever file is at the path stays as it was
        snprintf(msg, sizeof(msg), "--save-model-dtype bf16: parameter %s is beyond bf16's range (it would round to "
                 "infinity); '%s' was not written (--save-model-dtype fp32 can hold it)", where, tc->save_model);
        end_every_rank(comm, msg);
    }
    if (comm->world_rank == 0) {
        fault_due(&tc->fault, FAULT_SLOW_SAVE, comm->world_rank, -1);  // testing: slow storage
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
        snprintf(msg, sizeof(msg), "the checkpoint of step %lld was not written: a resume would refuse its state (%s)",
                 state->step, why);
        end_every_rank(comm, msg);
    }
    if (comm->world_rank == 0 && mkdir(dir, 0755) != 0 && errno != EEXIST)
        fatal("cannot create checkpoint folder '%s': %s", dir, strerror(errno));
    comm_barrier_io(comm, &comm->world);  // the folder exists for everyone
}
