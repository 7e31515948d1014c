/*
 * loss_scaler.h: loss scaling for FP16 training.
 *
 * fp16 has 5 exponent bits: gradients smaller than about 6e-8 flush to zero. Multiplying the loss by a
 * scale S before backward multiplies every gradient by S and lifts them into fp16's range; the
 * optimizer divides by S again (folded into AdamW's gradient factor, with clipping). Too large an S
 * overflows: some gradient becomes inf or NaN. Then the step is skipped on every rank (parameters and
 * optimizer state unchanged) and S shrinks.
 *
 *   dynamic (the default in FP16 builds): start at 2^16; on an overflow S *= backoff (0.5), after
 *           `interval` (2000) clean steps in a row S *= growth (2). With hysteresis H, S backs off only at
 *           the H-th overflow since the last change (H = 1: at every overflow).
 *   static: a fixed S; overflowing steps are still skipped.
 *   off:    S = 1, no check (BF16 and FP32: their 8-bit exponent has the range of fp32).
 *
 * Whether any gradient overflowed is decided once per step for the whole world (a max all-reduce of a
 * flag, loss_scaler_check), so every rank skips the same steps. A rank sees an overflow in its squared
 * gradient norm: one inf or NaN among the gradients makes the sum of squares inf or NaN. The scale and
 * its counters go into checkpoints.
 */
#pragma once

#include "comm.h"
#include "common.h"

typedef enum { SCALE_OFF, SCALE_STATIC, SCALE_DYNAMIC } ScaleMode;

typedef struct {
    ScaleMode mode;
    float scale;
    float growth, backoff;
    int interval;         // clean steps before the scale grows
    int hysteresis;       // overflows before the scale backs off
    int good_steps;       // clean steps since the last change
    int hysteresis_left;  // overflows still tolerated
} LossScaler;

static float loss_scale(const LossScaler* s) { return s->mode == SCALE_OFF ? 1.0f : s->scale; }

// After a step's gradients are known: found_inf says whether any rank saw inf/NaN. Returns 1 if the
// step must be skipped, and adjusts the scale.
static int loss_scaler_update(LossScaler* s, int found_inf) {
    if (s->mode == SCALE_OFF) return 0;
    if (found_inf) {
        if (s->mode == SCALE_DYNAMIC && --s->hysteresis_left <= 0) {
            s->scale *= s->backoff;
            s->hysteresis_left = s->hysteresis;
        }
        s->good_steps = 0;
        return 1;
    }
    if (s->mode == SCALE_DYNAMIC && ++s->good_steps >= s->interval) {
        s->scale *= s->growth;
        s->good_steps = 0;
        s->hysteresis_left = s->hysteresis;
    }
    return 0;
}

// The overflow check of one optimizer step, on every rank (collective over the world): sumsq is this
// rank's squared gradient norm (any sum that includes its own gradients). Returns 1 if any rank's
// gradients overflowed, so the step must be skipped everywhere, and adjusts the scale. No scaler (NULL)
// or mode off: no check, 0.
static int loss_scaler_check(LossScaler* s, Comm* comm, double sumsq) {
    if (s == NULL || s->mode == SCALE_OFF) return 0;
    double overflow = isfinite(sumsq) ? 0.0 : 1.0;
    comm_all_reduce_host(comm, &comm->world, &overflow, 1, REDUCE_MAX);
    return loss_scaler_update(s, overflow > 0.0);
}
