#!/usr/bin/python3
"""compare_losses.py: two training logs (--log FILE.jsonl) of the same job, one loss curve against the other.

scripts/check_gpu.sh uses it to hold one path of the GPU trainer (FP16, flash attention, the fused kernels)
to another (BF16, the classic path) over the same steps: their losses differ by rounding only, so the
curves must stay close. Losses are matched by step number. A step that one log marks skipped (FP16's
overflows under loss scaling: {"step": N, "skipped": true}, no loss) is left out of the comparison; any
other step missing from either log means the two runs are not the same job. Prints the steps compared, the
mean loss of the last --last of them in each log, their relative difference, the worst single step's and
each log's skipped steps.

Exit status: 0 when within --limit, 1 when not, when the logs do not cover the same steps (or not steps
1..--steps), when either skipped more than --max-skipped steps (a BF16 or FP32 run skips none: only FP16's
loss scaling skips), or when a loss is not a number; 77 when a log is missing (the run that writes it did
not happen: check_gpu.sh says SKIP).

usage: compare_losses.py A.jsonl B.jsonl [--names A,B] [--steps N] [--max-skipped N] [--last 10 | --every]
                         [--limit 0.02]
  --last K   compare the means of the last K common steps (default 10): a steady, noise-averaged criterion
  --every    compare every common step: for short runs, where a mean would hide one diverging step
"""
import argparse
import json
import os
import sys


def read_log(path):
    """({step: loss}, {skipped steps})"""
    losses, skipped = {}, set()
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("skipped"):
            skipped.add(r["step"])
        elif "loss" in r and "step" in r:
            losses[r["step"]] = r["loss"]
    return losses, skipped


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--names", default="a,b", help="what the two logs are, for the printed lines")
    ap.add_argument("--steps", type=int, help="both logs must cover steps 1..N exactly (a loss or a skip each)")
    ap.add_argument("--max-skipped", type=int, help="the most steps either log may have skipped")
    ap.add_argument("--last", type=int, default=10)
    ap.add_argument("--every", action="store_true")
    ap.add_argument("--limit", type=float, default=0.02)
    args = ap.parse_args()
    missing = [p for p in (args.a, args.b) if not os.path.exists(p)]
    if missing:
        print(f"compare_losses: no log at {', '.join(missing)} (its run did not happen)")
        sys.exit(77)
    name_a, name_b = (args.names.split(",") + ["b"])[:2]
    (la, sa), (lb, sb) = read_log(args.a), read_log(args.b)
    steps_a, steps_b = set(la) | sa, set(lb) | sb
    if args.steps is not None:
        for name, steps in ((name_a, steps_a), (name_b, steps_b)):
            if steps != set(range(1, args.steps + 1)):
                print(f"compare_losses: {name}'s log has {len(steps)} steps, not steps 1..{args.steps}: its run did not finish")
                sys.exit(1)
    if args.max_skipped is not None and max(len(sa), len(sb)) > args.max_skipped:
        print(f"compare_losses: {name_a} skipped {len(sa)} steps, {name_b} {len(sb)}: more than {args.max_skipped}")
        sys.exit(1)
    bad = [f"{n} step {k}" for n, l in ((name_a, la), (name_b, lb)) for k, x in l.items() if not isinstance(x, (int, float)) or x != x]
    if bad:
        print(f"compare_losses: a loss that is not a number: {', '.join(bad[:5])}")
        sys.exit(1)
    if steps_a != steps_b:
        print(f"compare_losses: {name_a} and {name_b} logged different steps ({len(steps_a)} and {len(steps_b)}): not the same job")
        sys.exit(1)
    common = sorted(set(la) & set(lb))
    if not common:
        print("compare_losses: no step has a loss in both logs")
        sys.exit(1)
    worst = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in common)
    last = common[-min(args.last, len(common)):]
    ma, mb = sum(la[s] for s in last) / len(last), sum(lb[s] for s in last) / len(last)
    mean_rel = abs(ma - mb) / abs(mb)
    print(f"{len(common)} steps with a loss in both (skipped: {name_a} {len(sa)}, {name_b} {len(sb)}); mean loss of the "
          f"last {len(last)}: {name_a} {ma:.4f}, {name_b} {mb:.4f}, relative {mean_rel:.4f}; worst step {worst:.4f}")
    measured = worst if args.every else mean_rel
    ok = measured <= args.limit
    print(f"{'every step' if args.every else f'mean of the last {len(last)}'}: {measured:.4f} "
          f"{'<=' if ok else '>'} {args.limit} {'(within the limit)' if ok else '(OVER the limit)'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
