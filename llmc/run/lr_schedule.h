/*
 * lr_schedule.h: the learning rate of each step (--lr, --warmup, --lr-schedule, --lr-min-frac): a linear
 * warmup from lr/warmup to lr over the first `warmup` steps, then constant, or a linear or cosine decay
 * to lr_min_frac x lr at the last step (--steps).
 */
#pragma once

#include <math.h>  // cosf, M_PI

#include "config.h"  // TrainConfig

static float learning_rate(const TrainConfig* tc, long long step) {
    float lr = tc->opt.lr, lr_min = tc->opt.lr * tc->lr_min_frac;
    if (step < tc->warmup) return lr * (float)(step + 1) / (float)tc->warmup;
    if (strcmp(tc->lr_schedule, "constant") == 0) return lr;
    long long decay_steps = tc->steps - tc->warmup;
    float progress = decay_steps > 0 ? (float)(step - tc->warmup) / (float)decay_steps : 1.0f;
    if (progress > 1.0f) progress = 1.0f;
    if (strcmp(tc->lr_schedule, "linear") == 0) return lr - (lr - lr_min) * progress;
    return lr_min + (lr - lr_min) * 0.5f * (1.0f + cosf((float)M_PI * progress));  // cosine
}
