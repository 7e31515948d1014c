/*
 * tokenizer.h: the GPT-2 decode table, to print sampled text.
 *
 * File, little-endian: 256 int32 header [20240328, version, V, eot_id (version 2)], then for each token
 * id a uint8 byte count and the token's bytes. Encoding text is the job of scripts/prepare_data.py.
 */
#pragma once

#include "../common.h"  // fatal, checked file calls

#define TOKENIZER_MAGIC 20240328

typedef struct {
    int V;
    int eot;
    char** tokens;  // NUL-terminated byte strings
} Tokenizer;

static void tokenizer_init(Tokenizer* tok, const char* path) {
    int header[256];
    long long size;
    FILE* f = open_with_header(path, TOKENIZER_MAGIC, "tokenizer file", header, &size);
    if (header[1] != 1 && header[1] != 2)
        fatal("'%s': unsupported tokenizer version %d (1 or 2 are known)", path, header[1]);
    tok->V = header[2];
    if (tok->V < 1 || tok->V > 65536) fatal("'%s': implausible vocabulary size %d", path, tok->V);
    tok->eot = header[1] == 2 ? header[3] : 50256;
    tok->tokens = (char**)malloc_check(tok->V * sizeof(char*));
    for (int i = 0; i < tok->V; i++) {
        unsigned char len;
        fread_check(&len, 1, 1, f, path);
        tok->tokens[i] = (char*)malloc_check(len + 1);
        fread_check(tok->tokens[i], 1, len, f, path);
        tok->tokens[i][len] = '\0';
    }
    fclose(f);
}

static void tokenizer_free(Tokenizer* tok) {
    for (int i = 0; i < tok->V; i++) free(tok->tokens[i]);
    free(tok->tokens);
}

// Prints one token. A lone byte of a split UTF-8 character is skipped (it is no character on its own),
// and a control character other than newline and tab is printed as a visible escape (ESC as \x1b, and
// the C1 controls U+0080 to U+009F, CSI among them, as \xc2\x9b): the decode table comes from a file,
// and an escape sequence in it would otherwise reach the terminal and drive it (colors, cursor moves,
// the window title), whether stdout is a terminal now or a saved output shown on one later.
static void tokenizer_print(const Tokenizer* tok, int id) {
    if (id < 0 || id >= tok->V) {
        printf("[%d]", id);
        return;
    }
    const unsigned char* s = (const unsigned char*)tok->tokens[id];
    if (s[0] >= 0x80 && s[1] == '\0') return;
    for (; *s; s++) {
        if (s[0] == 0xc2 && s[1] >= 0x80 && s[1] <= 0x9f) {
            printf("\\x%02x\\x%02x", s[0], s[1]);
            s++;
        } else if ((*s < 0x20 && *s != '\n' && *s != '\t') || *s == 0x7f) printf("\\x%02x", *s);
        else putchar(*s);
    }
}
