#!/usr/bin/env python3
"""Hugging Face transformers decode latency with quest bench's protocol, for the README's side-by-side table.

The same config (random FP16 weights), a prefill of `context` random tokens, then `steps` single-token forward
passes through the KV cache (DynamicCache, SDPA attention), each timed with CUDA events; sampling excluded (the
next input is a fixed random id). Writes JSON rows with quest bench's keys (engine "transformers").
Usage (GPU machine): python3 tools/hf_bench.py --config configs/llama2-7b.json --contexts 4096,32768 --json hf.json
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--contexts", default="4096,32768")
ap.add_argument("--steps", type=int, default=64)
ap.add_argument("--warmup", type=int, default=8)
ap.add_argument("--json", default=None)
a = ap.parse_args()

cfg_dict = {k: v for k, v in json.load(open(a.config)).items() if not k.startswith("_")}
cfg = LlamaConfig(**cfg_dict)
cfg.max_position_embeddings = max(cfg.max_position_embeddings, max(int(c) for c in a.contexts.split(",")) + 256)
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.float16).eval()
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
rows = []
for ctx in [int(c) for c in a.contexts.split(",")]:
    g = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(3, cfg.vocab_size, (1, ctx), device="cuda", generator=g)
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.time()
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
        prefill_s = time.time() - t0
        past = out.past_key_values
        ids = torch.randint(3, cfg.vocab_size, (a.warmup + a.steps, 1, 1), device="cuda", generator=g)
        times = []
        for i in range(a.warmup + a.steps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = model(input_ids=ids[i], past_key_values=past, use_cache=True)
            e.record()
            e.synchronize()
            past = out.past_key_values
            if i >= a.warmup:
                times.append(s.elapsed_time(e))
    times.sort()
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2 * (ctx + a.warmup + a.steps // 2)
    p50 = statistics.median(times)
    row = {"engine": "transformers " + transformers.__version__, "backend": "cuda", "weights": "fp16",
           "context": ctx, "budget": "full", "p50": p50, "p90": times[int(0.9 * (len(times) - 1))],
           "p99": times[int(0.99 * (len(times) - 1))], "mean": statistics.mean(times), "steps": len(times),
           "tokens_per_s": 1000.0 / statistics.mean(times), "bytes": weight_bytes + kv_bytes,
           "gbps": (weight_bytes + kv_bytes) / (p50 * 1e-3) / 1e9, "prefill_s": prefill_s}
    rows.append(row)
    print(f"transformers ctx {ctx}: p50 {p50:.3f} ms/token, {row['gbps']:.0f} GB/s, prefill {prefill_s:.2f} s", flush=True)
    del past, out
    torch.cuda.empty_cache()
if a.json:
    json.dump(rows, open(a.json, "w"), indent=2)
