#!/usr/bin/python3
"""
The learner model's data: the default dataset (The Devil's Dictionary in GPT-2 tokens, data/) rewritten
as bytes, one token per byte, with its decode table. `train_gpt --model-preset learner` trains on it.

Why it exists: the learner model (llmc/run/cli.h, docs/data_parallel.md) has a vocabulary of 256 so
that its transformer layers, not its embedding, hold the parameters: that is the shape on which ZeRO's
savings and even pipeline stages show. GPT-2's 50257 token ids do not fit such a vocabulary; the bytes of
the same text do. The text is ASCII, so a byte is a character; byte 0 never occurs in it and serves as
the end-of-text token that starts every document, as 50256 does in data/devil_*.bin. The files are
derived from the committed ones, deterministically, so they go under build/ (made again at will).

Usage, from anywhere:
  /usr/bin/python3 scripts/learner_data.py [--data data] [--out build/learner]
writes OUT/train.bin and OUT/val.bin (tokens) and OUT/tokenizer.bin (decode table: id i is byte i, id 0
end-of-text). The model's samples print as text; --prompt does not apply (it encodes GPT-2 tokens).

File formats: those of scripts/prepare_data.py (llm.c's). Standard library only. Errors print one line
and exit with status 1.
"""

import argparse
import array
import os
import struct
import sys

sys.dont_write_bytecode = True  # keep scripts/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from token_files import (DECODE_TABLE_MAGIC, DECODE_TABLE_VERSION, HEADER_INTS, TOKENS_MAGIC, TOKENS_VERSION,  # noqa: E402
                         DataError, header, write_atomically)

GPT2_EOT, EOT, VOCAB = 50256, 0, 256
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_file(path, magic, what):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError("cannot read %s: %s" % (path, e.strerror or e))
    if len(data) < 4 * HEADER_INTS or struct.unpack("<i", data[:4])[0] != magic:
        raise DataError("%s is no %s (its header is not magic %d)" % (path, what, magic))
    return struct.unpack("<%di" % HEADER_INTS, data[:4 * HEADER_INTS]), data[4 * HEADER_INTS:]


def read_decode_table(path):
    """The bytes of each GPT-2 token (version 2 decode table, as prepare_data.py writes it)."""
    head, body = read_file(path, DECODE_TABLE_MAGIC, "decode table")
    tokens, pos = [], 0
    for _ in range(head[2]):
        n = body[pos]
        tokens.append(body[pos + 1:pos + 1 + n])
        pos += 1 + n
    return tokens


def to_bytes(path, table):
    """The token file's documents as byte tokens: each GPT-2 end-of-text becomes EOT, each token its bytes."""
    head, body = read_file(path, TOKENS_MAGIC, "token file")
    ids = array.array("H", body[:2 * head[2]])
    if sys.byteorder == "big":
        ids.byteswap()
    out = bytearray()
    for i in ids:
        if i == GPT2_EOT:
            out.append(EOT)
        elif 0 in table[i]:  # (ASCII text never has it: it would read as end-of-text)
            raise DataError("%s: token %d holds byte 0, the learner's end-of-text" % (path, i))
        else:
            out += table[i]
    return out


def main():
    parser = argparse.ArgumentParser(description="Write the learner model's data (see the docstring).")
    parser.add_argument("--data", default=os.path.join(ROOT, "data"),
                        help="folder of devil_{train,val}.bin, gpt2_tokenizer.bin (default: the repository's data/)")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "learner"),
                        help="folder for train.bin, val.bin, tokenizer.bin (default: the repository's build/learner/)")
    args = parser.parse_args()
    try:
        table = read_decode_table(os.path.join(args.data, "gpt2_tokenizer.bin"))
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            raise DataError("cannot create %s: %s" % (args.out, e.strerror or e))
        for split in ("train", "val"):
            tokens = to_bytes(os.path.join(args.data, "devil_%s.bin" % split), table)
            path = os.path.join(args.out, split + ".bin")
            ids = array.array("H", list(tokens))  # uint16, as every token file (a list: from bytes, array reads pairs)
            if sys.byteorder == "big":
                ids.byteswap()
            write_atomically(path, [header(TOKENS_MAGIC, TOKENS_VERSION, len(ids)), ids.tobytes()])
            print("wrote %s (%d tokens, %d documents)" % (path, len(ids), tokens.count(EOT)))
        entries = [bytes([0])] + [bytes([1, i]) for i in range(1, VOCAB)]  # (end-of-text has no bytes)
        path = os.path.join(args.out, "tokenizer.bin")
        write_atomically(path, [header(DECODE_TABLE_MAGIC, DECODE_TABLE_VERSION, VOCAB, EOT)] + entries)
        print("wrote %s (%d tokens: byte i is token i, end-of-text %d)" % (path, VOCAB, EOT))
    except DataError as e:
        print("learner_data.py: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
