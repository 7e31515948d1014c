/*
 * atomic_file.h: a file written whole or not at all, for the model and state files of a checkpoint.
 *
 * Every write goes to "<path>.tmp", is flushed and fsync'ed, then renamed over <path>, so a crash in the
 * middle of a save leaves the previous file intact. The writer also keeps the FNV-1a hash of the bytes
 * written so far, which the state file stores as its checksum and the model file returns as its identity.
 */
#pragma once

#include "../common.h"  // fatal, checked file calls

typedef struct {
    FILE* f;
    char path[4096], tmp_path[4200];
    uint64_t hash;  // FNV-1a of everything written so far
} AtomicFile;

static void atomic_open(AtomicFile* a, const char* path) {
    if (strlen(path) >= sizeof(a->path)) fatal("path too long: %s", path);
    strcpy(a->path, path);
    snprintf(a->tmp_path, sizeof(a->tmp_path), "%s.tmp", path);
    a->f = fopen_check(a->tmp_path, "wb");
    a->hash = FNV1A_INIT;
}

static void atomic_write(AtomicFile* a, const void* data, size_t bytes) {
    fwrite_check(data, 1, bytes, a->f, a->tmp_path);
    a->hash = fnv1a_update(a->hash, data, bytes);
}

static void atomic_commit(AtomicFile* a) {
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) fatal("cannot flush '%s': %s", a->tmp_path, strerror(errno));
    if (fclose(a->f) != 0) fatal("cannot close '%s': %s", a->tmp_path, strerror(errno));
    if (rename(a->tmp_path, a->path) != 0)
        fatal("cannot rename '%s' to '%s': %s", a->tmp_path, a->path, strerror(errno));
}
