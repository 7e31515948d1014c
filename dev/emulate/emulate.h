/*
 * emulate.h: runs the CUDA kernels of dev/cuda/ and llmc/ on the CPU, so their checks against the CPU
 * reference run on a machine without a GPU: `make -C dev/cuda emulate` (the kernel files) and `make
 * emulated` (the GPU build of test_gpt and train_gpt), both part of `make test` without a GPU; `make -C
 * dev/emulate selftest` checks the emulation itself (README.md in this folder: how to use it). The
 * tensor-core flash attention runs too: llmc/attention_flash_mma.h calls the warp-collective ldmatrix,
 * mma.sync and cp.async below in place of its PTX when DEV_CUDA_EMULATED is defined.
 *
 * It is not a GPU simulator: nothing is timed and nothing about speed is learned. What it shows is that a
 * kernel's own source, launched with the real grid and block shapes, computes what the reference
 * computes: index arithmetic, bounds checks, grid-stride loops, warp shuffles, shared-memory reductions
 * and the order of barriers: much of what a first GPU run would otherwise find.
 *
 * How a launch runs. `kernel<<<grid, block, smem, stream>>>(args)` has been rewritten (emulate_source.pl)
 * into `emu::Launch("kernel", grid, block, smem, stream).run(kernel, args)`. The blocks run one after the other, on
 * one OS thread. A block's threads run on workers (fibers: a stack each, switched by a few instructions):
 * a worker runs a thread until it ends or waits at a barrier, and the waiting ones are resumed in passes
 * over the block. The barriers:
 *   __syncthreads()      waits for every thread of the block that has not exited (as on sm_70+);
 *   __shfl_*_sync()      each lane writes its value to its slot of the warp's next slot set (two sets,
 *                        used in turn), waits for the warp's lanes and reads its source lane's slot;
 *   __syncwarp()         a wait for the warp's lanes.
 * A pass in which no thread moves is a deadlock (a barrier that not every thread reaches, which hangs or
 * is undefined on a GPU): the program stops and says which barrier. Threads interleave only at barriers,
 * so a missing barrier shows up only where the order of the passes exposes it: even blocks run their
 * threads lowest first, odd blocks highest first, and a pass runs one warp at a time to its next
 * __syncthreads (run_block), so in a launch of two blocks or more a thread that reads what another
 * writes without a barrier between reads too early in one of them, whichever thread it is, and a warp
 * that overwrites what another warp has yet to read does so first in one of them. cp.async copies land
 * at once in blocks 0 and 1 (of every 4) and at their thread's wait in blocks 2 and 3 (cp_async_16).
 * The memory ordering a barrier gives is not modelled at all. The warp operations share one
 * barrier per warp: lanes of a warp that meet there from two kinds of warp operation (half at __syncwarp,
 * half at a shuffle; two calls of the same kind from diverged branches are not told apart) stop the
 * program, and so does a mask other than the full warp's, which the one barrier cannot model. (A full
 * mask in a warp some of whose lanes have exited is taken as the lanes left, not reported.)
 *
 * What is checked at launch, as the GPU would refuse it: block size (<= 1024 threads, and <= the kernel's
 * __launch_bounds__), grid limits (y, z <= 65535), dynamic shared memory above 48 KiB without
 * cudaFuncSetAttribute's opt-in, and above the device's 227 KiB. At run time, a 16-byte access that is not
 * 16-byte aligned (ldmatrix rows, cp.async, llmc's load128/store128) stops the program, as the GPU's
 * "misaligned address" does (check_aligned). Shared memory, dynamic and static, starts
 * each block filled with NaN bytes (0xff), so a read before a write shows up in the result.
 * Atomics are plain read-modify-writes: threads never interleave inside one.
 *
 * The runtime calls the programs make (cudaMalloc, cudaMemcpy, events, properties) and their cuBLAS(Lt)
 * products are defined over host memory in emulate_runtime.h, included at the end. A launch or copy has
 * finished when its call returns if it is on the default stream and that has nothing queued: a stream the
 * program created (and with EMU_STREAMS=main-late the default stream too) queues all its work, the
 * emulated NCCL's operations and copies from pinned host memory wait in their stream's queue until the
 * host waits for the stream, and what is issued behind them joins the queue (emulate_runtime.h, "streams
 * and events"). "Device" memory
 * is host memory, so a kernel that dereferences a host pointer does not fail here as it would on a GPU.
 */
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emulate_tensor_core.h"  // ldmatrix and mma.sync: which lane's register holds which element

// ----------------------------------------------------------------------------------------------------
// the language: qualifiers and built-in variables

// emulate_source.pl rewrites every __shared__ declaration (into emu::Shared below) and every
// __launch_bounds__ (into a check, emu::above_launch_bounds): one left over is an error
#undef __shared__
#define __shared__ __shared__declaration_not_rewritten_by_emulate_source_pl
#undef __launch_bounds__
#define __launch_bounds__ __launch_bounds__not_rewritten_by_emulate_source_pl
#undef __forceinline__
#define __forceinline__ inline

namespace emu {
struct Barrier {  // counts arrivals among the threads not yet exited; `generation` moves when all arrived
    int arrived, live, generation;
    const char* name;  // what the threads arrived so far wait at (a warp's lanes must all be at the same)
};
inline uint3 thread_index, block_index;
inline dim3 block_dim, grid_dim;
}  // namespace emu
#define threadIdx (emu::thread_index)
#define blockIdx (emu::block_index)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define warpSize 32

// ----------------------------------------------------------------------------------------------------
// fibers: a stack and a saved stack pointer each; a switch pushes the callee-saved registers on the old
// stack and pops them from the new one (x86-64; elsewhere ucontext, the same with a system call per switch)

namespace emu {
#if defined(__x86_64__)
// switch_stack(save, load): pushes rbp, rbx, r12-r15, stores rsp in *save, loads rsp = load, pops, returns
extern "C" void emu_switch_stack(void** save, void* load);
asm(R"(
    .text
emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
)");
struct Context {
    void* sp;
};
inline void context_switch(Context* from, Context* to) { emu_switch_stack(&from->sp, to->sp); }
// a fresh context that starts in entry(): six zeroed registers, then entry as the return address, placed so
// that entry sees the stack alignment of a called function
inline void context_make(Context* c, char* stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(stack + bytes) & ~(uintptr_t)15) - 16;
    void** sp = (void**)(top - 7 * sizeof(void*) + 8);
    for (int i = 0; i < 6; i++) sp[i] = NULL;
    sp[6] = (void*)entry;
    c->sp = sp;
}
#else
struct Context {
    ucontext_t uc;
};
inline void context_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
inline void context_make(Context* c, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, entry, 0);
}
#endif

// A block runs on workers: fibers that take the block's threads in order and run each to its end. A
// thread that waits at a barrier keeps its worker, and the next thread starts on a new one, so a kernel
// without barriers runs its whole block on one worker, and one with barriers on one worker per thread.
struct Worker {
    Context context;
    char* stack;
    int thread;  // the linear index of the thread it runs
    bool done;   // no thread left to take
    const Barrier* waiting_on;  // the barrier its thread waits at (NULL: none), until its generation moves
    int waiting_generation;
    unsigned exchanges;  // the warp exchanges its thread has made (which of the two slot sets is next)
    int copies, committed;  // its thread's cp.async copies not yet done (in `pending`), the first `committed` of them committed
};
// a cp.async copy held back until its thread waits for it (see cp_async_16)
struct PendingCopy {
    void* smem;
    const void* gmem;
    bool valid;
};
const int PENDING_MAX = 64;  // cp.async copies one thread may have outstanding here (the flash kernels: 16)
const size_t STACK_BYTES = 256 << 10;  // a worker's stack: a kernel's locals ("registers") live there
const size_t SHARED_DEFAULT = 48 << 10, SHARED_MAX = 227 << 10;  // sm_90's dynamic shared memory limits

inline Worker* workers = NULL;
inline int workers_cap = 0, current = -1;
inline Context scheduler;
inline int block_threads = 0, next_thread = 0;  // next_thread counts the threads started, in start order
inline bool reversed = false;  // whether this block starts its threads from the last (odd blocks do)
inline bool defer_copies = false;  // whether this block's cp.async copies land at the wait (blocks 2, 3 mod 4)
inline PendingCopy (*pending)[PENDING_MAX] = NULL;  // per worker
inline Barrier block_barrier;
inline Barrier* warp_barriers = NULL;  // one per warp of the block
// per warp, two sets of per-lane slots for the bytes a warp exchange (shuffle, ldmatrix, mma) passes on,
// used alternately: a lane that has read exchange k may write exchange k+1 while others still read k, and
// cannot pass exchange k+1's barrier (and write k+2 over k) before every lane has arrived there
inline uint64_t (*exchange)[2][32][4] = NULL;
inline uint64_t progress = 0;  // moves whenever a thread starts, arrives at a barrier or exits
inline const char* waiting_at = "";  // the barrier the last resumed thread waits at
inline std::function<void()> body;
inline unsigned char* dynamic_shared_memory = NULL;
inline uint64_t block_serial = 0;  // counts the blocks run, so a static shared array knows a new block began
inline std::map<const void*, int> shared_opt_in;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
inline cudaError_t last_error = cudaSuccess;
inline bool launch_refused = false;  // the launch running has been refused by above_launch_bounds

[[noreturn]] inline void die(const char* what) {
    fprintf(stderr, "emulated GPU: %s (block %u,%u,%u thread %u,%u,%u)\n", what, block_index.x, block_index.y, block_index.z,
            thread_index.x, thread_index.y, thread_index.z);
    exit(1);
}

inline void yield() { context_switch(&workers[current].context, &scheduler); }
inline uint3 thread_index_of(int t) {
    return make_uint3(t % block_dim.x, (t / block_dim.x) % block_dim.y, t / (block_dim.x * block_dim.y));
}
inline Barrier* my_warp() { return &warp_barriers[workers[current].thread / 32]; }
inline int thread_started(int k) { return reversed ? block_threads - 1 - k : k; }  // the k-th thread to start

inline void open_if_complete(Barrier* b) {
    if (b->arrived > 0 && b->arrived == b->live) b->arrived = 0, b->generation++;
}
inline void wait(Barrier* b, const char* name) {
    int generation = b->generation;
    if (b->arrived == 0) b->name = name;
    else if (strcmp(b->name, name) != 0) {  // e.g. half a warp at __syncwarp, half at a shuffle
        fprintf(stderr, "emulated GPU: lanes of one warp at different warp operations: %s and %s\n", b->name, name);
        die("divergent warp operations");
    }
    b->arrived++, progress++;
    open_if_complete(b);
    if (b->generation != generation) return;
    workers[current].waiting_on = b, workers[current].waiting_generation = generation;
    waiting_at = name;
    yield();  // resumed once the barrier has opened
    workers[current].waiting_on = NULL;
}
// a worker whose thread waits at a barrier that has not opened: resuming it would change nothing
inline bool blocked(const Worker* w) { return w->waiting_on != NULL && w->waiting_on->generation == w->waiting_generation; }

inline void cp_async_complete(int upto);

inline bool starting = false;  // whether run_block's start loop resumed the running worker

// A worker runs its thread; one whose thread ended takes the next thread to start only when the start
// loop resumed it (so a warp run to its barrier by run_warp never starts a thread of the next warp)
inline void worker_main() {
    Worker* w = &workers[current];
    do {
        w->thread = thread_started(next_thread++), w->exchanges = 0, w->copies = w->committed = 0;
        thread_index = thread_index_of(w->thread);
        progress++;
        body();
        cp_async_complete(w->copies);  // (what a thread left in flight lands all the same)
        block_barrier.live--, my_warp()->live--, progress++;  // an exited thread no longer holds back a barrier
        open_if_complete(&block_barrier);
        open_if_complete(my_warp());
    } while (starting && next_thread < block_threads);
    w->done = true;
    yield();  // never resumed
}

inline void grow_workers(int n) {
    if (n <= workers_cap) return;
    workers = (Worker*)realloc(workers, n * sizeof(Worker));
    for (int i = workers_cap; i < n; i++) workers[i].stack = (char*)malloc(STACK_BYTES);
    workers_cap = n;
    warp_barriers = (Barrier*)realloc(warp_barriers, ((n + 31) / 32) * sizeof(Barrier));
    exchange = (uint64_t(*)[2][32][4])realloc(exchange, ((n + 31) / 32) * sizeof(*exchange));
    pending = (PendingCopy(*)[PENDING_MAX])realloc(pending, n * sizeof(*pending));
}

inline void resume(int w) {
    current = w;
    thread_index = thread_index_of(workers[w].thread);
    context_switch(&scheduler, &workers[w].context);
}

// resumes workers [first, end), the threads of one warp, until none of them can move (each waits at a
// __syncthreads, or has ended)
inline void run_warp(int first, int end) {
    for (uint64_t seen = ~0ull; seen != progress;) {
        seen = progress;
        for (int w = first; w < end; w++)
            if (!workers[w].done && !blocked(&workers[w])) resume(w);
    }
}

// every thread of one block of n threads, to completion: passes over the block until every worker is
// done, each pass running one warp at a time as far as it can go (to a __syncthreads, or its end) before
// the next warp moves, then starting the threads not yet started, also a warp at a time. An odd block (by
// its linear index) starts its threads from the last, so its warps run from the last too. A missing
// barrier between a write and another thread's read shows when the reader runs first, which in a grid of
// two blocks or more is the case in one of them: between two threads of one warp, or between warps,
// however many warp operations (each a wait for the warp's lanes) lie between the write and the read; and
// so does an overwrite of what another warp has yet to read.
inline void run_block(int n, bool reverse, bool defer) {
    block_threads = n, next_thread = 0, reversed = reverse, defer_copies = defer;
    block_barrier = {0, n, 0, ""};
    for (int w = 0; w < (n + 31) / 32; w++) warp_barriers[w] = {0, (w + 1) * 32 <= n ? 32 : n - w * 32, 0, ""};
    for (int used = 0, running = 1; running > 0;) {
        uint64_t before = progress;
        for (int first = 0, end; first < used; first = end) {  // the warps started: workers [first, end) each
            for (end = first + 1; end < used && workers[end].thread / 32 == workers[first].thread / 32;) end++;
            run_warp(first, end);
        }
        for (int first = used; next_thread < n;) {  // the threads not started yet
            int warp = thread_started(next_thread) / 32;
            Worker* w = &workers[used];
            w->done = false, w->thread = thread_started(next_thread), w->waiting_on = NULL;
            context_make(&w->context, w->stack, STACK_BYTES, worker_main);
            starting = true, resume(used++), starting = false;
            if (next_thread == n || thread_started(next_thread) / 32 != warp) run_warp(first, used), first = used;
        }
        running = 0;
        for (int w = 0; w < used; w++) running += !workers[w].done;
        if (running > 0 && progress == before) {
            fprintf(stderr, "emulated GPU: deadlock: threads wait at barriers that the others never reach (last seen: %s)\n", waiting_at);
            die("deadlock");
        }
    }
    current = -1;
}

// an argument as the kernel's parameter receives it; NULL (an integer to a template) as a null pointer
template <typename P, typename A>
P convert(A&& a) {
    if constexpr (std::is_pointer<P>::value && std::is_integral<typename std::decay<A>::type>::value) {
        if (a != 0) die("an integer passed for a pointer parameter");
        return nullptr;
    } else {
        return a;
    }
}

// emulate_runtime.h, "streams and events": whether what is issued on a stream now is queued, and queueing it
inline bool stream_busy(cudaStream_t s);
inline void queue_op(cudaStream_t s, std::function<bool()> step, std::string what);

// EMU_COUNTS=FILE: a launch counted by its kernel's name (emulate_runtime.h, count_launch)
inline void count_launch(const char* kernel);

struct Launch {
    const char* kernel;  // its name as the source wrote it (emulate_source.pl), for EMU_COUNTS
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    Launch(const char* name, dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0)
        : kernel(name), grid(g), block(b), shared_bytes(smem), stream(s) {}

    // runs the kernel over the grid with the arguments converted to its parameter types, as a launch does:
    // at the call, or, where its stream queues it (emulate_runtime.h, stream_busy), when the stream gets to it,
    // with the arguments of the call
    template <typename... Params, typename... Args>
    void run(void (*kernel)(Params...), Args&&... args) {
        auto values = std::make_shared<std::tuple<typename std::decay<Params>::type...>>(
            convert<typename std::decay<Params>::type>(std::forward<Args>(args))...);
        if (!admissible((const void*)kernel)) return;
        count_launch(this->kernel);
        if (stream_busy(stream)) {
            Launch self = *this;
            queue_op(stream, [self, kernel, values]() mutable {
                body = [&] { std::apply(kernel, *values); };
                self.run_grid();
                return true;
            }, "a kernel launch behind it");
            return;
        }
        body = [&] { std::apply(kernel, *values); };
        run_grid();
    }

    bool admissible(const void* kernel) {
        size_t threads = (size_t)block.x * block.y * block.z;
        auto opted = shared_opt_in.find(kernel);
        size_t shared_limit = opted == shared_opt_in.end() ? SHARED_DEFAULT : (size_t)opted->second;
        const char* why = NULL;
        if (threads == 0 || threads > 1024 || block.z > 64) why = "block size out of range";
        else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) why = "grid size out of range";
        else if (shared_bytes > shared_limit || shared_bytes > SHARED_MAX) why = "dynamic shared memory above the limit";
        if (why == NULL) return true;
        fprintf(stderr, "emulated GPU: launch refused: %s (grid %u,%u,%u block %u,%u,%u, %zu B shared)\n", why, grid.x, grid.y,
                grid.z, block.x, block.y, block.z, shared_bytes);
        last_error = cudaErrorInvalidConfiguration;
        return false;
    }

    void run_grid() {
        int n = (int)(block.x * block.y * block.z);
        grow_workers(n);
        block_dim = block, grid_dim = grid;
        unsigned char* smem = (unsigned char*)malloc(shared_bytes > 0 ? shared_bytes : 1);
        dynamic_shared_memory = smem;
        launch_refused = false;
        for (unsigned z = 0; z < grid.z && !launch_refused; z++)
            for (unsigned y = 0; y < grid.y && !launch_refused; y++)
                for (unsigned x = 0; x < grid.x && !launch_refused; x++) {
                    block_index = make_uint3(x, y, z), block_serial++;
                    memset(smem, 0xff, shared_bytes);
                    unsigned linear = x + grid.x * (y + grid.y * z);
                    run_block(n, linear % 2 == 1, linear / 2 % 2 == 1);
                }
        dynamic_shared_memory = NULL;
        free(smem);
    }
};

inline void* dynamic_shared() { return dynamic_shared_memory; }

// The first statement of a kernel declared with __launch_bounds__(max_threads[, min_blocks[, max_cluster]]),
// put there by emulate_source.pl: a block of more threads is refused as the GPU refuses the launch (its
// registers were allocated for max_threads; cudaErrorLaunchOutOfResources, "too many resources requested
// for launch"). The first thread of block 0 finds it before any thread has run a statement of the kernel;
// every thread then returns at once and run_grid stops, so the launch does nothing.
inline bool above_launch_bounds(const char* kernel, unsigned max_threads, unsigned = 0, unsigned = 0) {
    if (launch_refused) return true;
    unsigned threads = block_dim.x * block_dim.y * block_dim.z;
    if (threads <= max_threads) return false;
    fprintf(stderr, "emulated GPU: launch refused: %s: a block of %u threads, above its __launch_bounds__(%u)\n", kernel, threads,
            max_threads);
    last_error = cudaErrorLaunchOutOfResources;
    launch_refused = true;
    return true;
}

// A static __shared__ array (or scalar) of type A, one per declaration (a static local of the kernel, as
// emulate_source.pl writes it): the threads of a block share it, and the first thread of each block to reach
// the declaration refills it with NaN bytes, as dynamic shared memory is
template <typename A, size_t Align>
struct Shared {
    alignas(Align) A data;  // (Align: the declaration's __align__, else 16)
    uint64_t block = ~0ull;
    A& fresh() {
        if (block != block_serial) memset((void*)&data, 0xff, sizeof(data)), block = block_serial;
        return data;
    }
};

// What a GPU stops with "misaligned address": an access of n bytes (a 16-byte vector, a cp.async, an
// ldmatrix row) at an address that is not a multiple of n. Host memory would take it silently.
inline void check_aligned(const void* p, size_t n, const char* what) {
    if ((uintptr_t)p % n == 0) return;
    fprintf(stderr, "emulated GPU: misaligned address: %s of %zu bytes at %p\n", what, n, p);
    die("misaligned address");
}

// A warp exchange: this lane's bytes go to its slot of the next slot set, then it waits for the warp;
// returns the slot set, in which lane l's bytes are at [l]
inline const uint64_t (*publish(const void* bytes, size_t n, const char* name))[4] {
    Worker* w = &workers[current];
    uint64_t(*slots)[4] = exchange[w->thread / 32][w->exchanges++ % 2];
    memcpy(slots[w->thread % 32], bytes, n);
    wait(my_warp(), name);
    return slots;
}
inline int warp_lanes() { return std::min(32, block_threads - workers[current].thread / 32 * 32); }  // (a block's last warp may be partial)

// A shuffle: every lane publishes `value`, then reads lane source(lane)'s (its own when out of range)
template <typename T, typename Source>
T shuffle(T value, Source source, const char* name) {
    static_assert(sizeof(T) <= 32, "shuffles move at most 32 bytes here");
    const uint64_t(*slots)[4] = publish(&value, sizeof(T), name);
    int from = source(workers[current].thread % 32);
    T got = value;
    if (from >= 0 && from < warp_lanes()) memcpy((void*)&got, slots[from], sizeof(T));
    return got;
}

// The tensor-core instructions of llmc/attention_flash_mma.h, each a warp exchange: every lane publishes
// its operands, waits for the warp, and computes its own registers from all lanes' operands, with the
// PTX definitions' element maps of emulate_tensor_core.h (the model dev/cuda's flash replay uses too).
inline uint16_t half_of(uint32_t reg, int j) { return (uint16_t)(j ? reg >> 16 : reg & 0xffffu); }

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i..8i+7 give the addresses of rows 0..7 of
// matrix i. Each lane publishes the 16 bytes of its row, so the warp's load is complete before any lane
// goes on (and may overwrite the tile), as on the GPU.
inline void ldmatrix_x4(uint32_t r[4], const void* row_address, bool trans) {
    check_aligned(row_address, 16, "an ldmatrix row");
    const uint64_t(*slots)[4] = publish(row_address, 16, "ldmatrix");
    int lane = workers[current].thread % 32;
    for (int i = 0; i < 4; i++) {
        uint32_t reg = 0;
        for (int j = 0; j < 2; j++) {
            LdmatrixSource s = ldmatrix_source(lane, j, trans);
            const uint16_t* src = (const uint16_t*)slots[8 * i + s.row];
            reg |= (uint32_t)src[s.element] << (16 * j);
        }
        r[i] = reg;
    }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d (16x8, fp32) += A (16x16) . B (16x8), from every
// lane's A registers a[0..3] and B registers b0, b1
template <typename Tp>
void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const uint64_t(*slots)[4] = publish(mine, sizeof(mine), "mma");
    auto value = [](uint16_t bits) {
        Tp x;
        memcpy((void*)&x, &bits, 2);
        return (float)x;
    };
    auto a_value = [&](Fragment f) { return value(half_of(((const uint32_t*)slots[f.lane])[f.reg], f.half)); };
    auto b_value = [&](Fragment f) { return value(half_of(((const uint32_t*)slots[f.lane])[4 + f.reg], f.half)); };
    int lane = workers[current].thread % 32;
    for (int e = 0; e < 4; e++) d[e] += mma_16816_dot(lane, e, a_value, b_value);
}

// cp.async.cg.shared.global, 16 bytes (zeros when !valid). On a GPU the copy lands at some time between
// the instruction and the cp.async.wait_group that waits for its group; here at one of the two ends, by
// block: blocks 0 and 1 (mod 4) copy at once, so a copy into a buffer that other threads still read
// without a barrier between shows in one of the pass orders, and blocks 2 and 3 hold the copy back until
// its thread waits for it (cp_async_wait_all), so a read of the tile before the wait finds NaN or the
// tile before. Commit groups are kept: a wait completes the committed copies only.
inline void cp_async_copy(const PendingCopy& c) {
    if (c.valid) memcpy(c.smem, c.gmem, 16);
    else memset(c.smem, 0, 16);
}
inline void cp_async_16(void* smem, const void* gmem, bool valid) {
    check_aligned(smem, 16, "a cp.async destination"), check_aligned(gmem, 16, "a cp.async source");
    if (!defer_copies) return cp_async_copy({smem, gmem, valid});
    Worker* w = &workers[current];
    if (w->copies == PENDING_MAX) die("more cp.async copies outstanding in one thread than the emulation holds (PENDING_MAX)");
    pending[current][w->copies++] = {smem, gmem, valid};
}
inline void cp_async_commit() { workers[current].committed = workers[current].copies; }
// the first `upto` outstanding copies of this thread, in issue order; the rest move to the front
inline void cp_async_complete(int upto) {
    Worker* w = &workers[current];
    for (int i = 0; i < upto; i++) cp_async_copy(pending[current][i]);
    memmove(pending[current], pending[current] + upto, (w->copies - upto) * sizeof(PendingCopy));
    w->copies -= upto, w->committed = std::max(0, w->committed - upto);
}
inline void cp_async_wait_all() { cp_async_complete(workers[current].committed); }  // cp.async.wait_group 0

// the warp operations take a full mask only (all of llmc's do): a partial one would need the lanes it names
// told apart from the rest, which the one barrier per warp cannot do, so it stops the program
inline void full_mask_only(unsigned mask) {
    if (mask != 0xffffffffu) die("a warp operation with a partial mask, which the emulation does not model");
}
}  // namespace emu

inline void __syncthreads() { emu::wait(&emu::block_barrier, "__syncthreads"); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu::full_mask_only(mask);
    emu::wait(emu::my_warp(), "__syncwarp");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    emu::full_mask_only(mask);
    return emu::shuffle(v, [&](int lane) { return (lane ^ lane_mask) < ((lane / width) + 1) * width ? lane ^ lane_mask : lane; },
                        "__shfl_xor_sync");
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    emu::full_mask_only(mask);
    return emu::shuffle(v, [&](int lane) { return (lane / width) * width + src % width; }, "__shfl_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    emu::full_mask_only(mask);
    return emu::shuffle(v, [&](int lane) { return (int)(lane % width + delta) < width ? lane + (int)delta : lane; },
                        "__shfl_down_sync");
}

// memory and arithmetic intrinsics: the host's own operations
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcs(const T* p) { return *p; }
template <typename T>
inline void __stcs(T* p, T v) { *p = v; }
template <typename T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }  // (only inside the PTX the emulation replaces)
inline unsigned __float_as_uint(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    return u;
}
[[noreturn]] inline void __trap() { emu::die("__trap"); }
using std::max;
using std::min;

#include "emulate_runtime.h"  // cudaMalloc, cudaMemcpy, events, properties, cuBLAS(Lt), over host memory
#ifdef EMULATE_NCCL
#include "emulate_nccl.h"  // NCCL's calls between processes on this machine (the emulated train_gpt's NCCL engine)
#endif

#define DEV_CUDA_EMULATED 1  // common.cuh: check, do not time
