/*
 * common.h: the small helpers every other file leans on.
 *
 * - fatal(): one clear line on stderr and exit(1). Bad input (a missing file, a wrong magic number, a
 *   flag that is not a number...) must never crash or hang the trainer, so every check ends here.
 * - checked wrappers around fopen/fread/fwrite/malloc that report what failed and where.
 * - a tiny deterministic random number generator (splitmix64 + Box-Muller) so that initialization,
 *   shuffling and sampling are reproducible and their state fits in one integer for checkpoints.
 * - FNV-1a 64-bit hashing, used as the checksum of our own checkpoint files.
 *
 * Nothing here knows about CUDA: it compiles the same for the CPU and GPU targets.
 */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------------------------------
// errors

// Set by the communicator when there are several ranks: takes every rank down (MPI_Abort), so that one
// rank's error never leaves the others waiting in a collective.
static void (*fatal_hook)(void) = NULL;

#ifdef LLMC_FUZZ
// Only in the fuzz harnesses (tests/fuzz/, never the trainer): they feed millions of forged files to the
// readers in one process, so fatal() jumps back to the harness (which then closes and frees what the
// reader held) instead of exiting. The message is kept for the harness to show on request.
#include <setjmp.h>
static jmp_buf* fatal_jump = NULL;
static char fatal_message[2048];
#endif

[[noreturn]] static inline void fatal(const char* fmt, ...) {
    fflush(stdout);
    char msg[2048];
    va_list args;
    va_start(args, fmt);
    vsnprintf(msg, sizeof(msg), fmt, args);
    va_end(args);
#ifdef LLMC_FUZZ
    if (fatal_jump) {
        memcpy(fatal_message, msg, sizeof(msg));
        longjmp(*fatal_jump, 1);
    }
#endif
    fprintf(stderr, "error: %s\n", msg);  // one write, so lines of several ranks do not interleave
    fflush(stderr);
    if (fatal_hook) fatal_hook();
    exit(1);
}

// For internal invariants (a bug, not a user error): name the file and line.
#define check_internal(cond, msg)                                                                   \
    do {                                                                                            \
        if (!(cond)) fatal("internal error at %s:%d: %s", __FILE__, __LINE__, msg);                 \
    } while (0)

// ----------------------------------------------------------------------------------------------------
// checked file and memory calls

// Files read are opened without blocking and must be regular files: a FIFO with no writer would block
// fopen forever, and a device or a folder is never one of our inputs.
static inline FILE* fopen_check(const char* path, const char* mode) {
    if (mode[0] != 'r') {
        FILE* f = fopen(path, mode);
        if (f == NULL) fatal("cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
        return f;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) fatal("cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fatal("cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        fatal("'%s' is not a regular file (a FIFO, device or folder cannot be read as one)", path);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) fatal("cannot read '%s': %s", path, strerror(errno));
    FILE* f = fdopen(fd, mode);
    if (f == NULL) fatal("cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    return f;
}

// Reads exactly `count` items or fails naming the file: a short read means the file is truncated.
static inline void fread_check(void* dst, size_t size, size_t count, FILE* f, const char* path) {
    size_t got = fread(dst, size, count, f);
    if (got != count) {
        if (ferror(f)) fatal("read error in '%s': %s", path, strerror(errno));
        fatal("file '%s' is truncated (wanted %zu more bytes)", path, (count - got) * size);
    }
}

static inline void fwrite_check(const void* src, size_t size, size_t count, FILE* f, const char* path) {
    if (fwrite(src, size, count, f) != count) fatal("write error in '%s': %s", path, strerror(errno));
}

static inline void fseek_check(FILE* f, long long offset, const char* path) {
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0) fatal("cannot seek in '%s': %s", path, strerror(errno));
}

static inline long long file_size_check(FILE* f, const char* path) {
    if (fseeko(f, 0, SEEK_END) != 0) fatal("cannot seek in '%s': %s", path, strerror(errno));
    long long size = (long long)ftello(f);
    fseek_check(f, 0, path);
    return size;
}

// All our file formats start with a 256-int32 header whose first entry is a magic number. Opens `path`,
// reads the header, checks the magic; returns the open file (positioned after the header) and its size.
static inline FILE* open_with_header(const char* path, int magic, const char* kind, int header[256], long long* size) {
    FILE* f = fopen_check(path, "rb");
    *size = file_size_check(f, path);
    if (*size < 1024) fatal("'%s' is truncated: %lld bytes, shorter than the 1024-byte header", path, *size);
    fread_check(header, sizeof(int), 256, f, path);
    if (header[0] != magic) fatal("'%s' is not a %s (magic %d, expected %d)", path, kind, header[0], magic);
    return f;
}

// The longest path this program writes: the model and state files' writer keeps 4096 bytes
// (llmc/run/atomic_file.h), Linux's PATH_MAX. An output path is checked at start-up together with what is
// appended to it when it is written (".tmp", a checkpoint's file names, a trace's ".rank<r>"), so that
// no save fails for its length, or writes a truncated name, after hours of training. An empty path names
// no file: "" is refused, not taken for the current folder ("" + ".tmp" would be a file ".tmp" there).
#define OUTPUT_PATH_MAX 4096
static inline void check_path_length(const char* path, size_t appended, const char* what) {
    if (path[0] == '\0') fatal("%s: the path is empty", what);
    size_t n = strlen(path);
    if (n + appended >= OUTPUT_PATH_MAX)
        fatal("%s: the path is too long (%zu characters and the %zu appended to it; at most %d in all)", what, n,
              appended, OUTPUT_PATH_MAX - 1);
}

// The folder of `path` into dir (cap bytes): "." for a bare name, "/" for "/name".
static inline void parent_folder(const char* path, char* dir, size_t cap) {
    snprintf(dir, cap, "%s", path);
    char* slash = strrchr(dir, '/');
    while (slash != NULL && slash != dir && slash[1] == '\0') {  // "a/b/": the parent of b
        *slash = '\0';
        slash = strrchr(dir, '/');
    }
    if (slash == NULL) snprintf(dir, cap, ".");
    else if (slash == dir) slash[1] = '\0';  // "/file": the root folder
    else *slash = '\0';
}

// Output paths are checked before a run starts, not at their first write hours later: `dir` must be a
// folder (created if missing with create = 1; its parent must exist) in which this process can create a
// file, which is checked by creating and removing a uniquely named empty file. With create = 2 a missing
// folder is not created now (the run may never save into it: a stop signal's checkpoint) but must be
// creatable then: its parent must be a writable folder. `appended`: the longest name written into it,
// with its slash. `what` names the flag for messages.
static inline void check_writable_dir(const char* dir, const char* what, int create, size_t appended) {
    struct stat st;
    check_path_length(dir, appended, what);
    if (create == 2 && stat(dir, &st) != 0 && errno == ENOENT) {
        char parent[OUTPUT_PATH_MAX];
        parent_folder(dir, parent, sizeof(parent));
        if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
            fatal("%s '%s' could not be created when needed: its parent folder '%s' %s", what, dir, parent,
                  stat(parent, &st) != 0 ? "does not exist" : "is not a folder");
        check_writable_dir(parent, what, 0, 0);  // (a probe file: access() says yes to root on a read-only sysfs)
        return;
    }
    if (create == 1 && mkdir(dir, 0755) != 0 && errno != EEXIST)
        fatal("%s '%s': cannot create the folder: %s", what, dir, strerror(errno));
    if (stat(dir, &st) != 0) fatal("%s: folder '%s': %s", what, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) fatal("%s: '%s' is not a folder", what, dir);
    char probe[OUTPUT_PATH_MAX + 64];
    for (int attempt = 0;; attempt++) {
        snprintf(probe, sizeof(probe), "%s/.write_probe_%d_%d", dir, (int)getpid(), attempt);
        int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            close(fd);
            unlink(probe);
            return;
        }
        if (errno != EEXIST || attempt >= 10) fatal("%s: cannot create files in '%s': %s", what, dir, strerror(errno));
    }
}

// The same for a file that will be written at `path` later (and at `path` with up to `appended`
// characters added: ".tmp" while it is written): its folder must be writable, its name short enough
// for that folder's file system, and the path must not be a folder, nor anything else that is not a
// regular file. Such a file is written by renaming a finished temporary file over the path
// (llmc/run/atomic_file.h), which would replace a device node (as root, /dev/null), a FIFO or a symbolic
// link with a plain file: refused, not done.
static inline void check_writable_file(const char* path, const char* what, size_t appended) {
    struct stat st;
    check_path_length(path, appended, what);
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) fatal("%s '%s' is a folder, not a file", what, path);
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
        fatal("%s '%s' exists and is not a regular file (%s): saving renames a new file over it; give another path",
              what, path,
              S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
    size_t len = strlen(path);
    if (path[len - 1] == '/') fatal("%s '%s' names a folder (it ends in '/'), not a file", what, path);
    char dir[OUTPUT_PATH_MAX];
    parent_folder(path, dir, sizeof(dir));
    check_writable_dir(dir, what, 0, 0);
    const char* slash = strrchr(path, '/');
    size_t name = strlen(slash ? slash + 1 : path) + appended;
    long name_max = pathconf(dir, _PC_NAME_MAX);
    if (name_max > 0 && name > (size_t)name_max)
        fatal("%s '%s': the file name is too long for its folder (%zu characters with the %zu appended while it is "
              "written; at most %ld)", what, path, name, appended, name_max);
}

static inline void* malloc_check(size_t bytes) {
    void* p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) fatal("out of host memory allocating %zu bytes", bytes);
    return p;
}

static inline void* calloc_check(size_t bytes) {
    void* p = calloc(bytes > 0 ? bytes : 1, 1);
    if (p == NULL) fatal("out of host memory allocating %zu bytes", bytes);
    return p;
}
static inline void* realloc_check(void* p, size_t bytes) {  // realloc's contract, with the failure checked
    p = realloc(p, bytes);
    if (p == NULL && bytes > 0) fatal("out of host memory allocating %zu bytes", bytes);
    return p;
}

// A host buffer that grows on demand and is kept for reuse (one per purpose).
typedef struct {
    float* ptr;
    size_t cap;
} HostScratch;
static inline float* host_scratch(HostScratch* s, size_t n) {
    if (n > s->cap) {
        free(s->ptr);
        s->ptr = (float*)malloc_check(n * sizeof(float));
        s->cap = n;
    }
    return s->ptr;
}

static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------------------------------
// deterministic random numbers: the whole generator state is one uint64 (saved in checkpoints)

typedef struct {
    uint64_t state;
} Rng;

static inline uint64_t rng_next_u64(Rng* rng) {  // splitmix64
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// uniform in [0, 1) with 24 random bits, exactly representable as float
static inline float rng_uniform(Rng* rng) { return (float)(rng_next_u64(rng) >> 40) / 16777216.0f; }

// standard normal (Box-Muller; one value per call so the state stays a single integer)
static inline float rng_normal(Rng* rng) {
    double u1 = ((double)(rng_next_u64(rng) >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
    double u2 = (double)(rng_next_u64(rng) >> 11) / 9007199254740992.0;          // [0, 1)
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

// ----------------------------------------------------------------------------------------------------
// FNV-1a 64: a simple, well-known hash, plenty to detect truncation, bit rot and mixed-up files

static const uint64_t FNV1A_INIT = 0xcbf29ce484222325ull;

static inline uint64_t fnv1a_update(uint64_t hash, const void* data, size_t bytes) {
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < bytes; i++) {
        hash ^= p[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

// ----------------------------------------------------------------------------------------------------
// exp for the CPU loops: glibc's expf is a call, which keeps a loop around it scalar (the compiler has a
// vector expf only under -ffast-math). This one is plain arithmetic without branches, so the loops of the
// softmax and GELU that call it vectorize. x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, so that
// n * LN2_HI is exact), exp(r) by its Taylor series up to r^7 (the first term left out, r^8/8!, is below
// 6e-9, under float's rounding of 6e-8), times 2^n built in the exponent bits. Within one ulp of the
// exact exp (measured over every float in [-87, 88]; glibc's expf: half an ulp); below -87 (where
// results leave the normal floats) it returns 0, above 88 exp(88); NaN stays NaN.
static inline float expf_cpu(float x) {
    const float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    const float ROUND = 12582912.0f;  // 1.5 * 2^23: adding it rounds |v| < 2^22 to an integer, to nearest
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.0f ? -87.0f : xc;
    float n = (xc * LOG2E + ROUND) - ROUND;  // round(x / ln2), in [-126, 127]
    float r = (xc - n * LN2_HI) - n * LN2_LO;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;  // 2^n
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return x < -87.0f ? 0.0f : p * scale;
}

static inline size_t round_up(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }
static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
