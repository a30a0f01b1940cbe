#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/seed-*): small valid and malformed inputs.

Deterministic (no randomness); run it again after changing it, and commit the result. Files named crash-* or
regress-* in the corpus folders are reproducers of bugs the fuzzers found: this script never touches them.
Standard library only.
"""
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")

F16 = {"F32": ("<f", 4), "F16": ("<e", 2)}


def st(tensors, metadata=None, pad=True, header_len=None, extra=b""):
    """safetensors bytes; tensors: list of (name, dtype, shape, values or raw bytes)."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, values in tensors:
        if isinstance(values, bytes):
            raw = values
        else:
            fmt, _ = F16.get(dtype, ("<f", 4))
            raw = b"".join(struct.pack(fmt, v) for v in values)
            if dtype == "BF16":
                raw = b"".join(struct.pack("<f", v)[2:] for v in values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data + extra


def st_raw_header(header_text, data=b"", header_len=None):
    text = header_text.encode() if isinstance(header_text, str) else header_text
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data


def bundle(files):
    out = b""
    for name, body in files:
        if isinstance(body, str):
            body = body.encode()
        out += (b"\n" if out else b"") + b"@@ " + name.encode() + b"\n" + body
    return out


def llama_config(**over):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
         "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64, "vocab_size": 16,
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def llama_tensors(c, dtype="F16"):
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * d, c.get("num_key_value_heads", c["num_attention_heads"]) * d
    specs = [("model.embed_tokens.weight", [v, h])]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        specs += [(p + "input_layernorm.weight", [h]), (p + "self_attn.q_proj.weight", [q, h]),
                  (p + "self_attn.k_proj.weight", [kv, h]), (p + "self_attn.v_proj.weight", [kv, h]),
                  (p + "self_attn.o_proj.weight", [h, q]), (p + "post_attention_layernorm.weight", [h]),
                  (p + "mlp.gate_proj.weight", [f, h]), (p + "mlp.up_proj.weight", [f, h]),
                  (p + "mlp.down_proj.weight", [h, f])]
    specs.append(("model.norm.weight", [h]))
    if not c.get("tie_word_embeddings"):
        specs.append(("lm_head.weight", [v, h]))
    out, k = [], 0
    for name, shape in specs:
        n = 1
        for s in shape:
            n *= s
        norm = len(shape) == 1
        vals = []
        for _ in range(n):
            k += 1
            vals.append((1.0 if norm else 0.0) + ((k * 37 % 101) - 50) / 500.0)
        out.append((name, dtype, shape, vals))
    return out


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as fh:
        fh.write(data)


def clean():
    if not os.path.isdir(CORPUS):
        return
    for target in os.listdir(CORPUS):
        d = os.path.join(CORPUS, target)
        for f in os.listdir(d):
            if f.startswith("seed-"):
                os.remove(os.path.join(d, f))


def safetensors_seeds():
    t = "safetensors"
    write(t, "f32", st([("a", "F32", [2, 2], [1, 2, 3, 4]), ("b", "F32", [3], [0, 0, 0])]))
    write(t, "f16-metadata", st([("w", "F16", [2, 3], [0.5, -1, 2, 65504, -0.0, 1e-7])],
                                metadata={"format": "pt"}))
    write(t, "bf16", st([("w", "BF16", [4], [1, -2, 3.5, 1e30])]))
    write(t, "ints-and-empty", st([("i", "I64", [2], struct.pack("<qq", 1, -1)), ("e", "F32", [0, 5], b""),
                                   ("u", "U8", [3], b"\x01\x02\x03"), ("s", "F32", [], [7.0])]))
    write(t, "no-padding", st([("a", "F16", [1], [1.0])], pad=False))
    write(t, "empty-header", st_raw_header("{}"))
    write(t, "truncated", st([("a", "F32", [4], [1, 2, 3, 4])])[:-5])
    write(t, "header-past-eof", st_raw_header('{"a":{}}', header_len=1 << 40))
    write(t, "overlap", st_raw_header('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                      '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\0" * 12))
    write(t, "duplicate", st_raw_header('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                        '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"))
    write(t, "huge-shape", st_raw_header('{"a":{"dtype":"F32","shape":[4294967296,4294967296,4],'
                                         '"data_offsets":[0,0]}}'))
    write(t, "negative-dim", st_raw_header('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b"\0" * 4))
    write(t, "bad-dtype", st_raw_header('{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}', b"\0"))
    write(t, "not-json", st_raw_header("{\"a\": [1, 2", b""))
    write(t, "tiny", b"\x02\0\0")


def index_seeds():
    t = "model_index"
    s1 = st([("a", "F32", [2, 2], [1, 2, 3, 4]), ("b", "F32", [3], [0, 0, 0])])
    s2 = st([("c", "F32", [2], [5, 6])])
    good = json.dumps({"metadata": {"total_size": 36}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}})
    shards = [("model-00001-of-00002.safetensors", s1), ("model-00002-of-00002.safetensors", s2)]
    write(t, "sharded", bundle([("model.safetensors.index.json", good)] + shards))
    write(t, "single", bundle([("model.safetensors", s1)]))
    write(t, "missing-shard", bundle([("model.safetensors.index.json", good), shards[0]]))
    write(t, "escape", bundle([("model.safetensors.index.json", '{"weight_map":{"a":"../x.safetensors"}}')]
                              + shards))
    write(t, "absent-tensor", bundle([("model.safetensors.index.json",
                                       '{"weight_map":{"z":"model-00001-of-00002.safetensors"}}')] + shards))
    write(t, "in-two-shards", bundle([("model.safetensors.index.json", good), shards[0],
                                      ("model-00002-of-00002.safetensors", st([("a", "F32", [1], [1.0])]))]))
    write(t, "index-not-object", bundle([("model.safetensors.index.json", '["a"]')] + shards))
    write(t, "shard-is-index", bundle([("model.safetensors.index.json",
                                        '{"weight_map":{"a":"model.safetensors.index.json"}}')]))


def config_seeds():
    t = "config"
    for f in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if f.startswith("quest"):
            continue
        shutil.copy(os.path.join(ROOT, "configs", f), os.path.join(CORPUS, t, "seed-configs-" + f))
    hf = os.path.join(ROOT, "tests", "fixtures", "hf")
    if os.path.isdir(hf):
        for d in sorted(os.listdir(hf)):
            p = os.path.join(hf, d, "config.json")
            if os.path.exists(p):
                shutil.copy(p, os.path.join(CORPUS, t, "seed-hf-" + d + ".json"))
    write(t, "tiny", json.dumps(llama_config()))
    write(t, "rope-params-t5", json.dumps(llama_config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6,
                                                                        "factor": 4.0, "beta_fast": 16})))
    write(t, "llama3", json.dumps(llama_config(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                             "original_max_position_embeddings": 32})))
    write(t, "dynamic", json.dumps(llama_config(rope_scaling={"type": "dynamic", "factor": 2.0})))
    write(t, "eos-list-float-dims", '{"hidden_size": 8.0, "intermediate_size": 16, "num_hidden_layers": 1, '
                                    '"num_attention_heads": 2, "vocab_size": 16, "eos_token_id": [2, 3]}')
    write(t, "bad-type", json.dumps(llama_config(hidden_size="8")))
    write(t, "not-object", "[1, 2, 3]")


def quest_seeds():
    t = "quest_settings"
    for f in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if f.startswith("quest"):
            shutil.copy(os.path.join(ROOT, "configs", f), os.path.join(CORPUS, t, "seed-configs-" + f))
    write(t, "full", '{"full_attention": true}')
    write(t, "small", '{"budget": 64, "page_size": 8, "dense_layers": 0, "gqa_policy": "per-head"}')
    write(t, "comments", '{"_comment": "x", "description": "y", "budget": 4096}')
    write(t, "bad", '{"page_size": 12}')
    write(t, "unknown", '{"pagesize": 16}')


def tokenizer_seeds():
    t = "tokenizer"
    src = os.path.join(ROOT, "models", "demo", "tokenizer.model")
    with open(src, "rb") as fh:
        model = fh.read()
    write(t, "demo", model)
    write(t, "demo-truncated", model[: len(model) // 2])
    write(t, "empty-proto", b"")
    write(t, "garbage", b"\x0a\x05hello\x12\x00")


def folder_seeds():
    t = "model_folder"
    c = llama_config()
    write(t, "tiny", bundle([("config.json", json.dumps(c)), ("model.safetensors", st(llama_tensors(c)))]))
    ct = llama_config(tie_word_embeddings=True, num_hidden_layers=1, num_key_value_heads=2,
                      rope_scaling={"rope_type": "yarn", "factor": 2.0})
    write(t, "tied-yarn-f32", bundle([("config.json", json.dumps(ct)),
                                      ("model.safetensors", st(llama_tensors(ct, "F32")))]))
    cb = llama_config(num_hidden_layers=1, torch_dtype="bfloat16",
                      rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    write(t, "bf16-dynamic", bundle([("config.json", json.dumps(cb)),
                                     ("model.safetensors", st(llama_tensors(cb, "BF16")))]))
    tensors = llama_tensors(c)
    half = len(tensors) // 2
    wm = {name: "model-00001-of-00002.safetensors" for name, *_ in tensors[:half]}
    wm.update({name: "model-00002-of-00002.safetensors" for name, *_ in tensors[half:]})
    write(t, "sharded", bundle([("config.json", json.dumps(c)),
                                ("model.safetensors.index.json", json.dumps({"weight_map": wm})),
                                ("model-00001-of-00002.safetensors", st(tensors[:half])),
                                ("model-00002-of-00002.safetensors", st(tensors[half:]))]))
    bad = [list(x) for x in tensors]
    bad[1][2] = [9]
    write(t, "wrong-shape", bundle([("config.json", json.dumps(c)),
                                    ("model.safetensors", st([tuple(x) for x in bad]))]))
    write(t, "many-layers", bundle([("config.json", json.dumps(llama_config(num_hidden_layers=1 << 30))),
                                    ("model.safetensors", st(llama_tensors(c)))]))
    write(t, "config-only", bundle([("config.json", json.dumps(c))]))


def main():
    clean()
    for t in ["safetensors", "model_index", "config", "quest_settings", "tokenizer", "model_folder"]:
        os.makedirs(os.path.join(CORPUS, t), exist_ok=True)
    safetensors_seeds()
    index_seeds()
    config_seeds()
    quest_seeds()
    tokenizer_seeds()
    folder_seeds()
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(CORPUS) for f in fs)
    print("seed corpus: %d files, %d bytes in %s" % (sum(len(fs) for _, _, fs in os.walk(CORPUS)), total, CORPUS))


if __name__ == "__main__":
    sys.exit(main())
