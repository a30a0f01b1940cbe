#!/usr/bin/env python3
"""Build small random Hugging Face models (Llama, Qwen2, Mistral) with transformers and record their reference logits.

Each fixture is a folder tests/fixtures/hf/<name>/ with
  config.json, model.safetensors   the model exactly as transformers saves it (save_pretrained)
  reference.safetensors            prompt_ids I32 [P], decode_ids I32 [D],
                                   prefill_logits F32 [P, V]  (one forward over the prompt)
                                   decode_logits  F32 [D, V]  (then one token at a time through the KV cache)
  reference.json                   versions and settings used

Qwen2 / Mistral fixtures ("qwen2_*", "mistral_*") use their own config and model classes; those with a sliding
window shorter than the context check, besides, that the cached decode logits equal one forward over the whole
sequence (the window is a mask, not an artefact of the cache).

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
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

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
    # Qwen2: q/k/v biases; no window (use_sliding_window false, as Qwen2.5 ships).
    "qwen2_gqa2":    (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1000000.0,
                           use_sliding_window=False, sliding_window=None, max_window_layers=2), torch.bfloat16, 20, 6),
    # Qwen2 with a 24-token window on the layers i >= max_window_layers = 1 (layer 0 full), context 64 = 56 + 8.
    "qwen2_swa24":   (dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                           use_sliding_window=True, sliding_window=24, max_window_layers=1), torch.float16, 56, 8),
    # Mistral: a 24-token window on every layer, context 64.
    "mistral_swa24": (dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=24),
                      torch.float16, 56, 8),
}

ARCH = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM)}


def family(name):
    return name.split("_")[0] if name.split("_")[0] in ARCH else "llama"


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
    config_cls, model_cls = ARCH[family(name)]
    base = dict(BASE)
    if family(name) != "llama":  # Llama-only options
        base.pop("attention_bias")
        base.pop("mlp_bias")
    cfg = config_cls(**{**base, **overrides})
    model = model_cls(cfg)
    # Larger-than-default weights so attention is not uniform and the logits are not all near zero.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):  # Qwen2's q/k/v biases: large enough to matter
                p.copy_(0.5 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5 * (3.0 if "embed" in n else 1.0))
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    if name.endswith("_legacy"):
        to_legacy_config(os.path.join(out, "config.json"))

    # Reference: reload what was saved, upcast to fp32, eager attention.
    ref = model_cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
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
        window = getattr(ref.config, "sliding_window", None)
        if window is not None and window < prompt_len + steps:
            whole = ref(input_ids=torch.cat([prompt, decode_ids], 1), use_cache=False).logits[0].float()
            assert torch.allclose(whole[:prompt_len], prefill_logits, atol=1e-4, rtol=1e-4)
            assert torch.allclose(whole[prompt_len:], torch.stack(dec), atol=1e-4, rtol=1e-4)
            # ... and that it matters: the same model with a window longer than the sequence differs.
            ref.config.sliding_window = 1 << 20
            unwindowed = ref(input_ids=torch.cat([prompt, decode_ids], 1), use_cache=False).logits[0].float()
            ref.config.sliding_window = window
            assert (unwindowed[prompt_len:] - whole[prompt_len:]).abs().max() > 1e-2, "the window changes nothing"
    save_file({
        "prompt_ids": prompt[0].to(torch.int32).contiguous(),
        "decode_ids": decode_ids[0].to(torch.int32).contiguous(),
        "prefill_logits": prefill_logits.contiguous(),
        "decode_logits": torch.stack(dec).contiguous(),
    }, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "seed": seed,
                   "storage_dtype": str(dtype), "reference_dtype": "float32", "attn_implementation": "eager",
                   "architecture": type(ref).__name__,
                   "layer_types": getattr(ref.config, "layer_types", None) if family(name) == "qwen2" else None,
                   "sliding_window": getattr(ref.config, "sliding_window", None)}, f,
                  indent=2)
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    print(f"{name}: {size / 1024:.0f} KiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    for i, (name, (ov, dt, p, d)) in enumerate(FIXTURES.items()):
        if not only or name in only:
            build(name, ov, dt, p, d, a.out, a.seed + 17 * i)


if __name__ == "__main__":
    main()
