/*
 * pipeline.h: pipeline parallelism: in what order a stage runs its micro-batches, and the messages
 * between stages (which layers a stage owns: llmc/placement.h; llmc/run/trace.h records when they ran).
 *
 * The L layers are cut into P stages of consecutive layers (as even as possible, or as given by
 * --pp-split). Stage 0 also owns the embedding, stage P-1 the final LayerNorm and the classifier, and
 * both hold the tied wte (their two gradients are summed before the update). One optimizer step pushes
 * M micro-batches through the stages: activations (B,T,C) go forward by send/recv, their gradients come
 * back the same way, gradients accumulate over the M micro-batches, and the optimizer steps once.
 *
 * Schedules, for stage s of P (F = forward of a micro-batch, B = its backward; with ZB-H1 B is only the
 * gradients of the inputs, W the weights' gradients, deferred):
 *   GPipe  F0 F1 ... F(M-1)  B0 B1 ... B(M-1)
 *          every stage keeps the activations of all M micro-batches
 *   1F1B   warm-up: min(P-s-1, M) forwards, then alternate one forward and one backward, then the
 *          remaining backwards; stage s keeps at most min(P-s, M) micro-batches of activations
 *   interleaved 1F1B (--virtual-stages V, Megatron's PTD-P): the layers are cut into P*V chunks and
 *          stage s holds V of them, chunks s, s+P, ..., s+(V-1)P (virtual stage v*P + s is its chunk v).
 *          A micro-batch goes round the ring of stages V times, so each chunk is 1/V of a stage's work
 *          and the fill and drain of the pipeline (the bubble) take 1/V of the time. Stage s runs its
 *          M*V forwards in groups of P micro-batches per chunk (chunk 0 for micro-batches 0..P-1, chunk
 *          1 for the same, ..., then the next P micro-batches), its backwards in the same order with
 *          the chunks reversed; warm-up 2(P-s-1) + (V-1)P forwards, then one forward and one backward
 *          alternately, then the remaining backwards. M must be a multiple of P.
 *   ZB-H1  (zero bubble, Qi et al. 2023) 1F1B with each backward split in two: B, the gradients of the
 *          layers' inputs, which the previous stage waits for, and W, the gradients of their weights,
 *          which nothing waits for. Stage s runs 1F1B's forwards and B's, and the W of micro-batch b-s
 *          right after the B of micro-batch b: the later stages, which 1F1B leaves idle at the end while
 *          the gradients travel back, defer their W's into that time. Stage s holds P micro-batches of
 *          activations (1F1B's stage 0 does too) and s+1 of the output gradients W needs. M >= P.
 *          W is the transformer layers' four matmul weight gradients (with their biases): the classifier's
 *          weight gradient stays in B (its output gradient, B x T x V, is too big to keep), and so do the
 *          embedding's (the first stage's last work anyway), the LayerNorms' and fc's bias (each comes out
 *          of the kernel that makes an input gradient).
 *
 *   GPipe, P=2, M=4 (a backward takes twice a forward's time):
 *   stage 0   F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3
 *   stage 1   .  F0 F1 F2 F3 B0 .  B1 .  B2 .  B3 .
 *   interleaved, P=2, M=2, V=2 (F1.0: micro-batch 1's forward in chunk 0, half a stage's layers):
 *   stage 0   F0.0 F1.0 F0.1 F1.1 .    .    B0.1 .    .    B1.1 .    B0.0 .    B1.0 .
 *   stage 1   .    F0.0 F1.0 F0.1 B0.1 .    F1.1 B1.1 .    B0.0 .    B1.0 .    .    .
 *   ZB-H1, P=2, M=2 (F, B and W one slot each; stage 1 defers W0 until after B1):
 *   stage 0   F0 F1 .  B0 W0 B1 W1
 *   stage 1   .  F0 B0 F1 B1 W0 W1
 * The idle slots are the bubble: a fraction (P-1)/(M+P-1) of the time, for GPipe or 1F1B,
 * (P-1)/(V*M+P-1) for the interleaved schedule (a chunk's forward taking one slot): 3 of 15 slots above,
 * and (P-1)/(3M+P-1) for ZB-H1 (F, B, W one slot each), a third of 1F1B's idle time.
 *
 * One protocol for every schedule: pipeline_plan turns a stage's actions into a list of steps, each an
 * action or an exchange (a send and a receive, one sendrecv when paired), decided when the plan is made;
 * train_gpt.cu's pipeline_step is one loop over them: an action runs on its micro-batch's slot, an
 * exchange calls pipe_sendrecv (below). Messages between stages are not tagged: on each (sender,
 * receiver) pair they are matched in the order they were sent, which the plans keep; --print-schedule
 * prints the same steps, and tests/pipeline_parallel.sh runs every schedule's printed steps as blocking
 * operations and checks that they all complete.
 */
#pragma once

#include "comm.h"       // comm_send, comm_recv, comm_sendrecv, comm_join
#include "common.h"     // fatal, check_internal, malloc_check, calloc_check
#include "run/trace.h"  // trace_now_us, trace_add, trace_finish

typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZBH1 } Schedule;

static const char* schedule_name(Schedule s) {
    return s == SCHEDULE_GPIPE ? "GPipe"
           : s == SCHEDULE_1F1B ? "1F1B"
           : s == SCHEDULE_ZBH1 ? "ZB-H1"
                                : "interleaved 1F1B";
}
static const char* schedule_flag(Schedule s) {  // --pp-schedule
    return s == SCHEDULE_GPIPE ? "gpipe" : s == SCHEDULE_1F1B ? "1f1b" : s == SCHEDULE_ZBH1 ? "zb-h1" : "interleaved";
}

// The bubble of a schedule whose actions take equal slots (a forward one, a backward two; ZB-H1's F, B
// and W one each): the fraction of a step each stage is idle, (P-1)/(M+P-1) for GPipe and 1F1B,
// (P-1)/(V*M+P-1) with V chunks per stage, (P-1)/(3M+P-1) for ZB-H1; `formula`: which, as text. What
// --print-schedule's timeline counts and --trace's measured bubble is set beside.
static double pipeline_ideal_bubble(Schedule sched, int P, int M, int V, const char** formula) {
    int zb = sched == SCHEDULE_ZBH1;
    *formula = zb ? "(P-1)/(3M+P-1)" : V > 1 ? "(P-1)/(V*M+P-1)" : "(P-1)/(M+P-1)";
    return (double)(P - 1) / ((zb ? 3 : V) * M + P - 1);
}

// --trace's end (llmc/run/trace.h): the trace written, and the bubble it measured beside the schedule's
static void pipeline_trace_finish(const Tracer* tracer, const char* path, Schedule sched, int M, int V, int zero_stage,
                                  Comm* comm) {
    const char* formula;
    double ideal = pipeline_ideal_bubble(sched, comm->pp, M, V, &formula);
    trace_finish(tracer, path, schedule_flag(sched), M, V, ideal, formula, zero_stage, comm);
}

// What an action does: a forward (F), a backward (B: with ZB-H1 the inputs' gradients only; otherwise the
// weights' too), or ZB-H1's deferred weight gradients (W)
enum { PIPE_F, PIPE_B, PIPE_W };

typedef struct {
    int kind;    // PIPE_F, PIPE_B or PIPE_W
    int micro;   // micro-batch index
    int chunk;   // which of the stage's virtual stages (0 but for the interleaved schedule)
    int staged;  // B: its output's gradient was received before other work, into the chunk's dreceived
} PipeAction;

// ----------------------------------------------------------------------------------------------------
// the plan: a stage's actions and the exchanges between them
//
// GPipe, 1F1B and ZB-H1 exchange before each forward and backward: the previous action's output goes
// out, paired with this action's input in one sendrecv when both go to the same neighbour, so that two
// neighbours never both block in a send (else the send, then the receive); before a ZB-H1 W, which has no
// messages of its own, the send left over goes alone unless the next forward or backward receives from
// the same neighbour (then they travel together after the W, as in 1F1B; the previous stage is busy until
// then anyway). Around a ring of stages that rule deadlocks: a send that must wait for its receiver
// (NCCL's always do, MPI's beyond a small size) can face a receiver that is itself waiting in a send to
// someone else. So the interleaved schedule exchanges as Megatron's does, after its actions: after a
// warm-up forward, its output is sent and the next forward's input received; after each steady-state pair
// (a forward, then a backward) the forward's output and the backward's input gradient are sent and the
// next forward's input and the next backward's output gradient received; after a cool-down backward, its
// input gradient is sent and the next one's received. Each exchange is two sendrecvs, the activations'
// (to the next stage, from the previous) before the gradients' (to the previous, from the next), on every
// stage in the same order, so every send meets its receive (tests/pipeline_parallel.sh runs every stage's
// printed exchanges as blocking operations and checks that they all complete, each message received in
// the order it was sent).

// A message of an exchange: micro-batch `micro`'s activation (backward 0) or gradient (1), sent from or
// received into chunk `chunk` of this stage; peer: the other stage (-1: no message). staged: a received
// gradient that waits in the chunk's dreceived for its backward (the plan sets it: the backward does not
// come next, or the same sendrecv sends a gradient out of dresidual, where it would otherwise land).
typedef struct {
    int peer, backward, micro, chunk, staged;
} PipeMessage;

// A step of a stage's plan: an action, or an exchange of a send and a receive (either may be absent)
typedef struct {
    int exchange;  // 0: the action, 1: the exchange
    PipeAction action;
    PipeMessage send, recv;
    int paired;  // the send and the receive go as one sendrecv (else the send first, then the receive)
} PipeStep;

// The interleaved schedule's k-th forward (or backward) of a stage: micro-batches in groups of P, each
// group through chunk 0, 1, ..., V-1 (backward: V-1, ..., 0)
static PipeAction interleaved_action(int backward, int k, int P, int V) {
    int chunk = (k % (P * V)) / P;
    return (PipeAction){.kind = backward ? PIPE_B : PIPE_F, .micro = k / (P * V) * P + k % P,
                        .chunk = backward ? V - 1 - chunk : chunk};
}

// The neighbours of chunk `chunk` of stage s of P (V chunks each) on the ring of stages: where its forward
// input comes from (and its input gradient goes), and where its output goes (and its output gradient
// comes from); -1 at the ends of the virtual pipeline (the first chunk of stage 0, the last of stage P-1)
static int pipe_prev(int P, int V, int s, int chunk) { return s == 0 && chunk == 0 ? -1 : (s + P - 1) % P; }
static int pipe_next(int P, int V, int s, int chunk) { return s == P - 1 && chunk == V - 1 ? -1 : (s + 1) % P; }

// The message action a of stage s receives (its input, or its output's gradient), or sends (its output,
// or its input's gradient); peer -1 at the ends of the pipeline, and for a W, which has no messages
static PipeMessage received_by(PipeAction a, int P, int V, int s) {
    int b = a.kind == PIPE_B,
        peer = a.kind == PIPE_W ? -1 : b ? pipe_next(P, V, s, a.chunk) : pipe_prev(P, V, s, a.chunk);
    return (PipeMessage){.peer = peer, .backward = b, .micro = a.micro, .chunk = a.chunk};
}
static PipeMessage sent_by(PipeAction a, int P, int V, int s) {
    int b = a.kind == PIPE_B,
        peer = a.kind == PIPE_W ? -1 : b ? pipe_prev(P, V, s, a.chunk) : pipe_next(P, V, s, a.chunk);
    return (PipeMessage){.peer = peer, .backward = b, .micro = a.micro, .chunk = a.chunk};
}

static const PipeMessage NO_MESSAGE = {.peer = -1, .backward = 0, .micro = 0, .chunk = 0, .staged = 0};

static PipeStep action_step(PipeAction a) {
    return (PipeStep){.exchange = 0, .action = a, .send = NO_MESSAGE, .recv = NO_MESSAGE, .paired = 0};
}

// Appends an exchange of `send` and `recv` if either has a message; `paired`: as one sendrecv
static int add_exchange(PipeStep* steps, int n, PipeMessage send, PipeMessage recv, int paired) {
    if (send.peer < 0 && recv.peer < 0) return n;
    PipeAction none = {.kind = PIPE_F, .micro = 0, .chunk = 0, .staged = 0};
    steps[n++] = (PipeStep){.exchange = 1, .action = none, .send = send, .recv = recv, .paired = paired};
    return n;
}

// Appends the interleaved schedule's exchange: the activations' sendrecv, then the gradients' (each only
// if it has a message)
static int add_exchange_pair(PipeStep* steps, int n, PipeMessage send_act, PipeMessage recv_act, PipeMessage send_grad,
                             PipeMessage recv_grad) {
    n = add_exchange(steps, n, send_act, recv_act, 1);
    return add_exchange(steps, n, send_grad, recv_grad, 1);
}

// GPipe, 1F1B, ZB-H1: the exchanges before the actions (the rule above). `acts`: the n actions in order;
// `steps`: the plan, 2n + 1 at most. Returns its length.
static int exchange_before_actions(const PipeAction* acts, int n, int P, int s, PipeStep* steps) {
    int k = 0;
    PipeMessage pending = NO_MESSAGE;  // the output of the action before, not sent yet
    for (int i = 0; i < n; i++) {
        if (acts[i].kind == PIPE_W) {  // its send goes first, unless the next forward or backward pairs it
            int next = i + 1;
            while (next < n && acts[next].kind == PIPE_W) next++;
            int next_peer = next < n ? received_by(acts[next], P, 1, s).peer : -1;
            if (pending.peer != next_peer) {
                k = add_exchange(steps, k, pending, NO_MESSAGE, 0);
                pending = NO_MESSAGE;
            }
            steps[k++] = action_step(acts[i]);
            continue;
        }
        PipeMessage recv = received_by(acts[i], P, 1, s);
        k = add_exchange(steps, k, pending, recv, pending.peer >= 0 && pending.peer == recv.peer);
        steps[k++] = action_step(acts[i]);
        pending = sent_by(acts[i], P, 1, s);
    }
    return add_exchange(steps, k, pending, NO_MESSAGE, 0);
}

// Which received gradients wait in dreceived (PipeMessage.staged), and the backwards that take them from there
static void mark_staged_gradients(PipeStep* steps, int n) {
    for (int i = 0; i < n; i++) {
        PipeMessage* r = &steps[i].recv;
        if (!steps[i].exchange || r->peer < 0 || !r->backward) continue;
        int j = i + 1;  // its backward
        while (steps[j].exchange || steps[j].action.kind != PIPE_B || steps[j].action.micro != r->micro ||
               steps[j].action.chunk != r->chunk)
            j++;
        r->staged = j != i + 1 || (steps[i].paired && steps[i].send.peer >= 0 && steps[i].send.backward);
        steps[j].action.staged = r->staged;
    }
}

// The steps of stage s (of P, M micro-batches, V chunks per stage: 1 but for the interleaved schedule),
// in order: its 2MV actions (ZB-H1: 3M) and the exchanges between them. `steps` holds
// pipeline_plan_capacity(M, V). Returns their number.
static int pipeline_plan_capacity(int M, int V) { return 6 * M * V + 2; }
static int pipeline_plan(Schedule sched, int P, int s, int M, int V, PipeStep* steps) {
    int n = 0;
    if (sched != SCHEDULE_INTERLEAVED) {
        PipeAction* acts = (PipeAction*)malloc_check(3 * (size_t)M * sizeof(PipeAction));
        if (sched == SCHEDULE_GPIPE) {
            for (int m = 0; m < M; m++) acts[n++] = (PipeAction){.kind = PIPE_F, .micro = m, .chunk = 0, .staged = 0};
            for (int m = 0; m < M; m++) acts[n++] = (PipeAction){.kind = PIPE_B, .micro = m, .chunk = 0, .staged = 0};
        } else {
            // ZB-H1: 1F1B's forwards and backwards (B), and after the backward of micro-batch b the W of
            // micro-batch b-s: stage s keeps s W's deferred, and runs them at the end
            int warmup = P - s - 1 < M ? P - s - 1 : M;
            int zb = sched == SCHEDULE_ZBH1;
            int f = 0, b = 0, w = 0;
            for (; f < warmup; f++) acts[n++] = (PipeAction){.kind = PIPE_F, .micro = f, .chunk = 0, .staged = 0};
            while (b < M) {  // steady state: one forward, one backward; then the cool-down's backwards
                if (f < M) acts[n++] = (PipeAction){.kind = PIPE_F, .micro = f++, .chunk = 0, .staged = 0};
                acts[n++] = (PipeAction){.kind = PIPE_B, .micro = b++, .chunk = 0, .staged = 0};
                if (zb && b - w > s) acts[n++] = (PipeAction){.kind = PIPE_W, .micro = w++, .chunk = 0, .staged = 0};
            }
            while (zb && w < M) acts[n++] = (PipeAction){.kind = PIPE_W, .micro = w++, .chunk = 0, .staged = 0};
        }
        n = exchange_before_actions(acts, n, P, s, steps);
        free(acts);
        return n;
    }
    // Interleaved: the M*V forwards in the order of interleaved_action, and the backwards likewise:
    // warm-up forwards, enough that the first backward's gradient (from the last virtual stage) is on its
    // way when the stage turns to it; then a forward and a backward alternately; then the remaining
    // backwards. An exchange follows each warm-up forward, each pair and each cool-down backward.
    int total = M * V, warmup = 2 * (P - s - 1) + (V - 1) * P;
    if (warmup > total) warmup = total;
#define F(k) interleaved_action(0, k, P, V)
#define B(k) interleaved_action(1, k, P, V)
    PipeMessage none = NO_MESSAGE;
    n = add_exchange_pair(steps, n, none, received_by(F(0), P, V, s), none, none);
    for (int k = 0; k < warmup; k++) {  // the last warm-up exchange also receives the first backward's gradient
        steps[n++] = action_step(F(k));
        n = add_exchange_pair(steps, n, sent_by(F(k), P, V, s), k + 1 < total ? received_by(F(k + 1), P, V, s) : none,
                              none, k == warmup - 1 && warmup < total ? received_by(B(0), P, V, s) : none);
    }
    for (int k = 0; k < total - warmup; k++) {  // steady state
        steps[n++] = action_step(F(k + warmup));
        steps[n++] = action_step(B(k));
        PipeMessage next_input = k + warmup + 1 < total ? received_by(F(k + warmup + 1), P, V, s) : none;
        n = add_exchange_pair(steps, n, sent_by(F(k + warmup), P, V, s), next_input, sent_by(B(k), P, V, s),
                              received_by(B(k + 1), P, V, s));
    }
    if (warmup == total) n = add_exchange_pair(steps, n, none, none, none, received_by(B(0), P, V, s));
    for (int k = total - warmup; k < total; k++) {  // cool-down
        steps[n++] = action_step(B(k));
        PipeMessage next_grad = k + 1 < total ? received_by(B(k + 1), P, V, s) : none;
        n = add_exchange_pair(steps, n, none, none, sent_by(B(k), P, V, s), next_grad);
    }
#undef F
#undef B
    mark_staged_gradients(steps, n);
    return n;
}

// How many actions a stage runs in one step: a forward and a backward per micro-batch and chunk (ZB-H1:
// also a W per micro-batch)
static int actions_per_stage(Schedule sched, int M, int V) { return sched == SCHEDULE_ZBH1 ? 3 * M : 2 * M * V; }

// The actions of stage s, in order (its plan without the exchanges). Returns their number.
static int pipeline_schedule(Schedule sched, int P, int s, int M, int V, PipeAction* actions) {
    PipeStep* steps = (PipeStep*)malloc_check((size_t)pipeline_plan_capacity(M, V) * sizeof(PipeStep));
    int n = pipeline_plan(sched, P, s, M, V, steps), k = 0;
    for (int i = 0; i < n; i++)
        if (!steps[i].exchange) actions[k++] = steps[i].action;
    free(steps);
    return k;
}

// The most micro-batches chunk `chunk` of stage s holds at once between an action of kind `from` and
// one of kind `to`. Each chunk runs each kind of action in micro-batch order, so the ones it holds are
// consecutive and micro-batch m can use slot m mod that number.
static int pipeline_held(Schedule sched, int P, int s, int M, int V, int chunk, int from, int to) {
    PipeAction* actions = (PipeAction*)malloc_check((size_t)actions_per_stage(sched, M, V) * sizeof(PipeAction));
    int n = pipeline_schedule(sched, P, s, M, V, actions), held = 0, most = 0;
    for (int i = 0; i < n; i++) {
        if (actions[i].chunk != chunk) continue;
        held += (actions[i].kind == from) - (actions[i].kind == to);
        most = held > most ? held : most;
    }
    free(actions);
    return most;
}

// The activation slots chunk `chunk` of stage s keeps for M micro-batches: one without pipelining (the
// plain step), else the most micro-batches its schedule holds at once, from their forward to their last
// use (the backward, or ZB-H1's W).
static int pipeline_slots(Schedule sched, int P, int s, int M, int V, int chunk) {
    if (P == 1) return 1;
    return pipeline_held(sched, P, s, M, V, chunk, PIPE_F, sched == SCHEDULE_ZBH1 ? PIPE_W : PIPE_B);
}

// ZB-H1: the sets of output gradients stage s keeps for its deferred W's (each B's, until its W); 0 for
// the other schedules, whose backward uses them at once
static int pipeline_stash_slots(Schedule sched, int P, int s, int M) {
    return P > 1 && sched == SCHEDULE_ZBH1 ? pipeline_held(sched, P, s, M, 1, 0, PIPE_B, PIPE_W) : 0;
}

// ----------------------------------------------------------------------------------------------------
// the messages between stages, as the pipeline step (train_gpt.cu) exchanges them

// The chunk a message of stage s (of P) leaves from: its own for a sent one; for a received one the
// sender's, which is the next chunk, or the one before, when the message crosses from stage P-1 to stage
// 0 (or back) round the ring
static int sending_chunk(PipeMessage m, int received, int P, int s) {
    if (!received) return m.chunk;
    return m.chunk + (m.backward ? (s == P - 1) : -(s == 0));
}

// A message's name in traces: what it carries, "act 3" (micro-batch 3's activation) or "grad 3" (its
// gradient), with virtual stages "act 3.1" (out of chunk 1 of its sender, as --print-schedule names it)
static void message_name(PipeMessage m, int received, int P, int V, int s, char* out, size_t n) {
    if (V > 1) snprintf(out, n, "%s %d.%d", m.backward ? "grad" : "act", m.micro, sending_chunk(m, received, P, s));
    else snprintf(out, n, "%s %d", m.backward ? "grad" : "act", m.micro);
}

// An exchange step: its send (out of send_buf) and its receive (into recv_buf; either NULL when the step
// has none). Paired (st->paired), the two go as one sendrecv; otherwise the send, then the receive. A
// receive is waited for. A lone send is waited for only when its buffer is `shared`: an input gradient
// in the shared dresidual, or with rematerialization a forward output in the shared work set, which the
// next action overwrites; a forward output in its micro-batch slot is written again only after a later
// receive has been waited for (same stream, in order), so its send is not waited for, and with NCCL it
// runs while the next forward computes. V: chunks per stage, for the traces' names ("send act 3, recv
// grad 2").
static void pipe_sendrecv(Comm* c, Tracer* tr, const PipeStep* st, const floatX* send_buf, floatX* recv_buf, int shared,
                          size_t n, int V) {
    char send_s[24], recv_s[24], name[60];
    message_name(st->send, 0, c->pp, V, c->pp_rank, send_s, sizeof(send_s));
    message_name(st->recv, 1, c->pp, V, c->pp_rank, recv_s, sizeof(recv_s));
    double t0 = trace_now_us(tr);
    if (send_buf && recv_buf && st->paired) {
        comm_sendrecv(c, &c->pp_group, send_buf, st->send.peer, recv_buf, st->recv.peer, n, DT_FLOATX);
        comm_join(c);
        snprintf(name, sizeof(name), "send %s, recv %s", send_s, recv_s);
        trace_add(tr, "sendrecv", name, -1, t0);
        return;
    }
    if (send_buf) {
        comm_send(c, &c->pp_group, send_buf, n, DT_FLOATX, st->send.peer);
        if (shared) comm_join(c);
        snprintf(name, sizeof(name), "send %s", send_s);
        trace_add(tr, "send", name, -1, t0);
    }
    if (recv_buf) {
        t0 = trace_now_us(tr);
        comm_recv(c, &c->pp_group, recv_buf, n, DT_FLOATX, st->recv.peer);
        comm_join(c);
        snprintf(name, sizeof(name), "recv %s", recv_s);
        trace_add(tr, "recv", name, -1, t0);
    }
}

// An action's name: "F3", "B3" or "W3" (micro-batch 3), with virtual stages "F3.1" (in chunk 1); `sep`
// goes between the kind and the numbers ("" in --print-schedule, " " in traces: "F 3.1")
static void action_label(PipeAction a, int V, const char* sep, char* out, size_t n) {
    char kind = a.kind == PIPE_F ? 'F' : a.kind == PIPE_B ? 'B' : 'W';
    if (V > 1) snprintf(out, n, "%c%s%d.%d", kind, sep, a.micro, a.chunk);
    else snprintf(out, n, "%c%s%d", kind, sep, a.micro);
}

// An action's span in traces: "F 3", with virtual stages "F 3.1"
static void trace_action(Tracer* tr, PipeAction a, int V, double start_us) {
    char name[24];
    action_label(a, V, " ", name, sizeof(name));
    trace_add(tr, a.kind == PIPE_F ? "forward" : "backward", name, -1, start_us);
}

// ----------------------------------------------------------------------------------------------------
// --print-schedule: the schedule of every stage, before running it

// A message of stage s as --print-schedule names it: 'a' (activation) or 'g' (gradient), the micro-batch,
// and with virtual stages the sending chunk ("a3.1": micro-batch 3's activation out of chunk 1; a
// message received from stage P-1 by stage 0, or back, crosses to the next chunk, or the one before)
static void message_label(PipeMessage m, int received, int P, int V, int s, char* out, size_t n) {
    char kind = m.backward ? 'g' : 'a';
    if (V > 1) snprintf(out, n, "%c%d.%d", kind, m.micro, sending_chunk(m, received, P, s));
    else snprintf(out, n, "%c%d", kind, m.micro);
}


// An exchange of stage s, as pipeline_step makes it: one sendrecv when `paired` (GPipe, 1F1B and ZB-H1
// pair a send and a receive with the same neighbour; the interleaved schedule pairs them all), else the
// send, then the receive. "a3>1": micro-batch 3's activation sent to stage 1; "g3<2": its
// gradient received from stage 2.
static void print_exchange(PipeMessage send, PipeMessage recv, int paired, int P, int V, int s) {
    char send_s[48] = "", recv_s[48] = "", label[24];
    message_label(send, 0, P, V, s, label, sizeof(label));
    if (send.peer >= 0) snprintf(send_s, sizeof(send_s), "%s>%d", label, send.peer);
    message_label(recv, 1, P, V, s, label, sizeof(label));
    if (recv.peer >= 0) snprintf(recv_s, sizeof(recv_s), "%s<%d", label, recv.peer);
    if (send.peer >= 0 && recv.peer >= 0 && paired) printf(" sendrecv %s %s |", send_s, recv_s);
    else {
        if (send.peer >= 0) printf(" send %s |", send_s);
        if (recv.peer >= 0) printf(" recv %s |", recv_s);
    }
}

// Prints, for P stages, M micro-batches and V chunks per stage (1 but for the interleaved schedule): a
// timeline (one column a time slot, a chunk's forward taking one slot and its backward two, or with ZB-H1
// F, B and W one each; each action starting when its stage is free and its input has arrived, a W when
// its B is done), and each stage's actions with the messages
// between them, so the sends and receives can be paired by eye; then the bubble: the idle slots, against
// the schedule's formula.
static void pipeline_print_schedule(Schedule sched, int P, int M, int V) {
    int per = actions_per_stage(sched, M, V), zb = sched == SCHEDULE_ZBH1;
    PipeAction* acts = (PipeAction*)malloc_check((size_t)P * per * sizeof(PipeAction));
    int* f_end = (int*)malloc_check((size_t)P * V * M * sizeof(int));  // [virtual stage][micro] when its forward ends
    int* b_end = (int*)malloc_check((size_t)P * V * M * sizeof(int));
    int* start = (int*)malloc_check((size_t)P * per * sizeof(int));
    PipeStep* steps = (PipeStep*)malloc_check((size_t)pipeline_plan_capacity(M, V) * sizeof(PipeStep));
    for (int s = 0; s < P; s++) pipeline_schedule(sched, P, s, M, V, acts + (size_t)s * per);
    for (int i = 0; i < P * V * M; i++) f_end[i] = b_end[i] = -1;
    // timeline: sweep until every action is placed (an action waits for the one before it on its stage
    // and for its input: the forward of the virtual stage before, or the backward of the one after)
    int* next = (int*)calloc_check(P * sizeof(int));
    int* free_at = (int*)calloc_check(P * sizeof(int));
    int placed = 0, width = 0, last_vs = P * V - 1;
    while (placed < P * per) {
        int placed_before = placed;
        for (int s = 0; s < P; s++) {
            if (next[s] == per) continue;
            PipeAction a = acts[(size_t)s * per + next[s]];
            int vs = a.chunk * P + s;  // its virtual stage
            int ready = a.kind == PIPE_W ? b_end[vs * M + a.micro]
                        : a.kind == PIPE_B ? (vs == last_vs ? f_end[vs * M + a.micro] : b_end[(vs + 1) * M + a.micro])
                                           : (vs == 0 ? 0 : f_end[(vs - 1) * M + a.micro]);
            if (ready < 0) continue;  // its input is not computed yet
            int t = ready > free_at[s] ? ready : free_at[s];
            start[(size_t)s * per + next[s]] = t;
            free_at[s] = t + (a.kind == PIPE_B && !zb ? 2 : 1);
            if (a.kind != PIPE_W) (a.kind == PIPE_B ? b_end : f_end)[vs * M + a.micro] = free_at[s];
            width = free_at[s] > width ? free_at[s] : width;
            next[s]++;
            placed++;
        }
        check_internal(placed > placed_before, "the pipeline schedule waits on itself");
    }
    printf("pipeline schedule %s: %d stage%s, %d micro-batch%s per step", schedule_name(sched), P, P > 1 ? "s" : "", M,
           M > 1 ? "es" : "");
    if (V > 1) printf(", %d chunks per stage (stage s holds virtual stages s, s+%d, ...)", V, P);
    printf("\n");
    if (V > 1)
        printf("timeline (a chunk's forward takes one slot, its backward two: Bm.c ==, micro-batch m in chunk c; "
               "'.' idle):\n");
    else if (zb)
        printf("timeline (a forward, a backward's B and its W take one slot each; '.' idle; the bubble is the idle "
               "slots):\n");
    else
        printf("timeline (a forward takes one slot, a backward two: Bm ==; '.' idle; the bubble is the idle slots):\n");
    // a slot is 2 + digits characters wide (4 up to 100 micro-batches; 2 more for ".c"), so columns align
    int digits = 2;
    for (int m = 100; m < M; m *= 10) digits++;
    int cell = digits + 1 + (V > 1 ? 2 : 0);  // what follows a slot's space
    for (int s = 0; s < P; s++) {
        printf("  stage %2d |", s);
        int t = 0;
        for (int i = 0; i < per; i++) {
            PipeAction a = acts[(size_t)s * per + i];
            for (; t < start[(size_t)s * per + i]; t++) printf(" %-*s", cell, ".");
            char label[24];
            action_label(a, V, "", label, sizeof(label));
            printf(" %-*s", cell, label);
            if (a.kind == PIPE_B && !zb) printf(" %-*s", cell, "==");
            t += a.kind == PIPE_B && !zb ? 2 : 1;
        }
        for (; t < width; t++) printf(" %-*s", cell, ".");
        printf("\n");
    }
    if (V > 1)
        printf("actions and messages of each stage, in order (a3.1>2: micro-batch 3's activation out of chunk 1 sent "
               "to stage 2;\n"
               "g3.1<2: its gradient out of chunk 1 of stage 2 received; an exchange's send and receive go as one "
               "sendrecv):\n");
    else
        printf("actions and messages of each stage, in order (a3>1: micro-batch 3's activation sent to stage 1;\n"
               "g3<2: its gradient received from stage 2; a send and a receive with the same neighbour go as one "
               "sendrecv):\n");
    for (int s = 0; s < P; s++) {
        printf("  stage %2d (", s);  // "2 activation slots", or by chunk "4+2 activation slots"
        int total = 0;
        for (int v = 0; v < V; v++) {
            int slots = pipeline_slots(sched, P, s, M, V, v);
            printf("%s%d", v > 0 ? "+" : "", slots);
            total += slots;
        }
        printf(" activation slot%s%s", total > 1 ? "s" : "", V > 1 ? " by chunk" : "");
        int douts = zb ? pipeline_stash_slots(sched, P, s, M) : 0;
        if (zb) printf(", %d set%s of output gradients", douts, douts > 1 ? "s" : "");
        printf(") |");
        int n = pipeline_plan(sched, P, s, M, V, steps);
        for (int i = 0; i < n; i++) {
            char label[24];
            action_label(steps[i].action, V, "", label, sizeof(label));
            if (steps[i].exchange) print_exchange(steps[i].send, steps[i].recv, steps[i].paired, P, V, s);
            else printf(" %s |", label);
        }
        printf("\n");
    }
    // the bubble: every stage is busy 3MV of the step's `width` slots (a forward 1, a backward 2; ZB-H1:
    // F, B and W 1 each)
    int busy = 3 * M * V;
    const char* formula;
    double ideal = pipeline_ideal_bubble(sched, P, M, V, &formula);
    printf("bubble: every stage is idle %d of the step's %d slots, %.1f%%; %s = %.1f%%\n", width - busy, width,
           100.0 * (width - busy) / width, formula, 100.0 * ideal);
    free(acts);
    free(f_end);
    free(b_end);
    free(start);
    free(next);
    free(free_at);
    free(steps);
}
