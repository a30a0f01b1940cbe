#!/usr/bin/env python3
"""Plots `quest eval passkey --json` rows: accuracy vs budget, one line per context (full attention as a dashed
reference), optionally with other selectors' runs of the same prompts as dotted lines.
Usage: python3 tools/plot_passkey.py PASSKEY.json OUT.png [--title TEXT] [--label quest] [--extra OTHER.json:LABEL ...]"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    by_ctx, full = defaultdict(list), {}
    for r in json.load(open(path)):
        if r["budget"] == "full":
            full[r["context"]] = r["accuracy"]
        else:
            by_ctx[r["context"]].append((r["budget"], r["accuracy"]))
    for pts in by_ctx.values():
        pts.sort()
    return by_ctx, full


ap = argparse.ArgumentParser()
ap.add_argument("json")
ap.add_argument("png")
ap.add_argument("--title", default="pass-key retrieval through the decode path")
ap.add_argument("--label", default="Quest", help="label of the main file's selector")
ap.add_argument("--extra", action="append", default=[], help="OTHER.json:LABEL, drawn dotted")
a = ap.parse_args()
by_ctx, full = load(a.json)
fig, ax = plt.subplots(figsize=(7.5, 4.8))
colors = {}
for ctx, pts in sorted(by_ctx.items()):
    line, = ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=f"{a.label}, context {ctx}")
    colors[ctx] = line.get_color()
    if ctx in full:
        ax.axhline(100 * full[ctx], linestyle="--", color=colors[ctx], alpha=0.5, label=f"full, context {ctx}")
for spec in a.extra:
    path, _, label = spec.rpartition(":")
    other, _ = load(path)
    for ctx, pts in sorted(other.items()):
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="x", linestyle=":", color=colors.get(ctx),
                label=f"{label}, context {ctx}")
ax.set_xscale("log", base=2)
ax.set_xlabel("token budget B")
ax.set_ylabel("accuracy (%)")
ax.set_ylim(-5, 105)
ax.set_title(a.title)
ax.grid(True, alpha=0.3)
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
fig.savefig(a.png, dpi=120)
print(f"wrote {a.png}")
