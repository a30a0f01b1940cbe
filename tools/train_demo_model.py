#!/usr/bin/env python3
"""Trains quest's demo model: a small Llama-2-style model that retrieves pass keys and key-value facts at 4K tokens.

The data is synthetic (tools/make_retrieval_data.py: pass keys and key-value facts hidden in children's-story
filler, questions at the end), the tokenizer the project's own (tools/data/retrieval-tokenizer.model, 2048 pieces,
digits split). The model is a transformers LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, GQA, tied embeddings, no
biases), trained with AdamW, warmup then cosine decay, bf16 autocast on the GPU, over a curriculum of context
lengths (256 -> 1024 -> 2048 -> 4608 tokens by default, the longest one past the 4096-token evaluation so that no
position is extrapolated). Training stops at --minutes or --max-steps, whichever comes first; the schedule and the
curriculum follow the progress towards that stop, so the same command fits any machine speed.

Every --eval-every minutes it measures pass-key accuracy (the exact `quest eval passkey` prompt) and multi-key
accuracy through transformers, and exports the model (so that a run cut short still leaves one). The export is a
Hugging Face folder that quest loads: config.json, model.safetensors (FP16), tokenizer.model, plus training.json
(settings, curve, final table).

  python3 tools/train_demo_model.py --out OUT/demo                 # the H200 run (docs/training.md)
  python3 tools/train_demo_model.py --out /tmp/tiny --tiny --max-steps 300   # a CPU smoke test
  python3 tools/train_demo_model.py --check OUT/demo --quest build/quest      # quest vs transformers on the export
"""

import argparse
import collections
import json
import math
import multiprocessing as mp
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_retrieval_data as data  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------------------
# Data workers (forked before CUDA is initialized; they use numpy and sentencepiece only)
# ---------------------------------------------------------------------------------------------------------------------

_COMP = None


def _worker_init(tokenizer, seed):
    global _COMP
    _COMP = data.Composer(data.load_sp(tokenizer), seed=seed)


def _worker_batch(args):
    seed, batch_size, length, pad_id, mix = args
    return _COMP.batch(seed, batch_size, length, pad_id, mix) + (length,)


class Batches:
    """Batches produced ahead by a process pool; the length of each is chosen when it is requested."""

    def __init__(self, tokenizer, seed, workers, pad_id, mix):
        self.pad_id, self.mix, self.seed = pad_id, mix, seed
        self.n = 0
        self.queue = collections.deque()
        self.pool = None
        if workers > 0:
            self.pool = mp.get_context("fork").Pool(workers, _worker_init, (str(tokenizer), seed))
            self.depth = 2 * workers
        else:
            _worker_init(str(tokenizer), seed)

    def _args(self, batch_size, length):
        self.n += 1
        return (self.seed * 1_000_003 + self.n, batch_size, length, self.pad_id, self.mix)

    def next(self, pick):
        """`pick()` -> (batch_size, length) for a batch requested now."""
        if self.pool is None:
            return _worker_batch(self._args(*pick()))
        while len(self.queue) < self.depth:
            self.queue.append(self.pool.apply_async(_worker_batch, (self._args(*pick()),)))
        return self.queue.popleft().get()

    def close(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


# ---------------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------------

def model_config(a, vocab):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim, hidden_act="silu",
        max_position_embeddings=a.max_positions, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": float(a.rope_theta)}, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2,
        initializer_range=0.02)


def quest_config_json(a, vocab):
    """config.json as quest (model/core/config.cpp) and transformers both read it: Llama-2 spelling plus transformers
    5's rope_parameters (the same theta)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_comment": "quest's trained demo model (tools/train_demo_model.py, docs/training.md)",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": float(a.rope_theta),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(a.rope_theta)},
        "max_position_embeddings": a.max_positions,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }


def export(model, a, vocab, out, extra=None):
    """Writes the Hugging Face folder atomically file by file; returns the weights' size in bytes."""
    import torch
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":  # tied to model.embed_tokens.weight
            continue
        sd[k] = v.detach().to("cpu", torch.float16).contiguous()
    for name, write in (
        ("model.safetensors", lambda p: save_file(sd, str(p), metadata={"format": "pt"})),
        ("config.json", lambda p: p.write_text(json.dumps(quest_config_json(a, vocab), indent=2) + "\n")),
        ("tokenizer.model", lambda p: shutil.copyfile(a.tokenizer, p)),
    ) + ((("training.json", lambda p: p.write_text(json.dumps(extra, indent=1) + "\n")),) if extra else ()):
        tmp = out / (name + ".tmp")
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return (out / "model.safetensors").stat().st_size


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation through transformers
# ---------------------------------------------------------------------------------------------------------------------

_EVAL_ROWS = {}


def eval_rows(comp, task, context, n, seed, n_keys=8):
    """[(prefill, question, answer)] with depths spread 0..1: passkey in the engine's exact format, multikey in
    mixed filler (what `make_retrieval_data.py eval-set` writes). The same rows at every evaluation."""
    key = (task, context, n, seed, n_keys)
    if key not in _EVAL_ROWS:
        _EVAL_ROWS[key] = [data.split_for_eval(comp, d)
                           for d in data.eval_docs(comp, task, context, n, seed, n_keys=n_keys)]
    return _EVAL_ROWS[key]


def teacher_forced_accuracy(model, rows, device, autocast, batch_size):
    """Share of rows whose every answer token is the argmax after prefill + question + the answer so far: the
    same as greedy decoding producing the answer (each greedy step would see exactly these tokens)."""
    import torch
    ok = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        seqs = [np.concatenate([p, q, ans]) for p, q, ans in chunk]
        L = max(len(s) for s in seqs)
        x = np.full((len(seqs), L), 2, dtype=np.int64)
        for b, s in enumerate(seqs):
            x[b, :len(s)] = s
        with torch.no_grad(), autocast():
            logits = model(input_ids=torch.from_numpy(x).to(device)).logits
        pred = logits.argmax(-1).cpu().numpy()
        for b, (p, q, ans) in enumerate(chunk):
            start = len(p) + len(q)
            ok.append(bool(np.all(pred[b, start - 1:start - 1 + len(ans)] == ans)))
    return float(np.mean(ok)), ok


def greedy_answers(model, rows, device, autocast, sp, max_new=8):
    """Greedy decoding (a full forward per new token: no cache API, which differs between transformers versions),
    one row at a time; the digits of the answer as `quest eval passkey` reads them."""
    import torch
    out = []
    for p, q, ans in rows:
        ids = [int(t) for t in np.concatenate([p, q])]
        text = ""
        for _ in range(max_new):
            with torch.no_grad(), autocast():
                t = int(model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].argmax())
            if t == sp.eos_id():
                break
            ids.append(t)
            text += sp.decode([t])
            if "." in text or "\n" in text:
                break
        digits = ""
        for ch in text:
            if ch.isdigit():
                digits += ch
            elif digits:
                break
        out.append((digits, sp.decode(ans.tolist()).strip(". ")))
    return out


def evaluate(model, comp, a, device, autocast, lengths, n, seed=7, keys=(8,)):
    model.eval()
    res = {}
    for L in lengths:
        bs = max(1, a.eval_batch_tokens // L)
        res[f"passkey@{L}"] = teacher_forced_accuracy(model, eval_rows(comp, "passkey", L, n, seed), device,
                                                      autocast, bs)[0]
        for k in keys:
            res[f"multikey{k}@{L}"] = teacher_forced_accuracy(
                model, eval_rows(comp, "multikey", L, n, seed, n_keys=k), device, autocast, bs)[0]
    model.train()
    return res


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------

def parse_stages(s):
    """"256:0,1024:0.1" -> [(0.0, 256), (0.1, 1024)]: from each progress fraction on, the longest length."""
    st = sorted((float(p), int(L)) for L, p in (x.split(":") for x in s.split(",")))
    assert st[0][0] == 0.0, "--stages must start at progress 0"
    return st


def train(a):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    t_start = time.time()
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    sp = data.load_sp(a.tokenizer)
    vocab = sp.vocab_size()
    stages = parse_stages(a.stages)
    max_len = max(L for _, L in stages)
    if max_len > a.max_positions:
        sys.exit(f"error: the longest stage ({max_len}) exceeds --max-positions ({a.max_positions})")
    mix = tuple(float(x) for x in a.mix.split(","))

    # The pool forks before CUDA starts.
    batches = Batches(a.tokenizer, a.seed, a.workers, sp.eos_id(), mix)
    comp = data.Composer(sp, seed=a.seed)  # evaluation documents, in this process

    device = torch.device(a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"

    amp = a.amp if a.amp != "auto" else ("bf16" if cuda else "off")

    def autocast():  # bf16 autocast over fp32 weights (also on the CPU with --amp bf16, to test that path)
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16")

    cfg = model_config(a, vocab)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    # What quest will compute from config.json: RoPE with this theta, tied embeddings.
    inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float32) / a.head_dim))
    assert torch.allclose(model.model.rotary_emb.inv_freq.float().cpu(), inv, rtol=1e-6), "unexpected RoPE frequencies"
    assert model.lm_head.weight is model.model.embed_tokens.weight, "embeddings are not tied"
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n_]
    no_decay = [p for n_, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n_)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))

    step, elapsed_before, history = 0, 0.0, []
    ckpt = pathlib.Path(a.ckpt) if a.ckpt else None
    if ckpt and a.resume and ckpt.exists():
        st = torch.load(ckpt, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed_before, history = st["step"], st["elapsed"], st["history"]
        print(f"resumed from {ckpt} at step {step} ({elapsed_before / 60:.1f} min trained)", flush=True)

    budget_s = a.minutes * 60.0
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))

    eval_lengths = [L for L in a.eval_lengths if L <= a.max_positions]
    print(f"model: {n_params / 1e6:.2f}M parameters ({n_params * 2 / 2**20:.1f} MiB in FP16), {a.layers} layers, "
          f"hidden {a.hidden}, {a.heads} heads / {a.kv_heads} KV heads of {a.head_dim}, vocab {vocab}, "
          f"rope_theta {a.rope_theta:g}; device {device}, amp {amp}; stages {stages}; budget {a.minutes} min / "
          f"{a.max_steps or 'no'} max steps; {a.batch_tokens} tokens per step", flush=True)

    rng = random.Random(a.seed + 17)
    t_train = time.time()
    clock = {"eval": 0.0}

    def progress():
        p_time = (elapsed_before + time.time() - t_train - (clock["eval"] if a.eval_outside_budget else 0)) / budget_s
        p_step = step / a.max_steps if a.max_steps else 0.0
        return min(1.0, max(p_time, p_step))

    def pick():
        p = progress()
        stage = max(i for i, (s, _) in enumerate(stages) if s <= p)
        L = stages[stage][1]
        if stage > 0 and rng.random() < a.short_share:  # keep the shorter lengths in the mix
            L = stages[rng.randrange(stage)][1]
        return max(1, a.batch_tokens // L), L

    def lr_at(p):
        warm = min(1.0, (step + 1) / a.warmup)
        return a.lr * warm * (a.min_lr + (1 - a.min_lr) * 0.5 * (1 + math.cos(math.pi * p)))

    def save_all(final_table=None):
        extra = {"args": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(a).items()},
                 "parameters": n_params, "steps": step, "minutes": (elapsed_before + time.time() - t_train) / 60,
                 "history": history, "final": final_table,
                 "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                              "device": torch.cuda.get_device_name() if cuda else "cpu"}}
        size = export(model, a, vocab, pathlib.Path(a.out), extra)
        if ckpt:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "elapsed": elapsed_before + time.time() - t_train, "history": history}, str(ckpt) + ".tmp")
            os.replace(str(ckpt) + ".tmp", ckpt)
        return size

    try:
        model.train()
        last_eval = time.time()
        win = collections.deque(maxlen=20)
        tokens_seen = 0
        t_log = time.time()
        while not stop["flag"]:
            p = progress()
            if p >= 1.0:
                break
            ids, kind, L = batches.next(pick)
            x = torch.from_numpy(ids).to(device, dtype=torch.long, non_blocking=True)
            k = torch.from_numpy(kind).to(device, non_blocking=True)
            for g in opt.param_groups:
                g["lr"] = lr_at(p)
            with autocast():
                logits = model(input_ids=x).logits
            logits = logits[:, :-1].float()
            tgt, kk = x[:, 1:], k[:, 1:]
            ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), reduction="none").view_as(tgt)
            text_m, ans_m = (kk > 0).float(), (kk == 2).float()
            loss_text = (ce * text_m).sum() / text_m.sum()
            loss_ans = (ce * ans_m).sum() / ans_m.sum().clamp(min=1)
            loss = loss_text + a.answer_weight * loss_ans
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            step += 1
            tokens_seen += int(ids.size)
            if step % a.log_every == 0 or step == 1:
                with torch.no_grad():
                    ans_acc = ((logits.argmax(-1) == tgt).float() * ans_m).sum() / ans_m.sum().clamp(min=1)
                win.append((loss_text.item(), loss_ans.item(), ans_acc.item()))
                lt, la, aa = (float(np.mean([w[i] for w in win])) for i in range(3))
                dt = time.time() - t_log
                t_log = time.time()
                print(f"step {step:6d}  p {p:.3f}  len {L:5d}  lr {lr_at(p):.2e}  loss {lt:.3f}  answer loss {la:.3f}  "
                      f"answer-token acc {aa:.3f}  gnorm {float(gnorm):.2f}  "
                      f"{tokens_seen / max(dt, 1e-9) / 1e3:.0f}K tok/s",
                      flush=True)
                tokens_seen = 0
                history.append({"step": step, "progress": round(p, 4), "len": L, "loss": round(lt, 4),
                                "answer_loss": round(la, 4), "answer_token_acc": round(aa, 4)})
            if a.eval_every > 0 and time.time() - last_eval >= a.eval_every * 60:
                t0 = time.time()
                res = evaluate(model, comp, a, device, autocast, eval_lengths, a.eval_samples)
                history.append({"step": step, "eval": res})
                size = save_all()
                print(f"eval at step {step}: " + "  ".join(f"{k_} {v:.2f}" for k_, v in res.items()) +
                      f"  (exported, {size / 2**20:.1f} MiB, {time.time() - t0:.1f} s)", flush=True)
                last_eval = time.time()
                clock["eval"] += time.time() - t0
    finally:
        batches.close()
    train_s = time.time() - t_train

    # Final table: accuracy by length and task, a greedy-decoding cross-check, the export.
    t0 = time.time()
    model.eval()
    table = {}
    for L in a.final_lengths:
        if L > a.max_positions:
            continue
        bs = max(1, a.eval_batch_tokens // L)
        row = {"passkey": teacher_forced_accuracy(model, eval_rows(comp, "passkey", L, a.final_samples, 11),
                                                  device, autocast, bs)[0]}
        for kk_ in a.final_keys:
            row[f"multikey{kk_}"] = teacher_forced_accuracy(
                model, eval_rows(comp, "multikey", L, a.final_samples, 11, n_keys=kk_), device, autocast, bs)[0]
        table[L] = row
    check_len = max([L for L in a.final_lengths if L <= max_len] or [max_len])
    greedy = greedy_answers(model, eval_rows(comp, "passkey", check_len, 4, 13), device, autocast, sp)
    size = save_all({"table": {str(k_): v for k_, v in table.items()},
                     "greedy_check": {"context": check_len, "answers": greedy}, "train_seconds": train_s})
    print(f"\ntrained {step} steps in {train_s / 60:.1f} min (+{(time.time() - t_start - train_s) / 60:.1f} min "
          f"setup/eval); model {n_params / 1e6:.2f}M parameters, model.safetensors {size / 2**20:.2f} MiB -> {a.out}")
    cols = list(next(iter(table.values())).keys()) if table else []
    print(f"\n{'context':>8} " + " ".join(f"{c:>11}" for c in cols) + f"   ({a.final_samples} prompts each, "
          "depths 0..100%, full attention, transformers)")
    for L, row in table.items():
        print(f"{L:8d} " + " ".join(f"{100 * row[c]:10.0f}%" for c in cols))
    print(f"greedy decoding at {check_len}: " + ", ".join(f"{g}{'=' if g == w else '!='}{w}" for g, w in greedy) +
          f"  (final eval {time.time() - t0:.0f} s)")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# quest vs transformers on an exported folder
# ---------------------------------------------------------------------------------------------------------------------

def check(a):
    """(1) greedy tokens of `quest generate --temp 0` against transformers' greedy decoding on a pass-key prompt;
    (2) `quest eval ppl` (full attention) against the same negative log-likelihood computed by transformers
    (the log-probabilities of the tokens after a window, from one causal forward), both in fp32 on the CPU."""
    import torch
    from transformers import LlamaForCausalLM
    d = pathlib.Path(a.check)
    quest = str(pathlib.Path(a.quest).resolve())
    sp = data.load_sp(d / "tokenizer.model")
    model = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32, attn_implementation="eager").eval()
    comp = data.Composer(sp, seed=0, pool_size=2000)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # (1) a varied pass-key document as one text (quest encodes it whole, BOS first)
        doc = comp.passkey_varied(random.Random(5), a.check_len)
        qi = next(i for i in range(len(doc.segs)) if doc.answer[i])
        pre = data.Doc()
        pre.segs = doc.segs[:qi]
        prompt = data.doc_text(pre)
        (tmp / "prompt.txt").write_text(prompt)
        n = 12
        r = subprocess.run([quest, "generate", "-m", str(d), "--prompt-file", str(tmp / "prompt.txt"), "-n", str(n),
                            "--temp", "0", "--full-attention", "--json", str(tmp / "gen.json")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr)
            return 1
        g = json.loads((tmp / "gen.json").read_text())
        ids = [sp.bos_id()] + sp.encode(prompt)
        same_prompt = g["prompt_tokens"] == ids
        hf = []
        with torch.no_grad():
            for _ in range(len(g["tokens"])):
                t = int(model(input_ids=torch.tensor([ids + hf])).logits[0, -1].argmax())
                hf.append(t)
        same = hf == g["tokens"]
        ok &= same and same_prompt
        print(f"greedy ({len(ids)}-token prompt, key {doc.meta['key']}): quest {sp.decode(g['tokens'])!r} | "
              f"transformers {sp.decode(hf)!r} -> {'same tokens' if same else 'DIFFERENT'}"
              f"{'' if same_prompt else ' (prompt tokens differ!)'}")

        # (2) perplexity of held-out stories
        _, held = data.split_stories(data.read_stories())
        text = "\n\n".join(" ".join(st) for st in held)
        (tmp / "ppl.txt").write_text(text)
        max_tokens, window = a.check_len, a.check_len // 2
        r = subprocess.run([quest, "eval", "ppl", "-m", str(d), "--text", str(tmp / "ppl.txt"), "--budgets", "full",
                            "--window", str(window), "--max-tokens", str(max_tokens), "--json", str(tmp / "ppl.json")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr)
            return 1
        q_nll = json.loads((tmp / "ppl.json").read_text())[0]["nll"]
        ids = ([sp.bos_id()] + sp.encode(text))[:max_tokens]
        with torch.no_grad():  # one causal forward gives every position's logits
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
        nll = -sum(float(logp[t - 1, ids[t]]) for t in range(window, len(ids)))
        hf_nll = nll / (len(ids) - window)
        rel = abs(q_nll - hf_nll) / hf_nll
        ok &= rel < 1e-4
        print(f"held-out stories, {len(ids) - window} tokens after a {window}-token window: nll quest {q_nll:.6f}, "
              f"transformers {hf_nll:.6f} (relative difference {rel:.1e}; perplexity {math.exp(hf_nll):.2f})")
    print("OK: quest matches transformers" if ok else "MISMATCH")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="out/demo", help="Hugging Face folder to write")
    p.add_argument("--tokenizer", type=pathlib.Path, default=data.DEFAULT_TOKENIZER)
    p.add_argument("--minutes", type=float, default=8.0, help="training time budget (evaluations included)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto", help="auto: bf16 on cuda, off on cpu")
    p.add_argument("--workers", type=int, default=min(10, max(0, (os.cpu_count() or 2) - 4)),
                   help="data processes (0: in the training process)")
    # model
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=640)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--max-positions", type=int, default=8192, help="max_position_embeddings of the export")
    # optimization
    p.add_argument("--stages", default="256:0,1024:0.12,2048:0.3,4608:0.5",
                   help="LENGTH:PROGRESS,...: the longest training length from each share of the run on")
    p.add_argument("--short-share", type=float, default=0.3, help="share of batches at an earlier stage's length")
    p.add_argument("--batch-tokens", type=int, default=65536, help="tokens per step (batch = this / length)")
    p.add_argument("--mix", default="0.25,0.30,0.45", help="shares of engine-format passkey, varied passkey; the "
                   "rest multikey")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=0.1, help="final learning rate as a share of --lr")
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--answer-weight", type=float, default=1.0, help="weight of the answer tokens' mean loss")
    # evaluation, checkpoints
    p.add_argument("--eval-every", type=float, default=1.5, help="minutes between evaluations + exports (0: off)")
    p.add_argument("--eval-outside-budget", action="store_true", help="do not count evaluation time in --minutes")
    p.add_argument("--eval-lengths", default="1024,4096", type=data.int_list)
    p.add_argument("--eval-samples", type=int, default=32)
    p.add_argument("--eval-batch-tokens", type=int, default=65536)
    p.add_argument("--final-lengths", default="1024,2048,4096,8192", type=data.int_list)
    p.add_argument("--final-keys", default="4,8,16", type=data.int_list)
    p.add_argument("--final-samples", type=int, default=50)
    p.add_argument("--ckpt", default=os.path.join(tempfile.gettempdir(), "quest-demo-ckpt.pt"),
                   help="checkpoint written at every evaluation ('' : none)")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--tiny", action="store_true", help="a CPU smoke-test configuration (2 layers, hidden 64, "
                   "lengths 128 -> 384)")
    # check
    p.add_argument("--check", metavar="DIR", help="compare quest with transformers on an exported folder")
    p.add_argument("--quest", default=str(ROOT / "build" / "quest"), help="quest binary for --check")
    p.add_argument("--check-len", type=int, default=1024, help="--check: prompt and text length in tokens")
    if "--tiny" in (sys.argv[1:] if argv is None else argv):  # defaults that explicit flags still override
        p.set_defaults(layers=2, hidden=64, intermediate=192, heads=4, kv_heads=2, head_dim=16,
                       stages="128:0,256:0.4,384:0.7", batch_tokens=4096, max_positions=512, eval_lengths=[256],
                       final_lengths=[256, 384], final_keys=[4], eval_samples=16, final_samples=24, warmup=30,
                       log_every=10, workers=1)
    a = p.parse_args(argv)
    if a.check:
        return check(a)
    return train(a)


if __name__ == "__main__":
    sys.exit(main())
