/*
 * tokenizer.h: the GPT-2 decode table, to print sampled text.
 *
 * File, little-endian: 256 int32 header [20240328, version, V, eot_id (version 2)], then for each token
 * id a uint8 byte count and the token's bytes. Encoding text is the job of scripts/prepare_data.py.
 */
#pragma once

#include <ctype.h>

#include "common.h"

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
    if (header[1] != 1 && header[1] != 2) fatal("'%s': unsupported tokenizer version %d (1 or 2 are known)", path, header[1]);
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

// Prints one token. Single bytes that are not printable (parts of a split UTF-8 character, control
// characters) are skipped so the terminal never receives garbage.
static void tokenizer_print(const Tokenizer* tok, int id) {
    if (id < 0 || id >= tok->V) {
        printf("[%d]", id);
        return;
    }
    const char* s = tok->tokens[id];
    if (s[0] != '\0' && s[1] == '\0' && !(isprint((unsigned char)s[0]) || isspace((unsigned char)s[0]))) return;
    fputs(s, stdout);
}
