#!/usr/bin/python3
"""plot_trace.py: renders a trace written by `train_gpt --trace FILE` as a PNG timeline.

One row per rank and one colored bar per span: forward, backward, send/recv, all-reduce and optimizer.
Forward and backward bars are labeled with their micro-batch. The gaps in the forward/backward rows
are the pipeline bubble. Needs matplotlib (Debian package python3-matplotlib).

usage: plot_trace.py TRACE.json OUT.png [--title TEXT] [--step N]
  --step N: draw only the N-th traced optimizer step (1-based; default: all traced steps)
"""
import argparse
import json
import sys

COLORS = {
    "forward": "#4C9BE8",
    "backward": "#F28C38",
    "send": "#9B9B9B",
    "recv": "#C8C8C8",
    "sendrecv": "#B0B0B0",
    "allreduce": "#7FBF7F",
    "optimizer": "#B07FD0",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--title", default=None)
    parser.add_argument("--step", type=int, default=0)
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("plot_trace.py needs matplotlib (Debian package python3-matplotlib)")
    try:
        data = json.load(open(args.trace))
    except (OSError, ValueError) as e:
        sys.exit(f"cannot read trace '{args.trace}': {e}")
    events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("ph") == "M"}
    if not events:
        sys.exit("the trace has no spans")
    if args.step > 0:  # the optimizer spans end the steps: keep what lies between the (N-1)-th and N-th
        ends = sorted({e["ts"] + e["dur"] for e in events if e["cat"] == "optimizer" and e["pid"] == 0})
        if args.step > len(ends):
            sys.exit(f"the trace has {len(ends)} steps")
        lo = ends[args.step - 2] if args.step > 1 else -1.0
        hi = ends[args.step - 1]
        events = [e for e in events if lo < e["ts"] and e["ts"] + e["dur"] <= hi + 1.0]
    t0 = min(e["ts"] for e in events)
    ranks = sorted({e["pid"] for e in events})
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(ranks) + 1.4))
    for row, pid in enumerate(ranks):
        for e in events:
            if e["pid"] != pid:
                continue
            start, width = (e["ts"] - t0) / 1000.0, e["dur"] / 1000.0
            ax.barh(row, width, left=start, height=0.7, color=COLORS.get(e["cat"], "#666666"), edgecolor="white", linewidth=0.4)
            if e["cat"] in ("forward", "backward") and width > 0:
                ax.text(start + width / 2, row, e["name"].split()[-1], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([names.get(p, f"rank {p}") for p in ranks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(args.title or args.trace, fontsize=10)
    used = sorted({e["cat"] for e in events})
    ax.legend(handles=[Patch(color=COLORS.get(c, "#666666"), label=c) for c in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if len(ranks) < 4 else -0.12), ncol=len(used), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
