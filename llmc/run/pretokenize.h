/*
 * pretokenize.h: GPT-2's pre-tokenizer, which cuts a text into the words that BPE (llmc/run/bpe.h) then
 * encodes one by one (BPE never crosses words), and the UTF-8 decoding and character classes it needs.
 *
 * At each position GPT-2's pattern tries, in this order:
 *   's 't 're 've 'm 'll 'd | ' '?letters | ' '?numbers | ' '?(not space, letter or number)+
 *   | whitespace not followed by a non-space (a run but its last character, when more follows)
 *   | whitespace
 * (the regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+).
 *
 * Character classes, and where they are approximate: ASCII is exact. Whitespace is exact everywhere (the
 * 25 code points of Python's \s). Letters (\p{L}) and numbers (\p{N}) are exact in the blocks listed in
 * CODEPOINT_CLASSES below (Latin-1, Latin Extended, IPA, spacing modifiers, combining diacritics, Greek
 * to U+036F, general punctuation to miscellaneous symbols U+2000-U+2BFF, CJK punctuation, small and
 * fullwidth forms, emoji U+1F000-U+1FAFF): that table was generated from Python's `regex` module, and
 * tests/sampling.sh checks every code point of those blocks against scripts/gpt2_tokenizer.py. Every
 * other non-ASCII code point counts as a letter: right for the letters of alphabetic scripts and for CJK
 * ideographs, wrong for their digits, punctuation and combining marks (e.g. Devanagari vowel signs,
 * Arabic-Indic digits), where a word may be cut differently from tiktoken's (the text still round-trips:
 * any split gives valid tokens, only not the same ones). Bytes that are not valid UTF-8 count as "other".
 */
#pragma once

#include "../common.h"  // fatal

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

