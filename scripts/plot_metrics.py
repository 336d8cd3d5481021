#!/usr/bin/env python3
"""Renders a metrics log locus wrote (the main job's --log CSV) to a PNG.

    plot_metrics.py METRICS.csv [OUT.png] [--title TEXT]

Three panels, one point per row: the losses (train, test or validation), the test
accuracy or the validation perplexity, and the learning rate (when the log has an `lr`
column). The x axis is the log's `epoch` column (the Fashion-MNIST job) or its `step`
column (the GPT job). Each series has its own fixed colour (SERIES below), so a test can
find every curve in the image. Columns that a log lacks are left out of the plot; a log
without `epoch` or `step`, or without rows, is refused with a message and exit status 2.
Needs matplotlib (scripts/plot-metrics installs it into the test virtual environment).
"""
import argparse
import csv
import math
import os
import sys

# column -> (panel, label, colour); the colours are matplotlib's first six "tab" colours
SERIES = {
    "train_loss": (0, "train loss", "#1f77b4"),
    "test_loss": (0, "test loss", "#ff7f0e"),
    "val_loss": (0, "validation loss", "#9467bd"),
    "test_accuracy": (1, "test accuracy", "#2ca02c"),
    "val_perplexity": (1, "validation perplexity", "#8c564b"),
    "lr": (2, "learning rate", "#d62728"),
}
X_COLUMNS = ("epoch", "step")  # the first of these a log has is the x axis
WIDTH_IN, HEIGHT_IN, DPI = 12.0, 4.0, 100  # 1200 x 400 pixels


def value(text):
    """A cell as a number to plot; empty, missing (a row from an older log with fewer
    columns), non-numeric or beyond +-1e300: NaN, which leaves a gap."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) and abs(v) <= 1e300 else math.nan


def read(path):
    with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not a column name
        rows = [{(k or "").strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    if not rows:
        raise ValueError(f"{path}: no rows (a header and one row per epoch or evaluation expected)")
    x = next((c for c in X_COLUMNS if c in rows[0]), None)
    if x is None:
        raise ValueError(f"{path}: no 'epoch' or 'step' column (columns: {', '.join(rows[0].keys())})")
    xs, data = [], {k: [] for k in SERIES if k in rows[0]}
    for i, row in enumerate(rows):
        try:
            xs.append(int(str(row[x]).strip()))
        except (TypeError, ValueError):
            raise ValueError(f"{path}: row {i + 2}: {x} {row[x]!r} is not an integer") from None
        for k in data:
            data[k].append(value(row.get(k)))
    return x, xs, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("png", nargs="?", help="default: the CSV's name with .png")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    out = args.png or os.path.splitext(args.csv)[0] + ".png"
    if not out.lower().endswith(".png"):
        out += ".png"  # what matplotlib would write anyway; say so
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        print(f"plot-metrics: the output directory {out_dir} does not exist", file=sys.stderr)
        return 2
    try:
        x, xs, data = read(args.csv)
    except (OSError, ValueError) as e:
        print(f"plot-metrics: {e}", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    middle = " / ".join(SERIES[k][1] for k in data if SERIES[k][0] == 1) or "test accuracy"
    for ax, name in zip(axes, ("loss", middle, "learning rate")):
        ax.set_title(name)
        ax.set_xlabel(x)
        ax.grid(True, color="#dddddd", linewidth=0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for key, values in data.items():
        panel, label, colour = SERIES[key]
        finite = [(e, v) for e, v in zip(xs, values) if math.isfinite(v)]
        if not finite:
            continue
        px, py = zip(*finite)
        axes[panel].plot(px, py, color=colour, label=label, linewidth=2, marker="o", markersize=3)
    lrs = [v for v in data.get("lr", []) if math.isfinite(v)]
    if lrs and min(lrs) > 0 and max(lrs) / min(lrs) > 100:
        axes[2].set_yscale("log")
    axes[0].legend()
    fig.suptitle(args.title or os.path.basename(args.csv))
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    print(f"plot-metrics: wrote {out} ({len(xs)} {x}s: {', '.join(SERIES[k][1] for k in data)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
