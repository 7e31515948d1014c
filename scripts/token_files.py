#!/usr/bin/python3
"""token_files.py: what the data scripts share about writing llm.c's token and decode-table files: their
256-int32 header, a file written whole or not at all, and the one-line error both report."""

import os
import struct

TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1
DECODE_TABLE_MAGIC, DECODE_TABLE_VERSION = 20240328, 2
HEADER_INTS = 256


class DataError(Exception):
    """A problem with an input or the output; reported as one line, exit status 1."""


def header(*values):
    """The 256-int32 header: `values`, then zeros."""
    return struct.pack("<%di" % HEADER_INTS, *(list(values) + [0] * (HEADER_INTS - len(values))))


def write_atomically(path, chunks):
    """Write to PATH.tmp and rename, so a half-written file never takes the place of a good one."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise DataError("cannot write %s: %s" % (path, e.strerror or e))
