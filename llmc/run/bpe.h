/*
 * bpe.h: the GPT-2 byte-level BPE encoder (text -> token ids), to turn a --prompt into tokens.
 *
 * Data preparation encodes the training text in Python (scripts/gpt2_tokenizer.py, equal to tiktoken's
 * GPT-2 encoding); this is the same algorithm in C, from the same two files of the GPT-2 release:
 *   encoder.json  a flat JSON object {"symbol string": id, ...}: 50257 tokens
 *   vocab.bpe     "#version" line, then one merge "left right" per line, rank 0 (merged first) first
 * Token strings in both files are written in GPT-2's byte symbols: every byte is one printable character
 * (bytes that print as themselves stay, the other 68 become U+0100..U+0143, so space is 'Ġ' U+0120).
 * On loading, every token is turned back into its raw bytes, and the merges into a table
 * (left id, right id) -> (rank, merged id), so encoding works on ids and never on symbol strings.
 *
 * Encoding a text:
 *   1. Pre-tokenize into words with GPT-2's pattern (llmc/run/pretokenize.h).
 *   2. Per word, start from its single bytes and repeatedly merge every occurrence (left to right) of the
 *      adjacent pair with the lowest rank, until no adjacent pair is a merge. BPE never crosses words.
 */
#pragma once

#include "../common.h"    // fatal, read_whole_file
#include "pretokenize.h"  // the pre-tokenizer: text to words

// GPT-2's byte -> symbol code point table: bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF are their own symbol;
// the other 68 bytes get U+0100, U+0101, ... in increasing byte order
static void bpe_byte_symbols(int symbol_of_byte[256]) {
    int shifted = 0;
    for (int b = 0; b < 256; b++) {
        int visible = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        symbol_of_byte[b] = visible ? b : 256 + shifted++;
    }
}

typedef struct {
    int V;                   // tokens in encoder.json
    unsigned char** bytes;   // (V) raw bytes of each token
    int* len;                // (V) their lengths
    int byte_id[256];        // the token of each single byte
    int n_merges;
    uint64_t* merge_key;     // (n_merges) left id << 32 | right id, sorted
    int* merge_rank;         // (n_merges) line of the merge in vocab.bpe (0 = merged first)
    int* merge_id;           // (n_merges) the merged token
    int* by_bytes;           // (V) token ids sorted by their bytes, to look a byte string up
} BpeEncoder;

static int bytes_compare(const unsigned char* a, int na, const unsigned char* b, int nb) {
    int c = memcmp(a, b, na < nb ? na : nb);
    return c != 0 ? c : na - nb;
}

// A token as the by_bytes sort sees it (qsort has no context argument, so each key carries its bytes)
typedef struct {
    const unsigned char* bytes;
    int len, id;
} BpeSortKey;
static int bpe_compare_keys(const void* x, const void* y) {
    const BpeSortKey *a = (const BpeSortKey*)x, *b = (const BpeSortKey*)y;
    int c = bytes_compare(a->bytes, a->len, b->bytes, b->len);
    return c != 0 ? c : a->id - b->id;  // the same bytes under two ids (a key repeated in the JSON): by id
}

// e->by_bytes: the ids sorted by their bytes
static void bpe_sort_by_bytes(BpeEncoder* e) {
    BpeSortKey* keys = (BpeSortKey*)malloc_check(e->V * sizeof(BpeSortKey));
    for (int id = 0; id < e->V; id++) keys[id] = (BpeSortKey){.bytes = e->bytes[id], .len = e->len[id], .id = id};
    qsort(keys, e->V, sizeof(BpeSortKey), bpe_compare_keys);
    e->by_bytes = (int*)malloc_check(e->V * sizeof(int));
    for (int i = 0; i < e->V; i++) e->by_bytes[i] = keys[i].id;
    free(keys);
}

// The id of a byte string, or -1
static int bpe_lookup(const BpeEncoder* e, const unsigned char* s, int n) {
    int lo = 0, hi = e->V - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, id = e->by_bytes[mid];
        int c = bytes_compare(s, n, e->bytes[id], e->len[id]);
        if (c == 0) return id;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

static char* read_whole_file(const char* path, size_t* n) {
    FILE* f = fopen_check(path, "rb");
    long long size = file_size_check(f, path);
    char* buf = (char*)malloc_check((size_t)size + 1);
    fread_check(buf, 1, (size_t)size, f, path);
    fclose(f);
    buf[size] = '\0';
    *n = (size_t)size;
    return buf;
}

// Symbol string (UTF-8 of byte symbols) -> raw bytes, in place in `out`; returns the byte count or -1
// if a character is not a byte symbol
static int symbols_to_bytes(const int* cps, int n_cps, const int byte_of_symbol[324], unsigned char* out) {
    for (int i = 0; i < n_cps; i++) {
        if (cps[i] < 0 || cps[i] >= 324 || byte_of_symbol[cps[i]] < 0) return -1;
        out[i] = (unsigned char)byte_of_symbol[cps[i]];
    }
    return n_cps;
}

// ----------------------------------------------------------------------------------------------------
// encoder.json: a flat object of string keys and integer values. Strings may hold \uXXXX escapes
// (surrogate pairs included) and the usual \" \\ \/ \b \f \n \r \t.

typedef struct {
    const char* s;
    size_t n, i;
    const char* path;
} JsonCursor;

[[noreturn]] static void json_error(const JsonCursor* j, const char* what) {
    fatal("'%s': not a flat JSON object of token ids: %s at byte %zu", j->path, what, j->i);
}

static void json_skip_space(JsonCursor* j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\n' || j->s[j->i] == '\r' || j->s[j->i] == '\t')) j->i++;
}

static int json_hex4(JsonCursor* j) {
    if (j->i + 4 > j->n) json_error(j, "a truncated \\u escape");
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = j->s[j->i++];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) json_error(j, "a bad \\u escape");
        v = v * 16 + d;
    }
    return v;
}

// Reads a JSON string into code points (at most `cap`); returns their count
static int json_string(JsonCursor* j, int* cps, int cap) {
    if (j->i >= j->n || j->s[j->i] != '"') json_error(j, "expected a string");
    j->i++;
    int n = 0;
    while (1) {
        if (j->i >= j->n) json_error(j, "an unterminated string");
        int cp, len = 1;
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') break;
        if (c == '\\') {
            if (j->i + 1 >= j->n) json_error(j, "an unterminated string");
            char e = j->s[j->i + 1];
            j->i += 2;
            len = 0;
            const char* from = "\"\\/bfnrt";
            const char* to = "\"\\/\b\f\n\r\t";
            if (e == 'u') {
                cp = json_hex4(j);
                if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair: \uD8xx\uDCxx
                    if (j->i + 2 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                        json_error(j, "a lone surrogate");
                    j->i += 2;
                    int low = json_hex4(j);
                    if (low < 0xDC00 || low > 0xDFFF) json_error(j, "a lone surrogate");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                }
            } else if (e != '\0' && strchr(from, e) != NULL) {
                cp = to[strchr(from, e) - from];
            } else {
                json_error(j, "an unknown escape");
            }
        } else {
            cp = utf8_decode((const unsigned char*)j->s + j->i, j->n - j->i, &len);
            if (cp < 0 || cp < 0x20) json_error(j, "invalid UTF-8 or a control character in a string");
        }
        j->i += len;
        if (n >= cap) json_error(j, "a token longer than 255 bytes");
        cps[n++] = cp;
    }
    j->i++;
    return n;
}

static long json_integer(JsonCursor* j) {
    size_t start = j->i;
    long v = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9' && j->i - start < 9) v = v * 10 + (j->s[j->i++] - '0');
    if (j->i == start || (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9'))
        json_error(j, "expected a token id (0..999999999)");
    return v;
}

// ----------------------------------------------------------------------------------------------------
// loading

static void bpe_load_vocabulary(BpeEncoder* e, const char* path, const int byte_of_symbol[324]) {
    size_t n;
    char* text = read_whole_file(path, &n);
    JsonCursor j = {.s = text, .n = n, .i = 0, .path = path};
    int cap = 65536;
    e->bytes = (unsigned char**)calloc_check(cap * sizeof(unsigned char*));
    e->len = (int*)malloc_check(cap * sizeof(int));
    e->V = 0;
    int cps[256];
    unsigned char raw[256];
    json_skip_space(&j);
    if (j.i >= j.n || j.s[j.i++] != '{') json_error(&j, "expected '{'");
    json_skip_space(&j);
    while (j.i < j.n && j.s[j.i] != '}') {
        int n_cps = json_string(&j, cps, 256);
        json_skip_space(&j);
        if (j.i >= j.n || j.s[j.i++] != ':') json_error(&j, "expected ':'");
        json_skip_space(&j);
        long id = json_integer(&j);
        int len = symbols_to_bytes(cps, n_cps, byte_of_symbol, raw);
        if (len <= 0) json_error(&j, "an empty token or a character that is not a GPT-2 byte symbol");
        if (id >= cap || e->bytes[id] != NULL) json_error(&j, "a token id twice or above 65535");
        e->bytes[id] = (unsigned char*)malloc_check(len);
        memcpy(e->bytes[id], raw, len);
        e->len[id] = len;
        e->V++;
        json_skip_space(&j);
        if (j.i < j.n && j.s[j.i] == ',') {
            j.i++;
            json_skip_space(&j);
        } else if (j.i >= j.n || j.s[j.i] != '}') {
            json_error(&j, "expected ',' or '}'");
        }
    }
    if (j.i >= j.n) json_error(&j, "expected '}'");
    j.i++;
    json_skip_space(&j);
    if (j.i != j.n) json_error(&j, "text after the object");
    for (int id = 0; id < e->V; id++)
        if (e->bytes[id] == NULL) fatal("'%s': the token ids are not 0..%d (id %d is missing)", path, e->V - 1, id);
    free(text);
    bpe_sort_by_bytes(e);
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        e->byte_id[b] = bpe_lookup(e, &c, 1);
        if (e->byte_id[b] < 0) fatal("'%s': no token for the single byte 0x%02X", path, b);
    }
}

typedef struct {
    uint64_t key;
    int rank, id;
} BpeMerge;
static int bpe_compare_merges(const void* x, const void* y) {
    uint64_t a = ((const BpeMerge*)x)->key, b = ((const BpeMerge*)y)->key;
    return a < b ? -1 : a > b;
}

// The id of a symbol string given as UTF-8 text s[0..n), or -1
static int bpe_symbols_id(const BpeEncoder* e, const char* s, size_t n, const int byte_of_symbol[324]) {
    int cps[256];
    unsigned char raw[256];
    int n_cps = 0;
    for (size_t i = 0; i < n;) {
        int len;
        int cp = utf8_decode((const unsigned char*)s + i, n - i, &len);
        if (n_cps >= 256) return -1;
        cps[n_cps++] = cp;
        i += len;
    }
    int len = symbols_to_bytes(cps, n_cps, byte_of_symbol, raw);
    return len > 0 ? bpe_lookup(e, raw, len) : -1;
}

static void bpe_load_merges(BpeEncoder* e, const char* path, const int byte_of_symbol[324]) {
    size_t n;
    char* text = read_whole_file(path, &n);
    BpeMerge* merges = (BpeMerge*)malloc_check((n / 3 + 1) * sizeof(BpeMerge));  // a line has >= 3 bytes
    int count = 0, line_no = 0;
    for (size_t i = 0; i < n; line_no++) {
        size_t end = i;
        while (end < n && text[end] != '\n') end++;
        size_t len = end - i;
        if (len > 0 && text[end - 1] == '\r') len--;
        const char* line = text + i;
        i = end + 1;
        if (len == 0 || (line_no == 0 && line[0] == '#')) continue;  // the "#version: 0.2" line, an empty last line
        const char* space = (const char*)memchr(line, ' ', len);
        if (space == NULL) fatal("'%s' line %d: not a merge \"left right\"", path, line_no + 1);
        int left = bpe_symbols_id(e, line, space - line, byte_of_symbol);
        int right = bpe_symbols_id(e, space + 1, line + len - space - 1, byte_of_symbol);
        if (left < 0 || right < 0)
            fatal("'%s' line %d: a side of the merge is not a token of encoder.json", path, line_no + 1);
        int merged_len = e->len[left] + e->len[right];
        unsigned char* merged = (unsigned char*)malloc_check(merged_len);
        memcpy(merged, e->bytes[left], e->len[left]);
        memcpy(merged + e->len[left], e->bytes[right], e->len[right]);
        int id = bpe_lookup(e, merged, merged_len);
        free(merged);
        if (id < 0) fatal("'%s' line %d: the merged token is not in encoder.json", path, line_no + 1);
        merges[count] = (BpeMerge){.key = (uint64_t)left << 32 | (uint64_t)right, .rank = count, .id = id};
        count++;
    }
    free(text);
    // no merges would encode every text byte by byte, tokens the model never saw in training: an empty
    // (or cut to its first line) vocab.bpe is a broken file, not a tokenizer
    if (count == 0) fatal("'%s' holds no merges (GPT-2's has 50000): an empty or truncated vocab.bpe", path);
    qsort(merges, count, sizeof(BpeMerge), bpe_compare_merges);
    e->n_merges = count;
    e->merge_key = (uint64_t*)malloc_check(count * sizeof(uint64_t));
    e->merge_rank = (int*)malloc_check(count * sizeof(int));
    e->merge_id = (int*)malloc_check(count * sizeof(int));
    for (int k = 0; k < count; k++) {
        if (k > 0 && merges[k].key == merges[k - 1].key) fatal("'%s': a merge is listed twice", path);
        e->merge_key[k] = merges[k].key;
        e->merge_rank[k] = merges[k].rank;
        e->merge_id[k] = merges[k].id;
    }
    free(merges);
}

// Loads DIR/encoder.json and DIR/vocab.bpe
static void bpe_init(BpeEncoder* e, const char* dir) {
    int symbol_of_byte[256], byte_of_symbol[324];
    bpe_byte_symbols(symbol_of_byte);
    for (int s = 0; s < 324; s++) byte_of_symbol[s] = -1;
    for (int b = 0; b < 256; b++) byte_of_symbol[symbol_of_byte[b]] = b;
    char path[4200];
    snprintf(path, sizeof(path), "%s/encoder.json", dir);
    bpe_load_vocabulary(e, path, byte_of_symbol);
    snprintf(path, sizeof(path), "%s/vocab.bpe", dir);
    bpe_load_merges(e, path, byte_of_symbol);
}

static void bpe_free(BpeEncoder* e) {
    for (int id = 0; id < e->V; id++) free(e->bytes[id]);
    free(e->bytes);
    free(e->len);
    free(e->by_bytes);
    free(e->merge_key);
    free(e->merge_rank);
    free(e->merge_id);
}

// ----------------------------------------------------------------------------------------------------
// encoding

// The merge of (left, right): its index in the table, or -1
static int bpe_find_merge(const BpeEncoder* e, int left, int right) {
    uint64_t key = (uint64_t)left << 32 | (uint64_t)right;
    int lo = 0, hi = e->n_merges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (e->merge_key[mid] == key) return mid;
        if (e->merge_key[mid] < key) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

// BPE of one word (bytes w[0..n)): appends its ids to out[*count..]; `parts` is scratch of n ints
static void bpe_encode_word(const BpeEncoder* e, const unsigned char* w, int n, int* parts, int* out, size_t* count) {
    for (int i = 0; i < n; i++) parts[i] = e->byte_id[w[i]];
    while (n > 1) {
        int best = -1;  // the merge of lowest rank among adjacent pairs
        for (int i = 0; i + 1 < n; i++) {
            int m = bpe_find_merge(e, parts[i], parts[i + 1]);
            if (m >= 0 && (best < 0 || e->merge_rank[m] < e->merge_rank[best])) best = m;
        }
        if (best < 0) break;
        int left = (int)(e->merge_key[best] >> 32), right = (int)(e->merge_key[best] & 0xFFFFFFFFu), k = 0;
        for (int i = 0; i < n; i++) {  // every occurrence, left to right, not overlapping
            if (i + 1 < n && parts[i] == left && parts[i + 1] == right) {
                parts[k++] = e->merge_id[best];
                i++;
            } else parts[k++] = parts[i];
        }
        n = k;
    }
    for (int i = 0; i < n; i++) out[(*count)++] = parts[i];
}

// Encodes text[0..n) (UTF-8); returns a malloc'd array of ids and their count in *count
static int* bpe_encode(const BpeEncoder* e, const char* text, size_t n, size_t* count) {
    const unsigned char* s = (const unsigned char*)text;
    int* cp = (int*)malloc_check((n + 1) * sizeof(int));
    int* cls = (int*)malloc_check((n + 1) * sizeof(int));
    size_t* at = (size_t*)malloc_check((n + 1) * sizeof(size_t));  // byte offset of each code point
    int n_cp = 0;
    for (size_t i = 0; i < n; n_cp++) {
        int len;
        cp[n_cp] = utf8_decode(s + i, n - i, &len);
        cls[n_cp] = codepoint_class(cp[n_cp]);
        at[n_cp] = i;
        i += len;
    }
    at[n_cp] = n;
    int* ids = (int*)malloc_check((n + 1) * sizeof(int));  // at most one token per byte
    int* parts = (int*)malloc_check((n + 1) * sizeof(int));
    *count = 0;
    for (int i = 0; i < n_cp;) {
        int len = pretokenize_next(cp, cls, n_cp, i);
        bpe_encode_word(e, s + at[i], (int)(at[i + len] - at[i]), parts, ids, count);
        i += len;
    }
    free(cp);
    free(cls);
    free(at);
    free(parts);
    return ids;
}
