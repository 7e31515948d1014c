/*
 * fuzz_selftest.cpp: checks fuzz_try (fuzz_harness.h), on which every harness relies to run millions of
 * rejected inputs in one process. Built with the harnesses' sanitizers but without libFuzzer (it has its
 * own main); tests/fuzz/run.sh runs it before the readers. Each case fails loudly when broken: a wrong count,
 * or AddressSanitizer stopping the program on a double free.
 *   1. a rejected call (fatal) gets back every block it allocated: the allocated bytes return to where
 *      they were;
 *   2. a finished call leaves its blocks to the caller, who may use and free them;
 *   3. a block another thread allocates during a rejected call is that thread's: fuzz_try must not free
 *      it. (libFuzzer's RSS-limit thread allocates as it starts; when that fell inside a reader call, the
 *      harness freed the thread's block and the thread freed it again.)
 */
#include "fuzz_harness.h"

#include <pthread.h>
#include <semaphore.h>

static int failures = 0;
static void check(int ok, const char* what) {
    printf("  %s  %s\n", ok ? "ok  " : "FAIL", what);
    fflush(stdout);  // (a sanitizer report that follows aborts the program)
    if (!ok) failures++;
}

// 1. allocates many blocks and one large one, then rejects
static char* volatile last_block;  // volatile, so the compiler keeps the mallocs
static size_t bytes_during;
static void allocate_then_reject(void*) {
    for (int i = 0; i < 100; i++) last_block = (char*)malloc(48);
    last_block = (char*)malloc(1 << 20);
    bytes_during = __sanitizer_get_current_allocated_bytes();
    fatal("rejected after allocating");
}

// 2. allocates one block and hands it back
static void allocate_and_finish(void* ctx) { *(char**)ctx = (char*)calloc(64, 1); }

// 3. another thread allocates a block while the call runs, and frees it after the call
static sem_t go, allocated, release;
static char* volatile others_block;  // volatile, so the compiler keeps the malloc and free
static void* other_thread(void*) {
    sem_wait(&go);
    others_block = (char*)malloc(64);
    sem_post(&allocated);
    sem_wait(&release);
    free(others_block);  // a double free, which AddressSanitizer stops on, if fuzz_try freed it
    return NULL;
}
static void reject_while_other_thread_allocates(void*) {
    sem_post(&go);
    sem_wait(&allocated);
    fatal("rejected while another thread allocated");
}

int main() {
    size_t before = __sanitizer_get_current_allocated_bytes();
    int finished = fuzz_try(allocate_then_reject, NULL);
    size_t after = __sanitizer_get_current_allocated_bytes();
    check(!finished && bytes_during >= before + (1 << 20) && after == before,
          "a rejected call's 101 blocks (1 MiB) are freed by fuzz_try");
    printf("        allocated bytes: %zu before the call, %zu in it, %zu after\n", before, bytes_during, after);

    char* block = NULL;
    finished = fuzz_try(allocate_and_finish, &block);
    check(finished && block != NULL && block[63] == 0, "a finished call's block is the caller's");
    free(block);  // a double free if fuzz_try had freed it

    sem_init(&go, 0, 0), sem_init(&allocated, 0, 0), sem_init(&release, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, NULL, other_thread, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    finished = fuzz_try(reject_while_other_thread_allocates, NULL);
    check(!finished && __sanitizer_get_ownership(others_block),  // (a freed block is not owned)
          "a block another thread allocated during a rejected call is left to that thread");
    sem_post(&release);
    pthread_join(thread, NULL);  // its free is a double free, which AddressSanitizer stops on, if fuzz_try freed it

    printf(failures ? "fuzz_selftest: %d case(s) failed\n" : "fuzz_selftest: all cases passed\n", failures);
    return failures ? 1 : 0;
}
