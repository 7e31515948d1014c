/*
 * fuzz_harness.h: what the four fuzz harnesses share (libFuzzer + AddressSanitizer + UBSan, clang).
 *
 * The readers under test take a path and end in fatal() on bad input, which in the trainer exits. A
 * fuzzer runs millions of inputs in one process, so here:
 * - each input is written to a file in a private temporary folder (in /dev/shm when it exists),
 * - fatal() jumps back to fuzz_try() (common.h does that when LLMC_FUZZ is defined, only in this build),
 * - a reader stopped half way has its files closed (every fopen/fdopen/fclose of the readers goes
 *   through the wrappers below) and its heap blocks freed (AddressSanitizer's allocation hooks record the blocks
 *   allocated during the call), so a million rejected inputs leak neither descriptors nor memory, and
 *   LeakSanitizer still reports a reader that leaks on its success path.
 * Set FUZZ_VERBOSE=1 to print the error message of each rejected input (when replaying one file).
 *
 * Include this file before any llmc/ header.
 */
#pragma once

#include <fcntl.h>
#include <sanitizer/allocator_interface.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------------------------------
// the files the readers hold open

#define FUZZ_MAX_OPEN_FILES 64
static FILE* fuzz_open_files[FUZZ_MAX_OPEN_FILES];

static FILE* fuzz_track_file(FILE* f) {
    if (f == NULL) return f;
    for (int i = 0; i < FUZZ_MAX_OPEN_FILES; i++)
        if (fuzz_open_files[i] == NULL) {
            fuzz_open_files[i] = f;
            return f;
        }
    fprintf(stderr, "fuzz harness: more than %d files open at once\n", FUZZ_MAX_OPEN_FILES);
    abort();
}

static FILE* fuzz_fopen(const char* path, const char* mode) { return fuzz_track_file(fopen(path, mode)); }
static FILE* fuzz_fdopen(int fd, const char* mode) { return fuzz_track_file(fdopen(fd, mode)); }

static int fuzz_fclose(FILE* f) {
    for (int i = 0; i < FUZZ_MAX_OPEN_FILES; i++)
        if (fuzz_open_files[i] == f) fuzz_open_files[i] = NULL;
    return fclose(f);
}

static void fuzz_close_open_files(void) {
    for (int i = 0; i < FUZZ_MAX_OPEN_FILES; i++)
        if (fuzz_open_files[i] != NULL) {
            fclose(fuzz_open_files[i]);
            fuzz_open_files[i] = NULL;
        }
}

// from here on, the readers' fopen, fdopen and fclose are the tracked ones
#define fopen fuzz_fopen
#define fdopen fuzz_fdopen
#define fclose fuzz_fclose

#include "../../llmc/common.h"

// ----------------------------------------------------------------------------------------------------
// the heap blocks allocated during one reader call: a log in allocation order, and an open-addressing
// set (linear probing) of the ones not yet freed

#define FUZZ_LOG_CAP (1u << 18)   // more than the largest reader needs (a 65536-token table: 65537 blocks)
#define FUZZ_SET_SLOTS (1u << 19)  // twice the log, so probes stay short
static const volatile void* fuzz_alloc_log[FUZZ_LOG_CAP];
static const volatile void* fuzz_live[FUZZ_SET_SLOTS];
static size_t fuzz_log_len;
// Per thread: the hooks run in whichever thread allocates, and libFuzzer has threads of its own (the
// RSS-limit thread allocates while it starts, which may fall inside a reader call). Only the thread
// running fuzz_try records, so another thread's block is never freed here, nor the set written by two.
static thread_local int fuzz_tracking;

static size_t fuzz_slot(const volatile void* p) { return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 45) & (FUZZ_SET_SLOTS - 1); }

static size_t fuzz_find(const volatile void* p) {  // its slot, or the empty slot where it would go
    size_t i = fuzz_slot(p);
    while (fuzz_live[i] != NULL && fuzz_live[i] != p) i = (i + 1) & (FUZZ_SET_SLOTS - 1);
    return i;
}

static void fuzz_set_remove(const volatile void* p) {
    size_t i = fuzz_find(p);
    if (fuzz_live[i] == NULL) return;
    fuzz_live[i] = NULL;  // then shift back the entries after it whose home slot is not in (i, j]
    for (size_t j = (i + 1) & (FUZZ_SET_SLOTS - 1); fuzz_live[j] != NULL; j = (j + 1) & (FUZZ_SET_SLOTS - 1)) {
        size_t home = fuzz_slot(fuzz_live[j]);
        int stays = i < j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            fuzz_live[i] = fuzz_live[j];
            fuzz_live[j] = NULL;
            i = j;
        }
    }
}

// called by AddressSanitizer inside every malloc and free: must not allocate
static void fuzz_on_malloc(const volatile void* p, size_t) {
    if (!fuzz_tracking || p == NULL) return;
    if (fuzz_log_len == FUZZ_LOG_CAP) {
        fprintf(stderr, "fuzz harness: more than %u allocations in one reader call\n", FUZZ_LOG_CAP);
        abort();
    }
    fuzz_alloc_log[fuzz_log_len++] = p;
    fuzz_live[fuzz_find(p)] = p;
}

static void fuzz_on_free(const volatile void* p) {
    if (fuzz_tracking && p != NULL) fuzz_set_remove(p);
}

// ----------------------------------------------------------------------------------------------------
// running a reader

typedef void (*FuzzBody)(void* ctx);

// Runs body(ctx). Returns 1 if it finished, 0 if it ended in fatal(); then everything it had opened or
// allocated is released, so its outputs must not be used (they may point to freed memory).
static int fuzz_try(FuzzBody body, void* ctx) {
    static int hooks_installed = 0;
    if (!hooks_installed) hooks_installed = __sanitizer_install_malloc_and_free_hooks(fuzz_on_malloc, fuzz_on_free);
    if (!hooks_installed) {
        fprintf(stderr, "fuzz harness: cannot install the allocation hooks (build with -fsanitize=address)\n");
        abort();
    }
    jmp_buf jump;
    fuzz_log_len = 0;
    fuzz_tracking = 1;
    fatal_jump = &jump;
    int finished = 0;  // (written only when body returns, so never between setjmp and a longjmp)
    if (setjmp(jump) == 0) {
        body(ctx);
        finished = 1;
    }
    fatal_jump = NULL;
    if (!finished) {
        if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "rejected: %s\n", fatal_message);
        fuzz_close_open_files();  // fclose frees the FILE's blocks, which leaves the set through the hook
        for (size_t k = 0; k < fuzz_log_len; k++)
            if (fuzz_live[fuzz_find(fuzz_alloc_log[k])] != NULL) free((void*)fuzz_alloc_log[k]);
    }
    for (size_t k = 0; k < fuzz_log_len; k++) fuzz_set_remove(fuzz_alloc_log[k]);  // blocks that live on are the caller's
    fuzz_tracking = 0;
    return finished;
}

// ----------------------------------------------------------------------------------------------------
// the input as a file

// a private folder for this process's files, removed at exit
static char fuzz_dir[256];
static void fuzz_remove_dir(void) {
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fuzz_dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz harness: could not remove %s\n", fuzz_dir);
}
static const char* fuzz_folder(void) {
    if (fuzz_dir[0] == '\0') {
        struct stat st;
        snprintf(fuzz_dir, sizeof(fuzz_dir), "%s/llmc_fuzz_XXXXXX", stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp");
        if (mkdtemp(fuzz_dir) == NULL) {
            perror("fuzz harness: mkdtemp");
            abort();
        }
        atexit(fuzz_remove_dir);
    }
    return fuzz_dir;
}

// the path of <name> in that folder, in out[cap]
static void fuzz_path(const char* name, char* out, size_t cap) { snprintf(out, cap, "%s/%s", fuzz_folder(), name); }

// writes the bytes to path (plain POSIX calls, so nothing here is tracked)
static void fuzz_write_file(const char* path, const uint8_t* data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror("fuzz harness: open");
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            perror("fuzz harness: write");
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
}
