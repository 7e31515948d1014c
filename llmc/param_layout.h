/*
 * param_layout.h: where each parameter tensor lives in the one flat buffer of a rank, and how that buffer
 * maps to the llm.c file order.
 *
 * Memory order is layer by layer: wte, wpe, then each layer's 12 tensors (llmc/model_file.h's order within
 * a layer), then lnfw, lnfb. So a layer's parameters (and its gradients, laid out alike) are one
 * contiguous range: a bucket, which is what data parallelism communicates and ZeRO shards (llmc/zero.h):
 *
 *   bucket 0: wte wpe | bucket 1: layer 0's 12 tensors | ... | bucket L: layer L-1's | bucket L+1: lnfw lnfb
 *
 * A rank holds only what its place in the dp x tp x pp grid gives it (Placement): its pipeline stage's
 * tensors (the first stage the embeddings, the last the final LayerNorm, both the tied wte; with
 * --virtual-stages the layers of its V chunks, which are not consecutive) and, with tensor parallelism,
 * its slice of the split ones (llmc/tensor_parallel.h). The file order (tensor by tensor, all layers of
 * one tensor together) is used only when reading and writing files.
 */
#pragma once

#include "common.h"           // round_up, malloc_check
#include "device.h"           // copy_to_host
#include "model_file.h"       // GPT2Config, FileTensor (WTE ...), file_tensor_numel
#include "placement.h"        // Placement: this rank's place in the grid
#include "tensor_parallel.h"  // TensorShape, local_shape, Run, tensor_runs
#include "zero.h"             // Bucket, ZeroPlan, owned_start

// One tensor's place in the flat buffer. Offsets are rounded up to 64 elements so every tensor starts
// 128-byte aligned (cuBLASLt's fast paths); the gaps are zero and stay zero. With tensor parallelism a
// rank holds its slice of the split tensors (see llmc/tensor_parallel.h), so numel is the local size.
typedef struct {
    int kind;   // which tensor: a FileTensor (llmc/model_file.h)
    int layer;  // 0..L-1 for per-layer tensors, 0 otherwise
    int bucket; // the communication bucket it belongs to (see below)
    size_t offset, numel;
    TensorShape whole;  // the whole tensor (all TP ranks), and how it is split
    size_t file_base;   // where the whole tensor starts in the file order
    int decay;  // weight decay applies (2-D weights: wte, wpe, qkvw, attprojw, fcw, fcprojw)
} TensorEntry;

// Buckets group the tensors that become final together in backward, and are what data parallelism
// communicates: 0 = embeddings (wte, wpe), 1 + l = layer l, L + 1 = final LayerNorm. Each bucket is
// padded to a multiple of 64 * D elements so that it splits into D aligned parts (llmc/zero.h).
typedef struct {
    int num_entries;  // 12 L + 4, in memory order
    TensorEntry* entries;
    int num_buckets;  // L + 2
    Bucket* buckets;
    size_t total;  // elements of the flat buffer, gaps included
} ParamLayout;

// Which tensors a pipeline stage holds: the first stage the embeddings, the last the final LayerNorm,
// both the tied wte, each its own layers.
static int stage_has(const Placement* p, int kind, int layer) {
    if (kind == WTE) return is_first_stage(p) || is_last_stage(p);
    if (kind == WPE) return is_first_stage(p);
    if (kind == LNFW || kind == LNFB) return is_last_stage(p);
    for (int v = 0; v < num_chunks(p); v++) {
        int l0, l1;
        chunk_layers(p, v, &l0, &l1);
        if (layer >= l0 && layer < l1) return 1;
    }
    return 0;
}

// the i-th tensor in memory order (wte, wpe, layer 0's 12 tensors, ..., layer L-1's, lnfw, lnfb), and
// its layer (0 for the tensors that are not per layer)
static int memory_order_tensor(int i, int L, int* layer) {
    int k = i - 2;  // index among the layers' tensors
    *layer = 0;
    if (i < 2) return i == 0 ? WTE : WPE;
    if (k >= NUM_LAYER_TENSORS * L) return k - NUM_LAYER_TENSORS * L == 0 ? LNFW : LNFB;
    *layer = k / NUM_LAYER_TENSORS;
    return LN1W + k % NUM_LAYER_TENSORS;
}

static ParamLayout build_layout(const GPT2Config* c, const Placement* p) {
    ParamLayout lay;
    lay.entries = (TensorEntry*)malloc_check((NUM_LAYER_TENSORS * c->L + 4) * sizeof(TensorEntry));
    // every tensor's place in the file order, and the entries of the ones this stage holds
    size_t* file_base = (size_t*)malloc_check(NUM_FILE_TENSORS * c->L * sizeof(size_t));  // [kind][layer]
    size_t file_offset = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++)
        for (int l = 0; l < (tensor_is_per_layer(kind) ? c->L : 1); l++) {
            file_base[kind * c->L + l] = file_offset;
            file_offset += file_tensor_numel(c, kind);
        }
    lay.num_entries = 0;
    for (int i = 0; i < NUM_LAYER_TENSORS * c->L + 4; i++) {  // memory order: wte, wpe, layers, lnfw, lnfb
        int layer, kind = memory_order_tensor(i, c->L, &layer);
        if (!stage_has(p, kind, layer)) continue;
        TensorEntry* s = &lay.entries[lay.num_entries++];
        s->kind = kind;
        s->layer = layer;
        s->bucket = tensor_is_per_layer(kind) ? 1 + layer : kind == WTE || kind == WPE ? 0 : c->L + 1;
        s->whole = file_tensor_shape(c, kind);
        TensorShape local = local_shape(s->whole, p->tp);
        s->numel = local.rows * local.cols;
        s->file_base = file_base[kind * c->L + layer];
        s->decay = tensor_is_matrix(kind);
    }
    lay.num_buckets = c->L + 2;  // buckets of layers on other stages stay empty
    lay.buckets = (Bucket*)calloc_check(lay.num_buckets * sizeof(Bucket));
    size_t offset = 0;
    for (int i = 0; i < lay.num_entries; i++) {
        TensorEntry* s = &lay.entries[i];
        if (i == 0 || s->bucket != lay.entries[i - 1].bucket) {  // a new bucket starts
            offset = round_up(offset, 64 * (size_t)p->dp);
            lay.buckets[s->bucket].offset = offset;
        }
        s->offset = offset;
        offset = round_up(offset + s->numel, 64);
        lay.buckets[s->bucket].size = round_up(offset, 64 * (size_t)p->dp) - lay.buckets[s->bucket].offset;
    }
    lay.total = round_up(offset, 64 * (size_t)p->dp);
    for (int b = 0; b < lay.num_buckets; b++)  // empty buckets sit at the end, owning nothing
        if (lay.buckets[b].size == 0) lay.buckets[b].offset = lay.total;
    free(file_base);
    return lay;
}

// The runs (llmc/tensor_parallel.h) of local elements [lo, hi) of entry i held by TP rank r of the
// placement's TP group, in the file order. Returns a malloc'ed array and its length in *n.
static Run* entry_runs(const ParamLayout* lay, const Placement* p, int i, int r, size_t lo, size_t hi, size_t* n) {
    const TensorEntry* s = &lay->entries[i];
    TensorShape local = local_shape(s->whole, p->tp);
    Run* runs = (Run*)malloc_check(((hi - lo) / local.cols + 2) * sizeof(Run));
    *n = tensor_runs(s->whole, p->tp, r, s->file_base, lo, hi, runs);
    return runs;
}

static void free_layout(ParamLayout* lay) {
    free(lay->entries);
    free(lay->buckets);
}

// memory layout of TP rank r (of the placement's TP group) <-> llm.c file order, for float buffers on the
// host (layout_to_file_order writes only rank r's slices of the split tensors; file_order_to_layout reads them)
static void copy_layout_file(const ParamLayout* lay, const Placement* p, int r, float* mem, float* file, int to_file) {
    for (int i = 0; i < lay->num_entries; i++) {
        size_t n;
        Run* runs = entry_runs(lay, p, i, r, 0, lay->entries[i].numel, &n);
        for (size_t k = 0; k < n; k++) {
            float* m = mem + lay->entries[i].offset + runs[k].local;
            if (to_file) memcpy(file + runs[k].file, m, runs[k].count * sizeof(float));
            else memcpy(m, file + runs[k].file, runs[k].count * sizeof(float));
        }
        free(runs);
    }
}
static void layout_to_file_order(const ParamLayout* lay, const Placement* p, int r, const float* mem, float* file) {
    copy_layout_file(lay, p, r, (float*)mem, file, 1);
}
static void file_order_to_layout(const ParamLayout* lay, const Placement* p, int r, const float* file, float* mem) {
    memset(mem, 0, lay->total * sizeof(float));
    copy_layout_file(lay, p, r, mem, (float*)file, 0);
}

// The part [lo, hi) of entry s that this rank owns (stage 0: all of it; stages 1, 2: its overlap with our
// part of the bucket), and the offset of lo in the shard buffers. Returns 0 if we own none of it.
static int owned_part(const ZeroPlan* z, const TensorEntry* s, size_t* lo, size_t* hi, size_t* shard_k) {
    size_t start = owned_start(z, s->bucket), end = start + owned_size(z, s->bucket);
    *lo = s->offset > start ? s->offset : start;
    *hi = s->offset + s->numel < end ? s->offset + s->numel : end;
    *shard_k = z->owned_offset[s->bucket] + (*lo - start);
    return *lo < *hi;
}

// host buffer in memory layout (layout.total) <-> this rank's shard of it (zero.shard_total)
static void shard_from_layout(const ZeroPlan* z, const float* mem, float* shard) {
    for (int b = 0; b < z->num_buckets; b++)
        memcpy(shard + z->owned_offset[b], mem + owned_start(z, b), owned_size(z, b) * sizeof(float));
}

// The optimizer state this rank writes into its state shard (llmc/run/state_file.h): each tensor's overlap with
// the owned parts, in runs of the file order, once across the ranks that hold a tensor alike (a replicated
// tensor by TP rank 0, the tied wte by the first stage). The AdamW moments m_dev and v_dev (on the device,
// z->shard_total each, in shard order) are copied to the host and gathered into *m_out and *v_out
// (malloc'ed) run after run; *ranges_out (malloc'ed) gets each run's (file offset, count). Returns the
// number of runs.
static size_t shard_file_runs(const ParamLayout* lay, const ZeroPlan* z, const Placement* p, const float* m_dev,
                              const float* v_dev, int64_t** ranges_out, float** m_out, float** v_out) {
    size_t cap = 1024, n_ranges = 0, count = 0, lo, hi, k, bytes = z->shard_total * sizeof(float);
    int64_t* ranges = (int64_t*)malloc_check(2 * cap * sizeof(int64_t));
    float *m = (float*)malloc_check(bytes), *v = (float*)malloc_check(bytes);
    float *m_file = (float*)malloc_check(bytes), *v_file = (float*)malloc_check(bytes);
    copy_to_host(m, m_dev, bytes);
    copy_to_host(v, v_dev, bytes);
    for (int i = 0; i < lay->num_entries; i++) {  // each tensor's overlap with what we own, in file runs
        const TensorEntry* t = &lay->entries[i];
        if (!owned_part(z, t, &lo, &hi, &k)) continue;
        if (t->whole.split == SPLIT_NONE && p->tp_rank != 0) continue;  // TP rank 0 has the same
        if (t->kind == WTE && !is_first_stage(p)) continue;             // the first stage has the same
        size_t n;
        Run* runs = entry_runs(lay, p, i, p->tp_rank, lo - t->offset, hi - t->offset, &n);
        for (size_t j = 0; j < n; j++) {
            if (n_ranges == cap) {
                cap *= 2;
                ranges = (int64_t*)realloc_check(ranges, 2 * cap * sizeof(int64_t));
            }
            size_t from = k + (runs[j].local - (lo - t->offset));
            ranges[2 * n_ranges] = (int64_t)runs[j].file;
            ranges[2 * n_ranges + 1] = (int64_t)runs[j].count;
            memcpy(m_file + count, m + from, runs[j].count * sizeof(float));
            memcpy(v_file + count, v + from, runs[j].count * sizeof(float));
            count += runs[j].count;
            n_ranges++;
        }
        free(runs);
    }
    free(m);
    free(v);
    *ranges_out = ranges;
    *m_out = m_file;
    *v_out = v_file;
    return n_ranges;
}
