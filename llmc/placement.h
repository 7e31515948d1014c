/*
 * placement.h: where a rank sits in the dp x tp x pp grid (Placement), the one structure that holds a
 * rank's position outside the communication engines (llmc/comm/): its data-parallel index and ZeRO stage,
 * its tensor-parallel slice, its pipeline stage and that stage's layers (with --virtual-stages, its
 * virtual stages' layers). The model, ZeRO's plan, the parameter layout and the planner ask it.
 */
#pragma once

#include <errno.h>

#include "common.h"      // fatal, malloc_check
#include "model_file.h"  // GPT2Config

enum { MAX_VIRTUAL_STAGES = 8 };  // --virtual-stages: chunks per stage

// ----------------------------------------------------------------------------------------------------
// which layers a pipeline stage owns

// First layer of each of the P stages (first[P] = L); with virtual stages P is P*V, the chunks.
// split: "a,b,c" layer counts, or NULL for as even as possible.
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
        char* end = (char*)p;
        errno = 0;
        long long n = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : 0;
        if (end == p || n < 1)
            fatal("--pp-split '%s': expected %d positive layer counts separated by commas", split, P);
        if (errno == ERANGE || n > L - first[s])
            fatal("--pp-split '%s': the layer counts add up to more than the model's %d layers (stage %d has %d left)",
                  split, L, s, L - first[s]);
        first[s + 1] = first[s] + (int)n;
        p = end;
        if (s < P - 1) {
            if (*p != ',')
                fatal("--pp-split '%s': expected %d layer counts (one per stage, or per chunk with --virtual-stages)",
                      split, P);
            p++;
        }
    }
    if (*p != '\0')
        fatal("--pp-split '%s': expected %d layer counts (one per stage, or per chunk with --virtual-stages)",
              split, P);
    if (first[P] != L) fatal("--pp-split '%s' covers %d layers, the model has %d", split, first[P], L);
}

// Stage s's chunks of layers: chunk v is virtual stage v*P + s of the P*V (V = 1: the stage itself),
// layers [l0[v], l1[v]).
static void pipeline_chunks(int L, int P, int V, const char* split, int s, int* l0, int* l1) {
    if (P * V > L && V > 1) fatal("--pp %d x --virtual-stages %d: more chunks than the %d layers", P, V, L);
    int* first = (int*)malloc_check((P * V + 1) * sizeof(int));
    pipeline_split(L, P * V, split, first);
    for (int v = 0; v < V; v++) {
        l0[v] = first[v * P + s];
        l1[v] = first[v * P + s + 1];
    }
    free(first);
}

// ----------------------------------------------------------------------------------------------------
// a rank's place

// Where a rank sits in the dp x tp x pp grid, what it owns, and how its optimizer state is sharded.
typedef struct {
    int zero;            // ZeRO stage
    int dp, dp_rank;     // data parallelism
    int tp, tp_rank;     // tensor parallelism: slice tp_rank of the split tensors
    int pp, pp_rank;     // pipeline parallelism: this stage owns layers [l0, l1)
    int l0, l1;
    int V;               // --virtual-stages: V > 1 chunks of layers [vl0[v], vl1[v]) instead (0 or 1: [l0, l1))
    int vl0[MAX_VIRTUAL_STAGES], vl1[MAX_VIRTUAL_STAGES];
} Placement;

static Placement placement_single(const GPT2Config* c) { return (Placement){.dp = 1, .tp = 1, .pp = 1, .l1 = c->L}; }

// Stage pp_rank's layers as the pipeline cuts L of them (--pp-split, --virtual-stages V): [l0, l1), or V chunks
static void place_layers(Placement* p, int L, const char* split, int V) {
    p->V = V;
    pipeline_chunks(L, p->pp, V, split, p->pp_rank, p->vl0, p->vl1);
    p->l0 = p->vl0[0];
    p->l1 = p->vl1[0];
}

// The chunks of layers a stage holds (1 but with --virtual-stages): chunk v is [*l0, *l1)
static int num_chunks(const Placement* p) { return p->V > 1 ? p->V : 1; }
static void chunk_layers(const Placement* p, int v, int* l0, int* l1) {
    *l0 = p->V > 1 ? p->vl0[v] : p->l0;
    *l1 = p->V > 1 ? p->vl1[v] : p->l1;
}
static int stage_layer_count(const Placement* p) {  // over all its chunks
    int n = 0, l0, l1;
    for (int v = 0; v < num_chunks(p); v++) {
        chunk_layers(p, v, &l0, &l1);
        n += l1 - l0;
    }
    return n;
}
static int is_first_stage(const Placement* p) { return p->pp_rank == 0; }
static int is_last_stage(const Placement* p) { return p->pp_rank == p->pp - 1; }
// the stages before and after this one on the ring of stages (the interleaved schedule goes round it)
static int ring_prev(const Placement* p) { return (p->pp_rank + p->pp - 1) % p->pp; }
static int ring_next(const Placement* p) { return (p->pp_rank + 1) % p->pp; }
