#!/usr/bin/python3
"""compare_losses.py: two training logs (--log FILE.jsonl) of the same job, one loss curve against the other.

scripts/check_gpu.sh uses it to hold one path of the GPU trainer (FP16, flash attention, the fused kernels)
to another (BF16, the default path) over the same steps: their losses differ by rounding only, so the curves
must stay close. Prints the steps compared, the mean loss of the last --last steps of each, their relative
difference, the worst single step's relative difference and the steps each log marks skipped (FP16's
overflows). Exit status: 0 when within --limit, 1 when not (or when the logs have different steps),
77 when a log is missing (the step that writes it did not run: check_gpu.sh then says SKIP).

usage: compare_losses.py A.jsonl B.jsonl --names A,B [--last 10 | --every] [--limit 0.02]
  --last K   compare the means of the last K losses (default 10): a steady, noise-averaged criterion
  --every    compare every step's loss: for short runs, where a mean would hide one diverging step
"""
import argparse
import json
import os
import sys


def losses(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r["loss"] for r in rows if "loss" in r], sum(1 for r in rows if r.get("skipped"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--names", default="a,b", help="what the two logs are, for the printed line")
    ap.add_argument("--last", type=int, default=10)
    ap.add_argument("--every", action="store_true")
    ap.add_argument("--limit", type=float, default=0.02)
    args = ap.parse_args()
    missing = [p for p in (args.a, args.b) if not os.path.exists(p)]
    if missing:
        print(f"compare_losses: no log at {', '.join(missing)} (its run did not happen)")
        sys.exit(77)
    name_a, name_b = (args.names.split(",") + ["b"])[:2]
    (la, skips_a), (lb, skips_b) = losses(args.a), losses(args.b)
    if not la or len(la) != len(lb):
        print(f"compare_losses: {name_a} has {len(la)} losses, {name_b} {len(lb)}: not the same run")
        sys.exit(1)
    worst = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    k = min(args.last, len(la))
    ma, mb = sum(la[-k:]) / k, sum(lb[-k:]) / k
    mean_rel = abs(ma - mb) / abs(mb)
    measured = worst if args.every else mean_rel
    print(f"{len(la)} steps; mean loss of the last {k}: {name_a} {ma:.4f}, {name_b} {mb:.4f}, relative {mean_rel:.4f}; "
          f"worst step {worst:.4f}; skipped steps: {name_a} {skips_a}, {name_b} {skips_b}")
    ok = measured <= args.limit
    print(f"{'every step' if args.every else f'mean of the last {k}'}: {measured:.4f} "
          f"{'<=' if ok else '>'} {args.limit} {'(within the limit)' if ok else '(OVER the limit)'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
