/*
 * dataloader.h: batches of tokens from llm.c-format shards.
 *
 * Token file, little-endian: 256 int32 header [20240520, 1, n_tokens, 0...], then n_tokens uint16.
 * A glob pattern names the shards; sorted by name they are read as one concatenated stream.
 *
 * Data-order contract (shuffling off): micro-batch k is the B*T+1 tokens starting at token k*B*T of the
 * stream; inputs are the first B*T, targets the same shifted by one. The training loop asks for
 * k = s*D + d (micro-step s, data-parallel rank d of D), so dp=D with batch B reads exactly the tokens of
 * dp=1 with batch D*B. The D micro-batches of one micro-step form a global batch; one epoch is
 * floor((n_tokens - 1) / (D*B*T)) global batches, after which k wraps around. With shuffling on
 * (--shuffle 1) the global batches of every epoch are visited in a seeded random permutation, a pure
 * function of (seed, epoch): so the contract between dp=D and dp=1 holds with shuffling too, and
 * resuming needs only k.
 *
 * Every token id is checked against the vocabulary size when the files are opened (one sequential read,
 * about a second per GB), so bad data fails at start-up, not hours into a run. And again as each batch
 * is read (a max over B*T+1 ids, nothing next to a step): a shard rewritten while the run goes on (a
 * data job that regenerates it in place) is not checked at start-up, and an id >= V would index past the
 * embedding's real rows (into the padded rows [V, Vp), which then train, or past the table: a crash).
 */
#pragma once

#include <glob.h>

#include "../common.h"  // fatal, checked file calls, Rng

#define TOKENS_MAGIC 20240520

typedef struct {
    int n_files;
    char** paths;
    long long* file_tokens;  // tokens in each file
    long long* file_start;   // position of each file's first token in the stream
    long long total_tokens;
    int B, T;
    int D;                // micro-batches per global batch (the DP size)
    int V;                // every id handed out is below it
    long long n_batches;  // global batches per epoch
    int shuffle;
    uint64_t seed;
    long long perm_epoch;  // epoch whose permutation is in perm (-1: none)
    long long* perm;
    uint16_t* buffer;  // (B*T+1)
    int* inputs;       // (B,T)
    int* targets;      // (B,T)
    FILE* file;        // the open shard, and its index
    int file_index;
} DataLoader;

// fails naming the first token id >= V in the file
static void check_token_ids(const char* path, long long n, int V) {
    FILE* f = fopen_check(path, "rb");
    fseek_check(f, 1024, path);
    const long long chunk = n < (1 << 20) ? n : (1 << 20);  // tokens per read (a small file needs no 2 MB buffer)
    uint16_t* buf = (uint16_t*)malloc_check(chunk * sizeof(uint16_t));
    for (long long pos = 0; pos < n; pos += chunk) {
        long long m = n - pos < chunk ? n - pos : chunk;
        fread_check(buf, sizeof(uint16_t), (size_t)m, f, path);
        for (long long j = 0; j < m; j++)
            if (buf[j] >= V)
                fatal("'%s': token id %d at token %lld is >= the vocabulary size %d", path, buf[j], pos + j, V);
    }
    free(buf);
    fclose(f);
}

static void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int D, int V, int shuffle,
                            uint64_t seed) {
    memset(dl, 0, sizeof(*dl));
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) fatal("no token file matches '%s'", pattern);
    dl->n_files = (int)g.gl_pathc;
    dl->paths = (char**)malloc_check(dl->n_files * sizeof(char*));
    dl->file_tokens = (long long*)malloc_check(dl->n_files * sizeof(long long));
    dl->file_start = (long long*)malloc_check(dl->n_files * sizeof(long long));
    for (int i = 0; i < dl->n_files; i++) {  // glob sorts the names
        const char* path = g.gl_pathv[i];
        dl->paths[i] = strdup(path);
        int header[256];
        long long size;
        fclose(open_with_header(path, TOKENS_MAGIC, "token file", header, &size));
        if (header[1] != 1) fatal("'%s': unsupported token file version %d (expected 1)", path, header[1]);
        long long n = (unsigned int)header[2];
        long long expected = (long long)sizeof(header) + 2 * n;
        if (size != expected)
            fatal("'%s' has %lld bytes but its header says %lld tokens (%lld bytes: %s)", path, size, n, expected,
                  size < expected ? "truncated" : "trailing bytes");
        check_token_ids(path, n, V);
        dl->file_tokens[i] = n;
        dl->file_start[i] = dl->total_tokens;
        dl->total_tokens += n;
    }
    globfree(&g);
    dl->B = B;
    dl->T = T;
    dl->V = V;
    long long need = (long long)D * B * T + 1;
    if (dl->total_tokens < need)
        fatal("'%s' holds %lld tokens, fewer than one batch needs (dp*B*T+1 = %lld)", pattern, dl->total_tokens, need);
    dl->D = D;
    dl->n_batches = (dl->total_tokens - 1) / ((long long)D * B * T);
    need = (long long)B * T + 1;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->perm_epoch = -1;
    dl->buffer = (uint16_t*)malloc_check(need * sizeof(uint16_t));
    dl->inputs = (int*)malloc_check((size_t)B * T * sizeof(int));
    dl->targets = (int*)malloc_check((size_t)B * T * sizeof(int));
    dl->file_index = -1;
}

static void dataloader_free(DataLoader* dl) {
    if (dl->file) fclose(dl->file);
    for (int i = 0; i < dl->n_files; i++) free(dl->paths[i]);
    free(dl->paths);
    free(dl->file_tokens);
    free(dl->file_start);
    free(dl->perm);
    free(dl->buffer);
    free(dl->inputs);
    free(dl->targets);
}

// reads n tokens starting at stream position pos, crossing file boundaries as needed
static void dataloader_read(DataLoader* dl, long long pos, long long n, uint16_t* out) {
    int i = 0;
    while (dl->file_start[i] + dl->file_tokens[i] <= pos) i++;
    while (n > 0) {
        if (i >= dl->n_files) fatal("internal error: read past the end of the token stream");
        if (dl->file_index != i) {
            if (dl->file) fclose(dl->file);
            dl->file = fopen_check(dl->paths[i], "rb");
            dl->file_index = i;
        }
        long long offset = pos - dl->file_start[i];
        long long take = dl->file_tokens[i] - offset < n ? dl->file_tokens[i] - offset : n;
        fseek_check(dl->file, 1024 + 2 * offset, dl->paths[i]);
        fread_check(out, sizeof(uint16_t), (size_t)take, dl->file, dl->paths[i]);
        uint16_t max_id = 0;
        for (long long j = 0; j < take; j++) max_id = out[j] > max_id ? out[j] : max_id;
        if (max_id >= dl->V)  // the file changed since start-up checked it: name the first bad id
            for (long long j = 0; j < take; j++)
                if (out[j] >= dl->V)
                    fatal("'%s': token id %d at token %lld is >= the vocabulary size %d (the file changed after "
                          "start-up checked it)", dl->paths[i], out[j], offset + j, dl->V);
        out += take;
        pos += take;
        n -= take;
        i++;
    }
}

// the position (in micro-batches of B*T tokens) of the micro-batch visited k-th
static long long dataloader_batch_position(DataLoader* dl, long long k) {
    long long g = k / dl->D, r = k % dl->D;  // global batch g, part r of it
    long long epoch = g / dl->n_batches, j = g % dl->n_batches;
    if (!dl->shuffle) return j * dl->D + r;
    if (dl->perm_epoch != epoch) {  // Fisher-Yates with a generator seeded by (seed, epoch)
        if (dl->perm == NULL) dl->perm = (long long*)malloc_check(dl->n_batches * sizeof(long long));
        for (long long i = 0; i < dl->n_batches; i++) dl->perm[i] = i;
        Rng rng = {dl->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(epoch + 1))};
        for (long long i = dl->n_batches - 1; i > 0; i--) {
            long long r = (long long)(rng_next_u64(&rng) % (uint64_t)(i + 1));
            long long tmp = dl->perm[i];
            dl->perm[i] = dl->perm[r];
            dl->perm[r] = tmp;
        }
        dl->perm_epoch = epoch;
    }
    return dl->perm[j] * dl->D + r;
}

// fills dl->inputs and dl->targets with micro-batch k
static void dataloader_load(DataLoader* dl, long long k) {
    long long BT = (long long)dl->B * dl->T;
    dataloader_read(dl, dataloader_batch_position(dl, k) * BT, BT + 1, dl->buffer);
    for (long long i = 0; i < BT; i++) {
        dl->inputs[i] = dl->buffer[i];
        dl->targets[i] = dl->buffer[i + 1];
    }
}
