#!/usr/bin/python3
"""
Data preparation: text -> GPT-2 tokens -> llm.c token shards (PREFIX_train.bin, PREFIX_val.bin), and the
decode table that train_gpt uses to print generated text (data/gpt2_tokenizer.bin).

Why it exists: train_gpt reads only tokens, never text. This script is the one place where text becomes
tokens, with the GPT-2 tokenizer of scripts/gpt2_tokenizer.py (standard library + python3-regex), and it
is deterministic: the same input gives byte-identical files (scripts/check_data.sh relies on that).

Usage (run with Debian's Python, which has python3-regex):
  /usr/bin/python3 scripts/prepare_data.py --input FILE --out-prefix PREFIX [--val-fraction 0.1]
        [--vocab-dir data] [--documents file|paragraphs] [--devil] [--write-decode-table PATH]

  The default dataset of this repository (what scripts/check_data.sh rebuilds):
  /usr/bin/python3 scripts/prepare_data.py --devil --input /usr/share/dictd/devil.dict.dz \\
        --out-prefix data/devil --write-decode-table data/gpt2_tokenizer.bin

Input: a UTF-8 text file, or a gzip file of one (detected by its magic bytes 1f 8b; dictzip .dz files
are gzip files). The text is cut into documents, every document is written as <|endoftext|> (50256)
followed by its tokens, as llm.c's data preparation does, and documents go either to train or to val:
  --documents file        (default) the text is one document; its last --val-fraction (by characters,
                          cut after a newline when there is one) becomes a second document, for val.
  --documents paragraphs  documents are the paragraphs between blank lines; see "val split" below.
  --devil                 the input is The Devil's Dictionary as packaged for dictd (Debian dict-devil):
                          the dictd metadata is dropped and every dictionary entry is a document (the
                          title page and preface at the top are one more document).
Val split (paragraphs, devil): evenly spaced documents, document i (from 0) is in val when
floor((i+1)·f) > floor(i·f) for f = --val-fraction; with f = 0.1 that is documents 9, 19, 29, ...

File formats (little-endian; the same as llm.c, see "File formats" in README.md):
  tokens:       256 int32 header [20240520, 1, n_tokens, 0, ...], then n_tokens uint16 ids.
  decode table: 256 int32 header [20240328, 2, V=50257, eot_id=50256, 0, ...], then for each id 0..V-1
                a uint8 byte length followed by the raw bytes of that token.

Errors (missing or unreadable input, text that is not UTF-8...) print one line and exit with status 1.
"""

import argparse
import array
import gzip
import os
import re
import sys
from fractions import Fraction

sys.dont_write_bytecode = True          # keep scripts/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_tokenizer import DEFAULT_VOCAB_DIR, EOT_ID, VOCAB_SIZE, GPT2Tokenizer  # noqa: E402
from token_files import (DECODE_TABLE_MAGIC, DECODE_TABLE_VERSION, TOKENS_MAGIC, TOKENS_VERSION,  # noqa: E402
                         DataError, header, write_atomically)


# ----------------------------------------------------------------------------------------------------
# reading

def read_text(path):
    """The file's text; gunzipped first when it starts with the gzip magic bytes."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError("cannot read %s: %s" % (path, e.strerror or e))
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, ValueError) as e:
            raise DataError("%s looks like gzip but cannot be decompressed: %s" % (path, e))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError("%s is not UTF-8 text (byte %d)" % (path, e.start))
    return text[1:] if text.startswith("\ufeff") else text   # drop a byte order mark


# ----------------------------------------------------------------------------------------------------
# cutting text into documents

# The Devil's Dictionary as dictfmt packaged it (zcat /usr/share/dictd/devil.dict.dz | head -80):
#   00-database-dictfmt-1.13.0                        \  dictd metadata: format version, url,
#   http://wiretap.area.com/Gopher/...devils.txt       | short name, and the info text whose first
#   00-database-short                                  | two paragraphs are the packager's notice
#        The Devil's Dictionary (1881-1906)            | ("The original data is available from...",
#   The original data is available from: ...          /   "...under the same conditions...")
#               The Internet Wiretap 1st Online Edition of      <- the book starts here: title page
#                         THE DEVIL'S DICTIONARY ...               and PREFACE (indented paragraphs)
#   ABASEMENT, n.  A decent and customary mental ...               <- first entry
#   ...
#   ZOOLOGY, n.  The science and history ...                       <- last entry
#    abcdefghijklmnopqrstuvwxyz                                    <- metadata: 00-database-alphabet
DEVIL_BOOK_START = "The Internet Wiretap 1st Online Edition of"
DEVIL_ALPHABET_LINE = " abcdefghijklmnopqrstuvwxyz"
# An entry starts, after a blank line, at column 0 with an upper-case headword: "ABASEMENT, n.",
# "BLANK-VERSE, n.", "ABRACADABRA.", "CUI BONO?", "LL.D.", "I is the first letter ...", "W (double U)".
# Continuation paragraphs and verse inside an entry are indented or start with a lower-case word.
DEVIL_ENTRY_START = re.compile(r"[A-Z][A-Z'.-]*(?=[ ,?]|$)")


def devil_documents(text):
    """The front matter (title page and preface) and then one document per dictionary entry."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == DEVIL_BOOK_START), None)
    if start is None or not any(line.startswith("00-database-") for line in lines[:start]):
        raise DataError("--devil: the input does not look like devil.dict.dz (no dictd header followed "
                        "by '%s')" % DEVIL_BOOK_START)
    while lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[-1] != DEVIL_ALPHABET_LINE:
        raise DataError("--devil: the input does not end with the dictd alphabet line")
    body = lines[start:-1]

    docs, current, after_blank = [], [], True
    for line in body:
        if after_blank and DEVIL_ENTRY_START.match(line) and current:
            docs.append(current)
            current = []
        current.append(line)
        after_blank = line.strip() == ""
    docs.append(current)
    # Each document: its lines without the blank lines around it, ending with one newline
    return ["\n".join(doc).strip("\n") + "\n" for doc in docs]


def paragraph_documents(text):
    """Paragraphs separated by blank lines (lines holding only whitespace count as blank)."""
    return [p.strip("\n") + "\n" for p in re.split(r"\n[ \t\r\f\v]*\n", text) if p.strip()]


def is_val_document(i, fraction):
    """Evenly spaced val documents: i is in val when floor((i+1)·f) > floor(i·f)."""
    return ((i + 1) * fraction) // 1 > (i * fraction) // 1


# ----------------------------------------------------------------------------------------------------
# writing

def write_tokens(path, tokens):
    ids = array.array("H", tokens)            # uint16: every GPT-2 id (< 50257) fits
    if sys.byteorder == "big":
        ids.byteswap()
    write_atomically(path, [header(TOKENS_MAGIC, TOKENS_VERSION, len(tokens)), ids.tobytes()])


def write_decode_table(path, tok):
    chunks = [header(DECODE_TABLE_MAGIC, DECODE_TABLE_VERSION, VOCAB_SIZE, EOT_ID)]
    for token_id in range(VOCAB_SIZE):
        b = tok.token_bytes(token_id)
        assert 0 < len(b) < 256, "token %d has %d bytes" % (token_id, len(b))
        chunks.append(bytes([len(b)]) + b)
    write_atomically(path, chunks)


# ----------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(
        description="Tokenize a text file with GPT-2 BPE into llm.c token shards (see the file's docstring).")
    parser.add_argument("--input", help="UTF-8 text file, or a gzip of one")
    parser.add_argument("--out-prefix", help="writes PREFIX_train.bin and PREFIX_val.bin")
    parser.add_argument("--val-fraction", type=str, default="0.1",
                        help="share of the data that goes to val, in [0, 1) (default 0.1)")
    parser.add_argument("--vocab-dir", default=DEFAULT_VOCAB_DIR,
                        help="folder with encoder.json and vocab.bpe (default: data/ of this repository)")
    parser.add_argument("--documents", choices=["file", "paragraphs"], default="file",
                        help="what a document is, for plain text input (default: the whole file)")
    parser.add_argument("--devil", action="store_true",
                        help="the input is /usr/share/dictd/devil.dict.dz: one document per entry")
    parser.add_argument("--write-decode-table", metavar="PATH",
                        help="also write the token decode table (e.g. data/gpt2_tokenizer.bin)")
    args = parser.parse_args()
    if args.out_prefix is None and args.write_decode_table is None:
        parser.error("nothing to do: give --out-prefix (with --input) and/or --write-decode-table")
    if args.out_prefix is not None and args.input is None:
        parser.error("--out-prefix needs --input")
    try:
        fraction = Fraction(args.val_fraction)     # exact, so the split never depends on float rounding
    except (ValueError, ZeroDivisionError):
        parser.error("--val-fraction: not a number: %s" % args.val_fraction)
    if not 0 <= fraction < 1:
        parser.error("--val-fraction must be in [0, 1)")

    try:
        try:
            tok = GPT2Tokenizer(args.vocab_dir)
        except (OSError, ValueError, RuntimeError) as e:
            raise DataError("cannot load the GPT-2 vocabulary from %s: %s" % (args.vocab_dir, e))

        if args.write_decode_table:
            write_decode_table(args.write_decode_table, tok)
            print("wrote %s (%d tokens, eot %d)" % (args.write_decode_table, VOCAB_SIZE, EOT_ID))
        if args.out_prefix is None:
            return 0

        text = read_text(args.input)
        if args.devil:
            docs = devil_documents(text)
            in_val = [is_val_document(i, fraction) for i in range(len(docs))]
        elif args.documents == "paragraphs":
            docs = paragraph_documents(text)
            in_val = [is_val_document(i, fraction) for i in range(len(docs))]
        else:
            # one document; its tail (from a line start) becomes the val document
            cut = len(text) - int(len(text) * fraction)
            newline = text.rfind("\n", 0, cut)
            if cut < len(text) and newline >= 0:
                cut = newline + 1
            docs, in_val = [], []
            for part, is_val in ((text[:cut], False), (text[cut:], True)):
                if part:
                    docs.append(part)
                    in_val.append(is_val)
        if not docs:
            raise DataError("%s holds no text" % args.input)

        train, val = [], []
        n_val_docs = 0
        for doc, is_val in zip(docs, in_val):
            ids = tok.encode(doc)
            if tok.decode(ids) != doc:            # cannot happen with byte-level BPE; cheap to check
                raise DataError("tokenizer roundtrip failed on a document")
            (val if is_val else train).extend([EOT_ID] + ids)
            n_val_docs += is_val
        write_tokens(args.out_prefix + "_train.bin", train)
        write_tokens(args.out_prefix + "_val.bin", val)
        print("%s: %d documents (%d train, %d val), %d characters" %
              (args.input, len(docs), len(docs) - n_val_docs, n_val_docs, len(text)))
        print("wrote %s_train.bin (%d tokens)" % (args.out_prefix, len(train)))
        print("wrote %s_val.bin (%d tokens)" % (args.out_prefix, len(val)))
    except DataError as e:
        print("prepare_data.py: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
