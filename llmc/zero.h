/*
 * zero.h: data parallelism and ZeRO sharding of the optimizer state (ZeRO-1) and of the gradients
 * (ZeRO-2, and ZeRO-3, which shards the parameters too: llmc/zero3.h): who owns what, when gradients are
 * reduced, and ZeRO-2's gradient buffers.
 *
 * Data parallelism: D ranks hold the same model and run backward on different micro-batches; before the
 * update the gradients are summed over the D ranks. Summed, not averaged: the loss of each position is
 * already weighted 1/(D*B*T*accum), so the sum over ranks is the gradient of the mean loss of the
 * global batch.
 *
 * Buckets. The flat parameter buffer is cut into buckets, the units of communication: the embeddings
 * (wte, wpe) are bucket 0, transformer layer l is bucket 1 + l, the final LayerNorm the last. Each
 * bucket is padded to a multiple of D elements, so it splits into D equal parts; DP rank d owns part
 * d of every bucket:
 *
 *      bucket b:  | part 0 (rank 0) | part 1 (rank 1) | ... | part D-1 |
 *
 * Backward finishes the buckets from the last to the first (final LayerNorm, layer L-1, ..., layer 0,
 * embeddings), and each bucket's communication starts as soon as its gradients are final, so it
 * overlaps the backward of the layers below (on the GPU with NCCL it runs on the communication stream).
 *
 * Per rank (Psi = parameters, gaps and padding included; the optimizer state is AdamW's m and v, plus
 * fp32 master weights in BF16 builds):
 *   stage 0  params Psi, grads Psi, optimizer state Psi. Each bucket is all-reduced: every rank gets the
 *            sum of every part and runs the same update on the whole model.
 *   ZeRO-1   params Psi, grads Psi, optimizer state Psi/D. Each bucket is reduce-scattered: rank d
 *            receives only the sum of its part, in place in its part of the full gradient buffer, and
 *            updates only that part (the optimizer state of the other parts lives on the other ranks).
 *            The reduce-scatter runs once per optimizer step, in the backward of the last micro-step;
 *            the micro-steps before it only accumulate (+=) into the full local buffer.
 *   ZeRO-2   params Psi, grads Psi/D (+ a bounded workspace), optimizer state Psi/D. The full gradient
 *            of a layer exists only briefly: backward writes it into a workspace buffer, the buffer is
 *            reduce-scattered in place (rank d's sum lands in part d of the buffer, as ZeRO-1's does in
 *            the full buffer), and before the buffer is reused that part is added into `shard`, which
 *            accumulates over the optimizer step. Since the workspace holds one micro-step, the
 *            reduce-scatter runs in every micro-step:
 *              shard (Psi/D) += part d of the bucket's buffer     (zero2_layer_begins, zero2_end_micro_step)
 *   ZeRO-3   params Psi/D (+ gather buffers), grads and optimizer state as ZeRO-2: the parameters are
 *            sharded too, and each layer's are all-gathered just before they are used (llmc/zero3.h).
 * At ZeRO-1 and ZeRO-2, after the update every rank holds new values for its parts only, and an
 * all-gather per bucket gives everyone the full parameters again (zero_gather_params).
 *
 * ZeRO-2's workspace (LayerBuffers): [embeddings bucket | final LayerNorm bucket | layer buffer 0 | layer
 * buffer 1].
 * The embeddings and final LayerNorm get their own space (the first and the last bucket backward
 * finishes); the L layers share two buffers, layer l writing buffer l % 2. Why two: the reduce-scatter of
 * layer l still reads its buffer while backward computes layer l-1, which therefore writes the other buffer;
 * layer l-2 comes back to l's buffer, and first waits for l's reduce-scatter (zero2_layer_begins). With
 * one buffer, every layer would wait for its predecessor's communication (no overlap); with L buffers, the
 * workspace would be as large as the full gradients ZeRO-2 set out not to keep.
 *
 * What the trainer calls, in order (the zero2_ calls do nothing below stage 2; stage 3's gradients are
 * stage 2's):
 *   zero2_init / zero2_free         allocate / free the shard and the workspace (gpt2_build_as, gpt2_free)
 *   zero2_begin_step                clear the accumulated shard (start of an optimizer step)
 *   zero_reduces_now                whether this micro-step's backward reduces: the last one; all at ZeRO-2
 *   zero2_begin_micro_step          clear the embeddings and final-LayerNorm workspace (start of backward)
 *   zero2_layer_begins (layer l)    wait until buffer l % 2 is free, add its reduced part to the shard, clear it
 *   zero_reduce_bucket (bucket b)   all-reduce or reduce-scatter the bucket's gradients, as they are final
 *   zero2_layer_done (layer l)      buffer l % 2 is read by the reduce-scatter just posted
 *   zero2_end_micro_step            after the join: the reduced parts still in the workspace join the shard
 *   zero_gather_params              after the update
 */
#pragma once

#include "comm.h"       // Comm, comm_all_reduce, comm_reduce_scatter, comm_all_gather, comm_join_group
#include "device.h"     // floatX, BuildMode, zeroed_device_buffer, device_free, device_memset_zero, device_accumulate
#include "placement.h"  // Placement: the DP group's size D (dp) and this rank's index d (dp_rank)

typedef struct {
    size_t offset;  // first element in the flat buffer
    size_t size;    // elements, a multiple of the DP size
} Bucket;

typedef struct {
    int stage;                 // 0, 1, 2, 3
    const Placement* place;    // this rank's place: D = place->dp ranks share the state, this one is d = place->dp_rank
    int num_buckets;
    Bucket* buckets;
    size_t* owned_offset;  // where bucket b's owned range sits in the shard buffers (m, v, master, grad shard)
    size_t shard_total;    // elements of each shard buffer
} ZeroPlan;

// The range of bucket b whose optimizer state this rank keeps: all of it at stage 0, its part otherwise.
static size_t owned_start(const ZeroPlan* z, int b) {
    const Bucket* k = &z->buckets[b];
    return z->stage == 0 ? k->offset : k->offset + (size_t)z->place->dp_rank * (k->size / z->place->dp);
}
static size_t owned_size(const ZeroPlan* z, int b) {
    return z->stage == 0 ? z->buckets[b].size : z->buckets[b].size / z->place->dp;
}

// The plan of a rank at `place` (kept: it must outlive the plan), for the layout's buckets.
static void zero_plan_init(ZeroPlan* z, const Placement* place, const Bucket* buckets, int num_buckets) {
    z->stage = place->zero;
    z->place = place;
    z->num_buckets = num_buckets;
    z->buckets = (Bucket*)malloc_check(num_buckets * sizeof(Bucket));
    memcpy(z->buckets, buckets, num_buckets * sizeof(Bucket));
    z->owned_offset = (size_t*)malloc_check(num_buckets * sizeof(size_t));
    size_t pos = 0;
    for (int b = 0; b < num_buckets; b++) {
        check_internal(buckets[b].size % place->dp == 0, "bucket size not a multiple of the DP size");
        z->owned_offset[b] = pos;
        pos += owned_size(z, b);
    }
    z->shard_total = pos;
}

static void zero_plan_free(ZeroPlan* z) {
    free(z->buckets);
    free(z->owned_offset);
}

// Whether backward reduces this micro-step's gradients: in the last micro-step of an optimizer step (the
// others accumulate locally); at ZeRO-2 in every micro-step, since the workspace holds one micro-step only.
static int zero_reduces_now(const ZeroPlan* z, int last_micro_step) {
    return last_micro_step || z->stage >= 2;
}

// ----------------------------------------------------------------------------------------------------
// ZeRO-2's gradient buffers (ZeRO-3's too)

// [embeddings bucket | final LayerNorm bucket | layer buffer 0 | layer buffer 1]: where ZeRO-2 writes a
// micro-step's gradients and ZeRO-3 gathers the parameters (llmc/zero3.h). Layer l uses buffer l % 2.
typedef struct {
    floatX* base;           // (ends + 2 * buf_size)
    floatX* layer_buf[2];  // (buf_size) each, inside base
    size_t ends, buf_size;  // elements; ends: the embeddings and final-LayerNorm buckets
} LayerBuffers;

// mode: real or dry, with the element size (the planner builds for other precisions); the bytes go to *account
static void layer_buffers_init(LayerBuffers* w, const ZeroPlan* z, const BuildMode* mode, size_t* account) {
    int last = z->num_buckets - 1;
    w->buf_size = 0;
    for (int b = 1; b < last; b++) w->buf_size = z->buckets[b].size > w->buf_size ? z->buckets[b].size : w->buf_size;
    w->ends = z->buckets[0].size + z->buckets[last].size;
    w->base = (floatX*)zeroed_device_buffer(mode, (w->ends + 2 * w->buf_size) * mode->elem_bytes, account);
    w->layer_buf[0] = w->base + w->ends;
    w->layer_buf[1] = w->layer_buf[0] + w->buf_size;
}

// Where bucket b sits in the buffers: bases[b] for every bucket (gpt2_build points the tensors there).
static void layer_buffers_bases(const LayerBuffers* w, const ZeroPlan* z, floatX** bases) {
    int last = z->num_buckets - 1;
    bases[0] = w->base;
    bases[last] = w->base + z->buckets[0].size;
    for (int b = 1; b < last; b++) bases[b] = w->layer_buf[(b - 1) % 2];
}

typedef struct {
    floatX* shard;           // (shard_total) this rank's reduced gradient parts, accumulated over micro-steps;
                             // NULL below stage 2, where the zero2_ calls do nothing
    LayerBuffers workspace;  // what backward writes, and where each bucket's reduce-scatter leaves our part
    const ZeroPlan* plan;    // which part of each bucket is ours
    CommFence buf_free[2];   // marked after the reduce-scatter of the layer in the buffer was posted
    int buf_bucket[2];       // the bucket whose reduced part waits in the buffer (-1: none)
} Zero2Grads;

// Allocates the buffers at stages 2 and 3 (below, nothing: the full gradient buffer serves); the bytes
// are counted into two accounts: the gradient shard, the workspace.
static void zero2_init(Zero2Grads* w, const ZeroPlan* z, const BuildMode* mode, size_t* bytes_grads,
                       size_t* bytes_workspace) {
    memset(w, 0, sizeof(*w));
    w->buf_bucket[0] = w->buf_bucket[1] = -1;
    if (z->stage < 2) return;
    w->plan = z;
    w->shard = (floatX*)zeroed_device_buffer(mode, z->shard_total * mode->elem_bytes, bytes_grads);
    layer_buffers_init(&w->workspace, z, mode, bytes_workspace);
}

static void zero2_free(Zero2Grads* w) {
    if (w->shard == NULL) return;
    device_free(w->shard);
    device_free(w->workspace.base);
    for (int s = 0; s < 2; s++) comm_fence_free(&w->buf_free[s]);
    memset(w, 0, sizeof(*w));
}

// start of an optimizer step: nothing accumulated yet
static void zero2_begin_step(Zero2Grads* w) {
    if (w->shard) device_memset_zero(w->shard, w->plan->shard_total * sizeof(floatX));
}

// start of a micro-step's backward: the embeddings' and final LayerNorm's gradients start from zero
// (backward adds into them; the layer buffers are cleared as each layer begins)
static void zero2_begin_micro_step(Zero2Grads* w) {
    if (w->shard) device_memset_zero(w->workspace.base, w->workspace.ends * sizeof(floatX));
}

// The reduced part of bucket b joins the ones accumulated so far: shard += our part of the bucket's
// gradient `bucket_grads` in the workspace, which its reduce-scatter has left there (it has completed).
static void zero2_add_part(Zero2Grads* w, int b, const floatX* bucket_grads) {
    size_t n = owned_size(w->plan, b);
    if (n == 0) return;
    device_accumulate(w->shard + w->plan->owned_offset[b], bucket_grads + (size_t)w->plan->place->dp_rank * n, n);
}

// Before backward writes layer l's gradients into buffer l % 2: the reduce-scatter of layer l + 2 there
// must be done (the main stream waits for it; on a GPU only the stream: the host blocks in the next copy
// or synchronization instead; the emulation blocks here), its part joins the shard, and the buffer starts
// from zero.
static void zero2_layer_begins(Comm* c, Zero2Grads* w, int l) {
    if (w->shard == NULL) return;
    int buffer = l % 2;
    comm_fence_wait(c, &c->dp_group, &w->buf_free[buffer], "the main stream's wait for a ZeRO-2 reduce-scatter");
    if (w->buf_bucket[buffer] >= 0) zero2_add_part(w, w->buf_bucket[buffer], w->workspace.layer_buf[buffer]);
    w->buf_bucket[buffer] = -1;
    device_memset_zero(w->workspace.layer_buf[buffer], w->workspace.buf_size * sizeof(floatX));
}

// After the reduce-scatter of layer l was posted (zero_reduce_bucket): its buffer belongs to it until done,
// and then holds our reduced part of the layer's bucket, 1 + l.
static void zero2_layer_done(Comm* c, Zero2Grads* w, int l) {
    if (w->shard == NULL) return;
    comm_fence_mark(c, &c->dp_group, &w->buf_free[l % 2]);
    w->buf_bucket[l % 2] = 1 + l;
}

// End of a micro-step's backward, after the communication was joined: the reduced parts still in the
// workspace (the last two layers', the embeddings' and the final LayerNorm's) join the shard.
static void zero2_end_micro_step(Zero2Grads* w) {
    if (w->shard == NULL) return;
    const ZeroPlan* z = w->plan;
    int last = z->num_buckets - 1;
    for (int buffer = 0; buffer < 2; buffer++) {
        if (w->buf_bucket[buffer] >= 0) zero2_add_part(w, w->buf_bucket[buffer], w->workspace.layer_buf[buffer]);
        w->buf_bucket[buffer] = -1;
    }
    zero2_add_part(w, 0, w->workspace.base);
    zero2_add_part(w, last, w->workspace.base + z->buckets[0].size);
}

// ----------------------------------------------------------------------------------------------------
// the communication of one bucket, called as soon as backward has finished its gradients

// grads: the bucket's full gradient (in the gradient buffer at stages 0 and 1, in the workspace at
// stages 2 and 3).
static void zero_reduce_bucket(Comm* c, const ZeroPlan* z, int b, floatX* grads) {
    size_t part = z->buckets[b].size / z->place->dp;
    switch (z->stage) {
        case 0:  // DP: everyone gets the sum of everyone's gradients
            comm_all_reduce(c, &c->dp_group, grads, z->buckets[b].size, DT_FLOATX, REDUCE_SUM);
            break;
        case 1:  // ZeRO-1: the sum of my part lands in place, in my part of the full gradient buffer
        case 2:  // ZeRO-2 (and 3): the same in the workspace, whence it joins the shard (zero2_layer_begins)
        case 3:
            comm_reduce_scatter(c, &c->dp_group, grads, grads + (size_t)z->place->dp_rank * part, part, DT_FLOATX);
            break;
    }
}

// stage 1 and 2, after the update of the owned parts: everyone gets every part of the parameters
// (stage 3 keeps its parts only: llmc/zero3.h gathers each layer when it runs)
static void zero_gather_params(Comm* c, const ZeroPlan* z, floatX* params) {
    if (z->stage == 0 || z->stage == 3) return;
    for (int b = 0; b < z->num_buckets; b++)
        comm_all_gather(c, &c->dp_group, params + z->buckets[b].offset, z->buckets[b].size / z->place->dp, DT_FLOATX);
}
