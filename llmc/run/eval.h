/*
 * eval.h: multiple-choice evaluation (HellaSwag-style), reading llm.c's eval file format.
 *
 * Each example is a context and K = 4 completions, one of them right (the label). The model scores a
 * completion by the mean cross-entropy of its tokens given the context and the completion's earlier
 * tokens (context + completion are fed; the loss counts only the positions that predict a completion
 * token), and predicts the completion of lowest mean loss; accuracy is the share of examples predicted
 * right. This is how llm.c scores HellaSwag, so its hellaswag_val.bin can be used as it is.
 *
 * File (llm.c's dev/data/data_common.py write_evalfile), little-endian: 256 int32 header
 * [20240522, version 1, number of examples, longest example in bytes], then per example a stream of uint16:
 *   65535 (start marker), the example's length in bytes (this stream, marker included), its index,
 *   the label, the number of completions (4), the context length and its tokens, then per completion its
 *   length and its tokens.
 * The reader checks all of it (a malformed file is one error line), and that token ids are < V.
 *
 * Rows: completion k of an example is the row ctx + comp_k, fed as inputs row[0..n-1) with targets
 * row[1..n); the completion's tokens are the last comp_len targets. A row longer than the model's T + 1
 * loses context tokens from its start (the completion is always kept whole).
 */
#pragma once

#include "../common.h"  // fatal, checked file calls

#define EVAL_MAGIC 20240522
#define EVAL_COMPLETIONS 4  // llm.c's files always hold 4

typedef struct {
    int n_examples;
    int* label;       // (n_examples)
    int* ctx_start;   // (n_examples) offset of the context in tokens
    int* ctx_len;     // (n_examples)
    int* comp_start;  // (n_examples, 4) offset of each completion in tokens
    int* comp_len;    // (n_examples, 4)
    int* tokens;      // all token ids, in file order
} EvalSet;

// reads one uint16 of the example stream, or fails: the stream ended inside an example
static int eval_next(const uint16_t* s, size_t n, size_t* i, const char* path, int example) {
    if (*i >= n) fatal("'%s': example %d runs past the end of the file (truncated?)", path, example);
    return s[(*i)++];
}

static void eval_read_example(EvalSet* e, const uint16_t* s, size_t n, size_t* i, int ex, int V, int longest,
                              int* n_tokens, const char* path) {
    size_t begin = *i;
    if (eval_next(s, n, i, path, ex) != 65535) fatal("'%s': example %d does not start with the marker 65535", path, ex);
    int bytes = eval_next(s, n, i, path, ex);
    if (bytes > longest)
        fatal("'%s': example %d is %d bytes, more than the header's longest %d", path, ex, bytes, longest);
    if (begin + bytes / 2 > n) fatal("'%s': example %d (%d bytes) runs past the end of the file", path, ex, bytes);
    eval_next(s, n, i, path, ex);  // the example's index in its dataset: not needed
    e->label[ex] = eval_next(s, n, i, path, ex);
    int k = eval_next(s, n, i, path, ex);
    if (k != EVAL_COMPLETIONS)
        fatal("'%s': example %d has %d completions (%d expected)", path, ex, k, EVAL_COMPLETIONS);
    if (e->label[ex] >= k)
        fatal("'%s': example %d: label %d is not one of its %d completions", path, ex, e->label[ex], k);
    for (int part = 0; part <= k; part++) {  // the context, then each completion
        int len = eval_next(s, n, i, path, ex);
        if (len == 0) fatal("'%s': example %d: an empty %s", path, ex, part == 0 ? "context" : "completion");
        if (*i + len > begin + bytes / 2)
            fatal("'%s': example %d: a length (%d tokens) runs past its %d bytes", path, ex, len, bytes);
        if (part == 0) {
            e->ctx_start[ex] = *n_tokens;
            e->ctx_len[ex] = len;
        } else {
            e->comp_start[ex * k + part - 1] = *n_tokens;
            e->comp_len[ex * k + part - 1] = len;
        }
        for (int t = 0; t < len; t++) {
            int id = s[(*i)++];
            if (id >= V) fatal("'%s': example %d: token id %d is outside the vocabulary of %d", path, ex, id, V);
            e->tokens[(*n_tokens)++] = id;
        }
    }
    if (*i != begin + bytes / 2 || bytes % 2 != 0)
        fatal("'%s': example %d: its byte count %d does not match its contents (%zu bytes)", path, ex, bytes,
              2 * (*i - begin));
}

static void eval_load(EvalSet* e, const char* path, int V) {
    int header[256];
    long long size;
    FILE* f = open_with_header(path, EVAL_MAGIC, "multiple-choice eval file (llm.c format)", header, &size);
    if (header[1] != 1) fatal("'%s': unsupported eval file version %d (1 is known)", path, header[1]);
    int n_ex = header[2], longest = header[3];
    if (n_ex < 1 || n_ex > 65536) fatal("'%s': implausible number of examples %d", path, n_ex);
    if ((size - 1024) % 2 != 0) fatal("'%s': the data after the header is not a whole number of uint16", path);
    size_t n = (size_t)(size - 1024) / 2;
    uint16_t* s = (uint16_t*)malloc_check(n * sizeof(uint16_t));
    fread_check(s, sizeof(uint16_t), n, f, path);
    fclose(f);
    e->n_examples = n_ex;
    e->label = (int*)malloc_check(n_ex * sizeof(int));
    e->ctx_start = (int*)malloc_check(n_ex * sizeof(int));
    e->ctx_len = (int*)malloc_check(n_ex * sizeof(int));
    e->comp_start = (int*)malloc_check(n_ex * EVAL_COMPLETIONS * sizeof(int));
    e->comp_len = (int*)malloc_check(n_ex * EVAL_COMPLETIONS * sizeof(int));
    e->tokens = (int*)malloc_check(n * sizeof(int));
    size_t i = 0;
    int n_tokens = 0;
    for (int ex = 0; ex < n_ex; ex++) eval_read_example(e, s, n, &i, ex, V, longest, &n_tokens, path);
    if (i != n) fatal("'%s': %zu bytes after the last of its %d examples", path, 2 * (n - i), n_ex);
    free(s);
}

static void eval_free(EvalSet* e) {
    free(e->label);
    free(e->ctx_start);
    free(e->ctx_len);
    free(e->comp_start);
    free(e->comp_len);
    free(e->tokens);
}

// Row of completion k of example ex, at most T + 1 tokens (context cut from the left): writes the T-long
// inputs and targets (0 past the row) and returns the row's number of targets; the completion's are the
// last comp_len of them. Fails if the completion alone does not fit.
static int eval_row(const EvalSet* e, int ex, int k, int T, int* inputs, int* targets, const char* path) {
    int c = e->comp_len[ex * EVAL_COMPLETIONS + k];
    if (c > T)
        fatal("'%s': example %d: completion %d is %d tokens, longer than the sequence length %d", path, ex, k, c, T);
    int ctx = e->ctx_len[ex] < T + 1 - c ? e->ctx_len[ex] : T + 1 - c;  // context tokens kept (its last ones)
    int n = ctx + c;
    for (int t = 0; t < T + 1; t++) {
        int id = 0;
        if (t < ctx) id = e->tokens[e->ctx_start[ex] + e->ctx_len[ex] - ctx + t];
        else if (t < n) id = e->tokens[e->comp_start[ex * EVAL_COMPLETIONS + k] + t - ctx];
        if (t < T) inputs[t] = id;
        if (t > 0) targets[t - 1] = id;
    }
    return n - 1;
}

// The prediction for one example from its completions' mean losses: the lowest (the first of ties)
static int eval_predict(const double* mean_loss) {
    int best = 0;
    for (int k = 1; k < EVAL_COMPLETIONS; k++)
        if (mean_loss[k] < mean_loss[best]) best = k;
    return best;
}

// The rows (one per completion) of the examples DP rank d of D scores (d, d + D, ...), each cut to its
// tokens and padded to T, with what scoring needs: each row's number of targets and its completion's
// length (the last targets), the longest row (Te), and each row's mean completion loss once forwarded.
typedef struct {
    int d, D;            // this rank scores examples d, d + D, ...
    int n_mine, n_rows;  // examples of this rank, and their rows (EVAL_COMPLETIONS each)
    int T, Te;           // the rows' allocated length, the longest row's tokens
    int *in, *tg;        // (n_rows, T) inputs and targets
    int *ntg, *nc;       // (n_rows) targets in each row, of which the completion's (the last ones)
    double* mean;        // (n_rows) mean completion loss (eval_row_means)
} EvalRows;

static EvalRows eval_rows(const EvalSet* e, int d, int D, int T, const char* path) {
    const int K = EVAL_COMPLETIONS;
    EvalRows r;
    r.d = d;
    r.D = D;
    r.n_mine = e->n_examples > d ? (e->n_examples - d + D - 1) / D : 0;
    r.n_rows = r.n_mine * K;
    r.T = T;
    r.Te = 1;
    r.in = (int*)malloc_check((size_t)(r.n_rows + 1) * T * sizeof(int));
    r.tg = (int*)malloc_check((size_t)(r.n_rows + 1) * T * sizeof(int));
    r.ntg = (int*)malloc_check((size_t)(r.n_rows + 1) * sizeof(int));
    r.nc = (int*)malloc_check((size_t)(r.n_rows + 1) * sizeof(int));
    r.mean = (double*)calloc_check((size_t)(r.n_rows + 1) * sizeof(double));
    for (int i = 0; i < r.n_rows; i++) {
        int ex = d + (i / K) * D;
        r.ntg[i] = eval_row(e, ex, i % K, T, r.in + (size_t)i * T, r.tg + (size_t)i * T, path);
        r.nc[i] = e->comp_len[ex * K + i % K];
        if (r.ntg[i] > r.Te) r.Te = r.ntg[i];
    }
    return r;
}

// Rows r0 .. r0 + n - 1, cut to Te, into one forward's (n, Te) inputs and targets; past the last row: zeros
static void eval_pack(const EvalRows* r, int r0, int n, int* in, int* tg) {
    for (int j = 0; j < n; j++) {
        int i = r0 + j < r->n_rows ? r0 + j : -1;
        for (int t = 0; t < r->Te; t++) {
            in[j * r->Te + t] = i >= 0 ? r->in[(size_t)i * r->T + t] : 0;
            tg[j * r->Te + t] = i >= 0 ? r->tg[(size_t)i * r->T + t] : 0;
        }
    }
}

// From the losses (n, Te) of the forward of eval_pack(r0, n): each row's mean loss over its completion
static void eval_row_means(EvalRows* r, int r0, int n, const float* losses) {
    for (int j = 0; j < n && r0 + j < r->n_rows; j++) {
        int i = r0 + j;
        double sum = 0.0;
        for (int t = r->ntg[i] - r->nc[i]; t < r->ntg[i]; t++) sum += losses[(size_t)j * r->Te + t];
        r->mean[i] = sum / r->nc[i];
    }
}

// Adds this rank's right answers and examples to counts[0], counts[1]; each example's line to `dump` if given
static void eval_count(const EvalRows* r, const EvalSet* e, double* counts, FILE* dump) {
    const int K = EVAL_COMPLETIONS;
    for (int i = 0; i < r->n_mine; i++) {
        int ex = r->d + i * r->D;
        const double* m = r->mean + (size_t)i * K;
        counts[0] += eval_predict(m) == e->label[ex];
        counts[1] += 1;
        if (dump) fprintf(dump, "%d %d %.9g %.9g %.9g %.9g\n", ex, e->label[ex], m[0], m[1], m[2], m[3]);
    }
}

static void eval_rows_free(EvalRows* r) {
    free(r->in);
    free(r->tg);
    free(r->ntg);
    free(r->nc);
    free(r->mean);
}
