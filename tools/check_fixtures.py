#!/usr/bin/env python3
"""Re-computes the committed fixtures' reference logits with the installed transformers (another version, e.g. the
GPU machine's) from the committed models and token ids, and reports the relative error against the committed
logits. Usage: python3 tools/check_fixtures.py [tests/fixtures/hf]"""
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf")
worst = 0.0
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        o = model(input_ids=ref["prompt_ids"].long()[None], use_cache=True)
        pre = o.logits[0]
        past, dec = o.past_key_values, []
        for t in ref["decode_ids"].long():
            o = model(input_ids=t.view(1, 1), past_key_values=past, use_cache=True)
            past = o.past_key_values
            dec.append(o.logits[0, -1])
    for k, v in (("prefill_logits", pre), ("decode_logits", torch.stack(dec))):
        err = float((v - ref[k]).norm() / ref[k].norm())
        worst = max(worst, err)
        print(f"{name:20s} {k:15s} rel err {err:.2e}")
print(f"transformers {transformers.__version__}, torch {torch.__version__}: worst relative error {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
