/*
 * zero.h: data parallelism and ZeRO sharding of the optimizer state (stage 1) and gradients (stage 2).
 *
 * The flat parameter buffer is cut into buckets, the units of communication: the embeddings (wte, wpe),
 * each transformer layer, and the final LayerNorm. Each bucket's size is padded to a multiple of the DP
 * size D, so it splits into D equal chunks; DP rank d owns chunk d of every bucket:
 *
 *      bucket b:  | chunk 0 (rank 0) | chunk 1 (rank 1) | ... | chunk D-1 |
 *
 * What each stage keeps and communicates, per rank (Psi = parameters, gaps and padding included):
 *   stage 0  params Psi, grads Psi, optimizer state Psi x (m, v[, fp32 master])
 *            every bucket's gradients are all-reduced (summed) as soon as backward has finished them
 *   stage 1  params Psi, grads Psi, optimizer state Psi/D x (m, v[, master])
 *            each bucket is reduce-scattered: the rank receives the summed gradients of its own chunk
 *   stage 2  params Psi, grads Psi/D (+ a bounded workspace: the embedding bucket, the final LayerNorm,
 *            and two layer buckets), optimizer state Psi/D x (m, v[, master])
 *            each layer's gradients are produced in a workspace bucket, reduce-scattered into the
 *            rank's gradient shard, and the workspace is reused two layers further down
 * With stage 1 and 2, after the update every rank holds new values for its chunks only, and an
 * all-gather per bucket gives everyone the full parameters again.
 *
 * Gradients are summed, not averaged: the loss of each position is already weighted 1/(D*B*T*accum),
 * so the sum over ranks is the gradient of the mean loss of the global batch.
 *
 * This file holds the bookkeeping (who owns what) and the communication of one bucket; the training
 * step in train_gpt.cu calls it.
 */
#pragma once

#include "comm.h"
#include "residual.h"

typedef struct {
    size_t offset;  // first element in the flat buffer
    size_t size;    // elements, a multiple of the DP size
} Bucket;

typedef struct {
    int stage;  // 0, 1, 2
    int D, d;   // DP size and this rank's DP index
    int num_buckets;
    Bucket* buckets;
    size_t* owned_offset;  // where bucket b's owned range sits in the shard buffers (m, v, master, grad shard)
    size_t shard_total;    // elements of each shard buffer
} ZeroPlan;

// The range of bucket b whose optimizer state this rank keeps: all of it at stage 0, its chunk otherwise.
static size_t owned_start(const ZeroPlan* z, int b) {
    const Bucket* k = &z->buckets[b];
    return z->stage == 0 ? k->offset : k->offset + (size_t)z->d * (k->size / z->D);
}
static size_t owned_size(const ZeroPlan* z, int b) {
    return z->stage == 0 ? z->buckets[b].size : z->buckets[b].size / z->D;
}

static void zero_plan_init(ZeroPlan* z, int stage, int D, int d, const Bucket* buckets, int num_buckets) {
    z->stage = stage;
    z->D = D;
    z->d = d;
    z->num_buckets = num_buckets;
    z->buckets = (Bucket*)malloc_check(num_buckets * sizeof(Bucket));
    memcpy(z->buckets, buckets, num_buckets * sizeof(Bucket));
    z->owned_offset = (size_t*)malloc_check(num_buckets * sizeof(size_t));
    size_t pos = 0;
    for (int b = 0; b < num_buckets; b++) {
        check_internal(buckets[b].size % D == 0, "bucket size not a multiple of the DP size");
        z->owned_offset[b] = pos;
        pos += owned_size(z, b);
    }
    z->shard_total = pos;
}

static void zero_plan_free(ZeroPlan* z) {
    free(z->buckets);
    free(z->owned_offset);
}

// ----------------------------------------------------------------------------------------------------
// stage 2: the gradient workspace. Layer l's gradients are produced in slot l % 2; before backward
// writes into a slot again, the reduce-scatter that last read it must be done.

typedef struct {
    floatX* layer_slot[2];  // (largest layer bucket) each
    int slot_pending[2];    // a reduce-scatter that reads the slot was posted and not yet waited for
#ifdef HAVE_NCCL
    cudaEvent_t slot_free[2];
#endif
} Zero2Workspace;

static void zero2_acquire_slot(Comm* c, Zero2Workspace* w, int slot, size_t size) {
    if (w->slot_pending[slot]) {
#ifdef HAVE_NCCL
        // NCCL: the main stream waits for the communication that reads this slot
        if (c->engine == ENGINE_NCCL) cudaCheck(cudaStreamWaitEvent(main_stream, w->slot_free[slot], 0));
#endif
        // MPI: done already, except in strict mode (llmc/comm.h), where the join runs it
        if (c->engine != ENGINE_NCCL) comm_join(c);
        w->slot_pending[slot] = 0;
    }
    device_memset_zero(w->layer_slot[slot], size * sizeof(floatX));
}

static void zero2_release_slot(Comm* c, Zero2Workspace* w, int slot) {
#ifdef HAVE_NCCL
    if (c->engine == ENGINE_NCCL) {
        if (w->slot_free[slot] == NULL) cudaCheck(cudaEventCreateWithFlags(&w->slot_free[slot], cudaEventDisableTiming));
        cudaCheck(cudaEventRecord(w->slot_free[slot], c->stream));
    }
#endif
    (void)c;
    w->slot_pending[slot] = 1;
}

// ----------------------------------------------------------------------------------------------------
// the communication of one bucket, called as soon as backward has finished its gradients

// grads: the bucket's full gradient (in the gradient buffer at stages 0 and 1, in a workspace at stage 2).
// incoming: stage 2's shard buffer that receives this micro-step's reduced chunks.
static void zero_reduce_bucket(Comm* c, const ZeroPlan* z, int b, floatX* grads, floatX* incoming) {
    size_t chunk = z->buckets[b].size / z->D;
    switch (z->stage) {
        case 0:  // DP: everyone gets the sum of everyone's gradients
            comm_all_reduce(c, &c->dp_group, grads, z->buckets[b].size, DT_FLOATX, REDUCE_SUM);
            break;
        case 1:  // ZeRO-1: the sum of my chunk lands in place, in my chunk of the full gradient buffer
            comm_reduce_scatter(c, &c->dp_group, grads, grads + (size_t)z->d * chunk, chunk, DT_FLOATX);
            break;
        case 2:  // ZeRO-2: the sum of my chunk lands in my gradient shard
            comm_reduce_scatter(c, &c->dp_group, grads, incoming + z->owned_offset[b], chunk, DT_FLOATX);
            break;
    }
}

// stage 1 and 2, after the update of the owned chunks: everyone gets every chunk of the parameters
static void zero_gather_params(Comm* c, const ZeroPlan* z, floatX* params) {
    if (z->stage == 0) return;
    for (int b = 0; b < z->num_buckets; b++)
        comm_all_gather(c, &c->dp_group, params + z->buckets[b].offset, z->buckets[b].size / z->D, DT_FLOATX);
}
