/*
 * common.cuh: what every kernel file in dev/cuda/ shares.
 *
 * - the command line: `./kernel` runs every version, `./kernel N` only version N;
 * - random inputs from a fixed seed (the project's splitmix64 generator from llmc/common.h), so every run
 *   sees the same data;
 * - device allocation and copies with every CUDA call checked (cudaCheck / cublasCheck come from
 *   llmc/device.h, which every llmc header includes);
 * - check_close(): compares a device result with the CPU reference, prints the largest absolute and
 *   relative errors and PASS/FAIL against a stated tolerance (|gpu - ref| <= atol + rtol * |ref| for every
 *   element; NaN always fails), and counts failures so that main() can exit non-zero;
 * - benchmark_ms(): time per call with cudaEvents, after a warmup, averaged over many calls. Before each
 *   timed call a buffer twice the size of the L2 cache is cleared, so inputs left in L2 by the previous
 *   call do not inflate the bandwidth (the clear itself is outside the timed interval);
 * - the reference bandwidth: one large cudaMemcpyDeviceToDevice, counted as 2 * bytes / time (read and
 *   write), measured once at start. Memory-bound kernels print their GB/s as a share of it.
 *
 * These files are built fp32 (floatX = float in llmc/device.h).
 */
#pragma once

#include "../../llmc/device.h"

#if defined(ENABLE_BF16) || defined(ENABLE_FP16)
#error "dev/cuda kernels are checked in fp32: build without ENABLE_BF16 / ENABLE_FP16"
#endif

// Built on the CPU emulation (../emulate/emulate.h, `make emulate`), a program checks and does not time; where
// its GPU shape would take minutes there, it checks a smaller batch, or only its odd shapes.
#ifdef DEV_CUDA_EMULATED
static const bool EMULATED = true;
#else
static const bool EMULATED = false;
#endif

// ----------------------------------------------------------------------------------------------------
// command line

// 0 = run every version, else the version asked for (1-based); names[v] says what version v is
// (names[0] unused), for the usage message
static int parse_version(int argc, char** argv, int num_versions, const char* const* names) {
    device_require_gpu();  // every kernel's main starts here: a clear error without a GPU or driver
    if (argc < 2) return 0;
    char* end = NULL;
    long v = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || v < 1 || v > num_versions) {
        fprintf(stderr, "usage: %s [version]   (version 1..%d; no argument runs all)\n", argv[0], num_versions);
        for (int i = 1; i <= num_versions; i++) fprintf(stderr, "  %d  %s\n", i, names[i]);
        exit(2);
    }
    return (int)v;
}

static inline bool version_selected(int selected, int v) { return selected == 0 || selected == v; }

// ----------------------------------------------------------------------------------------------------
// random host data (fixed seeds)

static float* make_random_uniform(size_t n, uint64_t seed, float lo, float hi) {
    float* x = (float*)malloc_check(n * sizeof(float));
    Rng rng = {seed};
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * rng_uniform(&rng);
    return x;
}

static float* make_random_normal(size_t n, uint64_t seed, float stddev) {
    float* x = (float*)malloc_check(n * sizeof(float));
    Rng rng = {seed};
    for (size_t i = 0; i < n; i++) x[i] = stddev * rng_normal(&rng);
    return x;
}

// integers uniform in [0, bound)
static int* make_random_ints(size_t n, uint64_t seed, int bound) {
    int* x = (int*)malloc_check(n * sizeof(int));
    Rng rng = {seed};
    for (size_t i = 0; i < n; i++) x[i] = (int)(rng_next_u64(&rng) % (uint64_t)bound);
    return x;
}

static float* host_copy(const float* src, size_t n) {
    float* x = (float*)malloc_check(n * sizeof(float));
    memcpy(x, src, n * sizeof(float));
    return x;
}

// ----------------------------------------------------------------------------------------------------
// device memory

template <typename Tp>
static Tp* dev_alloc(size_t n) {
    Tp* p = NULL;
    cudaCheck(cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(Tp)));
    return p;
}

template <typename Tp>
static Tp* dev_upload(const Tp* host, size_t n) {
    Tp* p = dev_alloc<Tp>(n);
    cudaCheck(cudaMemcpy(p, host, n * sizeof(Tp), cudaMemcpyHostToDevice));
    return p;
}

template <typename Tp>
static void dev_set(Tp* dev, const Tp* host, size_t n) {
    cudaCheck(cudaMemcpy(dev, host, n * sizeof(Tp), cudaMemcpyHostToDevice));
}

template <typename Tp>
static void dev_download(Tp* host, const Tp* dev, size_t n) {
    cudaCheck(cudaMemcpy(host, dev, n * sizeof(Tp), cudaMemcpyDeviceToHost));
}

static int sm_count(void) {
    int dev = 0, n = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
}

// ----------------------------------------------------------------------------------------------------
// checking against the CPU reference

static int g_failures = 0;

// compares n floats on the device with the host reference; returns true on PASS
static bool check_close(const char* what, const float* dev, const float* ref, size_t n, double atol, double rtol) {
    float* got = (float*)malloc_check(n * sizeof(float));
    cudaCheck(cudaDeviceSynchronize());
    dev_download(got, dev, n);
    double max_abs = 0.0, max_rel = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ref[i], g = got[i];
        double err = fabs(g - r);
        bool ok = err <= atol + rtol * fabs(r);  // false for NaN
        if (!ok) {
            if (bad < 5) printf("    mismatch %s[%zu]: gpu %.8g  cpu %.8g\n", what, i, g, r);
            bad++;
        }
        if (err != err) err = INFINITY;
        if (err > max_abs) max_abs = err;
        if (fabs(r) > atol && err / fabs(r) > max_rel) max_rel = err / fabs(r);
    }
    free(got);
    bool pass = bad == 0;
    printf("  %-8s max abs err %.3e, max rel err %.3e (|ref| > atol), tol %.0e + %.0e*|ref|: %s",
           what, max_abs, max_rel, atol, rtol, pass ? "PASS" : "FAIL");
    if (!pass) printf(" (%zu of %zu elements out of tolerance)", bad, n);
    printf("\n");
    if (!pass) g_failures++;
    return pass;
}

// the same for a single value computed on the host from device results
static bool check_scalar(const char* what, double got, double ref, double rtol) {
    double err = fabs(got - ref), rel = err / (fabs(ref) > 0 ? fabs(ref) : 1.0);
    bool pass = rel <= rtol;  // false for NaN
    printf("  %-8s gpu %.10g cpu %.10g, rel err %.3e, tol %.0e: %s\n", what, got, ref, rel, rtol, pass ? "PASS" : "FAIL");
    if (!pass) g_failures++;
    return pass;
}

// the exit status of main()
static int finish(void) {
    if (g_failures > 0) {
        printf("FAILED: %d check(s) out of tolerance\n", g_failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}

// ----------------------------------------------------------------------------------------------------
// timing

static void* g_flush_buf = NULL;
static size_t g_flush_bytes = 0;
static double g_copy_gbs = 0.0;

// prints the device, measures the device-to-device copy bandwidth, sets up the L2 flush buffer
static void bench_init(void) {
#ifdef DEV_CUDA_EMULATED
    printf("device: emulated on the CPU (dev/emulate/emulate.h): checks only, nothing is timed\n");
    return;
#endif
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    int l2 = 0;
    cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    g_flush_bytes = (size_t)(l2 > 0 ? 2 * l2 : 64 << 20);
    cudaCheck(cudaMalloc(&g_flush_buf, g_flush_bytes));

    const size_t bytes = (size_t)1 << 30;  // 1 GiB, far beyond any L2
    void *src = NULL, *dst = NULL;
    cudaCheck(cudaMalloc(&src, bytes));
    cudaCheck(cudaMalloc(&dst, bytes));
    cudaCheck(cudaMemset(src, 0, bytes));
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < 3; i++) cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, main_stream));
    const int reps = 20;
    cudaCheck(cudaEventRecord(start, main_stream));
    for (int i = 0; i < reps; i++) cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, main_stream));
    cudaCheck(cudaEventRecord(stop, main_stream));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    g_copy_gbs = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaFree(src));
    cudaCheck(cudaFree(dst));
    printf("device: %s (sm_%d%d, %d SMs, L2 %d MiB); device-to-device copy: %.1f GB/s (2 x bytes / time)\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, l2 >> 20, g_copy_gbs);
}

// Average milliseconds per call of f(), each call timed by its own pair of events with the L2 cleared
// before it (outside the timed interval).
template <typename F>
static float benchmark_ms(F f, int reps = 100, int warmup = 5) {
#ifdef DEV_CUDA_EMULATED
    (void)f, (void)reps, (void)warmup;
    return NAN;
#endif
    if (g_flush_buf == NULL) bench_init();
    for (int i = 0; i < warmup; i++) f();
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaDeviceSynchronize());
    cudaEvent_t* ev = (cudaEvent_t*)malloc_check(2 * (size_t)reps * sizeof(cudaEvent_t));
    for (int i = 0; i < 2 * reps; i++) cudaCheck(cudaEventCreate(&ev[i]));
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaMemsetAsync(g_flush_buf, i & 0xff, g_flush_bytes, main_stream));
        cudaCheck(cudaEventRecord(ev[2 * i], main_stream));
        f();
        cudaCheck(cudaEventRecord(ev[2 * i + 1], main_stream));
    }
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaEventSynchronize(ev[2 * reps - 1]));
    double total = 0.0;
    for (int i = 0; i < reps; i++) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        total += ms;
    }
    for (int i = 0; i < 2 * reps; i++) cudaCheck(cudaEventDestroy(ev[i]));
    free(ev);
    return (float)(total / reps);
}

// memory-bound: bytes = the least DRAM traffic one call needs (stated next to each call)
static void print_bandwidth(const char* name, float ms, double bytes) {
    if (ms != ms) return;  // not timed (emulated)
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("  %-28s %9.4f ms/call  %8.1f GB/s  (%5.1f%% of copy bandwidth)\n", name, ms, gbs, 100.0 * gbs / g_copy_gbs);
}

// The loop of the elementwise kernels: each selected version runs once on a cleared output `out_name`
// (n floats), is checked against ref and timed (GB/s for `bytes` moved per call). run(v) runs version v;
// names[v] is printed with its results.
template <typename Run>
static void check_and_time_versions(const char* kernel, const char* out_name, int num_versions, const char* const* names,
                                    int selected, float* d_out, const float* ref, size_t n, double atol, double rtol,
                                    double bytes, Run run) {
    for (int v = 1; v <= num_versions; v++) {
        if (!version_selected(selected, v)) continue;
        printf("version %d: %s\n", v, names[v]);
        cudaCheck(cudaMemset(d_out, 0, n * sizeof(float)));
        run(v);
        check_close(out_name, d_out, ref, n, atol, rtol);
        print_bandwidth(kernel, benchmark_ms([&] { run(v); }), bytes);
    }
}

// compute-bound
static void print_flops(const char* name, float ms, double flops) {
    if (ms != ms) return;  // not timed (emulated)
    printf("  %-28s %9.4f ms/call  %8.2f TFLOP/s\n", name, ms, flops / (ms * 1e-3) / 1e12);
}
