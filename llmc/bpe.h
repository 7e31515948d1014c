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
 *   1. Pre-tokenize into words with GPT-2's pattern, tried in this order at each position:
 *        's 't 're 've 'm 'll 'd | ' '?letters | ' '?numbers | ' '?(not space, letter or number)+
 *        | whitespace not followed by a non-space (a run but its last character, when more follows)
 *        | whitespace
 *      (the regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+).
 *   2. Per word, start from its single bytes and repeatedly merge every occurrence (left to right) of the
 *      adjacent pair with the lowest rank, until no adjacent pair is a merge. BPE never crosses words.
 *
 * Character classes, and where they are approximate: ASCII is exact. Whitespace is exact everywhere (the
 * 25 code points of Python's \s). Letters (\p{L}) and numbers (\p{N}) are exact in the blocks listed in
 * CODEPOINT_CLASSES below (Latin-1, Latin Extended, IPA, spacing modifiers, combining diacritics, Greek
 * to U+036F, general punctuation to miscellaneous symbols U+2000-U+2BFF, CJK punctuation, small and
 * fullwidth forms, emoji U+1F000-U+1FAFF): that table was generated from Python's `regex` module, and
 * scripts/test_bpe.sh checks every code point of those blocks against scripts/gpt2_tokenizer.py. Every
 * other non-ASCII code point counts as a letter: right for the letters of alphabetic scripts and for CJK
 * ideographs, wrong for their digits, punctuation and combining marks (e.g. Devanagari vowel signs,
 * Arabic-Indic digits), where a word may be cut differently from tiktoken's (the text still round-trips:
 * any split gives valid tokens, only not the same ones). Bytes that are not valid UTF-8 count as "other".
 */
#pragma once

#include "common.h"

enum { CP_LETTER, CP_NUMBER, CP_SPACE, CP_OTHER };

// Non-letter classes of the non-ASCII blocks named above (generated from Python's regex module; code
// points of those blocks not listed are letters)
static const struct { int lo, hi, cls; } CODEPOINT_CLASSES[] = {
    {0x80, 0x84, CP_OTHER}, {0x85, 0x85, CP_SPACE}, {0x86, 0x9F, CP_OTHER}, {0xA0, 0xA0, CP_SPACE},
    {0xA1, 0xA9, CP_OTHER}, {0xAB, 0xB1, CP_OTHER}, {0xB2, 0xB3, CP_NUMBER}, {0xB4, 0xB4, CP_OTHER},
    {0xB6, 0xB8, CP_OTHER}, {0xB9, 0xB9, CP_NUMBER}, {0xBB, 0xBB, CP_OTHER}, {0xBC, 0xBE, CP_NUMBER},
    {0xBF, 0xBF, CP_OTHER}, {0xD7, 0xD7, CP_OTHER}, {0xF7, 0xF7, CP_OTHER}, {0x2C2, 0x2C5, CP_OTHER},
    {0x2D2, 0x2DF, CP_OTHER}, {0x2E5, 0x2EB, CP_OTHER}, {0x2ED, 0x2ED, CP_OTHER}, {0x2EF, 0x36F, CP_OTHER},
    {0x1680, 0x1680, CP_SPACE}, {0x2000, 0x200A, CP_SPACE}, {0x200B, 0x2027, CP_OTHER}, {0x2028, 0x2029, CP_SPACE},
    {0x202A, 0x202E, CP_OTHER}, {0x202F, 0x202F, CP_SPACE}, {0x2030, 0x205E, CP_OTHER}, {0x205F, 0x205F, CP_SPACE},
    {0x2060, 0x206F, CP_OTHER}, {0x2070, 0x2070, CP_NUMBER}, {0x2072, 0x2073, CP_OTHER}, {0x2074, 0x2079, CP_NUMBER},
    {0x207A, 0x207E, CP_OTHER}, {0x2080, 0x2089, CP_NUMBER}, {0x208A, 0x208F, CP_OTHER}, {0x209D, 0x2101, CP_OTHER},
    {0x2103, 0x2106, CP_OTHER}, {0x2108, 0x2109, CP_OTHER}, {0x2114, 0x2114, CP_OTHER}, {0x2116, 0x2118, CP_OTHER},
    {0x211E, 0x2123, CP_OTHER}, {0x2125, 0x2125, CP_OTHER}, {0x2127, 0x2127, CP_OTHER}, {0x2129, 0x2129, CP_OTHER},
    {0x212E, 0x212E, CP_OTHER}, {0x213A, 0x213B, CP_OTHER}, {0x2140, 0x2144, CP_OTHER}, {0x214A, 0x214D, CP_OTHER},
    {0x214F, 0x214F, CP_OTHER}, {0x2150, 0x2182, CP_NUMBER}, {0x2185, 0x2189, CP_NUMBER}, {0x218A, 0x245F, CP_OTHER},
    {0x2460, 0x249B, CP_NUMBER}, {0x249C, 0x24E9, CP_OTHER}, {0x24EA, 0x24FF, CP_NUMBER}, {0x2500, 0x2775, CP_OTHER},
    {0x2776, 0x2793, CP_NUMBER}, {0x2794, 0x2BFF, CP_OTHER}, {0x3000, 0x3000, CP_SPACE}, {0x3001, 0x3004, CP_OTHER},
    {0x3007, 0x3007, CP_NUMBER}, {0x3008, 0x3020, CP_OTHER}, {0x3021, 0x3029, CP_NUMBER}, {0x302A, 0x3030, CP_OTHER},
    {0x3036, 0x3037, CP_OTHER}, {0x3038, 0x303A, CP_NUMBER}, {0x303D, 0x303F, CP_OTHER}, {0xFE30, 0xFE6F, CP_OTHER},
    {0xFF00, 0xFF0F, CP_OTHER}, {0xFF10, 0xFF19, CP_NUMBER}, {0xFF1A, 0xFF20, CP_OTHER}, {0xFF3B, 0xFF40, CP_OTHER},
    {0xFF5B, 0xFF65, CP_OTHER}, {0xFFBF, 0xFFC1, CP_OTHER}, {0xFFC8, 0xFFC9, CP_OTHER}, {0xFFD0, 0xFFD1, CP_OTHER},
    {0xFFD8, 0xFFD9, CP_OTHER}, {0xFFDD, 0xFFEF, CP_OTHER}, {0x1F000, 0x1F0FF, CP_OTHER},
    {0x1F100, 0x1F10C, CP_NUMBER}, {0x1F10D, 0x1FAFF, CP_OTHER},
};

static int codepoint_class(int cp) {
    if (cp < 0) return CP_OTHER;  // an invalid UTF-8 byte
    if (cp < 128) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CP_LETTER;
        if (cp >= '0' && cp <= '9') return CP_NUMBER;
        if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return CP_SPACE;
        return CP_OTHER;
    }
    int lo = 0, hi = (int)(sizeof(CODEPOINT_CLASSES) / sizeof(CODEPOINT_CLASSES[0])) - 1;
    while (lo <= hi) {  // binary search of the sorted, disjoint ranges
        int mid = (lo + hi) / 2;
        if (cp < CODEPOINT_CLASSES[mid].lo) hi = mid - 1;
        else if (cp > CODEPOINT_CLASSES[mid].hi) lo = mid + 1;
        else return CODEPOINT_CLASSES[mid].cls;
    }
    return CP_LETTER;
}

// Decodes the UTF-8 character at s[0..n): its code point (-1 for an invalid byte) and its length in bytes
static int utf8_decode(const unsigned char* s, size_t n, int* len) {
    int need = s[0] < 0x80 ? 0 : (s[0] & 0xE0) == 0xC0 ? 1 : (s[0] & 0xF0) == 0xE0 ? 2 : (s[0] & 0xF8) == 0xF0 ? 3 : -1;
    *len = 1;
    if (need == 0) return s[0];
    if (need < 0 || (size_t)need >= n) return -1;
    int cp = s[0] & (0x3F >> need);
    for (int i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const int smallest[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < smallest[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;  // overlong, surrogate
    *len = need + 1;
    return cp;
}

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

static const BpeEncoder* bpe_sort_context;  // qsort has no context argument
static int bpe_compare_ids(const void* x, const void* y) {
    const BpeEncoder* e = bpe_sort_context;
    int a = *(const int*)x, b = *(const int*)y;
    return bytes_compare(e->bytes[a], e->len[a], e->bytes[b], e->len[b]);
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
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
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
                    if (j->i + 2 > j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u') json_error(j, "a lone surrogate");
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
    if (j->i == start || (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')) json_error(j, "expected a token id (0..999999999)");
    return v;
}

// ----------------------------------------------------------------------------------------------------
// loading

static void bpe_load_vocabulary(BpeEncoder* e, const char* path, const int byte_of_symbol[324]) {
    size_t n;
    char* text = read_whole_file(path, &n);
    JsonCursor j = {text, n, 0, path};
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
    e->by_bytes = (int*)malloc_check(e->V * sizeof(int));
    for (int id = 0; id < e->V; id++) e->by_bytes[id] = id;
    bpe_sort_context = e;
    qsort(e->by_bytes, e->V, sizeof(int), bpe_compare_ids);
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
        if (left < 0 || right < 0) fatal("'%s' line %d: a side of the merge is not a token of encoder.json", path, line_no + 1);
        int merged_len = e->len[left] + e->len[right];
        unsigned char* merged = (unsigned char*)malloc_check(merged_len);
        memcpy(merged, e->bytes[left], e->len[left]);
        memcpy(merged + e->len[left], e->bytes[right], e->len[right]);
        int id = bpe_lookup(e, merged, merged_len);
        free(merged);
        if (id < 0) fatal("'%s' line %d: the merged token is not in encoder.json", path, line_no + 1);
        merges[count] = (BpeMerge){(uint64_t)left << 32 | (uint64_t)right, count, id};
        count++;
    }
    free(text);
    qsort(merges, count, sizeof(BpeMerge), bpe_compare_merges);
    e->n_merges = count;
    e->merge_key = (uint64_t*)malloc_check(count * sizeof(uint64_t));
    e->merge_rank = (int*)malloc_check(count * sizeof(int));
    e->merge_id = (int*)malloc_check(count * sizeof(int));
    for (int k = 0; k < count; k++) {
        if (k > 0 && merges[k].key == merges[k - 1].key) fatal("'%s': a merge is listed twice", path);
        e->merge_key[k] = merges[k].key, e->merge_rank[k] = merges[k].rank, e->merge_id[k] = merges[k].id;
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
    free(e->bytes), free(e->len), free(e->by_bytes), free(e->merge_key), free(e->merge_rank), free(e->merge_id);
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
            if (i + 1 < n && parts[i] == left && parts[i + 1] == right) parts[k++] = e->merge_id[best], i++;
            else parts[k++] = parts[i];
        }
        n = k;
    }
    for (int i = 0; i < n; i++) out[(*count)++] = parts[i];
}

// Length in code points of the word starting at code point i of the text (cp, cls: its code points and
// their classes, n of them): GPT-2's pre-tokenizer pattern, alternatives in order
static int pretokenize_next(const int* cp, const int* cls, int n, int i) {
    if (cp[i] == '\'' && i + 1 < n) {  // 's 't 're 've 'm 'll 'd (lower case only, as the pattern)
        int a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    int start = cp[i] == ' ' && i + 1 < n && cls[i + 1] != CP_SPACE ? i + 1 : i;  // ' '?letters|numbers|other
    if (cls[start] != CP_SPACE) {
        int j = start + 1;
        while (j < n && cls[j] == cls[start]) j++;
        return j - i;
    }
    int j = i;  // whitespace: all of it at the end of the text, else all but the last before a non-space
    while (j < n && cls[j] == CP_SPACE) j++;
    if (j == n || j - i == 1) return j - i;
    return j - i - 1;
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
    free(cp), free(cls), free(at), free(parts);
    return ids;
}
