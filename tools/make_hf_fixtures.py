#!/usr/bin/env python3
"""Build small random Hugging Face Llama models with transformers and record their reference logits.

Each fixture is a folder tests/fixtures/hf/<name>/ with
  config.json, model.safetensors   the model exactly as transformers saves it (save_pretrained)
  reference.safetensors            prompt_ids I32 [P], decode_ids I32 [D],
                                   prefill_logits F32 [P, V]  (one forward over the prompt)
                                   decode_logits  F32 [D, V]  (then one token at a time through the KV cache)
  reference.json                   versions and settings used

The reference runs in float32 with eager attention (weights stored in BF16/F16 are upcast), so an fp32 engine
must match it to rounding. Decode tokens are fixed random ids (teacher forcing), so one step's error cannot change
the next step's input. Usage (needs torch, transformers, safetensors):
    python3 tools/make_hf_fixtures.py [--out tests/fixtures/hf]
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 256
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, rms_norm_eps=1e-5,
            max_position_embeddings=256, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
            attention_bias=False, mlp_bias=False, hidden_act="silu")

# name: (config overrides, storage dtype, prompt length, decode steps). Names ending in "_legacy" get their
# config.json rewritten into the Llama-2-era spelling (top-level rope_theta, rope_scaling {type, ...},
# torch_dtype) before the reference is computed, so transformers itself reads that spelling too.
FIXTURES = {
    "mha_hd64":      (dict(num_attention_heads=2, num_key_value_heads=2, head_dim=64), torch.float32, 20, 6),
    "gqa4_hd128":    (dict(num_attention_heads=4, num_key_value_heads=1, head_dim=128), torch.float16, 20, 6),
    "gqa8_hd64_tied": (dict(num_attention_heads=8, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True),
                       torch.bfloat16, 20, 6),
    "linear_x4_legacy": (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           rope_scaling={"rope_type": "linear", "factor": 4.0}), torch.float32, 20, 6),
    # max_position_embeddings 16 < prompt: the NTK base grows with the sequence, at prefill and at every step.
    "dynamic_x2":    (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=16,
                           rope_scaling={"rope_type": "dynamic", "factor": 2.0}), torch.float16, 20, 6),
    "yarn_x4_legacy": (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
                      torch.bfloat16, 20, 6),
    "llama3_x8":     (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
                      torch.float16, 20, 6),
    "bf16_gqa2":     (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=500000.0),
                      torch.bfloat16, 20, 6),
    "f16_gqa4":      (dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16), torch.float16, 20, 6),
}


def to_legacy_config(path):
    with open(path) as f:
        c = json.load(f)
    rp = dict(c.pop("rope_parameters"))
    c["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    if rp["type"] == "yarn":
        rp["finetuned"] = True  # present in Yarn-Llama-2 checkpoints; not a rope parameter
    c["rope_scaling"] = rp
    c["torch_dtype"] = c.pop("dtype")
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def build(name, overrides, dtype, prompt_len, steps, out_root, seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**BASE, **overrides})
    model = LlamaForCausalLM(cfg)
    # Larger-than-default weights so attention is not uniform and the logits are not all near zero.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5 * (3.0 if "embed" in n else 1.0))
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    if name.endswith("_legacy"):
        to_legacy_config(os.path.join(out, "config.json"))

    # Reference: reload what was saved, upcast to fp32, eager attention.
    ref = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=g)
    prompt[0, 0] = cfg.bos_token_id
    decode_ids = torch.randint(3, VOCAB, (1, steps), generator=g)
    with torch.no_grad():
        o = ref(input_ids=prompt, use_cache=True)
        prefill_logits = o.logits[0].float().clone()
        past = o.past_key_values
        dec = []
        for i in range(steps):
            o = ref(input_ids=decode_ids[:, i:i + 1], past_key_values=past, use_cache=True)
            past = o.past_key_values
            dec.append(o.logits[0, -1].float().clone())
    save_file({
        "prompt_ids": prompt[0].to(torch.int32).contiguous(),
        "decode_ids": decode_ids[0].to(torch.int32).contiguous(),
        "prefill_logits": prefill_logits.contiguous(),
        "decode_logits": torch.stack(dec).contiguous(),
    }, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "seed": seed,
                   "storage_dtype": str(dtype), "reference_dtype": "float32", "attn_implementation": "eager"}, f,
                  indent=2)
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    print(f"{name}: {size / 1024:.0f} KiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf"))
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    for i, (name, (ov, dt, p, d)) in enumerate(FIXTURES.items()):
        build(name, ov, dt, p, d, a.out, a.seed + 17 * i)


if __name__ == "__main__":
    main()
