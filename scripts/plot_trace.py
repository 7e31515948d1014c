#!/usr/bin/python3
"""plot_trace.py: renders a trace written by `train_gpt --trace FILE` as a PNG timeline.

Two rows per rank: compute (forward and backward bars labeled with their micro-batch, the optimizer)
and, below it, communication (pipeline sends and receives, data-parallel reductions, ZeRO-3's
parameter gathers, tensor-parallel f/g sums, the tied-embedding sum). The gaps in the compute rows
are the pipeline bubble; the title gives the schedule, P, M (and V) and the bubble the run measured next to its ideal, by the
formula the trace records ((P-1)/(M+P-1); interleaved: (P-1)/(V*M+P-1); ZB-H1, whose B and W are bars of their own:
(P-1)/(3M+P-1)). Needs matplotlib (Debian package python3-matplotlib).

usage: plot_trace.py TRACE.json -o OUT.png [--title TEXT] [--step N]
  --step N: draw only the N-th traced optimizer step (1-based; default: all traced steps)
"""
import argparse
import json
import sys

COLORS = {
    "forward": "#4C9BE8",
    "backward": "#F28C38",
    "backward W": "#F8C491",  # ZB-H1's deferred weight gradients
    "send": "#9B9B9B",
    "recv": "#C8C8C8",
    "sendrecv": "#B0B0B0",
    "allreduce": "#7FBF7F",
    "allgather": "#5FA8A0",
    "tp": "#E0C050",
    "optimizer": "#B07FD0",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("-o", "--out", required=True)
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
    names = {e["pid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"}
    run = next((e["args"] for e in data["traceEvents"] if e.get("name") == "run"), None)
    zero_bubble = bool(run) and run.get("schedule") == "zb-h1"  # (its backward bars read B m and W m)
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
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(ranks) + 1.4))
    rows = {}  # (pid, lane) -> y: each rank's compute row, and its communication row just below
    for i, pid in enumerate(ranks):
        rows[(pid, 0)], rows[(pid, 1)] = 1.5 * i, 1.5 * i + 0.62
    for e in events:
        lane = min(e.get("tid", 0), 1)
        y, height = rows[(e["pid"], lane)], 0.7 if lane == 0 else 0.42
        start, width = (e["ts"] - t0) / 1000.0, e["dur"] / 1000.0
        kind = "backward W" if e["cat"] == "backward" and e["name"].startswith("W") else e["cat"]  # (ZB-H1: B, W)
        ax.barh(y, width, left=start, height=height, color=COLORS.get(kind, "#666666"), edgecolor="white", linewidth=0.4)
        if e["cat"] in ("forward", "backward") and width > 0:
            label = e["name"].replace(" ", "") if kind == "backward W" or zero_bubble else e["name"].split()[-1]
            ax.text(start + width / 2, y, label, ha="center", va="center", fontsize=7)
    ax.set_yticks([rows[k] for k in sorted(rows)])
    ax.set_yticklabels([names.get(p, f"rank {p}") if lane == 0 else "communication" for p, lane in sorted(rows)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    title = args.title or args.trace
    if run and not args.title:
        schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1"}.get(run["schedule"], run["schedule"])
        V = run.get("V", 1)
        shape = f"P={run['P']}, M={run['M']}" + (f", V={V}" if V > 1 else "")
        formula = run["bubble_formula"]  # (the schedule's, as llmc/pipeline.h gives it)
        title = (f"{schedule}, {shape}: bubble measured {100 * run['bubble_measured']:.0f}% "
                 f"(ideal {formula} = {100 * run['bubble_ideal']:.0f}%)")
    ax.set_title(title, fontsize=10)
    used = sorted({e["cat"] for e in events} | ({"backward W"} if zero_bubble else set()))
    ax.legend(handles=[Patch(color=COLORS.get(c, "#666666"), label=c) for c in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if len(ranks) < 4 else -0.12), ncol=len(used), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
