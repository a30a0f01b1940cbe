#!/usr/bin/env python3
"""Build a tiny AutoAWQ "GEMM" checkpoint (Llama) with a known quantization, and its reference logits.

Nothing can be downloaded, so the checkpoint is made here: a random LlamaForCausalLM, every linear layer of its decoder
quantized to 4 bits (asymmetric, group 32) with AutoAWQ's round-to-nearest formula (AwqQuantizer.pseudo_quantize_tensor:
scale = (max - min) / 15, zero = clamp(-round(min / scale), 0, 15), q = clamp(round(w / scale) + zero, 0, 15)), the
scale stored in fp16 as WQLinear_GEMM stores it, and packed exactly as AutoAWQ's WQLinear_GEMM.from_linear packs:

    intweight [in, out] = round((W + zeros * scales) / scales)  (per input column, then transposed)
    qweight   int32 [in, out / 8]:   qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (4 * i)
    qzeros    int32 [in / G, out / 8] the same packing of the zero points
    scales    fp16  [in / G, out]
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]                        (AWQ_ORDER in awq/utils/packing_utils.py)

and config.json carries quantization_config {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": true,
"version": "gemm"}. Embeddings, norms and lm_head are fp16, as in published AWQ checkpoints.

Output folder tests/fixtures/awq/llama_g32/:
  config.json, model.safetensors    the AWQ checkpoint
  source.safetensors                the quantization in plain form, per linear layer <p>:
                                      <p>.codes U8 [out, in], <p>.zeros U8 [out, in / G], <p>.scales F16 [out, in / G]
                                    (w = (codes - zeros) * scales): the reader must give exactly these
  reference.safetensors             prompt_ids, decode_ids, prefill_logits [P, V], decode_logits [D, V]: transformers in
                                    fp32 on the dequantized weights (eager attention; decode one token at a time)
  reference.json                    versions and settings

Usage (torch, transformers, safetensors):  python3 tools/make_awq_fixture.py [--out tests/fixtures/awq/llama_g32]
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

GROUP = 32
ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, bos_token_id=1,
              eos_token_id=2, tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu")
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def quantize(w):
    """AutoAWQ's zero-point round-to-nearest per group of GROUP input columns; w [out, in] fp32.
    Returns codes [out, in] int32, scales [out, in / G] fp16, zeros [out, in / G] int32."""
    out_f, in_f = w.shape
    g = w.reshape(-1, GROUP)
    max_val = g.amax(dim=1, keepdim=True)
    min_val = g.amin(dim=1, keepdim=True)
    scales = ((max_val - min_val).clamp(min=1e-5) / 15).half().float()  # the fp16 scale the checkpoint stores
    zeros = (-torch.round(min_val / scales)).clamp(0, 15)
    codes = torch.clamp(torch.round(g / scales) + zeros, 0, 15)
    return (codes.reshape(out_f, in_f).to(torch.int32), scales.reshape(out_f, -1).half(),
            zeros.reshape(out_f, -1).to(torch.int32))


def pack_awq(linear_weight, scales_t, zeros_t):
    """WQLinear_GEMM.from_linear, packing part (w_bit 4). linear_weight [out, in] fp32 (the dequantized weights),
    scales_t fp16 [in / G, out], zeros_t int [in / G, out]."""
    in_features = linear_weight.shape[1]
    scale_zeros = zeros_t.float() * scales_t.float()
    intweight = []
    for idx in range(in_features):
        intweight.append(torch.round((linear_weight[:, idx] + scale_zeros[idx // GROUP]) /
                                     scales_t[idx // GROUP].float()).to(torch.int)[:, None])
    intweight = torch.cat(intweight, dim=1).t().contiguous().to(torch.int32)  # [in, out]
    pack_num = 8
    qweight = torch.zeros((intweight.shape[0], intweight.shape[1] // 32 * 4), dtype=torch.int32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight[:, col] |= intweight[:, col * pack_num + ORDER_MAP[i]] << (i * 4)
    zeros = zeros_t.to(torch.int32)
    qzeros = torch.zeros((zeros.shape[0], zeros.shape[1] // 32 * 4), dtype=torch.int32)
    for col in range(zeros.shape[1] // pack_num):
        for i in range(pack_num):
            qzeros[:, col] |= zeros[:, col * pack_num + ORDER_MAP[i]] << (i * 4)
    return qweight, qzeros, intweight


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "awq",
                                                  "llama_g32"))
    ap.add_argument("--seed", type=int, default=4321)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(**CONFIG)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():  # as tools/make_hf_fixtures.py: larger than the default init
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5 * (3.0 if "embed" in n else 1.0))
        # fp16 storage for everything that stays in floating point (what the checkpoint holds).
        for n, p in model.named_parameters():
            p.copy_(p.half().float())

    tensors, source = {}, {}
    with torch.no_grad():
        tensors["model.embed_tokens.weight"] = model.model.embed_tokens.weight.half().contiguous()
        tensors["model.norm.weight"] = model.model.norm.weight.half().contiguous()
        tensors["lm_head.weight"] = model.lm_head.weight.half().contiguous()
        for l, layer in enumerate(model.model.layers):
            tensors[f"model.layers.{l}.input_layernorm.weight"] = layer.input_layernorm.weight.half().contiguous()
            tensors[f"model.layers.{l}.post_attention_layernorm.weight"] = \
                layer.post_attention_layernorm.weight.half().contiguous()
            for name in LINEARS:
                lin = layer.get_submodule(name)
                codes, scales, zeros = quantize(lin.weight.float())
                groups = scales.shape[1]
                dq = ((codes.reshape(-1, GROUP) - zeros.reshape(-1, 1)).float() *
                      scales.reshape(-1, 1).float()).reshape(codes.shape)
                lin.weight.copy_(dq)  # the reference model runs the exact dequantized weights in fp32
                qweight, qzeros, intweight = pack_awq(dq, scales.t().contiguous(), zeros.t().contiguous())
                assert torch.equal(intweight.t(), codes), f"{name}: packing did not recover the codes"
                p = f"model.layers.{l}.{name}"
                tensors[p + ".qweight"] = qweight
                tensors[p + ".qzeros"] = qzeros
                tensors[p + ".scales"] = scales.t().contiguous()
                source[p + ".codes"] = codes.to(torch.uint8).contiguous()
                source[p + ".zeros"] = zeros.to(torch.uint8).contiguous()
                source[p + ".scales"] = scales.contiguous()
                assert groups * GROUP == codes.shape[1]

    os.makedirs(a.out, exist_ok=True)
    save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    save_file(source, os.path.join(a.out, "source.safetensors"))
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(a.out)  # config.json as transformers writes it, then the AWQ fields
    with open(os.path.join(a.out, "config.json")) as f:
        c = json.load(f)
    c.pop("dtype", None)
    c["torch_dtype"] = "float16"
    c["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                                "version": "gemm", "modules_to_not_convert": None}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)

    g = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(3, CONFIG["vocab_size"], (1, 16), generator=g)
    prompt[0, 0] = cfg.bos_token_id
    decode_ids = torch.randint(3, CONFIG["vocab_size"], (1, 4), generator=g)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        o = model(input_ids=prompt, use_cache=True)
        prefill_logits = o.logits[0].float().clone()
        past = o.past_key_values
        dec = []
        for i in range(decode_ids.shape[1]):
            o = model(input_ids=decode_ids[:, i:i + 1], past_key_values=past, use_cache=True)
            past = o.past_key_values
            dec.append(o.logits[0, -1].float().clone())
    save_file({
        "prompt_ids": prompt[0].to(torch.int32).contiguous(),
        "decode_ids": decode_ids[0].to(torch.int32).contiguous(),
        "prefill_logits": prefill_logits.contiguous(),
        "decode_logits": torch.stack(dec).contiguous(),
    }, os.path.join(a.out, "reference.safetensors"))
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "seed": a.seed,
                   "group_size": GROUP, "reference_dtype": "float32", "attn_implementation": "eager"}, f, indent=2)
    size = sum(os.path.getsize(os.path.join(a.out, x)) for x in os.listdir(a.out))
    print(f"{a.out}: {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
