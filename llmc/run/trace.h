/*
 * trace.h: --trace FILE, a Chrome/Perfetto timeline of a few training steps, one process per rank and
 * two lanes in each: "compute" (forward, backward, optimizer) and "communication" (pipeline sends and
 * receives, data-parallel reductions per gradient bucket, ZeRO-3's parameter gathers, tensor-parallel
 * f/g sums, the tied-embedding sum). A learner sees there where a rank waits (the pipeline bubble, a
 * receive that blocks) and whether communication overlaps compute. scripts/plot_trace.py draws the file;
 * ui.perfetto.dev opens it.
 *
 * Every rank records its own spans and writes them to FILE.rank<r>; rank 0 merges the parts. The ranks'
 * timestamps must share one origin, or a receive seems to end before its send began: each rank's clock
 * is compared with rank 0's (trace_align_clocks, below), so the origin is the same instant on every rank,
 * whatever each rank's clock reads and however late each rank got there.
 *
 * The file ends with a "run" record: the techniques in use (dp, ZeRO stage, tp, pp, the schedule) and a
 * title naming them, and the notes a reader of the picture needs: a warning when the ranks outnumber the
 * machine's cores (then a bar's length is partly waiting for a core), and a hint when one pipeline stage
 * computes more than twice as long as another (--pp-split evens them). The run's last lines print the same.
 */
#pragma once

#include <unistd.h>     // sysconf: the machine's cores
#include "../comm.h"    // Comm: clocks aligned, parts merged
#include "../device.h"  // device_synchronize
#if defined(LLMC_CPU) && defined(_OPENMP)
#include <omp.h>  // omp_get_max_threads: each rank's threads, for the warning on shared cores
#endif

typedef enum { LANE_COMPUTE = 0, LANE_COMMUNICATION = 1 } TraceLane;

typedef struct {
    char name[40];
    const char* cat;  // forward | backward | optimizer  |  send | recv | sendrecv | allreduce | reducescatter
                      // | allgather | tp
    double start_us, dur_us;
} TraceEvent;

typedef struct {
    int enabled;  // recording now
    int n, cap;
    TraceEvent* events;
    double origin;        // this rank's trace_clock() at the instant that is time 0 on every rank
    double origin_error;  // at most this far (seconds) from that instant (trace_align_clocks' bound)
    double skew;          // testing (--fault-clock-skew): added to this rank's clock readings
    double busy_s;        // forward + backward time in the traced steps
    double pipeline_s;    // wall time of the traced steps' pipelines (first forward to last backward)
} Tracer;

static TraceLane trace_lane(const char* cat) {
    int compute = strcmp(cat, "forward") == 0 || strcmp(cat, "backward") == 0 || strcmp(cat, "optimizer") == 0;
    return compute ? LANE_COMPUTE : LANE_COMMUNICATION;
}

static double trace_clock(const Tracer* tr) { return wall_seconds() + tr->skew; }

// A traced pipeline step took `seconds` from its first forward to its last backward: what its busy share,
// and so the measured bubble, is measured against (tr NULL: not traced)
static void trace_pipeline_time(Tracer* tr, double seconds) {
    if (tr != NULL && tr->enabled) tr->pipeline_s += seconds;
}
static double trace_now_us(const Tracer* tr) { return tr ? (trace_clock(tr) - tr->origin) * 1e6 : 0.0; }

// Records a span from start_us to now. The GPU is synchronized first, so that a span is the time its
// work took, not the time to queue it (tracing slows a run down a little; it is for looking at).
// micro >= 0 is appended to the name ("F 3"); a caller that names the interleaved schedule's chunk too
// passes the whole name ("F 3.1": micro-batch 3 through the stage's chunk 1) and -1.
static void trace_add(Tracer* tr, const char* cat, const char* name, int micro, double start_us) {
    if (tr == NULL || !tr->enabled) return;
    device_synchronize();
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? 2 * tr->cap : 1024;
        tr->events = (TraceEvent*)realloc_check(tr->events, tr->cap * sizeof(TraceEvent));
    }
    TraceEvent* e = &tr->events[tr->n++];
    if (micro >= 0) snprintf(e->name, sizeof(e->name), "%s %d", name, micro);
    else snprintf(e->name, sizeof(e->name), "%s", name);
    e->cat = cat;
    e->start_us = start_us;
    e->dur_us = trace_now_us(tr) - start_us;
    if (strcmp(cat, "forward") == 0 || strcmp(cat, "backward") == 0) tr->busy_s += e->dur_us * 1e-6;
}

// Collective over the world, when the first traced step begins (close to the spans it aligns, as clocks
// of different nodes drift apart slowly): sets tr->origin on every rank to one instant, rank 0's clock
// reading at the last of a few rounds. Each round, rank 0 reads its clock t0 and all-reduces it (the
// others add 0). On rank r, whose clock reads `enter` before and `leave` after each round: rank 0 read
// t0 before it entered this round, which ends on rank r only after that (so t0 happened before `leave`),
// and after it left the previous round, which it could leave only after rank r entered it (so after the
// previous round's `enter`). Rank r's clock at the instant rank 0 read t0 therefore lies between those
// two readings; the rounds' intervals are intersected and the middle taken, so the error is at most half
// the intersection's width (kept in origin_error and written into the trace): microseconds on a quiet
// machine, more where ranks share busy cores; whatever each node's clock reads. (An empty intersection
// could only come from clocks drifting apart during the rounds; its gap is then taken as the error.)
// skew_s (testing): rank r's clock reads r * skew_s seconds ahead, which the alignment must cancel.
static void trace_align_clocks(Tracer* tr, Comm* comm, double skew_s) {
    tr->skew = comm->world_rank * skew_s;
    double lo = -INFINITY, hi = INFINITY, prev_enter = -INFINITY, t0 = 0.0;
    for (int round = 0; round < 16; round++) {
        double enter = trace_clock(tr);
        t0 = comm->world_rank == 0 ? enter : 0.0;
        comm_all_reduce_host(comm, &comm->world, &t0, 1, REDUCE_SUM);
        double leave = trace_clock(tr);
        lo = fmax(lo, prev_enter - t0);  // bounds on (this rank's clock - rank 0's clock)
        hi = fmin(hi, leave - t0);
        prev_enter = enter;
    }
    tr->origin = comm->world_rank == 0 ? t0 : t0 + 0.5 * (lo + hi);
    tr->origin_error = comm->world_rank == 0 ? 0.0 : 0.5 * fabs(hi - lo);
}

// writes this rank's events as a JSON fragment to <path>.rank<r>
static void trace_write_rank(const Tracer* tr, const char* path, int rank, const char* label) {
    char part[4200];
    snprintf(part, sizeof(part), "%s.rank%d", path, rank);
    FILE* f = fopen_check(part, "w");
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"%s\"}}", rank, label);
    fprintf(f, ",\n{\"name\": \"clock\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"origin_error_us\": %.1f}}", rank,
            tr->origin_error * 1e6 + 0.1);  // (+ the timestamps' rounding)
    const char* lanes[2] = {"compute", "communication"};
    for (int lane = 0; lane < 2; lane++)
        fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"name\": \"%s\"}}", rank, lane, lanes[lane]);
    for (int i = 0; i < tr->n; i++) {
        const TraceEvent* e = &tr->events[i];
        fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.1f, \"dur\": %.1f, \"pid\": %d, "
                "\"tid\": %d}", e->name, e->cat, e->start_us, e->dur_us, rank, (int)trace_lane(e->cat));
    }
    if (fclose(f) != 0) fatal("cannot write '%s'", part);
}

// rank 0, after every rank wrote its part: one {"traceEvents": [...]} file, the parts removed, ending
// with a "run" record (run_args: a JSON object describing the run)
static void trace_merge(const char* path, int world_size, const char* run_args) {
    FILE* out = fopen_check(path, "w");
    fprintf(out, "{\"traceEvents\": [\n");
    for (int r = 0; r < world_size; r++) {
        char part[4200];
        snprintf(part, sizeof(part), "%s.rank%d", path, r);
        FILE* f = fopen_check(part, "r");
        char buf[65536];
        size_t got;
        if (r > 0) fprintf(out, ",\n");
        while ((got = fread(buf, 1, sizeof(buf), f)) > 0) fwrite_check(buf, 1, got, out, path);
        fclose(f);
        remove(part);
    }
    fprintf(out, ",\n{\"name\": \"run\", \"ph\": \"M\", \"pid\": 0, \"args\": %s}\n]}\n", run_args);
    if (fclose(out) != 0) fatal("cannot write '%s'", path);
}

// The techniques in use, as the run's last line prints them and plot_trace.py's title begins:
// "dp 2 · ZeRO-3 · tp 1 · pp 1", and with a pipeline its schedule: "dp 1 · tp 1 · pp 4 · 1F1B · M=8".
// zero: the ZeRO stage.
static void trace_setup(char* out, size_t n, const Comm* comm, int zero, const char* schedule, int M, int V) {
    char z[24] = "";
    if (zero > 0) snprintf(z, sizeof(z), " · ZeRO-%d", zero);
    int k = snprintf(out, n, "dp %d%s · tp %d · pp %d", comm->dp, z, comm->tp, comm->pp);
    if (comm->pp == 1 || k < 0 || (size_t)k >= n) return;  // (one stage: no schedule)
    const char* name = strcmp(schedule, "gpipe") == 0       ? "GPipe"
                     : strcmp(schedule, "1f1b") == 0        ? "1F1B"
                     : strcmp(schedule, "interleaved") == 0 ? "interleaved 1F1B"
                     : strcmp(schedule, "zb-h1") == 0       ? "ZB-H1"
                                                            : schedule;
    char v[24] = "";
    if (V > 1) snprintf(v, sizeof(v), " · V=%d", V);
    snprintf(out + k, n - k, " · %s · M=%d%s", name, M, v);
}

// Rank 0's notes (empty: none): a warning when the busy threads on its node, ranks times each one's
// threads, outnumber the machine's cores (sysconf's online count), and a hint when one pipeline stage's
// forward and backward take more than twice another's. The ranks on the node are comm->local_size, those
// MPI finds sharing rank 0's memory (or LOCAL_WORLD_SIZE without MPI); the other nodes of a run are taken
// to look like rank 0's. stage_ms: each stage's forward + backward time per traced step (trace_compute_ms).
static void trace_notes(const Comm* comm, const double* stage_ms, int cores, int threads, char* warning, char* hint,
                        size_t n) {
    warning[0] = hint[0] = '\0';
    int ranks = comm->local_size;
    if (ranks * threads > cores)
        snprintf(warning, n, "warning: %d rank%s × %d thread%s share %d core%s on this machine: ranks also wait for "
                 "a core, so bars and bubble are longer than the work", ranks, ranks == 1 ? "" : "s", threads,
                 threads == 1 ? "" : "s", cores, cores == 1 ? "" : "s");
    int lo = 0, hi = 0;
    for (int s = 1; s < comm->pp; s++) {
        if (stage_ms[s] < stage_ms[lo]) lo = s;
        if (stage_ms[s] > stage_ms[hi]) hi = s;
    }
    if (comm->pp > 1 && stage_ms[lo] > 0 && stage_ms[hi] > 2.0 * stage_ms[lo])
        snprintf(hint, n, "hint: stage %d computes %.1fx as long as stage %d (forward + backward %.1f against %.1f ms "
                 "a step): --pp-split can give stage %d fewer layers", hi, stage_ms[hi] / stage_ms[lo], lo,
                 stage_ms[hi], stage_ms[lo], hi);
}

// This rank's compute per traced step, as the --pp-split hint compares it: for each kind of span
// ("F", "B", ZB-H1's "W"; per chunk with the interleaved schedule, "F 3.1" being chunk 1's) the median
// duration times their number. Not their sum: on a busy machine a rank is now and then taken off its core
// in the middle of a span, and the last backward of a step contains the wait for the data-parallel
// reduction it starts; either stretches a span many times over, the median of its kind not.
typedef struct {
    char key[24];  // "F", "B.1"
    double dur;
} TraceSample;

static int trace_sample_order(const void* a, const void* b) {
    const TraceSample *x = (const TraceSample*)a, *y = (const TraceSample*)b;
    int k = strcmp(x->key, y->key);
    return k != 0 ? k : (x->dur > y->dur) - (x->dur < y->dur);
}

static double trace_compute_ms(const Tracer* tr, int steps) {
    TraceSample* s = (TraceSample*)malloc_check((tr->n + 1) * sizeof(TraceSample));
    int n = 0;
    for (int i = 0; i < tr->n; i++) {
        const TraceEvent* e = &tr->events[i];
        if (strcmp(e->cat, "forward") != 0 && strcmp(e->cat, "backward") != 0) continue;
        const char *space = strchr(e->name, ' '), *dot = strrchr(e->name, '.');
        int head = space ? (int)(space - e->name) : (int)strlen(e->name);
        snprintf(s[n].key, sizeof(s[n].key), "%.*s%s", head < 12 ? head : 12, e->name, dot ? dot : "");
        s[n++].dur = e->dur_us;
    }
    qsort(s, n, sizeof(TraceSample), trace_sample_order);
    double us = 0.0;
    for (int i = 0, j; i < n; i = j) {
        for (j = i; j < n && strcmp(s[j].key, s[i].key) == 0; j++) {}
        int k = j - i;
        us += k * (k % 2 ? s[i + k / 2].dur : 0.5 * (s[i + k / 2 - 1].dur + s[i + k / 2].dur));
    }
    free(s);
    return 1e-3 * us / (steps > 0 ? steps : 1);
}

// Writes the trace (every rank its part, rank 0 merges) and prints its title: the techniques in use and,
// with a pipeline, the bubble measured in the traced steps (the fraction of each rank's pipeline time not
// spent in forward or backward, averaged over the ranks) next to the schedule's `ideal` one, whose
// `formula` llmc/pipeline.h gives (pipeline_ideal_bubble); then rank 0's notes (trace_notes) and the
// communication engine's rate in those steps. The "run" record holds all of it for plot_trace.py.
// zero_stage: --zero.
static void trace_finish(const Tracer* tracer, const char* path, const char* schedule, int M, int V, double ideal,
                         const char* formula, int zero_stage, Comm* comm) {
    char label[128];
    snprintf(label, sizeof(label), "rank %d (dp %d, tp %d, stage %d)", comm->world_rank, comm->dp_rank, comm->tp_rank,
             comm->pp_rank);
    double bubble = tracer->pipeline_s > 0 ? 1.0 - tracer->busy_s / tracer->pipeline_s : 0.0;
    comm_all_reduce_host(comm, &comm->world, &bubble, 1, REDUCE_AVG);
    // each stage's compute per traced step (the optimizer spans count the steps), averaged over its ranks
    int P = comm->pp, steps = 0;
    for (int i = 0; i < tracer->n; i++) steps += strcmp(tracer->events[i].cat, "optimizer") == 0;
    double* stage_ms = (double*)calloc_check(P * sizeof(double));
    stage_ms[comm->pp_rank] = trace_compute_ms(tracer, steps) / (comm->world_size / P);
    comm_all_reduce_host(comm, &comm->world, stage_ms, P, REDUCE_SUM);
    trace_write_rank(tracer, path, comm->world_rank, label);
    comm_barrier_io(comm, &comm->world);  // every part is written
    if (comm->world_rank == 0) {
        int cores = (int)sysconf(_SC_NPROCESSORS_ONLN), threads = 1;
#if defined(LLMC_CPU) && defined(_OPENMP)
        threads = omp_get_max_threads();
#endif
        // the title: the setup, and with a pipeline the bubble, "... · bubble 31% (ideal 27%)"
        char setup[160], title[256], warning[256], hint[256];
        trace_setup(setup, sizeof(setup), comm, zero_stage, schedule, M, V);
        if (P == 1) snprintf(title, sizeof(title), "%s", setup);
        else snprintf(title, sizeof(title), "%s · bubble %.0f%% (ideal %.0f%%)", setup, 100.0 * bubble, 100.0 * ideal);
        trace_notes(comm, stage_ms, cores, threads, warning, hint, sizeof(warning));
        size_t cap = 2048 + 16 * (size_t)P, k = 0;
        char* run = (char*)malloc_check(cap);
        k += snprintf(run + k, cap - k, "{\"title\": \"%s\", \"dp\": %d, \"zero\": %d, \"tp\": %d, \"pp\": %d, "
                      "\"schedule\": \"%s\", \"P\": %d, \"M\": %d, \"V\": %d, \"bubble_measured\": %.4f, "
                      "\"bubble_ideal\": %.4f, \"bubble_formula\": \"%s\", \"ranks_on_node\": %d, "
                      "\"threads_per_rank\": %d, \"cores\": %d, \"stage_compute_ms\": [", title, comm->dp, zero_stage,
                      comm->tp, P, P > 1 ? schedule : "", P, M, V, bubble, ideal, formula, comm->local_size, threads,
                      cores);
        for (int s = 0; s < P; s++) k += snprintf(run + k, cap - k, "%s%.3f", s ? ", " : "", stage_ms[s]);
        k += snprintf(run + k, cap - k, "], \"notes\": [");
        if (warning[0]) k += snprintf(run + k, cap - k, "\"%s\"", warning);
        if (hint[0]) k += snprintf(run + k, cap - k, "%s\"%s\"", warning[0] ? ", " : "", hint);
        snprintf(run + k, cap - k, "]}");
        trace_merge(path, comm->world_size, run);
        free(run);
        if (P == 1) printf("wrote trace %s: %s\n", path, setup);
        else printf("wrote trace %s: %s; pipeline bubble: measured %.1f%%, %s = %.1f%%\n", path, setup, 100.0 * bubble,
                    formula, 100.0 * ideal);
        if (warning[0]) printf("%s\n", warning);
        if (hint[0]) printf("%s\n", hint);
    }
    free(stage_ms);
    comm_barrier_io(comm, &comm->world);  // rank 0 has merged (the collective below waits under --comm-timeout)
    comm_print_stats(comm);
}

// --trace records the steps 1 .. n_traced after the first of a run (the first pays for first touches):
// `nth` is the step's number in this run (0: its first). The communication engine counts its bytes and
// time over the same steps (comm_print_stats); the ranks' clocks are aligned when the first traced step
// begins (skew: --fault-clock-skew, testing).
static void trace_step_begin(Tracer* tr, Comm* comm, int tracing, long long nth, int n_traced, double skew) {
    tr->enabled = tracing && nth > 0 && nth <= n_traced;
    comm->stats.on = tr->enabled;
    if (tr->enabled && nth == 1) trace_align_clocks(tr, comm, skew);
}
