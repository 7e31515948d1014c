/*
 * emulate_selftest: the CPU emulation of emulate.h checked against what CUDA defines, before it is trusted
 * with the kernel files (`make -C dev/emulate selftest`, which `make -C dev/cuda emulate` runs first). It
 * is written as a dev/cuda check (../cuda/common.cuh: device buffers, check_close, finish). Each case
 * states the GPU's behaviour it expects:
 *   shuffles    __shfl_xor_sync, __shfl_down_sync (own value past the warp) and __shfl_sync with a width
 *               give the values the CUDA programming guide defines, for every lane of a 96-thread block;
 *   reduce      a 1024-thread block reduction through shared memory and __syncthreads, over 3 blocks;
 *   early exit  threads that return before __syncthreads do not hold back the others (sm_70+), also
 *               when the only thing left to happen is their exit (a pass in which threads just exit
 *               is progress, not a deadlock);
 *   ldmatrix    the warp's load completes before any lane goes on: lanes overwrite their own rows of
 *               the tile right after it and must still get the old values;
 *   2-D index   threadIdx/blockIdx/blockDim/gridDim of a (4, 3) grid of (8, 2, 2) blocks;
 *   limits      a launch above 48 KiB of dynamic shared memory is refused until the kernel opts in,
 *               a 1025-thread block is refused, and so is a block above the kernel's __launch_bounds__
 *               (cudaErrorLaunchOutOfResources), without running any of it;
 *   poison      shared memory, dynamic and static, starts each block as NaN, so an unwritten read is
 *               visible (the second block of two must not see what the first wrote in a static array);
 *   order       a missing barrier is seen whichever thread reads first: each thread reads the value of
 *               the thread before it without a barrier, which in lowest-first order always finds it
 *               written; the odd one of two blocks (highest first) must read the NaN instead;
 *   warps       a warp runs to its __syncthreads before the next moves: warp 0 writes after one warp
 *               barrier, warp 1 reads three warp barriers later, with no __syncthreads between; passes
 *               that moved every warp one warp operation at a time would always find the value written,
 *               but the block that runs warp 1 first (the odd one of two) must read the NaN;
 *   cp.async    a copy lands between its instruction and the wait for its group: blocks 0 and 1 of 4
 *               find it at once, blocks 2 and 3 only after cp_async_wait_all, and a wait leaves a copy
 *               not yet committed in flight (it lands at the next commit's wait);
 *   streams     a created stream runs behind the host: a kernel on it that writes a value, then a
 *               main-stream kernel that reads it without waiting for the stream: the read comes first;
 *               with cudaStreamWaitEvent on an event recorded after the write: after it; and a
 *               side-stream kernel that reads what the main stream overwrites after it, unwaited: late.
 *               With EMU_STREAMS=main-late (set here by emu::main_late) the mirror: a created stream's
 *               read of what the main stream writes before it, unwaited, comes first; waited for, after;
 *               and its write of what the main stream reads before it, unwaited, comes first too;
 *   pinned      a cudaMemcpyAsync to the device from pinned host memory reads the host buffer when the
 *               stream gets to it, not at the call: a value written after the call and before the host
 *               waits for the stream is the one copied; a stream or event synchronize between the call
 *               and the write gets the earlier value; a kernel launched behind the copy runs after it, on
 *               what it copied; a copy from pageable memory reads its source at the call, also when it
 *               is queued behind a pinned one, and lands in the stream's order; a wait for an event runs
 *               the stream only up to the event (a pinned copy queued after it still reads late).
 * Five programs the emulation must stop, each with an error that names the fault (the Makefile checks the
 * exit status and the message): `emulate_selftest deadlock`, a warp whose lanes wait at two barriers that
 * can never open; `divergent`, half a warp at __syncwarp and half at a shuffle; `mask`, a shuffle with a
 * partial mask; `freed`, pinned memory freed while a copy from it is still queued; `misaligned`, an
 * ldmatrix row 2 bytes off its 16-byte alignment (a GPU's "misaligned address"; cp.async and the
 * trainer's 16-byte load128/store128 are checked the same way).
 */
#include "../cuda/common.cuh"

__global__ void shuffles_kernel(int* out) {
    int lane = threadIdx.x % 32;
    out[threadIdx.x * 3 + 0] = __shfl_xor_sync(0xffffffff, (int)threadIdx.x, 5);
    out[threadIdx.x * 3 + 1] = __shfl_down_sync(0xffffffff, (int)threadIdx.x, 3);
    out[threadIdx.x * 3 + 2] = __shfl_sync(0xffffffff, lane * 10, 2, 8);  // lane 2 of each group of 8
}

__global__ void reduce_kernel(float* out, const float* in) {
    __shared__ float s[1024];
    s[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        __syncthreads();
        if ((int)threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

__global__ void early_exit_kernel(int* out, int n) {
    __shared__ int count;
    if ((int)threadIdx.x >= n) return;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    atomicAdd(&count, 1);
    __syncthreads();
    out[threadIdx.x] = count;
}

// warp 0 waits at __syncthreads while warp 1 shuffles and exits: its exits open the barrier
__global__ void exit_after_shuffle_kernel(int* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
        out[threadIdx.x] = 1;
        return;
    }
    out[threadIdx.x] = __shfl_xor_sync(0xffffffff, (int)threadIdx.x, 1);
}

// one warp loads an 8x8 tile (x4: the same tile four times) of 16-bit values with ldmatrix, then each lane
// overwrites its row; the registers must hold the values from before
__global__ void ldmatrix_kernel(uint32_t* out) {
    __shared__ uint16_t tile[32][8];
    int lane = threadIdx.x;
    for (int e = 0; e < 8; e++) tile[lane][e] = (uint16_t)(lane * 8 + e);
    __syncwarp();
    uint32_t r[4];
    emu::ldmatrix_x4(r, tile[lane], false);
    for (int e = 0; e < 8; e++) tile[lane][e] = 0xffff;
    for (int i = 0; i < 4; i++) out[lane * 4 + i] = r[i];
}

__global__ void index_kernel(int* out) {
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * blockIdx.y;
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + threadIdx.z * 100 + threadIdx.y * 10 + threadIdx.x;
}

// declared for 64 threads: a block of 128 must be refused and write nothing
__global__ void __launch_bounds__(64) bounded_kernel(int* out) { out[threadIdx.x] = 1; }

__global__ void shared_kernel(float* out) {
    extern __shared__ float dyn[];
    out[threadIdx.x] = dyn[threadIdx.x];
}

// reads its static array before writing it: NaN in every block
__global__ void static_shared_kernel(float* out) {
    __shared__ float s[32];
    out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
    s[threadIdx.x] = 1.0f;
}

// the bug `order` must expose: no __syncthreads between the write and the read of another thread's value
__global__ void missing_barrier_kernel(float* out) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = (float)threadIdx.x;
    out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x > 0 ? dyn[threadIdx.x - 1] : 0.0f;
}

// the race `warps` must expose: warp 1 reads what warp 0 wrote with warp barriers between, but no
// __syncthreads. out: 32 values per block, warp 1's
__global__ void warp_race_kernel(float* out) {
    __shared__ float s[32];
    int lane = threadIdx.x % 32;
    __syncwarp();
    if (threadIdx.x < 32) s[lane] = (float)lane;
    __syncwarp();
    __syncwarp();
    __syncwarp();
    if (threadIdx.x >= 32) out[blockIdx.x * 32 + lane] = s[lane];
}

// each thread copies 16 bytes (4 ints) into its slot of two tiles with cp.async and reads its slot: before
// committing, after waiting for the first tile's group, with the second tile's copy issued but not yet
// committed, and after committing and waiting for that one. out: 4 ints per thread
__global__ void cp_async_kernel(int* out, const int* src) {
    __shared__ __align__(16) int first[32 * 4];
    __shared__ __align__(16) int second[32 * 4];
    int t = threadIdx.x, g = blockIdx.x * 32 + t, *o = out + g * 4;
    emu::cp_async_16(&first[t * 4], &src[g * 4], true);
    o[0] = first[t * 4];  // before the wait
    emu::cp_async_commit();
    emu::cp_async_16(&second[t * 4], &src[(128 + g) * 4], true);
    emu::cp_async_wait_all();
    o[1] = first[t * 4];   // committed and waited for
    o[2] = second[t * 4];  // not committed: the wait left it in flight
    emu::cp_async_commit();
    emu::cp_async_wait_all();
    o[3] = second[t * 4];
}

// lanes 0-15 wait for the block, lanes 16-31 for the warp: neither barrier can open
__global__ void deadlock_kernel(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    else __syncwarp();
    out[threadIdx.x] = 1;
}

// lanes 0-15 at __syncwarp, lanes 16-31 at a shuffle: on a GPU undefined (the shuffle reads lanes that
// never give a value); here both would pass the one warp barrier
__global__ void divergent_kernel(int* out) {
    if (threadIdx.x < 16) __syncwarp();
    else out[threadIdx.x] = __shfl_xor_sync(0xffffffff, (int)threadIdx.x, 1);
}

// an ldmatrix whose rows start 2 bytes into the tile
__global__ void misaligned_kernel(uint32_t* out) {
    __shared__ uint16_t tile[32][9];
    uint32_t r[4];
    emu::ldmatrix_x4(r, &tile[threadIdx.x][1], false);
    out[threadIdx.x] = r[0];
}

__global__ void mask_kernel(int* out) { out[threadIdx.x] = __shfl_xor_sync(0x0000ffff, (int)threadIdx.x, 1); }

static void check_ints(const char* what, const int* got, const int* want, int n) {
    float* g = (float*)malloc_check(n * sizeof(float));
    float* w = (float*)malloc_check(n * sizeof(float));
    for (int i = 0; i < n; i++) g[i] = (float)got[i], w[i] = (float)want[i];
    float* d = dev_upload(g, n);
    check_close(what, d, w, n, 0.0, 0.0);
    cudaCheck(cudaFree(d));
    free(g), free(w);
}

__global__ void times_ten_kernel(int* p) { p[threadIdx.x] *= 10; }

// the first int of d after the host has waited for the main stream
static int first_after_wait(const int* d) {
    int v;
    cudaCheck(cudaStreamSynchronize(main_stream));
    dev_download(&v, d, 1);
    return v;
}

__global__ void set_kernel(int* p, int v) { *p = v; }
__global__ void copy_int_kernel(int* dst, const int* src) { *dst = *src; }

// the streams case (see the top of the file): d[0] the value, d[1] what the side stream copied of it
static void check_side_stream(int* d) {
    bool order = emu::main_late;  // (EMU_STREAMS as this program was started with: both orders are set here)
    emu::main_late = false;
    cudaStream_t side;
    cudaEvent_t written;
    cudaCheck(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreate(&written));
    int got[3], want[3] = {7, 70, 2};
    set_kernel<<<1, 1, 0, main_stream>>>(d, 1);
    set_kernel<<<1, 1, 0, side>>>(d, 7);            // the write, unwaited
    times_ten_kernel<<<1, 1, 0, main_stream>>>(d);  // reads 1, writes 10; the side stream's 7 lands later
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got, d, 1);
    set_kernel<<<1, 1, 0, side>>>(d, 7);  // the write, waited for
    cudaCheck(cudaEventRecord(written, side));
    cudaCheck(cudaStreamWaitEvent(main_stream, written, 0));
    times_ten_kernel<<<1, 1, 0, main_stream>>>(d);
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got + 1, d, 1);
    set_kernel<<<1, 1, 0, main_stream>>>(d, 1);
    copy_int_kernel<<<1, 1, 0, side>>>(d + 1, d);  // reads d[0] when the side stream runs: after the overwrite
    set_kernel<<<1, 1, 0, main_stream>>>(d, 2);
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got + 2, d + 1, 1);
    check_ints("streams: a created stream's work runs after the main stream's unless waited for", got, want, 3);
    emu::main_late = true;  // the mirror (EMU_STREAMS=main-late)
    int want_late[3] = {1, 8, 5};
    set_kernel<<<1, 1, 0, main_stream>>>(d, 1);
    cudaCheck(cudaDeviceSynchronize());
    set_kernel<<<1, 1, 0, main_stream>>>(d, 7);
    copy_int_kernel<<<1, 1, 0, side>>>(d + 1, d);  // the read, unwaited: before the main stream's write
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got, d + 1, 1);
    set_kernel<<<1, 1, 0, main_stream>>>(d, 8);
    cudaCheck(cudaEventRecord(written, main_stream));
    cudaCheck(cudaStreamWaitEvent(side, written, 0));
    copy_int_kernel<<<1, 1, 0, side>>>(d + 1, d);  // the read, waited for
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got + 1, d + 1, 1);
    copy_int_kernel<<<1, 1, 0, main_stream>>>(d + 2, d);  // the main stream's read of 8 ...
    set_kernel<<<1, 1, 0, side>>>(d, 5);                   // ... and a later write, unwaited: it comes first
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got + 2, d + 2, 1);
    emu::main_late = order;
    check_ints("streams (main-late): a created stream's work runs before the main stream's unless it waits", got, want_late, 3);
    cudaCheck(cudaEventDestroy(written));
    cudaCheck(cudaStreamDestroy(side));
}

// the pinned case (see the top of the file)
static void check_pinned_copies(int* d) {
    int *pinned = NULL, *pageable = (int*)malloc_check(sizeof(int));
    cudaCheck(cudaMallocHost((void**)&pinned, 2 * sizeof(int)));
    cudaEvent_t copied;
    cudaCheck(cudaEventCreate(&copied));
    int got[7], want[7] = {2, 3, 5, 80, 9, 12, 16};
    const cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
    *pinned = 1;  // written again before the wait: the copy reads it late
    cudaCheck(cudaMemcpyAsync(d, pinned, sizeof(int), h2d, main_stream));
    *pinned = 2;
    got[0] = first_after_wait(d);
    *pinned = 3;  // a synchronize between: read by then
    cudaCheck(cudaMemcpyAsync(d, pinned, sizeof(int), h2d, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    *pinned = 4;
    got[1] = first_after_wait(d);
    *pinned = 5;  // an event recorded after the copy and waited for
    cudaCheck(cudaMemcpyAsync(d, pinned, sizeof(int), h2d, main_stream));
    cudaCheck(cudaEventRecord(copied, main_stream));
    cudaCheck(cudaEventSynchronize(copied));
    *pinned = 6;
    got[2] = first_after_wait(d);
    *pinned = 7;  // a kernel behind the copy: runs after it, on the value read late
    cudaCheck(cudaMemcpyAsync(d, pinned, sizeof(int), h2d, main_stream));
    times_ten_kernel<<<1, 1, 0, main_stream>>>(d);
    *pinned = 8;
    got[3] = first_after_wait(d);
    *pageable = 9;  // pageable: read at the call
    cudaCheck(cudaMemcpyAsync(d, pageable, sizeof(int), h2d, main_stream));
    *pageable = 10;
    got[4] = first_after_wait(d);
    *pinned = 11;  // pageable behind a queued pinned copy: read at the call, written after the pinned copy
    cudaCheck(cudaMemcpyAsync(d, pinned, sizeof(int), h2d, main_stream));
    *pageable = 12;
    cudaCheck(cudaMemcpyAsync(d, pageable, sizeof(int), h2d, main_stream));
    *pageable = 13, *pinned = 14;
    got[5] = first_after_wait(d);
    pinned[1] = 15;  // a copy queued after the event waited for still reads late
    cudaCheck(cudaMemcpyAsync(d, pinned, sizeof(int), h2d, main_stream));
    cudaCheck(cudaEventRecord(copied, main_stream));
    cudaCheck(cudaMemcpyAsync(d, pinned + 1, sizeof(int), h2d, main_stream));
    cudaCheck(cudaEventSynchronize(copied));
    pinned[1] = 16;
    got[6] = first_after_wait(d);
    check_ints("pinned: late read, stream and event synchronize, kernel after, pageable at the call, order, after an event",
               got, want, 7);
    cudaCheck(cudaEventDestroy(copied));
    cudaCheck(cudaFreeHost(pinned));
    free(pageable);
}

int main(int argc, char** argv) {
    int* d_int = dev_alloc<int>(4096);
    if (argc > 1) {  // a fault the emulation must stop on: returning from here is a failure
        if (strcmp(argv[1], "deadlock") == 0) deadlock_kernel<<<1, 32, 0, main_stream>>>(d_int);
        else if (strcmp(argv[1], "divergent") == 0) divergent_kernel<<<1, 32, 0, main_stream>>>(d_int);
        else if (strcmp(argv[1], "mask") == 0) mask_kernel<<<1, 32, 0, main_stream>>>(d_int);
        else if (strcmp(argv[1], "misaligned") == 0) misaligned_kernel<<<1, 32, 0, main_stream>>>((uint32_t*)d_int);
        else if (strcmp(argv[1], "freed") == 0) {  // freed before the stream has run the copy from it
            int* pinned = NULL;
            cudaCheck(cudaMallocHost((void**)&pinned, sizeof(int)));
            cudaCheck(cudaMemcpyAsync(d_int, pinned, sizeof(int), cudaMemcpyHostToDevice, main_stream));
            cudaCheck(cudaFreeHost(pinned));
        }
        printf("%s: not detected\n", argv[1]);
        return 0;
    }
    int got[4096], want[4096];

    shuffles_kernel<<<1, 96, 0, main_stream>>>(d_int);
    dev_download(got, d_int, 96 * 3);
    for (int t = 0; t < 96; t++) {
        int lane = t % 32;
        want[t * 3 + 0] = t ^ 5;
        want[t * 3 + 1] = lane + 3 < 32 ? t + 3 : t;
        want[t * 3 + 2] = ((lane / 8) * 8 + 2) * 10;
    }
    check_ints("shuffles", got, want, 96 * 3);

    float* in = make_random_uniform(3 * 1024, 5, -1.0f, 1.0f);
    float *d_in = dev_upload(in, 3 * 1024), *d_out = dev_alloc<float>(1024);
    reduce_kernel<<<3, 1024, 0, main_stream>>>(d_out, d_in);
    float sums[3];
    for (int b = 0; b < 3; b++) {  // the same pairwise order as the kernel, so the sums are exact matches
        float s[1024];
        memcpy(s, in + b * 1024, sizeof(s));
        for (int half = 512; half > 0; half /= 2)
            for (int i = 0; i < half; i++) s[i] += s[i + half];
        sums[b] = s[0];
    }
    check_close("reduce", d_out, sums, 3, 0.0, 0.0);

    early_exit_kernel<<<1, 64, 0, main_stream>>>(d_int, 40);
    dev_download(got, d_int, 40);
    for (int t = 0; t < 40; t++) want[t] = 40;
    check_ints("exit", got, want, 40);

    exit_after_shuffle_kernel<<<1, 64, 0, main_stream>>>(d_int);
    dev_download(got, d_int, 64);
    for (int t = 0; t < 64; t++) want[t] = t < 32 ? 1 : t ^ 1;
    check_ints("exit2", got, want, 64);

    uint32_t* d_regs = dev_alloc<uint32_t>(128);
    ldmatrix_kernel<<<1, 32, 0, main_stream>>>(d_regs);
    uint32_t regs[128];
    dev_download(regs, d_regs, 128);
    for (int l = 0; l < 32; l++)  // matrix i = rows 8i..8i+7 of the tile; lane l gets row l/4, elements 2(l%4), +1
        for (int i = 0; i < 4; i++) {
            int row = 8 * i + l / 4, e = 2 * (l % 4);
            got[l * 4 + i] = (int)regs[l * 4 + i];  // < 2^24: exact as the float check_close compares
            want[l * 4 + i] = (row * 8 + e + 1) << 16 | (row * 8 + e);
        }
    check_ints("ldmatrix", got, want, 128);
    cudaCheck(cudaFree(d_regs));

    index_kernel<<<dim3(4, 3), dim3(8, 2, 2), 0, main_stream>>>(d_int);
    dev_download(got, d_int, 12 * 32);
    for (int b = 0; b < 12; b++)
        for (int t = 0; t < 32; t++) want[b * 32 + t] = b * 1000 + (t / 16) * 100 + (t / 8 % 2) * 10 + t % 8;
    check_ints("index", got, want, 12 * 32);

    const int big = 64 << 10;
    printf("  (the three refused launches reported below are part of the test)\n");
    fflush(stdout);
    shared_kernel<<<1, 32, big, main_stream>>>(d_out);
    bool refused = cudaGetLastError() != cudaSuccess;
    cudaCheck(cudaFuncSetAttribute(shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    shared_kernel<<<1, 32, big, main_stream>>>(d_out);
    bool allowed = cudaGetLastError() == cudaSuccess;
    shared_kernel<<<1, 1025, 0, main_stream>>>(d_out);
    bool refused_block = cudaGetLastError() != cudaSuccess;
    check_scalar("limits", refused && allowed && refused_block, 1.0, 0.0);
    cudaCheck(cudaMemset(d_int, 0, 192 * sizeof(int)));
    bounded_kernel<<<1, 64, 0, main_stream>>>(d_int);
    bool within_bounds = cudaGetLastError() == cudaSuccess;
    bounded_kernel<<<1, 128, 0, main_stream>>>(d_int + 64);
    bool above_bounds = cudaGetLastError() == cudaErrorLaunchOutOfResources;
    check_scalar("limits: __launch_bounds__(64) allows 64 threads, refuses 128", within_bounds && above_bounds, 1.0, 0.0);
    dev_download(got, d_int, 192);
    for (int t = 0; t < 192; t++) want[t] = t < 64 ? 1 : 0;
    check_ints("limits: the refused launch wrote nothing", got, want, 192);

    float poison[32];
    dev_download(poison, d_out, 32);
    int nans = 0;
    for (int i = 0; i < 32; i++) nans += poison[i] != poison[i];
    check_scalar("poison", nans, 32.0, 0.0);
    static_shared_kernel<<<2, 32, 0, main_stream>>>(d_out);
    float unwritten[64];
    dev_download(unwritten, d_out, 64);
    nans = 0;
    for (int i = 0; i < 64; i++) nans += unwritten[i] != unwritten[i];
    check_scalar("poison (static, 2 blocks)", nans, 64.0, 0.0);

    missing_barrier_kernel<<<2, 64, 64 * sizeof(float), main_stream>>>(d_out);
    float read[128];
    dev_download(read, d_out, 128);
    int stale[2] = {0, 0};  // per block, the threads that read their neighbour's value before it was written
    for (int i = 0; i < 128; i++) stale[i / 64] += read[i] != (float)(i % 64 > 0 ? i % 64 - 1 : 0);
    check_scalar("order: block 0 (lowest first) reads every value written", stale[0], 0.0, 0.0);
    check_scalar("order: block 1 (highest first) reads all 63 too early", stale[1], 63.0, 0.0);

    warp_race_kernel<<<2, 64, 0, main_stream>>>(d_out);
    dev_download(read, d_out, 64);
    for (int b = 0; b < 2; b++) {
        stale[b] = 0;
        for (int l = 0; l < 32; l++) stale[b] += read[b * 32 + l] != (float)l;
    }
    check_scalar("warps: block 0 (warp 0 first) reads what warp 0 wrote", stale[0], 0.0, 0.0);
    check_scalar("warps: block 1 (warp 1 first) reads all 32 before warp 0 writes", stale[1], 32.0, 0.0);

    int src[256 * 4];
    for (int i = 0; i < 256 * 4; i++) src[i] = i;
    int* d_src = dev_alloc<int>(256 * 4);
    cudaCheck(cudaMemcpy(d_src, src, sizeof(src), cudaMemcpyHostToDevice));
    cp_async_kernel<<<4, 32, 0, main_stream>>>(d_int, d_src);
    dev_download(got, d_int, 128 * 4);
    for (int g = 0; g < 128; g++) {
        bool deferred = g / 32 >= 2;  // blocks 2 and 3; -1: the NaN bytes shared memory starts with
        want[g * 4 + 0] = deferred ? -1 : g * 4;
        want[g * 4 + 1] = g * 4;
        want[g * 4 + 2] = deferred ? -1 : (128 + g) * 4;
        want[g * 4 + 3] = (128 + g) * 4;
    }
    check_ints("cp.async: at once in blocks 0-1, at the wait for its committed group in blocks 2-3", got, want, 128 * 4);
    cudaCheck(cudaFree(d_src));

    check_side_stream(d_int);
    check_pinned_copies(d_int);
    return finish();
}
