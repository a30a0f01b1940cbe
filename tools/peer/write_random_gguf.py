#!/usr/bin/env python3
"""Write a random-weight GGUF of a Llama shape for llama.cpp's llama-bench (tools/peer/llama_cpp_bench.sh).

Reads a Hugging Face style config.json (configs/llama2-7b.json: hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, vocab_size, rms_norm_eps, rope_theta, max_position_embeddings) and writes
general.architecture = llama with the llama.* keys, a minimal SentencePiece ("llama") vocabulary (<unk>, <s>, </s>,
the 256 byte tokens <0x00>..<0xFF>, then dummy pieces up to vocab_size) and F16 weights (F32 norms). The values only
have to be finite and not all zero: one random block (N(0, 0.02), a prime number of values) is tiled into one matrix
per distinct shape, written for every layer, so the 7B file (13.5 GB) costs little more than the disk write. Needs gguf-py on PYTHONPATH (the copy in
llama.cpp's gguf-py/) and numpy.

  PYTHONPATH=llama.cpp/gguf-py python3 tools/peer/write_random_gguf.py --config configs/llama2-7b.json --out f16.gguf
  ... --layers 2 --hidden 64 --intermediate 128 --heads 4 --vocab 512 --check   (a tiny file, read back)
"""
import argparse
import json
import sys
import time

import numpy as np

import gguf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config.json of a Llama shape")
    ap.add_argument("--out", required=True, help="the .gguf to write")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    ap.add_argument("--hidden", type=int, help="override hidden_size")
    ap.add_argument("--intermediate", type=int, help="override intermediate_size")
    ap.add_argument("--heads", type=int, help="override num_attention_heads (and num_key_value_heads)")
    ap.add_argument("--vocab", type=int, help="override vocab_size (at least 259)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="read the file back with GGUFReader and check it")
    a = ap.parse_args()

    with open(a.config) as f:
        cfg = json.load(f)
    n_embd = a.hidden or cfg["hidden_size"]
    n_ff = a.intermediate or cfg["intermediate_size"]
    n_layer = a.layers or cfg["num_hidden_layers"]
    n_head = a.heads or cfg["num_attention_heads"]
    n_head_kv = a.heads or cfg.get("num_key_value_heads", n_head)
    n_vocab = a.vocab or cfg["vocab_size"]
    n_ctx = cfg.get("max_position_embeddings", 4096)
    head_dim = n_embd // n_head
    if n_vocab < 259 or n_embd % n_head or n_head % n_head_kv:
        print("error: inconsistent shape", file=sys.stderr)
        return 2
    t0 = time.time()

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("random " + cfg.get("_name", a.config))
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # a SentencePiece-shaped vocabulary: llama.cpp's SPM loader wants <0x0A> for the newline token
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581t{i}" for i in range(len(tokens), n_vocab)]
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(cfg.get("bos_token_id", 1))
    w.add_eos_token_id(cfg.get("eos_token_id", 2))
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    # N(0, 0.02) values: one block of a prime length, tiled over each distinct shape (so rows differ), drawn once
    rng = np.random.default_rng(a.seed)
    base = (rng.standard_normal(1_000_003, dtype=np.float32) * 0.02).astype(np.float16)
    cache: dict = {}

    def rand(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) = ggml ne (cols, rows); one per shape
        if (rows, cols) not in cache:
            cache[(rows, cols)] = np.resize(base, rows * cols).reshape(rows, cols)
        return cache[(rows, cols)]

    norm = np.ones(n_embd, dtype=np.float32)
    kv_dim = head_dim * n_head_kv
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm)
        w.add_tensor(p + "attn_q.weight", rand(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", rand(kv_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", rand(kv_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", rand(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", norm)
        w.add_tensor(p + "ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", rand(n_embd, n_ff))
    w.add_tensor("output_norm.weight", norm)
    w.add_tensor("output.weight", rand(n_vocab, n_embd))
    t1 = time.time()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    t2 = time.time()
    n_tensors = 2 + 9 * n_layer + 1
    print(f"wrote {a.out}: {n_layer} layers, hidden {n_embd}, ffn {n_ff}, heads {n_head}/{n_head_kv}, vocab {n_vocab}, "
          f"{n_tensors} tensors; random draw {t1 - t0:.1f} s, write {t2 - t1:.1f} s")

    if a.check:
        r = gguf.GGUFReader(a.out)
        arch = r.fields["general.architecture"]
        assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
        assert len(r.tensors) == n_tensors, len(r.tensors)
        toks = r.fields["tokenizer.ggml.tokens"]
        assert len(toks.data) == n_vocab
        assert bytes(toks.parts[toks.data[13]]).decode() == "<0x0A>"
        for key in ("llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
                    "llama.context_length", "llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.scores",
                    "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            assert key in r.fields, key
        by_name = {t.name: t for t in r.tensors}
        q = by_name["blk.0.attn_q.weight"]
        assert q.tensor_type == gguf.GGMLQuantizationType.F16 and list(q.shape) == [n_embd, n_embd]
        down = by_name[f"blk.{n_layer - 1}.ffn_down.weight"]
        assert list(down.shape) == [n_ff, n_embd], down.shape  # ggml ne order: columns first
        assert np.array_equal(np.asarray(down.data).reshape(n_embd, n_ff), rand(n_embd, n_ff))
        for t in r.tensors:
            d = np.asarray(t.data, dtype=np.float32)
            assert np.isfinite(d).all() and np.abs(d).max() > 0, t.name
        print(f"check: {len(r.tensors)} tensors, {len(r.fields)} fields, read back OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
