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
 *
 * The scale stays within [LOSS_SCALE_MIN, LOSS_SCALE_MAX]. Unbounded, a scale that never overflows (fp32
 * gradients, or a short --loss-scale-interval) doubles until it is inf; then every gradient is inf, every
 * step is skipped, inf * backoff is still inf, and a checkpoint holding it cannot be resumed. Repeated
 * overflows likewise halve it down to 0, where nothing is learned and nothing grows it back.
 */
#pragma once

#include "comm.h"    // comm_all_reduce_host: every rank sees an overflow
#include "common.h"  // fatal

typedef enum { SCALE_OFF, SCALE_STATIC, SCALE_DYNAMIC } ScaleMode;

// The largest scale: 2^24, apex.amp's max_loss_scale. A larger one would only rescue gradients below
// fp16's smallest subnormal (2^-24) divided by 2^24, i.e. below 2^-48 = 3.6e-15; AdamW moves a weight by
// about lr * g / eps for g << eps (1e-8), under 4e-7 * lr for those, which is nothing. Any growth factor
// the command line accepts (up to 1e6) keeps scale x growth far inside fp32's range.
#define LOSS_SCALE_MAX 16777216.0f
// The smallest: 1, Megatron-LM's and DeepSpeed's default minimum. Below 1 the scale would shrink the
// gradients, which never helps fp16 (its underflow is the problem), and it keeps the scale positive.
#define LOSS_SCALE_MIN 1.0f

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
            s->scale = fmaxf(s->scale * s->backoff, LOSS_SCALE_MIN);
            s->hysteresis_left = s->hysteresis;
        }
        s->good_steps = 0;
        return 1;
    }
    if (s->mode == SCALE_DYNAMIC && ++s->good_steps >= s->interval) {
        s->scale = fminf(s->scale * s->growth, LOSS_SCALE_MAX);
        s->good_steps = 0;
        s->hysteresis_left = s->hysteresis;
    }
    return 0;
}

// Start-up check of the settings (NULL if they are fine, else why not, for a one-line error). The scale
// must lie in [LOSS_SCALE_MIN, LOSS_SCALE_MAX], which the scaler never leaves; a dynamic scale must back
// off below 1 on an overflow, or an overflowing scale would stay and every later step would be skipped.
static const char* loss_scaler_settings_error(const LossScaler* s, char* msg, size_t len) {
    if (s->mode == SCALE_OFF) return NULL;
    if (!(s->scale >= LOSS_SCALE_MIN && s->scale <= LOSS_SCALE_MAX)) {
        snprintf(msg, len, "%s must be between %g and %.0f, got %g",
                 s->mode == SCALE_STATIC ? "--loss-scale" : "--loss-scale-init",
                 LOSS_SCALE_MIN, LOSS_SCALE_MAX, s->scale);
        return msg;
    }
    if (s->mode == SCALE_DYNAMIC && !(s->backoff < 1.0f)) {
        snprintf(msg, len, "--loss-scale-backoff must be below 1 (got %g): an overflowing dynamic scale would never "
                 "come down, and every later step would be skipped", s->backoff);
        return msg;
    }
    return NULL;
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
