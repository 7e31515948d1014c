#!/usr/bin/python3
"""
Builds a small multiple-choice eval file in llm.c's format (the format of its hellaswag_val.bin; see
llmc/run/eval.h) from a token file of the default dataset, for testing --eval-data without downloading
HellaSwag.

Each example: a passage's context (--context tokens at a random position of the token file), its true
continuation (the next --completion tokens), and three continuations of the same length taken from
elsewhere in the file (at least --context + --completion tokens away). The true one is placed at a random
position, which is the label. A model that has learned the text picks the true continuation more often
than 1 in 4; an untrained one picks at chance.

No completion starts with the context's last token, and the four start with different tokens: a randomly
initialized GPT-2 (tied embeddings) prefers repeating its input token, and this text repeats tokens often
(runs of spaces and newlines), which let an untrained model score 35% on one-token completions. The default
completion is one token: after the first token, a continuation from elsewhere is as fluent as the true
one, so longer completions dilute the signal; the default job's model scores at chance on 8-token ones.

Usage:
  /usr/bin/python3 scripts/make_eval_data.py --out build/eval_devil.bin [--tokens data/devil_val.bin]
        [--examples 200] [--context 24] [--completion 1] [--seed 1]
Errors print one line and exit with status 1.
"""

import argparse
import random
import struct
import sys

EVAL_MAGIC, EVAL_VERSION = 20240522, 1
TOKENS_MAGIC = 20240520
START_EXAMPLE = 65535


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 1024:
        raise ValueError("%s: shorter than the 1024-byte header" % path)
    magic, version, n = struct.unpack("<3i", data[:12])
    if magic != TOKENS_MAGIC or len(data) != 1024 + 2 * n:
        raise ValueError("%s: not an llm.c token file" % path)
    return list(struct.unpack("<%dH" % n, data[1024:]))


def make_examples(tokens, n_examples, n_ctx, n_comp, rng):
    span = n_ctx + n_comp
    if len(tokens) < 8 * span:
        raise ValueError("the token file is too short for passages of %d tokens" % span)
    examples = []
    for _ in range(n_examples):
        while True:
            p = rng.randrange(len(tokens) - span)
            ctx, true = tokens[p:p + n_ctx], tokens[p + n_ctx:p + span]
            if true[0] != ctx[-1]:
                break
        others = []
        while len(others) < 3:
            q = rng.randrange(len(tokens) - n_comp)
            firsts = [ctx[-1], true[0]] + [o[0] for o in others]
            if abs(q - (p + n_ctx)) >= span and tokens[q] not in firsts:
                others.append(tokens[q:q + n_comp])
        label = rng.randrange(4)
        endings = others[:label] + [true] + others[label:]
        examples.append((label, ctx, endings))
    return examples


def write_evalfile(path, examples):
    """llm.c's layout: 256 int32 header, then per example a uint16 stream (see llmc/run/eval.h)."""
    stream, longest = [], 0
    for index, (label, ctx, endings) in enumerate(examples):
        ex = [START_EXAMPLE, 0, index, label, len(endings), len(ctx)] + ctx
        for e in endings:
            ex += [len(e)] + e
        ex[1] = 2 * len(ex)
        longest = max(longest, ex[1])
        stream += ex
    header = [EVAL_MAGIC, EVAL_VERSION, len(examples), longest] + [0] * 252
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(stream), *stream))


def main():
    ap = argparse.ArgumentParser(description="Multiple-choice eval file (llm.c format) from a token file.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="data/devil_val.bin")
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--context", type=int, default=24)
    ap.add_argument("--completion", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    try:
        if args.examples < 1 or args.context < 1 or args.completion < 1:
            raise ValueError("--examples, --context and --completion must be positive")
        examples = make_examples(read_tokens(args.tokens), args.examples, args.context, args.completion,
                                 random.Random(args.seed))
        write_evalfile(args.out, examples)
    except (OSError, ValueError) as e:
        print("make_eval_data.py: error: %s" % e, file=sys.stderr)
        return 1
    print("wrote %s: %d examples, context %d, completions %d tokens" % (args.out, len(examples), args.context,
                                                                      args.completion))
    return 0


if __name__ == "__main__":
    sys.exit(main())
