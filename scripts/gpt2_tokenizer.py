#!/usr/bin/python3
"""
GPT-2 byte-level BPE tokenizer, self-contained: the Python standard library plus the `regex` module
(Debian package python3-regex, needed for the \\p{L} / \\p{N} Unicode classes of the pre-tokenizer).
No numpy, no tiktoken, nothing downloaded: the vocabulary is read from data/encoder.json and data/vocab.bpe.

Why it exists: scripts/prepare_data.py turns text into the uint16 token shards that train_gpt reads, and
writes the decode table (data/gpt2_tokenizer.bin) that train_gpt uses to print samples. Both must use
exactly the ids of OpenAI's GPT-2 tokenizer, so that llm.c's files and ours are interchangeable.

How GPT-2 tokenizes a string:
  1. Pre-tokenize: split the text into "words" with the regex PRETOKENIZE_PATTERN (contractions, letters
     with an optional leading space, digits, punctuation runs, whitespace). BPE never merges across words.
  2. Bytes to symbols: encode each word as UTF-8 and map every byte to one printable Unicode character
     (BYTE_TO_SYMBOL), so that a token is a plain string and the space byte shows up as 'Ġ'.
  3. BPE: start from single symbols and repeatedly merge the adjacent pair with the lowest merge rank
     (its line in vocab.bpe), until no adjacent pair has a rank.
  4. Look every resulting symbol string up in encoder.json to get its id.
Decoding is the reverse of 2 and 4: ids -> symbol strings -> bytes -> UTF-8 text.

Command line (handy for checks):
  /usr/bin/python3 scripts/gpt2_tokenizer.py encode "Hello world"      # prints 15496 995
  /usr/bin/python3 scripts/gpt2_tokenizer.py decode 15496 995          # prints Hello world
  /usr/bin/python3 scripts/gpt2_tokenizer.py selftest [FILE]           # known encodings + roundtrip
"""

import json
import os
import sys

try:
    import regex
except ImportError:  # pragma: no cover - depends on the machine
    regex = None

EOT_ID = 50256                 # <|endoftext|>, the document separator
EOT_TEXT = "<|endoftext|>"
VOCAB_SIZE = 50257             # 256 byte tokens + 50000 merges + <|endoftext|>

# GPT-2's pre-tokenizer (the regex module is required: the standard `re` has no \p{...} classes)
PRETOKENIZE_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The data/ folder of this repository (scripts/../data), the default place of encoder.json and vocab.bpe
DEFAULT_VOCAB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data")


def make_byte_to_symbol():
    """The byte -> printable character table of GPT-2.

    The 188 bytes that are already visible, non-space Latin-1 characters ('!'..'~', '¡'..'¬', '®'..'ÿ')
    stand for themselves. The remaining 68 bytes (control codes, space, DEL, NBSP, soft hyphen...) get the
    characters U+0100, U+0101, ... in increasing byte order. So the space byte 0x20, the 33rd unprintable
    byte, becomes U+0120 'Ġ' and the newline 0x0A becomes U+010A 'Ċ'.
    """
    visible = set(range(ord("!"), ord("~") + 1))
    visible |= set(range(ord("¡"), ord("¬") + 1))
    visible |= set(range(ord("®"), ord("ÿ") + 1))
    table = {}
    n_shifted = 0
    for b in range(256):
        if b in visible:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n_shifted)
            n_shifted += 1
    return table


BYTE_TO_SYMBOL = make_byte_to_symbol()
SYMBOL_TO_BYTE = {s: b for b, s in BYTE_TO_SYMBOL.items()}


class GPT2Tokenizer:
    """Encoder/decoder for GPT-2 ids. encode() treats '<|endoftext|>' in the text as ordinary text (like
    tiktoken's encode_ordinary); put EOT_ID between documents yourself."""

    def __init__(self, vocab_dir=DEFAULT_VOCAB_DIR):
        if regex is None:
            raise RuntimeError("the Python module 'regex' is missing (Debian package python3-regex)")
        encoder_path = os.path.join(vocab_dir, "encoder.json")
        merges_path = os.path.join(vocab_dir, "vocab.bpe")
        with open(encoder_path, "r", encoding="utf-8") as f:
            self.symbol_to_id = json.load(f)             # e.g. "Ġthe" -> 262
        with open(merges_path, "r", encoding="utf-8") as f:
            lines = f.read().split("\n")
        # line 0 is "#version: 0.2"; then one merge "left right" per line, best (rank 0) first
        merges = [tuple(line.split(" ")) for line in lines[1:] if line]
        self.merge_rank = {pair: rank for rank, pair in enumerate(merges)}
        self.id_to_symbol = {i: s for s, i in self.symbol_to_id.items()}
        if len(self.symbol_to_id) != VOCAB_SIZE or len(self.id_to_symbol) != VOCAB_SIZE:
            raise RuntimeError("%s: expected %d distinct tokens" % (encoder_path, VOCAB_SIZE))
        if self.symbol_to_id.get(EOT_TEXT) != EOT_ID:
            raise RuntimeError("%s: %s is not id %d" % (encoder_path, EOT_TEXT, EOT_ID))
        self.pretokenizer = regex.compile(PRETOKENIZE_PATTERN)
        self.cache = {}                                   # word (str) -> list of ids

    def bpe(self, symbols):
        """Merge a word, given as a string of byte symbols, into its BPE tokens (a list of strings)."""
        parts = list(symbols)
        while len(parts) > 1:
            # the adjacent pair with the lowest rank (ties cannot happen: a pair has one rank)
            best_rank, best_pair = None, None
            for pair in zip(parts, parts[1:]):
                rank = self.merge_rank.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_pair = rank, pair
            if best_pair is None:
                break
            # merge every occurrence of that pair, scanning left to right (non-overlapping)
            left, right = best_pair
            merged = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == left and parts[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode_word(self, word):
        ids = self.cache.get(word)
        if ids is None:
            symbols = "".join(BYTE_TO_SYMBOL[b] for b in word.encode("utf-8"))
            ids = [self.symbol_to_id[t] for t in self.bpe(symbols)]
            self.cache[word] = ids
        return ids

    def encode(self, text):
        """str -> list of token ids (no EOT added)."""
        ids = []
        for word in self.pretokenizer.findall(text):
            ids.extend(self.encode_word(word))
        return ids

    def token_bytes(self, token_id):
        """The raw bytes of one token. <|endoftext|> is made of visible ASCII symbols only, so it comes
        out as the 13 bytes of that string."""
        return bytes(SYMBOL_TO_BYTE[c] for c in self.id_to_symbol[token_id])

    def decode_bytes(self, ids):
        return b"".join(self.token_bytes(i) for i in ids)

    def decode(self, ids):
        """list of ids -> str (a token sequence cut inside a UTF-8 character gives U+FFFD there)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


# Encodings we are sure of (OpenAI's published examples and llm.c's well-known prompts)
KNOWN_ENCODINGS = [
    ("Hello world", [15496, 995]),
    ("hello world", [31373, 995]),
    (" the", [262]),
    ("Hello, world!", [15496, 11, 995, 0]),
    ("Hello, I'm a language model,", [15496, 11, 314, 1101, 257, 3303, 2746, 11]),
    ("First Citizen:\nBefore we proceed any further, hear me speak.",   # tiny shakespeare's first line
     [5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502, 2740, 13]),
    ("\n", [198]),
    ("\n\n", [628]),
]


def selftest(tok, path=None):
    """Check KNOWN_ENCODINGS, and that decode(encode(x)) == x for x = the file (if given). Returns ok."""
    ok = True
    for text, expected in KNOWN_ENCODINGS:
        got = tok.encode(text)
        status = "ok  " if got == expected else "FAIL"
        ok = ok and got == expected
        print("%s %r -> %s" % (status, text, got))
    if path is not None:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        ids = tok.encode(text)
        same = tok.decode(ids) == text
        ok = ok and same
        print("%s roundtrip of %s: %d chars -> %d tokens -> %s" %
              ("ok  " if same else "FAIL", path, len(text), len(ids), "identical" if same else "DIFFERENT"))
    return ok


def main(argv):
    usage = "usage: gpt2_tokenizer.py encode TEXT | decode ID... | selftest [UTF8_FILE]"
    if not argv or argv[0] not in ("encode", "decode", "selftest"):
        print(usage, file=sys.stderr)
        return 2
    try:
        tok = GPT2Tokenizer()
        if argv[0] == "encode":
            print(" ".join(str(i) for i in tok.encode(" ".join(argv[1:]))))
        elif argv[0] == "decode":
            print(tok.decode([int(a) for a in argv[1:]]))
        else:
            return 0 if selftest(tok, argv[1] if len(argv) > 1 else None) else 1
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        print("gpt2_tokenizer.py: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
