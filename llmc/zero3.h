/*
 * zero3.h: ZeRO-3 ("fully sharded" data parallelism): the parameters are sharded over the D data-parallel
 * ranks like the gradients and the optimizer state, and a layer's full parameters exist only while they
 * are used, all-gathered from the D ranks' parts into a bounded buffer.
 *
 * Ownership is ZeRO-1/2's (llmc/zero.h): rank d owns part d of every bucket. At stage 3 it stores only
 * those parts of the parameters (the `shard`; in BF16/FP16 builds beside its fp32 master parts), and its
 * gradients are ZeRO-2's (a workspace reduce-scattered into the owned parts). Per rank:
 *      params Psi/D + the gather buffer, grads Psi/D + ZeRO-2's workspace, optimizer state Psi/D
 *
 * The gather buffer has the shape of ZeRO-2's workspace (LayerBuffers): [embeddings | final LayerNorm |
 * layer buffer 0 | layer buffer 1]; the model's parameter tensors point into it, layer l into buffer l % 2.
 * Before layer l runs, its bucket is all-gathered into its buffer; while it runs, the gather of the next
 * layer it will run is already on the communication stream, into the other buffer. Why two buffers: the same
 * reasoning as ZeRO-2's workspace. With one, each gather waits for the layer before it to finish (no
 * overlap); with L, the buffer would be the full copy of the parameters ZeRO-3 set out not to keep.
 * The embeddings (tied to the classifier) and the final LayerNorm are gathered at the start of the
 * forward and stay until the parameters change: the classifier, its backward and the final LayerNorm's
 * read them at the end of the forward and the start of the backward.
 *
 * One micro-step, L = 4 layers, in time order left to right (on the GPU with NCCL; G x: the gather of x on
 * the communication stream, Ge: of the ends; F x / B x: layer x's forward / backward on the main stream;
 * RS x: the reduce-scatter of its gradients, ZeRO-2's; in the rows of layer buffers 0 and 1, x>y: y is
 * being gathered over x, whose last use is done):
 *
 *      main         F0    F1    F2    F3  classifier lnf  B3    B2        B1        B0   embedding
 *      comm   Ge G0 G1    G2    G3                        RSf   RS3 G1    RS2 G0    RS1  RS0 RSe
 *      buf  0    0  0     0>2   2     2                   2     2         2>0       0
 *      buf  1       >1    1     1>3   3                   3     3>1       1         1
 *
 * Backward begins with the last two layers still gathered (no gather for them), and then gathers again in
 * reverse order. Each gather into a buffer is queued after the work already queued on the main stream, so
 * it overwrites the buffer only once the layer that used it is done. The next micro-step's forward finds
 * layers 0 and 1 still gathered. Recomputation (llmc/recompute.h) re-gathers what it recomputes:
 * every use of a layer asks for it (zero3_need_layer), which gathers if it is not there.
 *
 * What the trainer calls (all do nothing below stage 3):
 *   zero3_init / zero3_free       the shard and the gather buffer (gpt2_build_as, gpt2_free)
 *   layer_buffers_bases (zero.h)    where the parameter tensors point: into `gathered` (gpt2_build_as)
 *   zero3_need_ends               forward's start: the embeddings and final LayerNorm, gathered
 *   zero3_need_layer (l, next)    before layer l runs (forward, recomputation, backward): gathered, and the
 *                                 gather of `next` posted
 *   zero3_params_changed          after the update or a load: every gathered copy is stale
 * Every rank must make the same calls in the same order (they post collectives); every forward and
 * backward does, evaluation included (multiple-choice eval runs as many forwards on every DP rank).
 */
#pragma once

#include "comm.h"       // Comm, comm_all_gather, comm_join_group
#include "device.h"     // floatX, BuildMode, zeroed_device_buffer, device_free, device_copy
#include "run/trace.h"  // trace_now_us, trace_add: the gathers on the communication lane of --trace
#include "zero.h"       // ZeroPlan, LayerBuffers, layer_buffers_init, layer_buffers_bases

typedef struct {
    floatX* shard;          // (shard_total) this rank's parts of the parameters; NULL below stage 3
    LayerBuffers gathered;  // the gathered parameters the model's tensors point into
    int ends_valid;         // the embeddings and final LayerNorm are gathered and current
    int buf_layer[2];       // the layer whose gather was posted into each layer buffer (-1: none, or stale)
    CommFence ready[3];     // marked after a gather into layer buffer 0, 1, or the ends (2) was posted
    Tracer* tracer;         // --trace (NULL: off)
} Zero3Params;

static void zero3_params_changed(Zero3Params* p) {
    p->ends_valid = 0;
    p->buf_layer[0] = p->buf_layer[1] = -1;
}

// Allocates the shard (counted as parameters) and the gather buffer (counted as workspace) at stage 3.
static void zero3_init(Zero3Params* p, const ZeroPlan* z, const BuildMode* mode, size_t* bytes_params,
                       size_t* bytes_workspace) {
    memset(p, 0, sizeof(*p));
    zero3_params_changed(p);
    if (z->stage != 3) return;
    p->shard = (floatX*)zeroed_device_buffer(mode, z->shard_total * mode->elem_bytes, bytes_params);
    layer_buffers_init(&p->gathered, z, mode, bytes_workspace);
}

static void zero3_free(Zero3Params* p) {
    if (p->shard == NULL) return;
    device_free(p->shard);
    device_free(p->gathered.base);
    for (int s = 0; s < 3; s++) comm_fence_free(&p->ready[s]);
    memset(p, 0, sizeof(*p));
}

// Posts the all-gather of bucket b into dst (the bucket's full size): this rank's part goes to its
// place in dst, the others arrive there from their owners.
static void zero3_post_gather(Comm* c, const Zero3Params* p, const ZeroPlan* z, int b, floatX* dst) {
    size_t part = z->buckets[b].size / z->place->dp;
    if (part == 0) return;
    double t0 = trace_now_us(p->tracer);
    device_copy(dst + (size_t)z->place->dp_rank * part, p->shard + z->owned_offset[b], part * sizeof(floatX));
    comm_all_gather(c, &c->dp_group, dst, part, DT_FLOATX);
    trace_add(p->tracer, "allgather", "gather", b, t0);  // (bucket b: layer b - 1)
}

// The gathers into buffer s (0, 1: layers; 2: the ends) were posted: mark their end (a fence, llmc/comm.h).
static void zero3_posted(Comm* c, Zero3Params* p, int s) { comm_fence_mark(c, &c->dp_group, &p->ready[s]); }

// The main stream waits for buffer s's gathers (on a GPU with NCCL only the stream: the host goes on).
static void zero3_wait(Comm* c, Zero3Params* p, int s) {
    comm_fence_wait(c, &c->dp_group, &p->ready[s], "the main stream's wait for a ZeRO-3 gather");
}

static void zero3_gather_layer(Comm* c, Zero3Params* p, const ZeroPlan* z, int l) {
    zero3_post_gather(c, p, z, 1 + l, p->gathered.layer_buf[l % 2]);  // (layer l is bucket 1 + l)
    zero3_posted(c, p, l % 2);
    p->buf_layer[l % 2] = l;
}

// Forward's start: the embeddings and the final LayerNorm, gathered unless current.
static void zero3_need_ends(Comm* c, Zero3Params* p, const ZeroPlan* z) {
    if (p->shard == NULL || p->ends_valid) return;
    int last = z->num_buckets - 1;
    zero3_post_gather(c, p, z, 0, p->gathered.base);
    zero3_post_gather(c, p, z, last, p->gathered.base + z->buckets[0].size);
    zero3_posted(c, p, 2);
    zero3_wait(c, p, 2);
    p->ends_valid = 1;
}

// Layer l runs next: its parameters are gathered into buffer l % 2 unless they are there already, and the
// main stream waits for them. Then the gather of `next` (the layer the caller runs after l; -1: none) is
// posted into the other buffer, to overlap layer l's work (a neighbour of l: the other buffer, never l's).
static void zero3_need_layer(Comm* c, Zero3Params* p, const ZeroPlan* z, int l, int next) {
    if (p->shard == NULL) return;
    check_internal(next < 0 || next % 2 != l % 2, "ZeRO-3: the next layer would be gathered into the buffer in use");
    if (p->buf_layer[l % 2] != l) zero3_gather_layer(c, p, z, l);
    zero3_wait(c, p, l % 2);
    if (next >= 0 && p->buf_layer[next % 2] != next) zero3_gather_layer(c, p, z, next);
}
