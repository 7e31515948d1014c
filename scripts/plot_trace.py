#!/usr/bin/python3
"""plot_trace.py: renders a trace written by `train_gpt --trace FILE` as a PNG timeline.

Two rows per rank: compute (forward and backward bars labeled with their span's name, "F 3" for
micro-batch 3's forward, "F 3.1" for its forward through the stage's chunk 1 with the interleaved
schedule, the optimizer) and, below it, communication (pipeline sends and receives, data-parallel
all-reduces, reduce-scatters (ZeRO) and ZeRO-3's all-gathers per gradient bucket, tensor-parallel f/g sums,
the tied-embedding sum), each labeled ("RS 3": bucket 3's reduce-scatter, "AR", "AG", "send act 2") where
the bar is wide enough for the text. The gaps in the compute rows are the pipeline bubble.

The title names the techniques in use, "dp 2 · ZeRO-3 · tp 1 · pp 1", and with a pipeline its schedule and
bubble, measured next to the ideal one ((P-1)/(M+P-1); interleaved: (P-1)/(V*M+P-1); ZB-H1, whose B and
W are bars of their own: (P-1)/(3M+P-1)): "dp 1 · tp 1 · pp 4 · 1F1B · M=8 · bubble 31% (ideal 27%)". Below
it go the run's notes: a warning when its ranks outnumbered the machine's cores (the bars then include
waiting for a core), a hint naming --pp-split when one stage computed more than twice as long as another.
Needs matplotlib (Debian package python3-matplotlib), except for --describe alone.

usage: plot_trace.py TRACE.json [-o OUT.png] [--title TEXT] [--step N] [--describe]   (-o, --describe or both)
  --step N: draw only the N-th traced optimizer step (1-based; default: all traced steps)
  --describe: print the title, the notes, the legend and (with -o) the labels drawn, as text, so that a
              test (tests/pipeline_parallel.sh, tests/zero.sh) reads what the picture shows
"""
import argparse
import json
import re
import sys

# What a bar shows, in the legend's order: (kind, legend entry, colour)
KINDS = [
    ("forward", "forward", "#4C9BE8"),
    ("backward", "backward", "#F28C38"),
    ("backward W", "backward W", "#F8C491"),  # ZB-H1's deferred weight gradients
    ("optimizer", "optimizer", "#B07FD0"),
    ("send", "send", "#9B9B9B"),
    ("recv", "recv", "#C8C8C8"),
    ("sendrecv", "send + recv", "#B0B0B0"),
    ("allreduce", "all-reduce", "#7FBF7F"),
    ("reducescatter", "reduce-scatter", "#D9685F"),
    ("allgather", "all-gather", "#3FA7B5"),
    ("tp", "tp f/g (all-reduce)", "#E0C050"),
]
COLORS = {k: c for k, _, c in KINDS}
LEGEND = {k: label for k, label, _ in KINDS}
COMPUTE = ("forward", "backward", "optimizer")
SHORT = {"all-reduce": "AR", "reduce-scatter": "RS", "gather": "AG", "all-gather": "AG"}


def kind_of(e):
    """The bar's kind. A reduce-scatter may be recorded under the category "allreduce" (the category of
    every data-parallel reduction), named "reduce-scatter b": the name tells it apart."""
    cat, name = e["cat"], e["name"]
    if cat == "backward" and name.startswith("W"):
        return "backward W"
    if cat in ("allreduce", "reducescatter") and name.startswith("reduce-scatter"):
        return "reducescatter"
    return cat


def labels_for(e, kind):
    """The texts a bar may carry, longest first: the first that fits its width is drawn."""
    name = e["name"]
    if kind in COMPUTE or kind == "backward W":  # "F 3.1", or "3.1" (the colour tells F from B)
        return list(dict.fromkeys([name, name.split()[-1]]))
    m = re.fullmatch(r"(all-reduce|reduce-scatter|gather|all-gather)(?: (\d+))?", name)
    if m:  # a bucket's reduction or gather: "RS 3"
        return [SHORT[m.group(1)] + (" " + m.group(2) if m.group(2) else "")]
    if name == "tied wte":  # the all-reduce of the tied embedding's gradient over the first and last stage
        return ["AR tied wte", "AR wte"]
    m = re.fullmatch(r"([fg]) \((?:forward|backward)\)", name)
    if m:  # tensor-parallel f and g
        return [name, m.group(1)]
    # pipeline messages: "send act 3, recv grad 2", then "s a3 r g2" (with chunks: "send act 3.1", "s a3.1")
    message = r"(send|recv) (act|grad) (\d+(?:\.\d+)?)"
    compact = re.sub(message, lambda x: f"{x.group(1)[0]} {x.group(2)[0]}{x.group(3)}", name)
    return list(dict.fromkeys([name, compact.replace(",", "")]))


def title_of(run, path):
    """The title: the trace's own (its "title"), or made from the fields of an older trace's run record."""
    if not run:
        return path
    if run.get("title"):
        return run["title"]
    schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1"}
    V = run.get("V", 1)
    shape = f"P={run['P']}, M={run['M']}" + (f", V={V}" if V > 1 else "")
    name = schedule.get(run["schedule"], run["schedule"])
    return (f"{name}, {shape}: bubble measured {100 * run['bubble_measured']:.0f}% "
            f"(ideal {run['bubble_formula']} = {100 * run['bubble_ideal']:.0f}%)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("-o", "--out", default=None)
    parser.add_argument("--title", default=None)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--describe", action="store_true")
    args = parser.parse_args()
    if not args.out and not args.describe:
        parser.error("give -o OUT.png, --describe, or both")
    try:
        with open(args.trace, encoding="utf-8") as f:
            data = json.load(f)
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
    title = args.title or title_of(run, args.trace)
    notes = list(run.get("notes", [])) if run else []
    present = {kind_of(e) for e in events} | ({"backward W"} if zero_bubble else set())
    used = [k for k, _, _ in KINDS if k in present] + sorted(present - set(COLORS))  # (an unknown kind: grey)
    if args.describe:
        print(f"title: {title}")
        for note in notes:
            print(f"note: {note}")
        print("legend: " + ", ".join(LEGEND.get(k, k) for k in used))
    if not args.out:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.font_manager import FontProperties
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("plot_trace.py needs matplotlib (Debian package python3-matplotlib)")
    t0 = min(e["ts"] for e in events)
    ranks = sorted({e["pid"] for e in events})
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(ranks) + 1.4 + 0.2 * len(notes)))
    rows = {}  # (pid, lane) -> y: each rank's compute row, and its communication row just below
    for i, pid in enumerate(ranks):
        rows[(pid, 0)], rows[(pid, 1)] = 1.5 * i, 1.5 * i + 0.62
    bars = []  # (event, kind, lane, y, start, width): labeled once the layout is known
    for e in events:
        lane = min(e.get("tid", 0), 1)
        y, height = rows[(e["pid"], lane)], 0.7 if lane == 0 else 0.42
        start, width = (e["ts"] - t0) / 1000.0, e["dur"] / 1000.0
        kind = kind_of(e)
        ax.barh(y, width, left=start, height=height, color=COLORS.get(kind, "#666666"), edgecolor="white",
                linewidth=0.4)
        bars.append((e, kind, lane, y, start, width))
    ax.set_xlim(0, max(b[4] + b[5] for b in bars) * 1.01)
    ax.set_yticks([rows[k] for k in sorted(rows)])
    ax.set_yticklabels([names.get(p, f"rank {p}") if lane == 0 else "communication" for p, lane in sorted(rows)],
                       fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    # the notes in red between the title and the bars, where a reader of the picture sees them first
    ax.set_title(title, fontsize=10, pad=6 + 11 * len(notes))
    for i, note in enumerate(notes):
        ax.annotate(note, xy=(0.5, 1.0), xycoords="axes fraction", xytext=(0, 4 + 11 * (len(notes) - 1 - i)),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8, color="#B00020")
    # (one row of entries while they fit across the picture, two beyond)
    ax.legend(handles=[Patch(color=COLORS.get(k, "#666666"), label=LEGEND.get(k, k)) for k in used], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if len(ranks) < 4 else -0.12), ncol=len(used) if len(used) <= 8 else
              (len(used) + 1) // 2, fontsize=8, frameon=False)
    fig.tight_layout()
    # Labels, now that the layout fixes how many pixels a millisecond is: each bar gets the longest of its
    # texts that fits inside it, or none (a text wider than its bar would cover its neighbours).
    renderer = fig.canvas.get_renderer()
    px_per_ms = ax.transData.transform((1.0, 0.0))[0] - ax.transData.transform((0.0, 0.0))[0]
    drawn = []
    for e, kind, lane, y, start, width in bars:
        size = 7 if lane == 0 else 6
        font = FontProperties(size=size)
        for text in labels_for(e, kind):
            w = renderer.get_text_width_height_descent(text, font, ismath=False)[0]
            if w + 4 <= width * px_per_ms:
                ax.text(start + width / 2, y, text, ha="center", va="center", fontsize=size)
                drawn.append(text)
                break
    fig.savefig(args.out, dpi=110)
    if args.describe:
        print("labels: " + ", ".join(dict.fromkeys(drawn)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
