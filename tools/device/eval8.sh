#!/bin/bash
# Issue 8's accuracy table on the GPU: the trained demo model, 8-key multikey retrieval at 4K (120 prompts, made
# here with `tools/make_retrieval_data.py eval-set --task multikey --contexts 4096 --keys 8 --samples 120` into
# .evalsets/), every policy at B = 64 and 256, with the default 2 dense layers and with every layer sparse.
# Run on the GPU machine from the repository root with .device-bin unpacked and LD_LIBRARY_PATH set
# (`. tools/device/env.sh`); writes $OUT/multikey8-4096-dense{0,2}-policies-cuda.{json,log}.
# GQA=kv-max|kv-sum|per-head picks the policy (default: the engine's, kv-sum since 2026-11-30; the tables before that
# date were measured under kv-max).
set -u
SET=${SET:-.evalsets/mk8-4096-120.jsonl}
GQA=${GQA:-kv-sum}
for d in 2 0; do
  .device-bin/quest eval jsonl -m models/demo --backend cuda --set "$SET" --budgets full,64,256 --dense-layers $d \
    --gqa-policy "$GQA" \
    --policies quest,oracle,streaming,quest+int8,quest+int4,quest+int8+m,quest+int4+m \
    --json "$OUT/multikey8-4096-dense$d-policies-cuda.json" > "$OUT/multikey8-4096-dense$d-policies-cuda.log" 2>&1
  echo "dense $d: rc=$?"
done
