/*
 * agreement.h: at start, every rank checks that it runs the same job as every other rank.
 *
 * Ranks launched with different flags, different data or a different checkpoint do not fail by
 * themselves: they hang in a collective that the others never reach (--steps 2 against --steps 50),
 * abort deep inside MPI (a different --channels sends messages of another size), or train divergent
 * replicas and exit 0 (a different --lr, or node-local data folders that differ). So before its first
 * collective, each rank reduces what must match to a list of named items, each a 48-bit hash: flags
 * that define the run, model sizes, a fingerprint of each data file (name, size, and a checksum of its
 * header and first block), the resume step and the checkpoint's identity, and the environment variables
 * that change what the ranks exchange. One all-reduce of (max hash, max of minus the hash) per item
 * tells every rank, identically, which items differ; every rank then ends with exit code 1 and rank 0
 * prints one line naming the first differing item.
 *
 * Hashes are 48 bits so that they are exact as doubles (the host all-reduce works in doubles).
 */
#pragma once

#include "../comm.h"  // Comm, comm_all_reduce_host
#include <glob.h>
#include <sys/stat.h>

#define AGREE_MAX_ITEMS 64  // (2 doubles each: one host all-reduce takes at most COMM_HOST_MAX = 128)
static_assert(2 * AGREE_MAX_ITEMS <= COMM_HOST_MAX, "the agreement is one host all-reduce");
#define AGREE_HASH_MASK 0xffffffffffffull

typedef struct {
    const char* names[AGREE_MAX_ITEMS];
    uint64_t hashes[AGREE_MAX_ITEMS];
    int n;
} Agreement;

static uint64_t agree_fnv(uint64_t h, const void* data, size_t bytes) {
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
static const uint64_t AGREE_FNV_INIT = 0xcbf29ce484222325ull;

static void agree_add(Agreement* a, const char* name, uint64_t hash) {
    check_internal(a->n < AGREE_MAX_ITEMS, "too many agreement items");
    a->names[a->n] = name;
    a->hashes[a->n++] = hash & AGREE_HASH_MASK;
}
// bytes, and optionally a string (NULL and "" differ)
static void agree_bytes(Agreement* a, const char* name, const void* data, size_t bytes, const char* text) {
    uint64_t h = agree_fnv(AGREE_FNV_INIT, data, bytes);
    if (text) h = agree_fnv(agree_fnv(h, "s", 1), text, strlen(text));
    agree_add(a, name, h);
}
static void agree_int(Agreement* a, const char* name, long long v) {
    agree_add(a, name, agree_fnv(AGREE_FNV_INIT, &v, sizeof(v)));
}
static void agree_double(Agreement* a, const char* name, double v) {
    agree_add(a, name, agree_fnv(AGREE_FNV_INIT, &v, sizeof(v)));
}
static void agree_string(Agreement* a, const char* name, const char* s) {
    agree_add(a, name, s ? agree_fnv(AGREE_FNV_INIT ^ 1, s, strlen(s)) : AGREE_FNV_INIT);
}

// One file's fingerprint into h: its name (without the folder: node-local folders may differ), its size,
// and its first `block` bytes (the header and the start of the data). Reading all of it would take
// minutes for large datasets; a copy that differs only far inside is not caught.
static uint64_t agree_file(uint64_t h, const char* path) {
    const size_t block = 1 << 20;
    const char* base = strrchr(path, '/');
    base = base ? base + 1 : path;
    h = agree_fnv(h, base, strlen(base) + 1);
    struct stat st;  // not a regular file (a FIFO would block fopen): the reader says what is wrong, after the check
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return agree_fnv(h, "not a file", 10);
    FILE* f = fopen(path, "rb");
    if (f == NULL) return agree_fnv(h, "missing", 7);
    long long size = fseek(f, 0, SEEK_END) == 0 ? (long long)ftell(f) : -1;
    h = agree_fnv(h, &size, sizeof(size));
    rewind(f);
    unsigned char* buf = (unsigned char*)malloc_check(block);
    size_t got = fread(buf, 1, block, f);
    fclose(f);
    h = agree_fnv(h, buf, got);
    free(buf);
    return h;
}

// every file a glob pattern names (a single path is its own pattern), in sorted order
static void agree_files(Agreement* a, const char* name, const char* pattern) {
    uint64_t h = AGREE_FNV_INIT;
    if (pattern && pattern[0]) {
        glob_t g;
        if (glob(pattern, 0, NULL, &g) == 0) {
            for (size_t i = 0; i < g.gl_pathc; i++) h = agree_file(h, g.gl_pathv[i]);
            globfree(&g);
        } else {
            h = agree_fnv(h, "no match", 8);
        }
    }
    agree_add(a, name, h);
}

// Collective over the world: every rank calls it with the same item names, before any other collective.
// On a mismatch every rank ends here (exit 1); rank 0 says which item differs in one line.
static void agree_check(Comm* comm, const Agreement* a) {
    if (comm->world_size == 1) return;
    double v[2 * AGREE_MAX_ITEMS];
    for (int i = 0; i < a->n; i++) {
        v[2 * i] = (double)a->hashes[i];
        v[2 * i + 1] = -(double)a->hashes[i];
    }
    comm_all_reduce_host(comm, &comm->world, v, 2 * a->n, REDUCE_MAX);
    for (int i = 0; i < a->n; i++) {
        if (v[2 * i] == -v[2 * i + 1]) continue;  // max == min: every rank has the same
        if (comm->world_rank == 0)
            fprintf(stderr, "error: the ranks were started differently: %s differs between ranks (every rank must "
                    "run the same job)\n", a->names[i]);
        fflush(stdout);
        fflush(stderr);
        comm_finalize(comm);
        exit(1);
    }
}
