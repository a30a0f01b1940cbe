#!/usr/bin/env python3
"""Greedy text of quest against llama.cpp's CPU build on the same GGUF (the second half of
tools/peer/llama_cpp_greedy.sh, which runs both and calls this), with Hugging Face transformers (fp32, the same GGUF
dequantized; the oracle of tests/fixtures/smollm2) as the referee where the two part.

  llama_cpp_divergence.py prompts DIR    write DIR/prompt_<i>.txt (the prompts, exactly)
  llama_cpp_divergence.py compare DIR    read DIR/llama_<i>.jsonl, DIR/llama_<i>.f32, DIR/quest_<i>.json; print the
                                         table and write DIR/summary.json

Per prompt: the common prefix of the generated tokens. llama.cpp quantizes the activations to Q8_1 for its Q4_1 /
Q8_0 dot products on the CPU, so its logits are not fp32's: along llama.cpp's own greedy sequence, transformers'
logits (one teacher-forced forward) against llama.cpp's measure that error, as the error of the top-2 margin
(llama.cpp's l[a] - l[b] minus transformers', a, b transformers' top two) at every generated step of every prompt.
Where the texts part, the margin between quest's token and llama.cpp's token in transformers' logits (quest's CPU
backend equals those within 1e-4: E2eSmolLM2.LogitsMatchTransformers) and in llama.cpp's are set against that error.
"""
import json
import pathlib
import sys

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are",
    "Photosynthesis is the process by which",
    "<|im_start|>user\nGive me three tips for sleeping well.<|im_end|>\n<|im_start|>assistant\n",
]
GGUF = pathlib.Path(__file__).resolve().parents[2] / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def write_prompts(d: pathlib.Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(PROMPTS):
        (d / f"prompt_{i}.txt").write_bytes(p.encode())
    print(len(PROMPTS))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def compare(d: pathlib.Path, gguf: pathlib.Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()

    def hf_logits(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float().numpy()

    rows, margin_err, max_abs_err = [], [], []
    for i, prompt in enumerate(PROMPTS):
        lines = [json.loads(x) for x in (d / f"llama_{i}.jsonl").read_text().splitlines() if x.strip()]
        l_prompt = lines[0]["prompt_ids"]
        l_gen = [x["id"] for x in lines[1:]]
        q = json.loads((d / f"quest_{i}.json").read_text())
        q_prompt, q_gen = q["prompt_tokens"], q["tokens"]
        hf_prompt = tok(prompt, add_special_tokens=False)["input_ids"]
        V = model.config.vocab_size
        L_ll = np.fromfile(d / f"llama_{i}.f32", dtype=np.float32).reshape(-1, V)
        assert L_ll.shape[0] == len(l_gen), (L_ll.shape, len(l_gen))
        P = len(l_prompt)
        # transformers along llama.cpp's sequence: the logits each llama.cpp step chose from
        H_ll = hf_logits(l_prompt + l_gen[:-1])[P - 1:]
        llama_is_hf = sum(int(H_ll[s].argmax() == l_gen[s]) for s in range(len(l_gen)))
        for s in range(len(l_gen)):
            a, b = np.argsort(-H_ll[s])[:2]
            margin_err.append(float((L_ll[s, a] - L_ll[s, b]) - (H_ll[s, a] - H_ll[s, b])))
            max_abs_err.append(float(np.abs(L_ll[s] - H_ll[s]).max()))
        # transformers along quest's sequence: is every quest token transformers' argmax, and by how much
        H_q = hf_logits(q_prompt + q_gen[:-1])[len(q_prompt) - 1:]
        hf_agrees = sum(int(H_q[s].argmax() == q_gen[s]) for s in range(len(q_gen)))
        k = common_prefix(l_gen, q_gen)
        row = {"prompt": prompt, "prompt_tokens": P, "prompt_ids_equal": l_prompt == q_prompt == hf_prompt,
               "llama_tokens": len(l_gen), "quest_tokens": len(q_gen), "common_prefix": k,
               "quest_is_hf_argmax": hf_agrees, "llama_is_hf_argmax": llama_is_hf, "quest_stop": q["stop_reason"],
               "llama_text": tok.decode(l_gen), "quest_text": q["text"]}
        if k < min(len(l_gen), len(q_gen)):
            tq, tl = q_gen[k], l_gen[k]
            h = H_q[k]  # the same prefix: transformers' logits at the first divergence
            row["divergence"] = {
                "step": k, "quest_token": tq, "llama_token": tl,
                "quest_piece": tok.decode([tq]), "llama_piece": tok.decode([tl]),
                "hf_margin": float(h[tq] - h[tl]),            # >= 0: transformers (and quest) prefer quest's token
                "llama_margin": float(L_ll[k, tl] - L_ll[k, tq]),  # >= 0: llama.cpp prefers its own
                "hf_top2": [[int(j), float(h[j])] for j in np.argsort(-h)[:2]],
                "llama_top2": [[int(j), float(L_ll[k, j])] for j in np.argsort(-L_ll[k])[:2]],
            }
        rows.append(row)

    e = np.abs(np.array(margin_err))
    stats = {"steps": int(e.size), "margin_err_median": float(np.median(e)), "margin_err_p90": float(np.percentile(e, 90)),
             "margin_err_p99": float(np.percentile(e, 99)), "margin_err_max": float(e.max()),
             "logit_max_abs_err_median": float(np.median(max_abs_err)), "logit_max_abs_err_max": float(np.max(max_abs_err))}
    (d / "summary.json").write_text(json.dumps({"rows": rows, "llama_error": stats}, indent=2, ensure_ascii=False))

    print("| # | prompt | prompt tokens | llama.cpp / quest tokens | common prefix | quest = transformers' argmax "
          "| llama.cpp = transformers' argmax |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, r in enumerate(rows):
        p = r["prompt"].replace("\n", "\\n").replace("|", "\\|")
        print(f"| {i} | `{p[:48]}{'...' if len(p) > 48 else ''}` | {r['prompt_tokens']}"
              f"{'' if r['prompt_ids_equal'] else ' (ids differ!)'} | {r['llama_tokens']} / {r['quest_tokens']} "
              f"| {r['common_prefix']} | {r['quest_is_hf_argmax']} / {r['quest_tokens']} "
              f"| {r['llama_is_hf_argmax']} / {r['llama_tokens']} |")
    print()
    print(f"llama.cpp's error against transformers fp32 over {stats['steps']} generated steps: top-2 margin error "
          f"|d| median {stats['margin_err_median']:.3f}, p90 {stats['margin_err_p90']:.3f}, p99 "
          f"{stats['margin_err_p99']:.3f}, max {stats['margin_err_max']:.3f}; max |logit error| per step median "
          f"{stats['logit_max_abs_err_median']:.3f}, max {stats['logit_max_abs_err_max']:.3f}")
    for i, r in enumerate(rows):
        v = r.get("divergence")
        if not v:
            continue
        print(f"prompt {i}: parts at step {v['step']}: quest {v['quest_token']} {v['quest_piece']!r}, llama.cpp "
              f"{v['llama_token']} {v['llama_piece']!r}; transformers' margin (quest's - llama.cpp's) "
              f"{v['hf_margin']:.4f}, llama.cpp's (its - quest's) {v['llama_margin']:.4f}; their sum, llama.cpp's "
              f"error on this margin, {v['hf_margin'] + v['llama_margin']:.4f} (p90 of its margin error "
              f"{stats['margin_err_p90']:.3f})")
    for i, r in enumerate(rows):
        print(f"--- prompt {i}\nllama.cpp: {r['llama_text']!r}\nquest:     {r['quest_text']!r}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("prompts", "compare"):
        sys.exit("usage: llama_cpp_divergence.py prompts|compare DIR [GGUF]")
    d = pathlib.Path(sys.argv[2])
    if sys.argv[1] == "prompts":
        write_prompts(d)
    else:
        compare(d, pathlib.Path(sys.argv[3]).resolve() if len(sys.argv) > 3 else GGUF)
