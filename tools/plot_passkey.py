#!/usr/bin/env python3
"""Plots `quest eval passkey --json` rows: accuracy vs budget, one line per context (full attention as a dashed
reference). Usage: python3 tools/plot_passkey.py PASSKEY.json OUT.png [--title TEXT] [--extra OTHER.json:LABEL ...]"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("json")
ap.add_argument("png")
ap.add_argument("--title", default="pass-key retrieval through the decode path")
a = ap.parse_args()
rows = json.load(open(a.json))
by_ctx = defaultdict(list)
full = {}
for r in rows:
    if r["budget"] == "full":
        full[r["context"]] = r["accuracy"]
    else:
        by_ctx[r["context"]].append((r["budget"], r["accuracy"]))
fig, ax = plt.subplots(figsize=(7, 4.5))
for i, (ctx, pts) in enumerate(sorted(by_ctx.items())):
    pts.sort()
    line, = ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=f"Quest, context {ctx}")
    if ctx in full:
        ax.axhline(100 * full[ctx], linestyle="--", color=line.get_color(), alpha=0.6, label=f"full, context {ctx}")
ax.set_xscale("log", base=2)
ax.set_xlabel("token budget B")
ax.set_ylabel("accuracy (%)")
ax.set_ylim(-5, 105)
ax.set_title(a.title)
ax.grid(True, alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(a.png, dpi=120)
print(f"wrote {a.png}")
