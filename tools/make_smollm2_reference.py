#!/usr/bin/env python3
"""Records Hugging Face transformers' logits for SmolLM2-135M-Instruct read from the GGUF file the engine reads
(models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, tools/fetch_smollm2.sh): the oracle of the SmolLM2 parity tests
(tests/test_e2e_gguf.cpp E2eSmolLM2.LogitsMatchTransformers, tests/cuda/test_gguf_cuda.cpp CudaGguf.SmolLM2*).

transformers reads the GGUF with the `gguf` package (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)): every
tensor dequantized to float32 (Q4_1 and Q8_0 exactly: d * q + m in fp32), llama.cpp's Q/K row permutation undone by
its own converter, the tokenizer built from tokenizer.ggml.* by its own GGUF-to-tokenizers conversion. The model runs
in float32 with eager attention on the CPU, so an fp32 engine differs by summation order only.

The prompt is a ChatML conversation (system, a user turn with a paragraph and a question, the assistant header),
tokenized by transformers' tokenizer; then 32 greedy steps through the KV cache, each step's input the previous
step's argmax. Written (small, committed):

  tests/fixtures/smollm2/reference.safetensors
    prompt_ids    I32 [P]        transformers' ids of the prompt text
    decode_ids    I32 [D]        the greedy tokens fed to the D = 32 decode steps: decode_ids[0] = argmax of the last
                                 prompt position, decode_ids[i] = argmax of step i-1's logits (reference.json "last":
                                 the argmax of the last step's)
    top_ids       I32 [N, K]     per position (the P prompt positions, then the D decode steps: N = P + D) the K = 32
                                 ids of the largest logits, largest first
    top_logits    F32 [N, K]     their logits
    probe_ids     I32 [M]        M = 64 fixed ids spread over the vocabulary (and the three special tokens)
    probe_logits  F32 [N, M]     the logits of those ids at every position
    logsumexp     F32 [N]        log sum exp of all the position's logits (the softmax normaliser)
  tests/fixtures/smollm2/reference.json   the prompt text, the greedy text, the versions, the gguf file's sha256

Requires torch, transformers, gguf and accelerate (transformers asks for it to load a GGUF). Usage:
    python3 tools/make_smollm2_reference.py [--gguf models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import hashlib
import json
import pathlib

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "tests" / "fixtures" / "smollm2"
TOP_K = 32
PROBES = 64
DECODE_STEPS = 32

PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nThe Amazon rainforest covers much of the Amazon basin of South America. It spans nine "
    "countries, and the majority of the forest, about sixty percent, is contained within Brazil. The rainforest is "
    "home to millions of species of insects, plants, birds and other animals, and it plays an important role in "
    "the global climate. Summarize this paragraph in two sentences, then name one threat to the forest.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=pathlib.Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args()
    gguf = args.gguf.resolve()
    torch.manual_seed(0)
    torch.set_num_threads(2)

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    prompt_ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    assert tok.decode(prompt_ids) == PROMPT, "the prompt does not round-trip through the tokenizer"
    V = model.config.vocab_size

    rows = []  # float32 logits [V] per position
    decode_ids = []
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        rows.extend(out.logits[0].float().numpy())
        past = out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
        for _ in range(DECODE_STEPS):
            decode_ids.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1].float().numpy())
            nxt = int(out.logits[0, -1].argmax())
    last = nxt
    L = np.stack(rows).astype(np.float32)  # [N, V]

    specials = [tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    spread = np.linspace(3, V - 1, PROBES - len(specials)).round().astype(np.int64)
    probe_ids = np.array(specials + sorted(set(spread.tolist())), dtype=np.int32)
    assert len(probe_ids) == PROBES, len(probe_ids)

    order = np.argsort(-L, axis=1, kind="stable")[:, :TOP_K]
    top_logits = np.take_along_axis(L, order, axis=1)
    m = L.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(L - m).sum(axis=1))).astype(np.float32)
    gaps = top_logits[:, 0] - top_logits[:, 1]

    args.out.mkdir(parents=True, exist_ok=True)
    save_file({
        "prompt_ids": np.array(prompt_ids, dtype=np.int32),
        "decode_ids": np.array(decode_ids, dtype=np.int32),
        "top_ids": order.astype(np.int32),
        "top_logits": np.ascontiguousarray(top_logits, dtype=np.float32),
        "probe_ids": probe_ids,
        "probe_logits": np.ascontiguousarray(L[:, probe_ids], dtype=np.float32),
        "logsumexp": lse,
    }, str(args.out / "reference.safetensors"))
    meta = {
        "gguf": gguf.name,
        "gguf_sha256": sha256(gguf),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "prompt": PROMPT,
        "prompt_tokens": len(prompt_ids),
        "decode_steps": DECODE_STEPS,
        "greedy_text": tok.decode(decode_ids),
        "last": last,
        "min_top2_gap_decode": float(gaps[len(prompt_ids) - 1:].min()),
    }
    (args.out / "reference.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(meta, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
