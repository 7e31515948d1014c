/*
 * pipeline.h: pipeline parallelism: which layers a stage owns and in what order it runs its
 * micro-batches (llmc/trace.h records when they ran).
 *
 * The L layers are cut into P stages of consecutive layers (as even as possible, or as given by
 * --pp-split). Stage 0 also owns the embedding, stage P-1 the final LayerNorm and the classifier, and
 * both hold the tied wte (their two gradients are summed before the update). One optimizer step pushes
 * M micro-batches through the stages: activations (B,T,C) go forward by send/recv, their gradients come
 * back the same way, gradients accumulate over the M micro-batches, and the optimizer steps once.
 *
 * Schedules, for stage s of P (F = forward of a micro-batch, B = its backward):
 *   GPipe  F0 F1 ... F(M-1)  B0 B1 ... B(M-1)
 *          every stage keeps the activations of all M micro-batches
 *   1F1B   warm-up: min(P-s-1, M) forwards, then alternate one forward and one backward, then the
 *          remaining backwards; stage s keeps at most min(P-s, M) micro-batches of activations
 *
 *   stage 0   F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3                        (GPipe, P=2, M=4)
 *   stage 1   .  F0 F1 F2 F3 B0 .  B1 .  B2 .  B3 .
 * The idle slots are the bubble: a fraction (P-1)/(M+P-1) of the time, for either schedule.
 *
 * The schedule is a list of actions; train_gpt.cu executes it (pipeline_step). Its messages go through
 * pipe_exchange (below), which pairs each send with the receive that follows it when both go to the same
 * neighbour, so two neighbours never both block in a send.
 */
#pragma once

#include "comm.h"    // comm_send, comm_recv, comm_sendrecv, comm_join
#include "common.h"  // fatal, check_internal, malloc_check, calloc_check
#include "trace.h"   // trace_now_us, trace_add

typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B } Schedule;

typedef struct {
    int backward;  // 0: forward, 1: backward
    int micro;     // micro-batch index
} PipeAction;

// First layer of each stage (first[P] = L). split: "a,b,c" layer counts, or NULL for as even as possible.
static void pipeline_split(int L, int P, const char* split, int* first) {
    if (P > L) fatal("--pp %d: more pipeline stages than the %d layers", P, L);
    first[0] = 0;
    if (split == NULL) {
        for (int s = 0; s < P; s++) first[s + 1] = first[s] + L / P + (s < L % P ? 1 : 0);
        return;
    }
    const char* p = split;
    for (int s = 0; s < P; s++) {
        // each count is parsed as a 64-bit integer (errno catches what does not fit even there) and
        // checked against L before it becomes an int, so no count wraps around into a small number
        char* end;
        errno = 0;
        long long n = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : (end = (char*)p, 0);
        if (end == p || n < 1) fatal("--pp-split '%s': expected %d positive layer counts separated by commas", split, P);
        if (errno == ERANGE || n > L - first[s])
            fatal("--pp-split '%s': the layer counts add up to more than the model's %d layers (stage %d has %d left)", split, L, s,
                  L - first[s]);
        first[s + 1] = first[s] + (int)n;
        p = end;
        if (s < P - 1) {
            if (*p != ',') fatal("--pp-split '%s': expected %d layer counts (one per stage)", split, P);
            p++;
        }
    }
    if (*p != '\0') fatal("--pp-split '%s': expected %d layer counts (one per stage)", split, P);
    if (first[P] != L) fatal("--pp-split '%s' covers %d layers, the model has %d", split, first[P], L);
}

// The 2M actions of stage s, in order. Returns the number of activation slots the stage needs.
static int pipeline_schedule(Schedule sched, int P, int s, int M, PipeAction* actions) {
    int n = 0;
    if (sched == SCHEDULE_GPIPE) {
        for (int m = 0; m < M; m++) actions[n++] = (PipeAction){.backward = 0, .micro = m};
        for (int m = 0; m < M; m++) actions[n++] = (PipeAction){.backward = 1, .micro = m};
        return M;
    }
    int warmup = P - s - 1 < M ? P - s - 1 : M;
    int f = 0, b = 0;
    for (; f < warmup; f++) actions[n++] = (PipeAction){.backward = 0, .micro = f};
    while (f < M) {  // steady state: one forward, one backward
        actions[n++] = (PipeAction){.backward = 0, .micro = f++};
        actions[n++] = (PipeAction){.backward = 1, .micro = b++};
    }
    while (b < M) actions[n++] = (PipeAction){.backward = 1, .micro = b++};  // cool-down
    return warmup + 1 < M ? warmup + 1 : M;
}

// The activation slots stage s of P keeps for M micro-batches: one without pipelining (the plain step),
// else as many as its schedule keeps in flight
static int pipeline_slots(Schedule sched, int P, int s, int M) {
    if (P == 1) return 1;
    PipeAction* actions = (PipeAction*)malloc_check(2 * (size_t)M * sizeof(PipeAction));
    int slots = pipeline_schedule(sched, P, s, M, actions);
    free(actions);
    return slots;
}

// ----------------------------------------------------------------------------------------------------
// the messages between stages, as the pipeline step (train_gpt.cu) exchanges them

// The send left over from the previous action, if any, goes out now; if this action receives from
// the same neighbour, the two travel as one paired send-receive (so that two neighbours never both
// block sending to each other). recv_buf NULL: nothing to receive. Messages are named in traces by
// what they carry: "act m" (micro-batch m's activations, forward) or "grad m" (their gradient, backward).
typedef struct {
    const floatX* buf;
    int peer;    // stage index, -1: nothing pending
    int shared;  // buf is shared (dresidual, or the rematerialized work set), which the next action overwrites: wait for the send
    char what[16];  // "act m" or "grad m"
} PendingSend;

static void pipe_exchange(Comm* c, Tracer* tr, PendingSend* pending, floatX* recv_buf, int recv_peer, size_t n, const char* recv_what) {
    char name[40];
    double t0 = trace_now_us(tr);
    if (pending->peer >= 0 && recv_buf != NULL && pending->peer == recv_peer) {
        comm_sendrecv(c, &c->pp_group, pending->buf, pending->peer, recv_buf, recv_peer, n, DT_FLOATX);
        comm_join(c);
        snprintf(name, sizeof(name), "send %s, recv %s", pending->what, recv_what);
        trace_add(tr, "sendrecv", name, -1, t0);
    } else {
        if (pending->peer >= 0) {
            // A forward output lives in its micro-batch slot, which nothing writes before a later
            // receive has been waited for (same stream, in order): its send is not waited for, and with
            // NCCL it runs while the next forward computes. An input gradient is in the shared dresidual,
            // and with rematerialization a forward output is in the shared work set: the next forward or
            // backward overwrites them, so those sends are waited for.
            comm_send(c, &c->pp_group, pending->buf, n, DT_FLOATX, pending->peer);
            if (pending->shared) comm_join(c);
            snprintf(name, sizeof(name), "send %s", pending->what);
            trace_add(tr, "send", name, -1, t0);
        }
        if (recv_buf != NULL) {
            t0 = trace_now_us(tr);
            comm_recv(c, &c->pp_group, recv_buf, n, DT_FLOATX, recv_peer);
            comm_join(c);
            snprintf(name, sizeof(name), "recv %s", recv_what);
            trace_add(tr, "recv", name, -1, t0);
        }
    }
    pending->peer = -1;
}

// ----------------------------------------------------------------------------------------------------
// --print-schedule: the schedule of every stage, before running it

// The messages before an action, as pipeline_step exchanges them (through pipe_exchange, above): the
// send left over from the previous action goes out first, and when the action receives from the same
// neighbour the two travel as one send-receive. "a3>1": micro-batch 3's activation sent to stage 1;
// "g3<2": its gradient received from stage 2.
static void print_messages(int pending, int pending_peer, int recv, int recv_peer) {
    char send_s[32] = "", recv_s[32] = "";
    if (pending_peer >= 0) snprintf(send_s, sizeof(send_s), "%c%d>%d", pending < 0 ? 'g' : 'a', pending < 0 ? -pending - 1 : pending, pending_peer);
    if (recv_peer >= 0) snprintf(recv_s, sizeof(recv_s), "%c%d<%d", recv < 0 ? 'g' : 'a', recv < 0 ? -recv - 1 : recv, recv_peer);
    if (pending_peer >= 0 && recv_peer >= 0 && pending_peer == recv_peer) printf(" sendrecv %s %s |", send_s, recv_s);
    else {
        if (pending_peer >= 0) printf(" send %s |", send_s);
        if (recv_peer >= 0) printf(" recv %s |", recv_s);
    }
}

// Prints, for P stages and M micro-batches: a timeline (one column a time slot, a forward taking one
// slot and a backward two, each action starting when its stage is free and its input has arrived), and
// each stage's actions with the messages between them, so the sends and receives can be paired by eye.
static void pipeline_print_schedule(Schedule sched, int P, int M) {
    PipeAction* acts = (PipeAction*)malloc_check((size_t)P * 2 * M * sizeof(PipeAction));
    int* slots = (int*)malloc_check(P * sizeof(int));
    int* f_end = (int*)malloc_check((size_t)P * M * sizeof(int));  // [stage][micro] when its forward ends
    int* b_end = (int*)malloc_check((size_t)P * M * sizeof(int));
    int* start = (int*)malloc_check((size_t)P * 2 * M * sizeof(int));
    for (int s = 0; s < P; s++) slots[s] = pipeline_schedule(sched, P, s, M, acts + (size_t)s * 2 * M);
    for (int i = 0; i < P * M; i++) f_end[i] = b_end[i] = -1;
    // timeline: sweep until every action is placed (an action waits for the one before it on its stage
    // and for its input: the forward of the stage before, or the backward of the stage after)
    int* next = (int*)calloc_check(P * sizeof(int));
    int* free_at = (int*)calloc_check(P * sizeof(int));
    int placed = 0, width = 0;
    while (placed < P * 2 * M) {
        int placed_before = placed;
        for (int s = 0; s < P; s++) {
            if (next[s] == 2 * M) continue;
            PipeAction a = acts[(size_t)s * 2 * M + next[s]];
            int ready = a.backward ? (s == P - 1 ? f_end[s * M + a.micro] : b_end[(s + 1) * M + a.micro])
                                   : (s == 0 ? 0 : f_end[(s - 1) * M + a.micro]);
            if (ready < 0) continue;  // its input is not computed yet
            int t = ready > free_at[s] ? ready : free_at[s];
            start[(size_t)s * 2 * M + next[s]] = t;
            free_at[s] = t + (a.backward ? 2 : 1);
            (a.backward ? b_end : f_end)[s * M + a.micro] = free_at[s];
            width = free_at[s] > width ? free_at[s] : width;
            next[s]++, placed++;
        }
        check_internal(placed > placed_before, "the pipeline schedule waits on itself");
    }
    printf("pipeline schedule %s: %d stage%s, %d micro-batch%s per step\n", sched == SCHEDULE_GPIPE ? "GPipe" : "1F1B", P,
           P > 1 ? "s" : "", M, M > 1 ? "es" : "");
    printf("timeline (a forward takes one slot, a backward two: Bm ==; '.' idle; the bubble is the idle slots):\n");
    int digits = 2;  // every slot is 2 + digits characters wide (4 up to 100 micro-batches), so columns align
    for (int m = 100; m < M; m *= 10) digits++;
    for (int s = 0; s < P; s++) {
        printf("  stage %2d |", s);
        int t = 0;
        for (int i = 0; i < 2 * M; i++) {
            PipeAction a = acts[(size_t)s * 2 * M + i];
            for (; t < start[(size_t)s * 2 * M + i]; t++) printf(" %-*s", digits + 1, ".");
            printf(" %c%-*d", a.backward ? 'B' : 'F', digits, a.micro);
            if (a.backward) printf(" %-*s", digits + 1, "==");
            t += a.backward ? 2 : 1;
        }
        for (; t < width; t++) printf(" %-*s", digits + 1, ".");
        printf("\n");
    }
    printf("actions and messages of each stage, in order (a3>1: micro-batch 3's activation sent to stage 1;\n"
           "g3<2: its gradient received from stage 2; a send and a receive with the same neighbour go as one sendrecv):\n");
    for (int s = 0; s < P; s++) {
        printf("  stage %2d (%d activation slot%s) |", s, slots[s], slots[s] > 1 ? "s" : "");
        int pending = 0, pending_peer = -1;  // pending >= 0: activation of that micro-batch; < 0: gradient of -pending-1
        for (int i = 0; i < 2 * M; i++) {
            PipeAction a = acts[(size_t)s * 2 * M + i];
            int recv_peer = a.backward ? (s < P - 1 ? s + 1 : -1) : (s > 0 ? s - 1 : -1);
            print_messages(pending, pending_peer, a.backward ? -a.micro - 1 : a.micro, recv_peer);
            printf(" %c%d |", a.backward ? 'B' : 'F', a.micro);
            pending = a.backward ? -a.micro - 1 : a.micro;
            pending_peer = a.backward ? (s > 0 ? s - 1 : -1) : (s < P - 1 ? s + 1 : -1);
        }
        print_messages(pending, pending_peer, 0, -1);
        printf("\n");
    }
    // the bubble: every stage is busy 3M of the step's `width` slots (a forward 1, a backward 2)
    printf("bubble: every stage is idle %d of the step's %d slots, %.1f%%; (P-1)/(M+P-1) = %.1f%%\n", width - 3 * M, width,
           100.0 * (width - 3 * M) / width, 100.0 * (P - 1) / (M + P - 1));
    free(acts), free(slots), free(f_end), free(b_end), free(start), free(next), free(free_at);
}
