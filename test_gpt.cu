/*
 * test_gpt.cu: checks the trainer against the PyTorch reference, on whichever target it is built for.
 *
 * The reference (scripts/gpt2_reference.py, float64 inside) writes for each configuration a model file
 * and a debug state: inputs, targets, logits, loss, every parameter gradient, the gradient norm, the
 * losses of 10 AdamW steps on that batch and the parameters after them. This program loads the model,
 * runs the same computation and compares:
 *   logits, every gradient tensor and the final parameters by relative norm of the difference
 *   ||ours - ref|| / ||ref||; the loss, grad norm and each of the 10 losses by relative difference.
 * Then it checks resume determinism (20 training steps in one run equal 10 steps, a checkpoint, and 10
 * resumed steps, in every bit of every loss), gradient accumulation against one larger batch, and
 * loading a bf16 (version 5) model file.
 *
 * usage: test_gpt [reference folder, default build/ref] [--attention flash]    exit code 0 = all passed
 * With --attention flash (GPU BF16/FP16 builds) the checks that can use the tensor-core flash attention
 * (head size 64: the "hs64" reference, recomputation on it, the memory plan) run with it; the others
 * (their references have head size 16) are skipped, and say so.
 */
#define TRAIN_GPT_NO_MAIN
#include "train_gpt.cu"

// Tolerances, relative. Why these values:
// CPU fp32: float32 against a float64 reference; logits and the loss carry only the rounding of a few
//   thousand-term sums (~1e-6), gradients go through more stages and reach ~1e-5, so 1e-5 and 1e-4 leave
//   a margin of several times the observed error while still catching any real bug (an error in a layer
//   shows up as 1e-2 or more).
// GPU FP32 (no TF32): other summation orders and cuBLAS algorithms, so 10x the CPU bounds.
// GPU BF16: 8-bit mantissas for parameters and activations (relative rounding 4e-3 per operation,
//   compounding through the layers): losses 2e-2, gradients 5e-2.
typedef struct {
    double logits, loss, grads, params;
} Tolerances;

#if defined(LLMC_CPU)
static const Tolerances TOL = {.logits = 1e-5, .loss = 1e-5, .grads = 1e-4, .params = 1e-5};
#elif defined(ENABLE_BF16) || defined(ENABLE_FP16)
// (FP16 has 3 more mantissa bits than BF16 but less range; it runs with a loss scale, below)
static const Tolerances TOL = {.logits = 5e-2, .loss = 2e-2, .grads = 5e-2, .params = 5e-2};
#else
static const Tolerances TOL = {.logits = 1e-4, .loss = 1e-4, .grads = 1e-3, .params = 1e-4};
#endif

static int failures = 0;

static void check(const char* what, double error, double tolerance) {
    int ok = error <= tolerance;  // NaN fails too
    printf("  %-34s rel. error %.3e  (tolerance %.0e)  %s\n", what, error, tolerance, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

static double rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

// ||a - b|| / ||b||
static double rel_norm_diff(const float* a, const float* b, size_t n) {
    double diff = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        ref += (double)b[i] * b[i];
    }
    return ref > 0 ? sqrt(diff / ref) : sqrt(diff);
}

typedef struct {
    int B, T, V, Vp, L, NH, C, maxT, nsteps;
    size_t num_params;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int *inputs, *targets;  // (B, T)
    float* logits;          // (B, T, V)
    float loss, grad_norm;
    float* grads;           // (num_params) file order
    float* losses;          // (nsteps)
    float* params_after;    // (num_params) file order
} Reference;

static void read_reference(Reference* r, const char* path) {
    FILE* f = fopen_check(path, "rb");
    int h[256];
    fread_check(h, sizeof(int), 256, f, path);
    if (h[0] != 20261122 || h[1] != 1)
        fatal("'%s' is not a reference debug state (magic %d version %d)", path, h[0], h[1]);
    r->B = h[2];
    r->T = h[3];
    r->V = h[4];
    r->Vp = h[5];
    r->L = h[6];
    r->NH = h[7];
    r->C = h[8];
    r->maxT = h[9];
    r->nsteps = h[10];
    r->num_params = (size_t)h[11];
    float hp[8];
    fread_check(hp, sizeof(float), 8, f, path);
    r->lr = hp[0];
    r->beta1 = hp[1];
    r->beta2 = hp[2];
    r->eps = hp[3];
    r->weight_decay = hp[4];
    r->grad_clip = hp[5];
    size_t BT = (size_t)r->B * r->T;
    r->inputs = (int*)malloc_check(BT * sizeof(int));
    r->targets = (int*)malloc_check(BT * sizeof(int));
    r->logits = (float*)malloc_check(BT * r->V * sizeof(float));
    r->grads = (float*)malloc_check(r->num_params * sizeof(float));
    r->losses = (float*)malloc_check(r->nsteps * sizeof(float));
    r->params_after = (float*)malloc_check(r->num_params * sizeof(float));
    fread_check(r->inputs, sizeof(int), BT, f, path);
    fread_check(r->targets, sizeof(int), BT, f, path);
    fread_check(r->logits, sizeof(float), BT * r->V, f, path);
    fread_check(&r->loss, sizeof(float), 1, f, path);
    fread_check(r->grads, sizeof(float), r->num_params, f, path);
    fread_check(&r->grad_norm, sizeof(float), 1, f, path);
    fread_check(r->losses, sizeof(float), r->nsteps, f, path);
    fread_check(r->params_after, sizeof(float), r->num_params, f, path);
    fclose(f);
}

// The one-rank world of every single-process check, made once (the models built here keep a pointer to it)
static Comm* single_rank(void) {
    static Comm single = comm_single();
    return &single;
}

// A forward as the training step runs it (the ids staged, then forward): the mean loss over the batch,
// brought to the host (0 without targets: the logits are left in a->logits)
static float forward_loss(GPT2* model, Activations* a, const int* inputs, const int* targets, int B, int T,
                          float dloss) {
    stage_token_ids(model, a, inputs, targets, B, T);
    gpt2_forward(model, a, B, T, dloss, targets != NULL);
    return targets ? mean_loss_on_host(model->host_losses, a->losses, (size_t)B * T) : 0.0f;
}

static void load_model(GPT2* model, const char* path, const KernelChoice* kernels) {
    GPT2Config c;
    float* p = NULL;
    model_file_read(path, &c, &p);
    Placement place = placement_single(&c);
    gpt2_build(model, &c, single_rank(), &place, kernels);
    gpt2_set_parameters(model, p);
    free(p);
}

// compares a file-order buffer tensor by tensor (each tensor over all its layers), except skip_kind
static void check_tensors(const char* what, const GPT2Config* c, const float* ours, const float* ref, double tol,
                          int skip_kind) {
    size_t pos = 0;
    for (int kind = 0; kind < NUM_FILE_TENSORS; kind++) {
        size_t n = file_tensor_numel(c, kind) * (tensor_is_per_layer(kind) ? c->L : 1);
        if (kind == skip_kind) {
            pos += n;
            continue;
        }
        char name[64];
        snprintf(name, sizeof(name), "%s %s", what, FILE_TENSOR_NAMES[kind]);
        check(name, rel_norm_diff(ours + pos, ref + pos, n), tol);
        pos += n;
    }
}

// The key bias is the one parameter whose exact gradient is zero: adding a constant to every score of
// a softmax row changes nothing, and q . bk is such a constant. Its computed gradient is pure rounding
// noise (~1e-17 in the float64 reference, ~1e-10 in float32), which Adam then normalizes into updates
// of up to lr per step. So after training, the key bias is compared in absolute terms against that
// bound (nsteps * lr) and the query and value biases by relative norm as usual.
static void check_qkvb_after_adam(const GPT2Config* c, const float* ours, const float* ref, double tol, int nsteps,
                                  float lr) {
    size_t pos = 0;
    for (int kind = 0; kind < QKVB; kind++) pos += file_tensor_numel(c, kind) * (tensor_is_per_layer(kind) ? c->L : 1);
    size_t C = c->C, qv = 0;
    float *ours_qv = (float*)malloc_check(2 * C * c->L * sizeof(float)),
          *ref_qv = (float*)malloc_check(2 * C * c->L * sizeof(float));
    double kmax = 0.0;
    for (int l = 0; l < c->L; l++) {
        const float *o = ours + pos + l * 3 * C, *r = ref + pos + l * 3 * C;
        memcpy(ours_qv + qv, o, C * sizeof(float));
        memcpy(ref_qv + qv, r, C * sizeof(float));
        memcpy(ours_qv + qv + C, o + 2 * C, C * sizeof(float));
        memcpy(ref_qv + qv + C, r + 2 * C, C * sizeof(float));
        qv += 2 * C;
        for (size_t i = C; i < 2 * C; i++) kmax = fmax(kmax, fabs((double)o[i] - r[i]));
    }
    check("params after qkvb (q and v parts)", rel_norm_diff(ours_qv, ref_qv, qv), tol);
    int ok = kmax <= nsteps * lr;
    printf("  %-34s max abs. diff %.3e  (bound nsteps*lr = %.0e)  %s\n", "params after qkvb (k part)", kmax,
           nsteps * lr, ok ? "ok" : "FAIL");
    if (!ok) failures++;
    free(ours_qv);
    free(ref_qv);
}

// a buffer laid out like the parameters (floatX, whole) -> host float array in file order
static void gpt2_export(const GPT2* model, const floatX* buffer, float* file_order) {
    float* mem = (float*)malloc_check(model->layout.total * sizeof(float));
    download_floats(mem, buffer, model->layout.total);
    layout_to_file_order(&model->layout, &model->place, model->place.tp_rank, mem, file_order);
    free(mem);
}

static void test_against_reference(const KernelChoice* kernels, const char* dir, const char* name) {
    char model_path[4096], debug_path[4096];
    snprintf(model_path, sizeof(model_path), "%s/ref_%s_model.bin", dir, name);
    snprintf(debug_path, sizeof(debug_path), "%s/ref_%s_debug.bin", dir, name);
    Reference r;
    read_reference(&r, debug_path);
    GPT2 model;
    load_model(&model, model_path, kernels);
    const GPT2Config* c = &model.config;
    printf("reference '%s': L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, B=%d T=%d\n", name, c->L, c->C, c->NH, c->V, c->Vp,
           c->maxT, r.B, r.T);
    if (c->V != r.V || c->Vp != r.Vp || c->L != r.L || c->C != r.C || model.num_parameters != r.num_params)
        fatal("'%s' and '%s' describe different models", model_path, debug_path);
    size_t BT = (size_t)r.B * r.T;
    gpt2_allocate_activations(&model, r.B, r.T, 1, 0);
    Activations* a = &model.chunk->slots[0];

    // logits (inference forward), only the V real columns
    forward_loss(&model, a, r.inputs, NULL, r.B, r.T, 0.0f);
    float* logits = (float*)malloc_check(BT * c->Vp * sizeof(float));
    download_floats(logits, a->logits, BT * c->Vp);
    float* real = (float*)malloc_check(BT * c->V * sizeof(float));
    for (size_t i = 0; i < BT; i++) memcpy(real + i * c->V, logits + i * c->Vp, c->V * sizeof(float));
    check("logits", rel_norm_diff(real, r.logits, BT * c->V), TOL.logits);

    // loss and gradients (FP16: with a static loss scale, divided out here, as the optimizer does)
    float S = FP16_BUILD ? 1024.0f : 1.0f;
    LossScaler scaler = {.mode = FP16_BUILD ? SCALE_STATIC : SCALE_OFF, .scale = S, .growth = 2.0f, .backoff = 0.5f,
                         .interval = 2000, .hysteresis = 1, .good_steps = 0, .hysteresis_left = 1};
    gpt2_zero_grad(&model);
    float loss = forward_loss(&model, a, r.inputs, r.targets, r.B, r.T, S / BT);
    check("loss", rel_diff(loss, r.loss), TOL.loss);
    gpt2_backward(&model, a, r.B, r.T, 1);
    float* grads = (float*)malloc_check(r.num_params * sizeof(float));
    gpt2_export(&model, model.grads_memory, grads);
    for (size_t i = 0; i < r.num_params; i++) grads[i] /= S;
    check_tensors("grad", c, grads, r.grads, TOL.grads, -1);
    float norm = global_norm(model.grads_memory, model.layout.total, &model.kernel_scratch.norm) / S;
    check("grad norm", rel_diff(norm, r.grad_norm), TOL.grads);
    gpt2_free(&model);

    // 10 AdamW steps on the same batch, from the same start
    load_model(&model, model_path, kernels);
    gpt2_allocate_activations(&model, r.B, r.T, 1, 0);
    a = &model.chunk->slots[0];
    OptimizerConfig opt = {.lr = r.lr, .beta1 = r.beta1, .beta2 = r.beta2, .eps = r.eps, .weight_decay = r.weight_decay,
                           .grad_clip = r.grad_clip};
    for (int step = 0; step < r.nsteps; step++) {
        gpt2_zero_grad(&model);
        float l = forward_loss(&model, a, r.inputs, r.targets, r.B, r.T, S / BT);
        char what[64];
        snprintf(what, sizeof(what), "loss at step %d (ref %.6f)", step, r.losses[step]);
        check(what, rel_diff(l, r.losses[step]), TOL.loss);
        gpt2_backward(&model, a, r.B, r.T, 1);
        int skipped = 0;
        double step_loss;
        gpt2_update(&model, &opt, r.lr, step + 1, &scaler, &skipped, &step_loss);
        if (skipped) fatal("a step overflowed at loss scale %g in the reference test", S);
    }
    float* params = (float*)malloc_check(r.num_params * sizeof(float));
    gpt2_export_master(&model, params);
    check_tensors("params after", c, params, r.params_after, TOL.params, QKVB);  // qkvb: see below
    check_qkvb_after_adam(c, params, r.params_after, TOL.params, r.nsteps, r.lr);
    gpt2_free(&model);
    free(logits);
    free(real);
    free(grads);
    free(params);
    free(r.inputs);
    free(r.targets);
    free(r.logits);
    free(r.grads);
    free(r.losses);
    free(r.params_after);
}

// writes a token file of n random ids below V
static void write_random_tokens(const char* path, long long n, int V, uint64_t seed) {
    FILE* f = fopen_check(path, "wb");
    int header[256] = {TOKENS_MAGIC, 1, (int)n};
    fwrite_check(header, sizeof(int), 256, f, path);
    Rng rng = {seed};
    for (long long i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(rng_next_u64(&rng) % V);
        fwrite_check(&t, sizeof(t), 1, f, path);
    }
    fclose(f);
}

// 20 steps in one go == 10 steps, checkpoint, resume, 10 more: every loss bit, and the final model file.
static void test_resume(const KernelChoice* kernels, const char* dir) {
    printf("resume determinism (cosine schedule with warmup, grad accumulation 2, shuffled data)\n");
    char tmp[] = "/tmp/test_gpt_XXXXXX";
    if (mkdtemp(tmp) == NULL) fatal("cannot create a temporary folder: %s", strerror(errno));
    char data[4200], ckpt[4200], model_a[4200], model_b[4200], model_path[4096];
    snprintf(data, sizeof(data), "%s/tokens.bin", tmp);
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", tmp);
    snprintf(model_a, sizeof(model_a), "%s/a.bin", tmp);
    snprintf(model_b, sizeof(model_b), "%s/b.bin", tmp);
    snprintf(model_path, sizeof(model_path), "%s/ref_odd_model.bin", dir);
    write_random_tokens(data, 20000, 1000, 7);

    TrainConfig tc;
    default_train_config(&tc);
    tc.kernels = *kernels;
    tc.train_data = data;
    tc.val_data = "";
    tc.tokenizer = "";
    tc.shuffle = 1;
    tc.model_file = model_path;
    tc.B = 2;
    tc.T = 24;
    tc.grad_accum = 2;
    tc.steps = 20;
    tc.warmup = 3;
    tc.quiet = 1;
    tc.checkpoint_dir = ckpt;
    float straight[20], resumed[20];
    memset(resumed, 0xff, sizeof(resumed));

    tc.save_model = model_a;
    train(&tc, single_rank(), straight, 20);  // one run of 20 steps

    tc.save_model = NULL;
    tc.stop_after = 10;
    tc.save_every = 5;
    train(&tc, single_rank(), resumed, 20);  // 10 steps, checkpoints at 5 and 10, stop
    tc.stop_after = 0;
    tc.model_file = NULL;
    tc.resume = ckpt;
    tc.save_model = model_b;
    train(&tc, single_rank(), resumed, 20);  // resumes at 10 (the newest checkpoint), runs 10 more

    int same = memcmp(straight, resumed, sizeof(straight)) == 0;
    for (int i = 0; i < 20; i++)
        printf("    step %2d: %.9g %.9g%s\n", i + 1, straight[i], resumed[i],
               straight[i] == resumed[i] ? "" : "  <- differs");
    printf("  %-34s %s\n", "losses bit-identical", same ? "ok" : "FAIL");
    if (!same) failures++;
    GPT2Config ca, cb;
    float *pa = NULL, *pb = NULL;
    model_file_read(model_a, &ca, &pa);
    model_file_read(model_b, &cb, &pb);
    int same_params = memcmp(pa, pb, gpt2_num_parameters(&ca) * sizeof(float)) == 0;
    printf("  %-34s %s\n", "final parameters bit-identical", same_params ? "ok" : "FAIL");
    if (!same_params) failures++;
    free(pa);
    free(pb);
    char cmd[4300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", tmp);
}

// Gradient accumulation: by the data-order contract, B=2 with 2 micro-steps reads exactly the tokens
// of B=4 with 1, and the loss weights 1/(B*T*accum) make the gradients equal; so the two runs must
// give the same losses to rounding (sums over 2 micro-batches instead of one batch: ~1e-7).
static void test_grad_accumulation(const KernelChoice* kernels, const char* dir) {
    printf("gradient accumulation: B=4 x 1 micro-step == B=2 x 2 micro-steps\n");
    char tmp[] = "/tmp/test_gpt_XXXXXX";
    if (mkdtemp(tmp) == NULL) fatal("cannot create a temporary folder: %s", strerror(errno));
    char data[4200], model_path[4096];
    snprintf(data, sizeof(data), "%s/tokens.bin", tmp);
    snprintf(model_path, sizeof(model_path), "%s/ref_small_model.bin", dir);
    write_random_tokens(data, 5000, 512, 11);
    TrainConfig tc;
    default_train_config(&tc);
    tc.kernels = *kernels;
    tc.train_data = data;
    tc.val_data = "";
    tc.tokenizer = "";
    tc.model_file = model_path;
    tc.quiet = 1;
    tc.T = 32;
    tc.steps = 8;
    tc.warmup = 2;
    float whole[8], accumulated[8];
    tc.B = 4;
    tc.grad_accum = 1;
    train(&tc, single_rank(), whole, 8);
    tc.B = 2;
    tc.grad_accum = 2;
    train(&tc, single_rank(), accumulated, 8);
    for (int i = 0; i < 8; i++) {
        char what[64];
        snprintf(what, sizeof(what), "loss at step %d", i + 1);
        check(what, rel_diff(accumulated[i], whole[i]), TOL.loss);
    }
    unlink(data);
    rmdir(tmp);
}

// A version 5 (bf16) model file loads as the bf16 values of its parameters: every element read back
// equals the float32 -> bf16 -> float32 round trip of the reference parameter, exactly.
static void test_bf16_model_file(const KernelChoice* kernels, const char* dir) {
    printf("bf16 model file (version 5)\n");
    char path[4096], tmp_path[] = "/tmp/test_gpt_bf16_XXXXXX";
    snprintf(path, sizeof(path), "%s/ref_small_model.bin", dir);
    GPT2Config c;
    float* p = NULL;
    model_file_read(path, &c, &p);
    size_t n = gpt2_num_parameters(&c);
    int fd = mkstemp(tmp_path);
    if (fd < 0) fatal("cannot create a temporary file: %s", strerror(errno));
    close(fd);
    FILE* f = fopen_check(tmp_path, "wb");
    int header[256] = {MODEL_MAGIC, 5, c.maxT, c.V, c.L, c.NH, c.C, c.Vp};
    fwrite_check(header, sizeof(int), 256, f, tmp_path);
    uint16_t* bf = (uint16_t*)malloc_check(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {  // round to nearest even, as PyTorch's .bfloat16() does
        uint32_t u;
        memcpy(&u, &p[i], 4);
        bf[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    fwrite_check(bf, sizeof(uint16_t), n, f, tmp_path);
    fclose(f);
    GPT2 model;
    load_model(&model, tmp_path, kernels);
    float* back = (float*)malloc_check(n * sizeof(float));
    gpt2_export_master(&model, back);
    size_t mismatches = 0;
    for (size_t i = 0; i < n; i++) mismatches += back[i] != bf16_bits_to_float(bf[i]);
    printf("  %-34s %zu of %zu differ  %s\n", "parameters == bf16(reference)", mismatches, n,
           mismatches ? "FAIL" : "ok");
    if (mismatches) failures++;
    gpt2_free(&model);
    free(p);
    free(bf);
    free(back);
    unlink(tmp_path);
}

// Per-rank memory of D data-parallel ranks against the ZeRO formulas, with Psi = the parameter buffer's
// elements (alignment and bucket padding included), in the bytes of this build's precision:
//   parameters  Psi*sizeof(floatX) at stages 0-2;  Psi/D*sizeof(floatX) at stage 3, plus a gather buffer
//               the size of the gradient workspace (below), counted as workspace
//   gradients   Psi*sizeof(floatX) at stages 0 and 1;  Psi/D*sizeof(floatX) at stages 2 and 3, plus a
//               workspace of the embedding and final-LayerNorm buckets and two layer buckets
//   optimizer   k*Psi*4 at stage 0, k*Psi/D*4 at stages 1-3 (k = 2: m, v; k = 3 with the fp32
//               master weights of a BF16 build)
// The allocation is real (the model is built for rank d of D); no communication is needed to build it.
static void test_zero_memory(const KernelChoice* kernels, const char* dir) {
    printf("ZeRO memory per rank (odd config: its parameter count is divisible by nothing in particular)\n");
    char path[4096];
    snprintf(path, sizeof(path), "%s/ref_odd_model.bin", dir);
    GPT2Config c;
    model_file_read(path, &c, NULL);
    size_t fx = sizeof(floatX), k = fx == sizeof(float) ? 2 : 3;  // fp32: the parameters are the master weights
    for (int D = 1; D <= 4; D++) {
        for (int stage = 0; stage <= 3; stage++) {
            for (int d = 0; d < D; d++) {
                GPT2 model;
                Placement place = {.zero = stage, .dp = D, .dp_rank = d, .tp = 1, .pp = 1, .l1 = c.L};
                gpt2_build(&model, &c, single_rank(), &place, kernels);
                size_t psi = model.layout.total;
                size_t largest_layer = 0;
                for (int b = 1; b <= c.L; b++)
                    largest_layer = model.layout.buckets[b].size > largest_layer ? model.layout.buckets[b].size
                                                                                 : largest_layer;
                size_t workspace = (model.layout.buckets[0].size + model.layout.buckets[c.L + 1].size +
                                    2 * largest_layer) * fx;
                int ok = psi % D == 0 && psi >= model.num_parameters &&
                         model.bytes_params == (stage < 3 ? psi : psi / D) * fx &&
                         model.bytes_grads == (stage < 2 ? psi : psi / D) * fx &&
                         model.bytes_optimizer == k * (stage == 0 ? psi : psi / D) * 4 &&
                         model.bytes_workspace == (stage < 2 ? 0 : stage == 2 ? workspace : 2 * workspace);
                if (d == 0 || !ok) {
                    printf("  D=%d stage %d rank %d: Psi %zu | params %zu | grads %zu | optimizer %zu | "
                           "workspace %zu  %s\n", D, stage, d, psi, model.bytes_params, model.bytes_grads,
                           model.bytes_optimizer, model.bytes_workspace, ok ? "ok" : "FAIL");
                }
                if (!ok) failures++;
                gpt2_free(&model);
            }
        }
    }
}

// Tensor parallelism: every split tensor holds exactly 1/T of the whole on each rank, the replicated ones
// all of it, and the split activations (qkv, attention output and probabilities, MLP hidden, logits,
// the wide backward buffer) are 1/T of the single-rank ones. Sizes are read off the real allocation:
// a buffer's size is the distance to the next one (each rounded up to 256 bytes).
static void test_tp_memory(const KernelChoice* kernels) {
    printf("TP memory per rank (L=2 C=48 NH=12 V=700, B=4 T=16)\n");
    GPT2Config c = {.maxT = 16, .V = 700, .Vp = 768, .L = 2, .NH = 12, .C = 48};
    int B = 4, T = 16;
    size_t fx = sizeof(floatX), BT = (size_t)B * T;
    for (int tp = 1; tp <= 4; tp++) {
        GPT2 model;
        Placement place = {.dp = 1, .tp = tp, .tp_rank = tp - 1, .pp = 1, .l1 = c.L};
        gpt2_build(&model, &c, single_rank(), &place, kernels);
        gpt2_allocate_activations(&model, B, T, 1, 0);
        size_t split_local = 0, split_whole = 0, replicated = 0;
        int ok = 1;
        for (int i = 0; i < model.layout.num_entries; i++) {
            const TensorEntry* s = &model.layout.entries[i];
            size_t whole = s->whole.rows * s->whole.cols;
            if (s->whole.split == SPLIT_NONE) {
                replicated += s->numel;
                ok &= s->numel == whole;
            } else {
                split_local += s->numel;
                split_whole += whole;
                ok &= s->numel * tp == whole;
            }
        }
        ok &= model.bytes_params >= (split_local + replicated) * fx &&
              model.bytes_params < (split_local + replicated + 64 * model.layout.num_entries) * fx;
        const Activations* a = &model.chunk->slots[0];
        size_t Cl = c.C / tp, NHl = c.NH / tp, Vpl = c.Vp / tp, L = c.L;
#define SPAN(x, y) ((size_t)((const char*)(y) - (const char*)(x)))
        ok &= SPAN(a->qkv, a->atty) == round_up(L * BT * 3 * Cl * fx, 256);
        ok &= SPAN(a->atty, a->att) == round_up(L * BT * Cl * fx, 256);
        ok &= SPAN(a->att, a->residual2) == round_up(L * B * NHl * T * T * fx, 256);
        ok &= SPAN(a->fch, a->fch_gelu) == round_up(L * BT * 4 * Cl * fx, 256);
        ok &= SPAN(a->dwide, a->logits) == round_up(BT * 4 * Cl * fx, 256);  // the shared workspace precedes the slots,
        ok &= SPAN(a->logits, a->encoded) == round_up(BT * Vpl * fx, 256);   // the logits last (shared with the slots)
#undef SPAN
        printf("  tp=%d: split tensors %zu of %zu elements (1/%d), replicated %zu | params %zu B | activations %zu B"
               "  %s\n", tp, split_local, split_whole, tp, replicated, model.bytes_params, model.bytes_activations,
               ok ? "ok" : "FAIL");
        if (!ok) failures++;
        gpt2_free(&model);
    }
}

// Pipeline activation memory. A schedule's slot count must equal the most micro-batches it ever holds
// (forwards done minus backwards done, or with ZB-H1 minus W's done, simulated from its action list): M
// for GPipe, min(P - s, M) for 1F1B, P for ZB-H1, whose stage s also keeps s + 1 sets of output gradients
// (B's done minus W's done); and each stage's activation bytes must grow by one slot's size per slot, and
// by a set of output gradients' size, (2C + 7C) x L x B x T elements, per set, less the (B, T, 4C) work
// buffer the sets replace, read off the allocation.
static void test_pipeline_memory(const KernelChoice* kernels) {
    printf("pipeline activation memory per stage (L=5 C=32 NH=4 V=512, P=4, B=2 T=16)\n");
    GPT2Config c = {.maxT = 16, .V = 512, .Vp = 512, .L = 5, .NH = 4, .C = 32};
    int P = 4, first[5];
    pipeline_split(c.L, P, NULL, first);
    PipeAction actions[3 * 7];
    Schedule scheds[] = {SCHEDULE_GPIPE, SCHEDULE_1F1B, SCHEDULE_ZBH1};
    for (int k_s = 0; k_s < 3; k_s++) {
        Schedule sched = scheds[k_s];
        int zb = sched == SCHEDULE_ZBH1;
        for (int M = zb ? 4 : 1; M <= 7; M += 3) {
            printf("  %-5s M=%d:", schedule_name(sched), M);
            for (int st = 0; st < P; st++) {
                int slots = pipeline_slots(sched, P, st, M, 1, 0), douts = pipeline_stash_slots(sched, P, st, M);
                int n_actions = pipeline_schedule(sched, P, st, M, 1, actions);
                int in_flight = 0, peak = 0, kept = 0, peak_kept = 0;
                for (int i = 0; i < n_actions; i++) {
                    in_flight += actions[i].kind == PIPE_F ? 1 : actions[i].kind == (zb ? PIPE_W : PIPE_B) ? -1 : 0;
                    kept += zb ? (actions[i].kind == PIPE_B) - (actions[i].kind == PIPE_W) : 0;
                    peak = in_flight > peak ? in_flight : peak;
                    peak_kept = kept > peak_kept ? kept : peak_kept;
                }
                int expect = sched == SCHEDULE_GPIPE ? M : zb ? P : (P - st < M ? P - st : M);
                size_t bytes[2];
                for (int k = 0; k < 2; k++) {  // allocated with `slots` slots and with one
                    GPT2 model;
                    Placement place = {.dp = 1, .tp = 1, .pp = P, .pp_rank = st, .l0 = first[st], .l1 = first[st + 1]};
                    gpt2_build(&model, &c, single_rank(), &place, kernels);
                    gpt2_allocate_activations(&model, 2, 16, k == 0 ? slots : 1, 0);
                    bytes[k] = model.bytes_activations;
                    gpt2_free(&model);
                }
                GPT2 two;
                Placement place = {.dp = 1, .tp = 1, .pp = P, .pp_rank = st, .l0 = first[st], .l1 = first[st + 1]};
                gpt2_build(&two, &c, single_rank(), &place, kernels);
                gpt2_allocate_activations(&two, 2, 16, 2, 0);
                size_t per_slot = two.bytes_activations - bytes[1];
                gpt2_free(&two);
                int ok = slots == peak && slots == expect && bytes[0] == bytes[1] + (slots - 1) * per_slot &&
                         n_actions == (zb ? 3 : 2) * M && douts == peak_kept && douts == (zb ? st + 1 : 0);
                if (zb) {  // the same stage with its sets of output gradients
                    GPT2 kept_model;
                    gpt2_build(&kept_model, &c, single_rank(), &place, kernels);
                    kept_model.chunk->n_douts = douts;
                    gpt2_allocate_activations(&kept_model, 2, 16, slots, 0);
                    size_t set = (size_t)(first[st + 1] - first[st]) * 2 * 16 * (2 * c.C + 7 * c.C) * sizeof(floatX);
                    // (its B writes into the sets instead)
                    size_t dwide = round_up((size_t)2 * 16 * 4 * c.C * sizeof(floatX), 256);
                    ok &= kept_model.bytes_activations == bytes[0] + round_up(douts * set, 256) - dwide;
                    gpt2_free(&kept_model);
                }
                printf("  stage %d: %d slot%s%s %6zu B %s", st, slots, slots > 1 ? "s" : " ",
                       zb ? (douts > 1 ? " +douts" : " +dout ") : "", bytes[0], ok ? "ok" : "FAIL");
                if (!ok) failures++;
            }
            printf("\n");
        }
    }
}

// Whether n slots serve chunk `chunk` of stage s: run its actions in order, micro-batch m's action of
// kind `take` taking slot m mod n, and check that the slot's previous micro-batch has had its action of
// kind `release` (activations: from the forward to the backward, or ZB-H1's W; ZB-H1's output gradients:
// from the B to the W).
static int slots_suffice(const PipeAction* actions, int n_actions, int chunk, int n, int M, int take, int release) {
    int* holder = (int*)malloc_check(n * sizeof(int));  // the micro-batch a slot holds, -1: free
    int* done = (int*)calloc_check(M * sizeof(int));     // micro-batch m's releasing action has run
    for (int i = 0; i < n; i++) holder[i] = -1;
    int ok = 1;
    for (int i = 0; i < n_actions; i++) {
        PipeAction a = actions[i];
        if (a.chunk != chunk) continue;
        if (a.kind == release) done[a.micro] = 1;
        else if (a.kind != take) continue;
        else if (holder[a.micro % n] >= 0 && !done[holder[a.micro % n]]) ok = 0;
        else holder[a.micro % n] = a.micro;
    }
    free(holder);
    free(done);
    return ok;
}

// Every schedule's slot count per chunk (pipeline_slots: the most micro-batches the chunk holds at once)
// is the least that serves it: with that many, no slot is taken while its micro-batch is still held;
// with one fewer, one is. (It also shows that a chunk holds consecutive micro-batches: with slots by m
// mod n, the peak would not suffice otherwise.) P 2..4, M 1..3P, V 1 (GPipe, 1F1B, ZB-H1: M >= P) and 2, 3
// (interleaved); ZB-H1's sets of output gradients likewise.
static int fewest_that_serve(const PipeAction* actions, int n_actions, int v, int slots, int M, int take,
                             int release) {
    return slots_suffice(actions, n_actions, v, slots, M, take, release) &&
           (slots == 1 || !slots_suffice(actions, n_actions, v, slots - 1, M, take, release));
}
static void test_pipeline_slots(void) {
    printf("pipeline activation slots per chunk are the fewest that serve it (GPipe, 1F1B, interleaved V=2,3, "
           "ZB-H1; P 2..4)\n");
    int n = 0, bad = 0;
    for (int sched = 0; sched < 4; sched++)
        for (int V = 1; V <= 3; V++) {
            if ((sched == SCHEDULE_INTERLEAVED) != (V > 1)) continue;
            int zb = sched == SCHEDULE_ZBH1;
            for (int P = 2; P <= 4; P++)
                for (int M = zb ? P : 1; M <= 3 * P; M++) {
                    if (sched == SCHEDULE_INTERLEAVED && M % P != 0) continue;
                    PipeAction* actions = (PipeAction*)malloc_check((size_t)actions_per_stage((Schedule)sched, M, V) *
                                                                    sizeof(PipeAction));
                    for (int s = 0; s < P; s++) {
                        int n_actions = pipeline_schedule((Schedule)sched, P, s, M, V, actions);
                        for (int v = 0; v < V; v++) {
                            int slots = pipeline_slots((Schedule)sched, P, s, M, V, v);
                            int ok = n_actions == (zb ? 3 : 2) * M * V &&
                                     fewest_that_serve(actions, n_actions, v, slots, M, PIPE_F, zb ? PIPE_W : PIPE_B);
                            if (zb)
                                ok &= fewest_that_serve(actions, n_actions, v,
                                                        pipeline_stash_slots((Schedule)sched, P, s, M),
                                                        M, PIPE_B, PIPE_W);
                            if (!ok)
                                printf("  FAIL %s P=%d M=%d V=%d stage %d chunk %d: %d slots\n",
                                       schedule_name((Schedule)sched), P, M, V, s, v, slots);
                            bad += !ok;
                            n++;
                        }
                    }
                    free(actions);
                }
        }
    printf("  %d (schedule, P, M, stage, chunk): %s\n", n, bad ? "FAIL" : "each the fewest slots that serve it  ok");
    failures += bad;
}

// Recomputation: 10 training steps give bit-identical losses and final parameters at every --recompute
// level (backward recomputes with the same operations on the same inputs), and the activation memory
// falls at each level by exactly what that level stops keeping for the layers beyond the first. Level 0
// runs GELU in its own kernel here, as the other levels do (see KernelChoice.separate_gelu).
static void test_recompute(const KernelChoice* run_kernels, const char* dir, const char* name, int B, int T, int V) {
    KernelChoice same_gelu = *run_kernels;
    same_gelu.separate_gelu = 1;
    const KernelChoice* kernels = &same_gelu;
    printf("recomputation levels (%s config, B=%d T=%d, 10 steps%s)\n", name, B, T,
           kernels->flash_attention ? ", flash attention" : "");
    char tmp[] = "/tmp/test_gpt_XXXXXX";
    if (mkdtemp(tmp) == NULL) fatal("cannot create a temporary folder: %s", strerror(errno));
    char data[4200], model_path[4096], out[6][4300];
    snprintf(data, sizeof(data), "%s/tokens.bin", tmp);
    snprintf(model_path, sizeof(model_path), "%s/ref_%s_model.bin", dir, name);
    write_random_tokens(data, 5000, V, 5);
    GPT2Config c;
    model_file_read(model_path, &c, NULL);
    // levels 0..3, then level 3 in segments (sublinear checkpointing) of 2 layers and of all L layers
    const int levels[6] = {0, 1, 2, 3, 3, 3}, segments[6] = {1, 1, 1, 1, 2, c.L};
    float losses[6][10];
    for (int i = 0; i < 6; i++) {
        TrainConfig tc;
        default_train_config(&tc);
        tc.kernels = *kernels;
        tc.train_data = data;
        tc.val_data = "";
        tc.tokenizer = "";
        tc.model_file = model_path;
        tc.quiet = 1;
        tc.B = B;
        tc.T = T;
        tc.steps = 10;
        tc.recompute = levels[i];
        tc.recompute_segment = segments[i];
        snprintf(out[i], sizeof(out[i]), "%s/model_%d.bin", tmp, i);
        tc.save_model = out[i];
        train(&tc, single_rank(), losses[i], 10);
    }
    float* p0 = NULL;
    model_file_read(out[0], &c, &p0);
    size_t n = gpt2_num_parameters(&c);
    size_t bytes[6];
    for (int i = 0; i < 6; i++) {
        int R = levels[i], K = segments[i];
        float* pr = NULL;
        model_file_read(out[i], &c, &pr);
        int same = memcmp(losses[i], losses[0], sizeof(losses[0])) == 0 && memcmp(pr, p0, n * sizeof(float)) == 0;
        GPT2 model;
        Placement place = placement_single(&c);
        gpt2_build(&model, &c, single_rank(), &place, kernels);
        model.recompute = R;
        model.recompute_segment = K;
        gpt2_allocate_activations(&model, B, T, 1, 0);
        bytes[i] = model.bytes_activations;
        gpt2_free(&model);
        // what each level stops keeping for layers 1..L-1 (fx bytes): R1 GELU out, R2 two LN outs,
        // R3 ln stats, qkv, atty, att (flash: lse), residual2, fch; each buffer rounded to 256 bytes. In
        // segments of K layers, K layers' worth of all of them and of the layers' outputs is kept instead
        // of one layer's (and of L outputs), and the inputs of the segments after the first.
        size_t fx = sizeof(floatX), BT = (size_t)B * T, L = c.L, C = c.C,
               kept = K > 1 ? (K < (int)L ? K : L) : 1;
        size_t att = kernels->flash_attention ? (size_t)c.NH * T * B * 4 : (size_t)c.NH * T * T * B * fx;
        size_t drop = 0;
        if (R >= 1) drop += round_up(L * BT * 4 * C * fx, 256) - round_up(kept * BT * 4 * C * fx, 256);
        if (R >= 2) drop += 2 * (round_up(L * BT * C * fx, 256) - round_up(kept * BT * C * fx, 256));
        if (R >= 3) {
            size_t per_layer[] = {BT * 4, BT * 4, BT * 3 * C * fx, BT * C * fx, att, BT * C * fx, BT * 4, BT * 4,
                                  BT * 4 * C * fx};
            for (size_t k = 0; k < sizeof(per_layer) / sizeof(per_layer[0]); k++)
                drop += round_up(L * per_layer[k], 256) - round_up(kept * per_layer[k], 256);
        }
        size_t checkpoints = 0;
        if (K > 1) {
            drop += round_up(L * BT * C * fx, 256) - round_up(kept * BT * C * fx, 256);  // the layers' outputs
            checkpoints = round_up(((L + kept - 1) / kept - 1) * BT * C * fx, 256);
        }
        int ok = same && bytes[i] == bytes[0] - drop + checkpoints;
        printf("  --recompute %d --recompute-segment %d: losses and parameters %s, activations %zu B "
               "(%.0f%% of level 0)  %s\n", R, K, same ? "bit-identical" : "DIFFER", bytes[i],
               100.0 * bytes[i] / bytes[0], ok ? "ok" : "FAIL");
        if (!ok) failures++;
        free(pr);
    }
    free(p0);
    char cmd[4300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", tmp);
}

// The memory planner builds a rank dry (nothing allocated); the same configuration built for real must
// allocate exactly what the plan says, category by category, and nothing outside those categories
// (the device allocation counter moves by the plan's total). A grid of dp, tp, pp, ZeRO stage,
// recomputation, rematerialization, batch, and interleaved chunks (pp 2 with 2 chunks per stage of
// 2 and 1 slots: the chunks' activations, each with its own workspace and received-gradient buffer);
// pipelined with B = 1 also ZB-H1's 2 sets of output gradients for deferred weight gradients.
static void test_memory_plan(const KernelChoice* kernels) {
    printf("memory plan = measured allocation (L=4 C=48 NH=12 V=700), grid of configurations\n");
    GPT2Config c = {.maxT = 16, .V = 700, .Vp = 768, .L = 4, .NH = 12, .C = 48};
    int n = 0, bad = 0;
    for (int dp = 1; dp <= 4; dp *= 2)
        for (int tp = 1; tp <= 2; tp++)
            for (int pp = 1; pp <= 2; pp++)
                for (int zero = 0; zero <= 3; zero++)
                    for (int v = 0; v < 3; v++)  // --recompute 0, 3, and 3 in segments of 3 layers
                        for (int B = 1; B <= 3; B += 2)
                            for (int chunks = 1; chunks <= pp; chunks++) {
                                if (pp > 1 && zero >= 2) continue;
                                int R = v ? 3 : 0, K = v == 2 ? 3 : 1;
                                for (int st = 0; st < pp; st++) {
                                    Placement pl = {.zero = zero, .dp = dp, .dp_rank = dp - 1, .tp = tp,
                                                    .tp_rank = tp - 1, .pp = pp, .pp_rank = st};
                                    place_layers(&pl, c.L, NULL, chunks);
                                    StageSlots slots = {{pp > 1 ? 2 : 1, 1}, pp > 1 && B == 1 ? 2 : 0,
                                                        pp > 1 && B == 1 ? 1 : 0};  // (ZB-H1's douts, logits)
                                    int remat = pp > 1 && B == 3 && chunks == 1;
                                    MemoryPlan plan = plan_rank(&c, &pl, B, 16, slots, R, K, remat, -1,
                                                                sizeof(floatX), kernels);
                                    size_t before = device_allocated_bytes;
                                    GPT2 model;
                                    gpt2_build(&model, &c, single_rank(), &pl, kernels);
                                    model.recompute = R;
                                    model.recompute_segment = K;
                                    allocate_stage_activations(&model, B, 16, slots, remat);
                                    size_t measured = device_allocated_bytes - before;
                                    int ok = plan.params == model.bytes_params && plan.grads == model.bytes_grads &&
                                             plan.optimizer == model.bytes_optimizer &&
                                             plan.activations == model.bytes_activations &&
                                             plan.workspace == model.bytes_workspace &&
                                             measured == plan_total(&plan) - plan.kernel_scratch;
                                    if (!ok) {
                                        printf("  FAIL dp=%d tp=%d pp=%d (%d chunks) stage %d zero=%d R=%d K=%d B=%d: "
                                               "planned %zu, allocated %zu\n", dp, tp, pp, chunks, st, zero, R, K, B,
                                               plan_total(&plan) - plan.kernel_scratch, measured);
                                        bad++;
                                    }
                                    n++;
                                    gpt2_free(&model);
                                }
                            }
    printf("  %d rank configurations: %s\n", n, bad ? "FAIL" : "plan equals the allocation in every category  ok");
    failures += bad;
}

// --attention flash in the planner: built for real, a rank allocates what the plan says, and its
// activations lose exactly the (B, NH/tp, T, T) probabilities per kept layer for the (B, NH/tp, T) fp32
// logsumexp (the T x T term disappears). Planning needs no GPU, so every target checks it.
static void test_memory_plan_flash(const KernelChoice* kernels) {
    printf("memory plan with --attention flash (L=4 C=48 NH=12 V=700, T=16)\n");
    GPT2Config c = {.maxT = 16, .V = 700, .Vp = 768, .L = 4, .NH = 12, .C = 48};
    // this run's kernels, with classic and with flash attention (the model is built with flash)
    KernelChoice classic_kernels = {.fused = kernels->fused, .flash_attention = 0, .cpu_blas = kernels->cpu_blas};
    KernelChoice flash_kernels = {.fused = kernels->fused, .flash_attention = 1, .cpu_blas = kernels->cpu_blas};
    int bad = 0, T = 16;
    StageSlots one = {{1}, 0, 0};
    for (int tp = 1; tp <= 2; tp++)
        for (int R = 0; R <= 3; R += 3)
            for (int B = 1; B <= 3; B += 2) {
                Placement pl = {.dp = 1, .tp = tp, .tp_rank = tp - 1, .pp = 1, .l1 = c.L};
                MemoryPlan classic = plan_rank(&c, &pl, B, T, one, R, 0, 0, -1, sizeof(floatX), &classic_kernels);
                MemoryPlan flash = plan_rank(&c, &pl, B, T, one, R, 0, 0, -1, sizeof(floatX), &flash_kernels);
                size_t before = device_allocated_bytes;
                GPT2 model;
                gpt2_build(&model, &c, single_rank(), &pl, &flash_kernels);
                model.recompute = R;
                gpt2_allocate_activations(&model, B, T, 1, 0);
                size_t measured = device_allocated_bytes - before;
                size_t Lall = R < 3 ? c.L : 1, NHl = c.NH / tp, fx = sizeof(floatX);
                size_t drop = round_up(Lall * B * NHl * T * T * fx, 256) -
                              round_up(Lall * B * NHl * T * sizeof(float), 256);
                int ok = measured == plan_total(&flash) - flash.kernel_scratch &&
                         flash.activations == model.bytes_activations &&
                         classic.activations - flash.activations == drop;
                if (!ok) {
                    printf("  FAIL tp=%d R=%d B=%d: planned %zu allocated %zu; activations classic %zu flash %zu "
                           "(drop want %zu)\n", tp, R, B, plan_total(&flash) - flash.kernel_scratch, measured,
                           classic.activations, flash.activations, drop);
                    bad++;
                }
                gpt2_free(&model);
            }
    printf("  8 configurations: %s\n", bad ? "FAIL" : "plan equals the allocation, the T x T term is gone  ok");
    failures += bad;
}

// The host side of the GPU embedding backward: positions grouped by token id (only ids in the vocabulary
// range), every kept position exactly once, ascending inside its group, groups by ascending id.
static void test_token_grouping(void) {
    int BT = 4096, start = 100, rows = 300;
    int* inp = (int*)malloc_check(BT * sizeof(int));
    int* buf = (int*)malloc_check((3 * (size_t)BT + 1) * sizeof(int));
    int* seen = (int*)calloc_check(BT * sizeof(int));
    Rng rng = {99};
    int expect_kept = 0;
    for (int i = 0; i < BT; i++) {
        inp[i] = (int)(rng_next_u64(&rng) % 512);
        expect_kept += inp[i] >= start && inp[i] < start + rows;
    }
    int n_kept = -1;
    int n_unique = group_positions_by_token(buf, inp, BT, start, rows, &n_kept);
    int *token = buf, *first = buf + n_unique, *positions = buf + 2 * n_unique + 1;
    int ok = n_kept == expect_kept && first[0] == 0 && first[n_unique] == n_kept;
    for (int u = 0; ok && u < n_unique; u++) {
        ok &= u == 0 || token[u] > token[u - 1];
        for (int i = first[u]; ok && i < first[u + 1]; i++) {
            int p = positions[i];
            ok &= p >= 0 && p < BT && inp[p] - start == token[u] && !seen[p] && (i == first[u] || p > positions[i - 1]);
            seen[p] = 1;
        }
    }
    printf("GPU embedding backward, host grouping of %d positions (%d in the vocabulary range, %d distinct ids)"
           "  %s\n", BT, n_kept, n_unique, ok ? "ok" : "FAIL");
    if (!ok) failures++;
    free(inp);
    free(buf);
    free(seen);
}

#ifdef LLMC_CPU
// --cpu-matmul: OpenBLAS against the reference GEMM (llmc/matmul.h). They sum each output's K products in
// other orders, so they agree to fp32 rounding, not bit for bit. The reference adds the K terms one after
// another: with random signs its rounding grows like 2^-24 x sqrt(K/2) of the result (1e-5 at the
// classifier's K = 50304 in dinp, where 4e-6 is measured; 1e-6 and less at K <= 4096). The layer bound,
// 5e-5, is that with a margin of five at the largest K, while a wrong transpose, stride or beta is off by
// 1e-1 or more. Then the whole model, whose K are at most 512 (C, 4C, B x T, Vp): its 10 losses and first
// gradients to 1e-5 (TOL.loss), and its parameters after 10 AdamW steps to TOL.params, the bound of the
// PyTorch comparison.
static void fill_uniform(float* x, size_t n, Rng* rng) {
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rng_uniform(rng) - 1.0f;
}

static void test_cpu_matmul(const char* dir) {
    if (!cpu_blas_linked) {
        printf("--cpu-matmul: this build has no BLAS, the reference GEMM only (nothing to compare)\n");
        return;
    }
    printf("--cpu-matmul blas against reference (layers, then the 'small' model)\n");
    const double tol = 5e-5;
    // (N, IC, OC): ragged against every tile size, the MLP's 4C, K = 4096 rows in dweight, a classifier
    const int shapes[][3] = {{37, 48, 1000}, {64, 128, 512}, {256, 512, 128}, {4096, 64, 96}, {96, 256, 50304}};
    KernelChoice ref = {.cpu_blas = 0}, blas = {.cpu_blas = 1};
    Rng rng = {20240601};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        size_t ni = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
        float *inp = (float*)malloc_check(ni * 4), *w = (float*)malloc_check(nw * 4), *b = (float*)malloc_check(OC * 4);
        float *dout = (float*)malloc_check(no * 4), *dw0 = (float*)malloc_check(nw * 4);
        fill_uniform(inp, ni, &rng);
        fill_uniform(w, nw, &rng);
        fill_uniform(b, OC, &rng);
        fill_uniform(dout, no, &rng);
        fill_uniform(dw0, nw, &rng);  // dweight accumulates (+=): start from something
        float* out[2];
        float* dinp[2];
        float* dw[2];
        float* db[2];
        Scratch scratch = {NULL, 0};
        for (int k = 0; k < 2; k++) {
            const KernelChoice* kc = k ? &blas : &ref;
            out[k] = (float*)malloc_check(no * 4);
            dinp[k] = (float*)malloc_check(ni * 4);
            dw[k] = (float*)malloc_check(nw * 4);
            db[k] = (float*)malloc_check(OC * 4);
            memcpy(dw[k], dw0, nw * 4);
            memcpy(db[k], b, OC * 4);
            matmul_forward(out[k], inp, w, b, N, IC, OC, &scratch, kc);
            matmul_backward(dinp[k], dw[k], db[k], dout, inp, w, N, IC, OC, &scratch, kc);
        }
        char what[4][64];
        snprintf(what[0], 64, "N=%d IC=%d OC=%d: out", N, IC, OC);
        snprintf(what[1], 64, "N=%d IC=%d OC=%d: dinp", N, IC, OC);
        snprintf(what[2], 64, "N=%d IC=%d OC=%d: dweight +=", N, IC, OC);
        snprintf(what[3], 64, "N=%d IC=%d OC=%d: dbias +=", N, IC, OC);
        check(what[0], rel_norm_diff(out[1], out[0], no), tol);
        check(what[1], rel_norm_diff(dinp[1], dinp[0], ni), tol);
        check(what[2], rel_norm_diff(dw[1], dw[0], nw), tol);
        check(what[3], rel_norm_diff(db[1], db[0], OC), tol);
        for (int k = 0; k < 2; k++) {
            free(out[k]);
            free(dinp[k]);
            free(dw[k]);
            free(db[k]);
        }
        free(inp);
        free(w);
        free(b);
        free(dout);
        free(dw0);
        scratch_free(&scratch);
    }

    // the model: losses, gradients and 10 AdamW steps with each matmul, from one start on one batch
    char model_path[4096], debug_path[4096];
    snprintf(model_path, sizeof(model_path), "%s/ref_small_model.bin", dir);
    snprintf(debug_path, sizeof(debug_path), "%s/ref_small_debug.bin", dir);
    Reference r;
    read_reference(&r, debug_path);
    size_t BT = (size_t)r.B * r.T;
    float losses[2][16], *grads[2], *params[2];
    if (r.nsteps > 16) fatal("the 'small' reference has %d steps, more than this check keeps", r.nsteps);
    for (int k = 0; k < 2; k++) {
        GPT2 model;
        load_model(&model, model_path, k ? &blas : &ref);
        gpt2_allocate_activations(&model, r.B, r.T, 1, 0);
        Activations* a = &model.chunk->slots[0];
        OptimizerConfig opt = {.lr = r.lr, .beta1 = r.beta1, .beta2 = r.beta2, .eps = r.eps,
                               .weight_decay = r.weight_decay, .grad_clip = r.grad_clip};
        LossScaler scaler = {.mode = SCALE_OFF, .scale = 1.0f, .growth = 2.0f, .backoff = 0.5f, .interval = 2000,
                             .hysteresis = 1, .good_steps = 0, .hysteresis_left = 1};
        grads[k] = (float*)malloc_check(r.num_params * sizeof(float));
        params[k] = (float*)malloc_check(r.num_params * sizeof(float));
        for (int step = 0; step < r.nsteps; step++) {
            gpt2_zero_grad(&model);
            losses[k][step] = forward_loss(&model, a, r.inputs, r.targets, r.B, r.T, 1.0f / BT);
            gpt2_backward(&model, a, r.B, r.T, 1);
            if (step == 0) gpt2_export(&model, model.grads_memory, grads[k]);
            int skipped = 0;
            double step_loss;
            gpt2_update(&model, &opt, r.lr, step + 1, &scaler, &skipped, &step_loss);
        }
        gpt2_export_master(&model, params[k]);
        gpt2_free(&model);
    }
    double worst = 0.0;
    for (int step = 0; step < r.nsteps; step++) worst = fmax(worst, rel_diff(losses[1][step], losses[0][step]));
    check("model: 10 losses (worst)", worst, TOL.loss);
    check("model: gradients at step 0", rel_norm_diff(grads[1], grads[0], r.num_params), TOL.loss);
    // (AdamW divides by sqrt(v): where a gradient is tiny its rounding moves the update more; the same
    // bound as the PyTorch comparison's parameters, TOL.params)
    check("model: params after 10 steps", rel_norm_diff(params[1], params[0], r.num_params), TOL.params);
    for (int k = 0; k < 2; k++) {
        free(grads[k]);
        free(params[k]);
    }
    free(r.inputs);
    free(r.targets);
    free(r.logits);
    free(r.grads);
    free(r.losses);
    free(r.params_after);
}

// Attention with --cpu-matmul blas (cblas_sgemm on each head's slices, by blocks of ATTENTION_CPU_ROWS
// query rows, llmc/attention.h) against the reference loops, forward (att, out) and backward (dqkv). The
// products sum at most max(hs, T) = 150 terms here in other orders, and the softmax uses expf_cpu (within
// an ulp of expf): they agree to fp32 rounding, measured at 5e-7 and less; the bound, 1e-5, leaves a margin
// of twenty, while a wrong stride, block edge or mask is off by 1e-2 or more. The shapes: a ragged block
// below one block (T = 37), exactly one (T = 64), and three with a ragged last (T = 150, head size 64).
// Then the thread count: the OpenBLAS path at 1 thread and at this run's must give the same bits (each
// head is one thread's, OpenBLAS runs single-threaded inside it).
static void test_cpu_attention(void) {
    if (!cpu_blas_linked) {
        printf("attention: this build has no BLAS, the reference loops only (nothing to compare)\n");
        return;
    }
    printf("attention with OpenBLAS against the reference loops\n");
    const double tol = 1e-5;
    const int shapes[][4] = {{2, 37, 48, 3}, {2, 64, 64, 4}, {1, 150, 128, 2}};  // B, T, C, NH
    KernelChoice ref = {.cpu_blas = 0}, blas = {.cpu_blas = 1};
    Rng rng = {20240917};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
        float *qkv = (float*)malloc_check(nqkv * 4), *dout = (float*)malloc_check(nout * 4);
        fill_uniform(qkv, nqkv, &rng);
        fill_uniform(dout, nout, &rng);
        for (size_t i = 0; i < nqkv; i++) qkv[i] *= 3.0f;  // scores of a few units: softmax rows far from uniform
        float *out[3], *att[3], *dqkv[3];
        Scratch scratch = {NULL, 0};
        int threads = omp_get_max_threads();
        for (int k = 0; k < 3; k++) {  // reference, OpenBLAS, OpenBLAS at 1 thread
            out[k] = (float*)malloc_check(nout * 4);
            att[k] = (float*)malloc_check(natt * 4);
            dqkv[k] = (float*)malloc_check(nqkv * 4);
            for (size_t i = 0; i < natt; i++) att[k][i] = NAN;  // every element must be written
            for (size_t i = 0; i < nqkv; i++) dqkv[k][i] = NAN;
            if (k == 2) omp_set_num_threads(1);
            attention_forward(out[k], att[k], qkv, B, T, C, NH, &scratch, k ? &blas : &ref);
            attention_backward(dqkv[k], dout, qkv, att[k], B, T, C, NH, &scratch, k ? &blas : &ref);
            if (k == 2) omp_set_num_threads(threads);
        }
        char what[3][64];
        snprintf(what[0], 64, "B=%d T=%d C=%d NH=%d: att", B, T, C, NH);
        snprintf(what[1], 64, "B=%d T=%d C=%d NH=%d: out", B, T, C, NH);
        snprintf(what[2], 64, "B=%d T=%d C=%d NH=%d: dqkv", B, T, C, NH);
        check(what[0], rel_norm_diff(att[1], att[0], natt), tol);
        check(what[1], rel_norm_diff(out[1], out[0], nout), tol);
        check(what[2], rel_norm_diff(dqkv[1], dqkv[0], nqkv), tol);
        int same = !memcmp(out[1], out[2], nout * 4) && !memcmp(att[1], att[2], natt * 4) &&
                   !memcmp(dqkv[1], dqkv[2], nqkv * 4);
        printf("  B=%d T=%d C=%d NH=%d: %d threads and 1 bit-identical  %s\n", B, T, C, NH, threads,
               same ? "ok" : "FAIL");
        if (!same) failures++;
        for (int k = 0; k < 3; k++) {
            free(out[k]);
            free(att[k]);
            free(dqkv[k]);
        }
        free(qkv);
        free(dout);
        scratch_free(&scratch);
    }
}
#endif

int main(int argc, char** argv) {
    const char* dir = "build/ref";
    // every check's models and runs use these kernels; the CPU matmul is the trainer's default (OpenBLAS
    // where linked) unless --cpu-matmul says otherwise
    KernelChoice kernels = {.fused = 0, .flash_attention = 0, .cpu_blas = cpu_blas_linked && TARGET_IS_CPU};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--attention") && i + 1 < argc) {
            if (strcmp(argv[i + 1], "classic") && strcmp(argv[i + 1], "flash"))
                fatal("--attention must be classic or flash");
            kernels.flash_attention = !strcmp(argv[++i], "flash");
        } else if (!strcmp(argv[i], "--cpu-matmul") && i + 1 < argc) {
            if (strcmp(argv[i + 1], "blas") && strcmp(argv[i + 1], "reference"))
                fatal("--cpu-matmul must be blas or reference");
            kernels.cpu_blas = !strcmp(argv[++i], "blas");
            if (kernels.cpu_blas && !(cpu_blas_linked && TARGET_IS_CPU))
                fatal("--cpu-matmul blas: this build has no BLAS");
        } else if (argv[i][0] == '-')
            fatal("usage: test_gpt [reference folder] [--attention classic|flash] [--cpu-matmul blas|reference]");
        else dir = argv[i];
    }
    // LLMC_FUSED_KERNELS=1 runs every check with --fused-kernels 1 (llmc/device.h), same tolerances
    const char* fused = getenv("LLMC_FUSED_KERNELS");
    if (fused != NULL && strcmp(fused, "0") != 0 && strcmp(fused, "1") != 0)
        fatal("LLMC_FUSED_KERNELS must be 0 or 1, got '%s'", fused);
    kernels.fused = fused != NULL && strcmp(fused, "1") == 0;
    printf("test_gpt: target %s, precision %s, fused kernels %s, attention %s%s, references in %s\n", TARGET_NAME,
           PRECISION_NAME, kernels.fused ? "on" : "off", kernels.flash_attention ? "flash" : "classic",
           !TARGET_IS_CPU ? "" : kernels.cpu_blas ? ", matmuls OpenBLAS" : ", matmuls reference GEMM", dir);
    if (kernels.flash_attention)
        attention_flash_validate(64, 1, sizeof(floatX), 0);  // a clear error on CPU / FP32 builds
    device_require_gpu();
    if (kernels.flash_attention) {  // only head size 64 runs on the flash path
        printf("--attention flash: checks with head size 64 only (small, odd, resume, accumulation, bf16 file, "
               "ZeRO, TP and pipeline memory are checked without it)\n");
        test_against_reference(&kernels, dir, "hs64");
        test_recompute(&kernels, dir, "hs64", 2, 100, 512);
        test_memory_plan(&kernels);
        test_memory_plan_flash(&kernels);
    } else {
        test_against_reference(&kernels, dir, "small");
        test_against_reference(&kernels, dir, "odd");
        test_against_reference(&kernels, dir, "hs64");
        test_resume(&kernels, dir);
        test_grad_accumulation(&kernels, dir);
        test_bf16_model_file(&kernels, dir);
        test_zero_memory(&kernels, dir);
        test_tp_memory(&kernels);
        test_pipeline_memory(&kernels);
        test_pipeline_slots();
        test_recompute(&kernels, dir, "odd", 3, 37, 1000);
        test_memory_plan(&kernels);
        test_memory_plan_flash(&kernels);
#ifdef LLMC_CPU
        test_cpu_matmul(dir);
        test_cpu_attention();
#endif
    }
    test_token_grouping();
    if (failures) {
        printf("FAILED: %d check(s)\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}
