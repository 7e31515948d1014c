#!/usr/bin/python3
"""forge_state.py: writes a copy of a training state file (llmc/run/state_file.h) with some header fields
changed and its checksum recomputed, so that tests can feed the trainer well-formed files that lie.

usage: forge_state.py SRC DST [FIELD=VALUE ...]
  FIELD: version (int32 at header int 1), B (8), T (9), grad_accum (10), shuffle (11), shard (22),
         num_shards (23), run_id_lo (33), run_id_hi (34); step (int64 at 12), updates (int64 at 28);
         m, v (float32: the first value of AdamW's moments in the file; VALUE may be nan, inf, -1)
"""
import struct
import sys

INT32 = {"version": 1, "run_id_lo": 33, "run_id_hi": 34, "B": 8, "T": 9, "grad_accum": 10, "shuffle": 11, "shard": 22, "num_shards": 23}
INT64 = {"step": 12, "updates": 28}


def fnv1a(data, h=0xCBF29CE484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    src, dst = sys.argv[1], sys.argv[2]
    raw = bytearray(open(src, "rb").read())
    for arg in sys.argv[3:]:
        key, value = arg.split("=")
        if key in ("m", "v"):  # after the header and the R (offset, count) pairs: the m values, then the v values
            n_ranges = struct.unpack_from("<q", raw, 4 * 26)[0]
            count = (len(raw) - 1024 - 16 * n_ranges - 8) // 8
            struct.pack_into("<f", raw, 1024 + 16 * n_ranges + (4 * count if key == "v" else 0), float(value))
        elif key in INT32:
            struct.pack_into("<i", raw, 4 * INT32[key], int(value))
        else:
            struct.pack_into("<q", raw, 4 * INT64[key], int(value))
    body = bytes(raw[:-8])
    open(dst, "wb").write(body + struct.pack("<Q", fnv1a(body)))


if __name__ == "__main__":
    main()
