/*
 * recompute.h: which activations a stage keeps under recomputation, and which buffer each layer uses
 * (train_gpt.cu's section 2 allocates and indexes its activations by it).
 *
 * Recomputation (--recompute R): what R does not keep per layer lives in a single layer-sized buffer that
 * every layer reuses, and backward recomputes it just before it needs it (recompute_layer):
 *   R = 0  everything is kept
 *   R = 1  the GELU output is recomputed from the MLP hidden                   saves (B,T,4C) per layer
 *   R = 2  also the two LayerNorm outputs, from their inputs                     saves 2 (B,T,C) more
 *   R = 3  only each layer's input and output (the residual stream) are kept; the whole layer is
 *          recomputed in backward ("full checkpointing")
 *   R = 3 with --recompute-segment K > 1: sublinear checkpointing (Chen et al. 2016). Only the input of
 *          every K-th layer is kept (a checkpoint), and one segment's worth of everything: backward
 *          reruns the forward of a segment of K layers from its checkpoint, keeping all its activations,
 *          then runs the segment's backward (recompute_segment). The last segment is still there from
 *          the forward. Activation memory for L layers: L/K checkpoints + K layers of activations, least
 *          near K = sqrt(L x a checkpoint's size / a layer's activations); --plan prints the best K.
 *          Activations per rank from --plan (GiB; BF16, T=1024; nothing else a rank holds depends on K):
 *                              R=0    K=1    K=2    K=3    K=4    K=6    K=12
 *            124M B=8 classic 5.363  1.366  1.670  2.022  2.385  3.124  5.363
 *            124M B=8 flash   3.117  1.178  1.296  1.461  1.637  2.001  3.117
 *            1.5B B=1 classic 4.809  0.361  0.386  0.459  0.545  0.728  1.302
 *            1.5B B=1 flash   2.469  0.313  0.288  0.313  0.350  0.435  0.717
 *          A layer's activations are many checkpoints' worth at GPT-2's sizes (classic attention's T x T
 *          probabilities most of all), so K = 1 keeps the least, but for 1.5B with flash attention: K = 2.
 * Recomputation repeats the same operations on the same inputs, so the losses do not change in any bit.
 * recompute_keeps is the one mapping from R (and K) to buffers: the allocation (gpt2_allocate_activations)
 * sizes them by it and layer_acts indexes them by it; recompute_layer and recompute_segment rerun what
 * the level does not keep. The pipeline's --pp-rematerialize is the coarser
 * form: a stage keeps only each micro-batch's input and reruns its whole forward before the backward
 * (micro_batch_activations, schedule_backward).
 */
#pragma once

#include "common.h"  // size_t

typedef struct {
    int all;          // layers' worth of what a layer's backward reads: L (kept per layer, R < 3), 1 (R = 3) or K
    int ln;           // of the LayerNorm outputs: L (R < 2), 1 or K
    int gelu;         // of the GELU output: L (R < 1), 1 or K
    int outputs;      // of the layers' outputs (the residual stream): L, or K with segments
    int checkpoints;  // segment inputs kept besides the stage's input: ceil(L/K) - 1 with segments, else 0
    int segment;      // K: layers per segment (0: no segments)
} RecomputeKeeps;

// for a stage of L layers at --recompute R and --recompute-segment K
static RecomputeKeeps recompute_keeps(int R, int K, int L) {
    if (R == 3 && K > 1) {
        K = K < L ? K : L;
        return (RecomputeKeeps){.all = K, .ln = K, .gelu = K, .outputs = K, .checkpoints = (L + K - 1) / K - 1,
                                .segment = K};
    }
    return (RecomputeKeeps){.all = R < 3 ? L : 1, .ln = R < 2 ? L : 1, .gelu = R < 1 ? L : 1, .outputs = L,
                            .checkpoints = 0, .segment = 0};
}

// Which of `count` layer-sized buffers layer li (of L) uses: its own, the one shared, or its place in the segment
static size_t keep_index(int count, int L, const RecomputeKeeps* keep, int li) {
    return count == L ? li : count == 1 ? 0 : li % keep->segment;
}
