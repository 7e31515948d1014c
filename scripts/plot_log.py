#!/usr/bin/python3
"""plot_log.py: draws the training curves of one or more `train_gpt --log FILE` logs into a PNG.

Top: the training loss per step (a line per log) and the validation loss (dots joined, same color).
Bottom: throughput in tokens/s per step. Configuration lines ({"config": ...}) and skipped steps are
not points; a log resumed after a crash holds every step once (llmc/run/logger.h), so it draws as one run.
Needs matplotlib (Debian package python3-matplotlib).

usage: plot_log.py LOG.jsonl [LOG.jsonl ...] -o OUT.png [--title TEXT]
"""
import argparse
import json
import os
import sys


def read_log(path):
    """(steps, losses), (val_steps, val_losses), (steps, tokens_per_s) of one log"""
    train, val, speed = ([], []), ([], []), ([], [])
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                sys.exit(f"error: {path}:{n} is not a JSON line")
            if "step" not in row:
                continue  # the configuration
            if row.get("loss") is not None:
                train[0].append(row["step"]), train[1].append(row["loss"])
            if row.get("val_loss") is not None:
                val[0].append(row["step"]), val[1].append(row["val_loss"])
            if row.get("tokens_per_s") is not None:
                speed[0].append(row["step"]), speed[1].append(row["tokens_per_s"])
    return train, val, speed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("-o", "--out", required=True)
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_speed) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    drawn = 0
    for i, path in enumerate(args.logs):
        train, val, speed = read_log(path)
        color = f"C{i % 10}"
        name = os.path.basename(path)
        if train[0]:
            ax_loss.plot(train[0], train[1], color=color, lw=1, alpha=0.8, label=f"{name}: train")
        if val[0]:
            ax_loss.plot(val[0], val[1], color=color, marker="o", ms=4, lw=1.5, ls="--", label=f"{name}: val")
        if speed[0]:
            ax_speed.plot(speed[0], speed[1], color=color, lw=1)
        drawn += len(train[0]) + len(val[0])
    if drawn == 0:
        sys.exit("error: the logs hold no loss or val_loss lines")
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)
    ax_speed.set_ylabel("tokens/s")
    ax_speed.set_xlabel("step")
    ax_speed.grid(alpha=0.3)
    ax_loss.set_title(args.title or "training curves")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
