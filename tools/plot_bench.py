#!/usr/bin/env python3
"""Plots `quest bench --json` rows: decode latency (p50 ms/token) vs context, one line per budget and weight type.
Usage: python3 tools/plot_bench.py BENCH.json OUT.png [--title TEXT] [--hf HF.json]
--hf adds Hugging Face transformers rows written by tools/hf_bench.py (same schema)."""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("json")
ap.add_argument("png")
ap.add_argument("--title", default="quest decode latency (batch 1, sampling excluded)")
ap.add_argument("--hf", default=None)
a = ap.parse_args()
rows = json.load(open(a.json))
if a.hf:
    rows += json.load(open(a.hf))
lines = defaultdict(list)
for r in rows:
    label = f"{r.get('engine', 'quest')} {r['weights']} " + ("full" if r["budget"] == "full" else f"B={r['budget']}")
    lines[label].append((r["context"], r["p50"]))
fig, ax = plt.subplots(figsize=(7, 4.5))
for label, pts in sorted(lines.items()):
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
ax.set_xscale("log", base=2)
ax.set_xlabel("context (tokens)")
ax.set_ylabel("p50 ms / token")
ax.set_title(a.title)
ax.grid(True, alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(a.png, dpi=120)
print(f"wrote {a.png}")
