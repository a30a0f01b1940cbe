#!/usr/bin/env python3
"""Markdown table of `quest eval jsonl --json` rows (issue 8): accuracy, bytes per step, tokens read, softmax mass
captured, and the share of the quest -> oracle gap a policy closes (in accuracy and in captured mass).

Usage: python3 tools/policy_table.py RESULT.json [RESULT2.json ...]
"""
import json
import sys


def main(paths):
    rows = []
    for p in paths:
        rows += json.load(open(p))
    by = {(r["policy"], str(r["budget"])): r for r in rows}
    print("| policy | B | correct | accuracy | quest-layer KiB/step | of which metadata | KV tokens/row "
          "| mass captured | mass gap closed | accuracy gap closed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        b, s = r.get("bytes") or {}, r.get("selection") or {}
        q, o = by.get(("quest", str(r["budget"]))), by.get(("oracle", str(r["budget"])))

        def closed(get):
            if not q or not o or r["policy"] in ("quest", "oracle", "full"):
                return ""
            gap = get(o) - get(q)
            if abs(gap) < 1e-12:
                return "no gap"
            return f"{100 * (get(r) - get(q)) / gap + 0.0:.0f}%".replace("-0%", "0%")

        mass = s.get("selected_mass")
        print(f"| {r['policy']} | {r['budget']} | {r['correct']}/{r['samples']} | {100 * r['accuracy']:.0f}% "
              f"| {b.get('quest_layer_bytes_per_step', 0) / 1024:.1f} | {b.get('metadata_bytes_per_step', 0) / 1024:.1f} "
              f"| {b.get('kv_tokens_per_row', 0):.1f} | {'' if mass is None else f'{mass:.3f}'} "
              f"| {closed(lambda x: (x.get('selection') or {}).get('selected_mass', 0))} "
              f"| {closed(lambda x: x['accuracy'])} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
