#!/usr/bin/env python3
"""Writes the GGUF test fixtures under tests/fixtures/gguf/ (run once; the outputs are committed).

Requires: pip install gguf numpy safetensors

The expected fp32 values come from gguf-py's numpy dequantization (gguf.quants.dequantize), an oracle independent
of the C++ code under test. Files written:

  types.gguf               one tensor of every type the C++ dequantizes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
                           Q5_K, Q6_K), a 3-D F32 tensor, a Q5_0 tensor (a known type the C++ does not dequantize),
                           Q4_1 tensors built to map exactly into quest-int4, and metadata of every GGUF value type;
                           general.alignment 64
  expected/<tensor>.f32    gguf-py's dequantization of each tensor of types.gguf: raw little-endian float32, in
                           the tensor's row-major order (ne[0] innermost)
  llama_gqa4.gguf          tests/fixtures/hf/f16_gqa4/model.safetensors written the way llama.cpp's
                           convert_hf_to_gguf.py writes a Llama model: GGUF tensor names, q_proj / k_proj rows
                           permuted (LlamaModel.permute), 1-D norms in F32, matrices in F16 (the checkpoint's dtype, so
                           every value is kept exactly), the config.json fields as llama.* metadata
  qwen2_gqa2.gguf          tests/fixtures/hf/qwen2_gqa2 (Qwen2ForCausalLM, BF16) the way the converter writes a
                           Qwen2 model (conversion/qwen.py, Qwen2Model): architecture "qwen2", qwen2.* metadata, the
                           q/k/v biases as blk.N.attn_{q,k,v}.bias in F32, and NO Q/K permutation (Qwen2Model does
                           not apply LlamaModel.permute); matrices in BF16 as stored. Needs torch to read the BF16
                           checkpoint: run it alone with --only qwen2 in a torch venv.
  tiny_tied.gguf           a 1-layer Llama with tied embeddings and yarn rope scaling, random F32 weights
  tiny_tied_hf.safetensors the same weights in Hugging Face layout (names, unpermuted rows)
  spm_demo.gguf            a SentencePiece ("llama") vocabulary, tests/fixtures/tokenizer/demo-512.model written as
                           convert_hf_to_gguf.py writes a Llama tokenizer (below), with a 1-layer random F32 Llama
  spm_demo_hf/             the same weights as a Hugging Face folder (config.json, model.safetensors; the test adds
                           demo-512.model as tokenizer.model), so that the two can be compared end to end
  tiny_bpe.gguf            a 2-layer Llama shaped like SmolLM2's GGUF (tied embeddings, token_embd Q8_0, matrices
                           Q4_1, norms F32, random weights) carrying a byte-level BPE vocabulary as convert_hf_to_gguf.py
                           writes one (tokenizer.ggml.model gpt2, pre "smollm", tokens / merges / token_type, bos /
                           eos) made from tests/fixtures/tokenizer/bpe/smollm2/tokenizer.json, and SmolLM2's ChatML
                           chat template: `quest quantize` from a GGUF writes its tokenizer.json without SmolLM2 itself
  fuzz/corpus/gguf/seed-*  seeds of the fuzz_gguf target: the small files above, the tiny model with Q4_0 / Q4_1 /
                           Q8_0 matrices, truncated copies, and spm_demo.gguf

With --shared DIR (needs ../shared, which is never copied into the project) it writes instead, into DIR (a build
folder):
  stories260K.gguf         ../shared/models/stories260K (weights F32, config, SentencePiece vocabulary) as the
                           converter writes it: the model of the GGUF end-to-end test against the safetensors folder
  llama2-vocab.gguf        the Llama-2 tokenizer.model (32000 pieces) as a vocabulary-only GGUF (no tensors)

SentencePiece vocabulary (convert_hf_to_gguf.py: _create_vocab_sentencepiece, _set_vocab_sentencepiece, SpecialVocab
from config.json): tokenizer.ggml.model "llama", pre "default", tokens = IdToPiece, scores = GetScore, token_type
2 unknown / 3 control / 5 unused / 6 byte / 1 normal, pieces up to config.json's vocab_size padded as [PAD{i}]
(unused, score -10000), bos / eos ids from config.json. Beyond what the converter writes for Llama, the normalizer's
two flags go into the keys llama.cpp defines for them (tokenizer.ggml.add_space_prefix = add_dummy_prefix,
tokenizer.ggml.remove_extra_whitespaces), read from the model protobuf: stories260K's tokenizer removes extra
whitespace, which a GGUF without the key cannot say.

The permutation below restates what the converter does (read from llama.cpp's convert_hf_to_gguf.py,
LlamaModel.permute): the rows of a projection with n heads, viewed as [n][2][head_dim / 2], have their last two
axes swapped; q_proj uses num_attention_heads, k_proj num_key_value_heads.
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, RopeScalingType
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"



def one_layer_shapes(h: int, f: int, V: int, q: int, kv: int) -> dict:
    """Hugging Face tensor names and shapes of a 1-layer Llama (hidden h, MLP f, vocabulary V, q / kv widths)."""
    shapes = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,)}
    for name, shape in (("input_layernorm.weight", (h,)), ("self_attn.q_proj.weight", (q, h)),
                        ("self_attn.k_proj.weight", (kv, h)), ("self_attn.v_proj.weight", (kv, h)),
                        ("self_attn.o_proj.weight", (h, q)), ("post_attention_layernorm.weight", (h,)),
                        ("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h)),
                        ("mlp.down_proj.weight", (h, f))):
        shapes["model.layers.0." + name] = shape
    return shapes

def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute for a [rows][cols] projection with n_head heads."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(rng: np.random.Generator, n_blocks: int, block_bytes: int, half_offsets: list[int]) -> np.ndarray:
    """Random K-quant super-blocks whose fp16 fields (at the byte offsets given) hold sane positive scales."""
    b = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in half_offsets:
        h = rng.uniform(1e-3, 5e-2, size=n_blocks).astype(np.float16)
        b[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return b


def exact_q4_1_blocks(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """Q4_1 blocks with m = -z * d (z integer in 0..15): each maps exactly into quest-int4. d is a small multiple of a
    power of two (so that z * d is an fp16), of either sign; a few blocks have d = 0 or m = +-0."""
    out = np.zeros((n_blocks, 20), dtype=np.uint8)
    for i in range(n_blocks):
        k = int(rng.integers(1, 64)) * (1 if i % 3 else -1)
        d = np.float16(k * 2.0 ** -int(rng.integers(4, 12)))
        z = int(rng.integers(0, 16))
        m = np.float16(-z * float(d))
        if i == 1:
            d, m = np.float16(0.0), np.float16(0.375)   # constant block
        if i == 2:
            d, m = np.float16(-0.25), np.float16(0.0)   # z = 0, d < 0, m = +0
        if i == 3:
            d, m = np.float16(-0.25), np.float16(-0.0)  # z = 0, d < 0, m = -0
        out[i, 0:2] = np.array([d], dtype=np.float16).view(np.uint8)
        out[i, 2:4] = np.array([m], dtype=np.float16).view(np.uint8)
        out[i, 4:] = rng.integers(0, 256, size=16, dtype=np.uint8)
    return out


def write_types(rng: np.random.Generator) -> None:
    path = OUT / "types.gguf"
    w = GGUFWriter(str(path), "test")
    w.add_custom_alignment(64)
    # One key of every value type (the C++ test reads them back).
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "h\u00e9llo")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -1.0e300)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_f32", [0.5, -1.5])
    w.add_array("test.arr_str", ["a", "", "bc"])
    w.add_array("test.arr_bool", [True, False])

    tensors = []  # (name, bytes-or-floats array, raw dtype or None)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    tensors.append(("t_f32", x, None))
    tensors.append(("t_f32_3d", rng.standard_normal((3, 2, 8)).astype(np.float32), None))
    tensors.append(("t_f16", rng.standard_normal((3, 64)).astype(np.float16), None))
    tensors.append(("t_bf16", quantize(rng.standard_normal((3, 64)).astype(np.float32), T.BF16), T.BF16))
    for name, qt in (("t_q8_0", T.Q8_0), ("t_q4_0", T.Q4_0), ("t_q4_1", T.Q4_1), ("t_q5_0", T.Q5_0)):
        tensors.append((name, quantize(rng.standard_normal((4, 64)).astype(np.float32), qt), qt))
    tensors.append(("t_q4_1_exact", exact_q4_1_blocks(rng, 8).reshape(4, 2 * 20), T.Q4_1))
    # K-quants: random super-blocks (gguf-py has no quantizer for them) with the fp16 d / dmin fields sane.
    tensors.append(("t_q4_k", random_k_blocks(rng, 2, 144, [0, 2]).reshape(2, 144), T.Q4_K))
    tensors.append(("t_q5_k", random_k_blocks(rng, 4, 176, [0, 2]).reshape(2, 2 * 176), T.Q5_K))
    tensors.append(("t_q6_k", random_k_blocks(rng, 2, 210, [208]).reshape(2, 210), T.Q6_K))

    (OUT / "expected").mkdir(parents=True, exist_ok=True)
    for name, data, qt in tensors:
        w.add_tensor(name, data, raw_dtype=qt)
        if qt == T.Q5_0:
            continue  # not dequantized by the C++ (the test expects an InputError)
        if qt is None:
            ref = data.astype(np.float32)
        else:
            ref = dequantize(data, qt)
        ref.astype("<f4").tofile(OUT / "expected" / f"{name}.f32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_metadata(w: GGUFWriter, cfg: dict, n_vocab: int, vocab: bool = True) -> None:
    """The keys convert_hf_to_gguf.py writes for a Llama model (TextModel + LlamaModel.set_gguf_parameters)."""
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    theta = cfg.get("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if "head_dim" in cfg:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_rope_dimension_count(head_dim)
    if not vocab:
        return
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(n_vocab)])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])


LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    if hf in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf]
    parts = hf.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf
    return f"blk.{parts[2]}." + LAYER_NAMES[".".join(parts[3:])]


def write_llama(path: pathlib.Path, tensors: dict, cfg: dict, matrix_types: tuple = (), arch: str = "llama") -> None:
    """A Llama GGUF as the converter writes it; matrix_types (cycled) quantizes the 2-D tensors (fuzz seeds).
    arch "qwen2": the same keys under qwen2.*, rows not permuted (Qwen2Model)."""
    w = GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    llama_metadata(w, cfg, cfg["vocab_size"])
    add_llama_tensors(w, tensors, cfg, matrix_types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_llama_tensors(w: GGUFWriter, tensors: dict, cfg: dict, matrix_types: tuple = ()) -> None:
    """The rope scaling keys and the tensors of a Llama GGUF, named and permuted as the converter does."""
    if cfg.get("rope_scaling", {}).get("rope_type") == "yarn":
        rs = cfg["rope_scaling"]
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    for hf, t in tensors.items():
        if arch == "qwen2":
            pass
        elif hf.endswith("q_proj.weight"):
            t = permute(t, n_head)
        elif hf.endswith("k_proj.weight"):
            t = permute(t, n_kv)
        if t.dtype == np.uint16:  # BF16 bit patterns
            w.add_tensor(gguf_name(hf), np.ascontiguousarray(t), raw_dtype=T.BF16)
            continue
        if t.ndim == 1:
            t = t.astype(np.float32)  # the converter keeps 1-D tensors (norms) in F32
        if t.ndim == 2 and matrix_types:
            qt = matrix_types[len(w.tensors[0]) % len(matrix_types)]
            w.add_tensor(gguf_name(hf), quantize(t.astype(np.float32), qt), raw_dtype=qt)
            continue
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(t))


def write_llama_gqa4() -> None:
    src = ROOT / "tests" / "fixtures" / "hf" / "f16_gqa4"
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    assert all(t.dtype == np.float16 for t in tensors.values())
    write_llama(OUT / "llama_gqa4.gguf", tensors, cfg)


def write_qwen2_gqa2() -> None:
    import torch  # the checkpoint is BF16, which numpy cannot read
    from safetensors.torch import load_file as load_torch
    src = ROOT / "tests" / "fixtures" / "hf" / "qwen2_gqa2"
    cfg = json.loads((src / "config.json").read_text())
    # 1-D tensors in F32 (as the converter writes them), matrices in BF16 as they are (uint16 bit patterns).
    tensors = {k: v.to(torch.float32).numpy() if v.dim() == 1 else v.view(torch.int16).numpy().view(np.uint16)
               for k, v in load_torch(str(src / "model.safetensors")).items()}
    write_llama(OUT / "qwen2_gqa2.gguf", tensors, cfg, arch="qwen2")


def write_tiny_tied(rng: np.random.Generator) -> dict:
    cfg = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
           "rope_theta": 500000.0, "vocab_size": 48, "bos_token_id": 3, "eos_token_id": 7,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}
    h, f, V, q, kv = 32, 64, 48, 32, 16
    shapes = one_layer_shapes(h, f, V, q, kv)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    save_file(tensors, str(OUT / "tiny_tied_hf.safetensors"))
    write_llama(OUT / "tiny_tied.gguf", tensors, cfg)
    return {"tensors": tensors, "cfg": cfg}


def normalizer_flags(model_bytes: bytes) -> tuple[bool, bool]:
    """add_dummy_prefix and remove_extra_whitespaces of a SentencePiece ModelProto (NormalizerSpec is field 3, the
    flags its fields 3 and 4, both true by default; the last value of a repeated field wins)."""
    def varint(b: bytes, i: int) -> tuple[int, int]:
        r = s = 0
        while True:
            c = b[i]
            i += 1
            r |= (c & 0x7F) << s
            s += 7
            if not c & 0x80:
                return r, i

    def fields(b: bytes):
        i = 0
        while i < len(b):
            tag, i = varint(b, i)
            num, wt = tag >> 3, tag & 7
            if wt == 0:
                v, i = varint(b, i)
            elif wt == 2:
                n, i = varint(b, i)
                v, i = b[i:i + n], i + n
            elif wt in (1, 5):
                v, i = None, i + (8 if wt == 1 else 4)
            else:
                raise ValueError(f"wire type {wt}")
            yield num, wt, v

    dummy, remove = True, True
    for num, wt, v in fields(model_bytes):
        if num == 3 and wt == 2:
            for n, w, x in fields(v):
                if w == 0 and n == 3:
                    dummy = bool(x)
                if w == 0 and n == 4:
                    remove = bool(x)
    return dummy, remove


def spm_vocab(w: GGUFWriter, model_file: pathlib.Path, vocab_size: int, bos: int | None, eos: int | None) -> None:
    """A SentencePiece vocabulary as convert_hf_to_gguf.py writes it (see the module docstring)."""
    from gguf import TokenType
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(model_file))
    tokens = [f"[PAD{i}]".encode() for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [TokenType.UNUSED] * vocab_size
    for i in range(min(sp.vocab_size(), vocab_size)):
        t = TokenType.NORMAL
        if sp.IsUnknown(i):
            t = TokenType.UNKNOWN
        elif sp.IsControl(i):
            t = TokenType.CONTROL
        elif sp.IsUnused(i):
            t = TokenType.UNUSED
        elif sp.IsByte(i):
            t = TokenType.BYTE
        tokens[i], scores[i], types[i] = sp.IdToPiece(i).encode(), sp.GetScore(i), t
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    dummy, remove = normalizer_flags(model_file.read_bytes())
    w.add_add_space_prefix(dummy)
    w.add_remove_extra_whitespaces(remove)


def write_spm_llama(path: pathlib.Path, tensors: dict, cfg: dict, model_file: pathlib.Path) -> None:
    """A Llama GGUF (write_llama's tensors and metadata) whose vocabulary is the SentencePiece model_file's."""
    w = GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    llama_metadata(w, cfg, cfg["vocab_size"], vocab=False)
    spm_vocab(w, model_file, cfg["vocab_size"], cfg.get("bos_token_id"), cfg.get("eos_token_id"))
    add_llama_tensors(w, tensors, cfg)
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_tiny_bpe() -> None:
    """tiny_bpe.gguf: the vocabulary of the smollm2 tokenizer fixture in GGUF form (as convert_hf_to_gguf.py's
    _set_vocab_gpt2 writes it: every id's text, added tokens typed CONTROL when special else USER_DEFINED, merges as
    "a b"), on a small random model quantized like SmolLM2's file."""
    tj = json.loads((ROOT / "tests" / "fixtures" / "tokenizer" / "bpe" / "smollm2" / "tokenizer.json").read_text())
    n = 1 + max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj["added_tokens"]])
    tokens, types = [None] * n, [1] * n
    for piece, i in tj["model"]["vocab"].items():
        tokens[i] = piece
    for a in tj["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
           "vocab_size": n}
    h, f, q, kv = 64, 128, 64, 32
    rng = np.random.default_rng(20250135)
    w = GGUFWriter(str(OUT / "tiny_bpe.gguf"), "llama")
    w.add_name("tiny_bpe")
    llama_metadata(w, cfg, n, vocab=False)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(SMOLLM2_CHAT_TEMPLATE)
    w.add_tensor("token_embd.weight", quantize(0.5 * rng.standard_normal((n, h)).astype(np.float32), T.Q8_0),
                 raw_dtype=T.Q8_0)
    for l in range(cfg["num_hidden_layers"]):
        for name, shape in (("attn_norm.weight", (h,)), ("attn_q.weight", (q, h)), ("attn_k.weight", (kv, h)),
                            ("attn_v.weight", (kv, h)), ("attn_output.weight", (h, q)), ("ffn_norm.weight", (h,)),
                            ("ffn_gate.weight", (f, h)), ("ffn_up.weight", (f, h)), ("ffn_down.weight", (h, f))):
            if len(shape) == 1:
                w.add_tensor(f"blk.{l}.{name}", (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            else:
                t = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
                w.add_tensor(f"blk.{l}.{name}", quantize(t, T.Q4_1), raw_dtype=T.Q4_1)
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_spm_demo(rng: np.random.Generator) -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
           "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True,
           "torch_dtype": "float32"}
    h, f, V, q, kv = 16, 32, 512, 16, 8
    shapes = one_layer_shapes(h, f, V, q, kv)
    # Norms near 1 and matrices of a sane scale, so that greedy decoding does not repeat one token at once.
    tensors = {n: (1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else rng.standard_normal(s) / np.sqrt(s[-1]) * 2)
               .astype(np.float32) for n, s in shapes.items()}
    hf = OUT / "spm_demo_hf"
    hf.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_spm_llama(OUT / "spm_demo.gguf", tensors, cfg, ROOT / "tests" / "fixtures" / "tokenizer" / "demo-512.model")


def write_shared(out: pathlib.Path) -> None:
    shared = ROOT.parent / "shared" / "models"
    out.mkdir(parents=True, exist_ok=True)
    stories = shared / "stories260K"
    cfg = json.loads((stories / "config.json").read_text())
    write_spm_llama(out / "stories260K.gguf", load_file(str(stories / "model.safetensors")), cfg,
                    stories / "tokenizer.model")
    w = GGUFWriter(str(out / "llama2-vocab.gguf"), "llama")
    spm_vocab(w, shared / "llama2-tokenizer" / "tokenizer.model", 32000, 1, 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for p in sorted(out.glob("*.gguf")):
        print(f"{p}: {p.stat().st_size} bytes")


def write_fuzz_seeds(tiny: dict) -> None:
    """Seeds of fuzz/fuzz_gguf.cpp: the small fixtures, a Q4_0/Q4_1/Q8_0 Llama, and truncated copies."""
    seeds = ROOT / "fuzz" / "corpus" / "gguf"
    seeds.mkdir(parents=True, exist_ok=True)
    write_llama(seeds / "seed-llama-q4", tiny["tensors"], tiny["cfg"], (T.Q4_0, T.Q4_1, T.Q8_0))
    types = (OUT / "types.gguf").read_bytes()
    (seeds / "seed-types").write_bytes(types)
    for name, cut in (("header", 20), ("kv", 200), ("infos", 900), ("data", len(types) - 100)):
        (seeds / f"seed-types-cut-{name}").write_bytes(types[:cut])
    (seeds / "seed-spm-demo").write_bytes((OUT / "spm_demo.gguf").read_bytes())
    q4 = (seeds / "seed-llama-q4").read_bytes()
    (seeds / "seed-llama-q4-cut").write_bytes(q4[: len(q4) // 2])


def main() -> None:
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--shared":
        write_shared(pathlib.Path(sys.argv[2]))
        return
    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["--only", "qwen2"]:
        write_qwen2_gqa2()
        return
    rng = np.random.default_rng(20240601)
    write_types(rng)
    write_llama_gqa4()
    tiny = write_tiny_tied(rng)
    write_spm_demo(np.random.default_rng(20250125))
    write_fuzz_seeds(tiny)
    write_tiny_bpe()
    for p in sorted(list(OUT.rglob("*")) + list((ROOT / "fuzz" / "corpus" / "gguf").glob("*"))):
        if p.is_file():
            print(f"{p.relative_to(ROOT)}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
