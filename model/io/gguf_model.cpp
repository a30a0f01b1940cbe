#include "model/io/gguf_model.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>

#include "kernels/common/error.h"

namespace quest {

namespace {

// {GGUF suffix, HF suffix} of the per-layer tensors.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},  // Qwen2
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
constexpr std::pair<const char*, const char*> kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><N>.<rest>" -> N and rest, N a plain decimal layer number without leading zeros.
bool split_layer(const std::string& name, const std::string& prefix, int& layer, std::string& rest) {
    if (name.rfind(prefix, 0) != 0) return false;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size() || dot - prefix.size() > 9) return false;
    const std::string num = name.substr(prefix.size(), dot - prefix.size());
    if (num.size() > 1 && num[0] == '0') return false;
    for (char ch : num)
        if (ch < '0' || ch > '9') return false;
    layer = std::stoi(num);
    rest = name.substr(dot + 1);
    return true;
}

// The shortest decimal that rounds to the float32 v, as a double (1e-05f -> 1e-05).
double float_as_decimal(float v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    *r.ptr = '\0';
    return std::strtod(buf, nullptr);
}

// Metadata of one architecture, read with the GGUF key in every message.
class Meta {
public:
    Meta(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
    std::string key(const char* suffix) const { return arch_ + "." + suffix; }

    [[noreturn]] void fail(const std::string& key, const std::string& what) const {
        throw InputError(f_.name() + ": key '" + key + "': " + what);
    }
    std::optional<int> positive(const std::string& k) const {
        const auto v = f_.get_uint(k);
        if (!v) return std::nullopt;
        if (*v == 0 || *v > (uint64_t(1) << 30)) fail(k, "expected a positive integer <= 2^30, found " + std::to_string(*v));
        return int(*v);
    }
    int required_positive(const std::string& k) const {
        const auto v = positive(k);
        if (!v) fail(k, "missing (expected a positive integer)");
        return *v;
    }
    std::optional<double> number(const std::string& k) const {
        const auto v = f_.get_float(k);
        if (!v) return std::nullopt;
        const GgufValue* raw = f_.find_value(k);
        return raw->type == GgufType::Float32 ? float_as_decimal(float(*v)) : *v;
    }

private:
    const GgufFile& f_;
    std::string arch_;
};

}  // namespace

namespace {

// A tensor name translated between the two namings of kGlobalNames and kLayerNames (from_gguf: GGUF's to Hugging
// Face's, else back); nullopt when it has no counterpart.
std::optional<std::string> translate_name(const std::string& name, bool from_gguf) {
    const auto from = [&](const std::pair<const char*, const char*>& gh) { return from_gguf ? gh.first : gh.second; };
    const auto to = [&](const std::pair<const char*, const char*>& gh) { return from_gguf ? gh.second : gh.first; };
    for (const auto& gh : kGlobalNames)
        if (name == from(gh)) return std::string(to(gh));
    const std::string gguf_layers = "blk.", hf_layers = "model.layers.";
    int layer = 0;
    std::string rest;
    if (!split_layer(name, from_gguf ? gguf_layers : hf_layers, layer, rest)) return std::nullopt;
    for (const auto& gh : kLayerNames)
        if (rest == from(gh)) return (from_gguf ? hf_layers : gguf_layers) + std::to_string(layer) + "." + to(gh);
    return std::nullopt;
}

}  // namespace

std::optional<std::string> gguf_name_from_hf(const std::string& hf_name) { return translate_name(hf_name, false); }
std::optional<std::string> hf_name_from_gguf(const std::string& gguf_name) { return translate_name(gguf_name, true); }

std::vector<int> gguf_unpermute_rows(int rows, int n_head) {
    if (n_head <= 0 || rows < 0 || rows % (2 * n_head) != 0)
        throw std::invalid_argument("gguf_unpermute_rows: " + std::to_string(rows) + " rows are not " +
                                    std::to_string(n_head) + " heads of an even size");
    const int hd = rows / n_head, half = hd / 2;
    std::vector<int> order(size_t(rows), 0);
    for (int h = 0; h < n_head; ++h)
        for (int a = 0; a < 2; ++a)
            for (int i = 0; i < half; ++i) order[size_t(h * hd + a * half + i)] = h * hd + 2 * i + a;
    return order;
}

int gguf_permuted_heads(const std::string& hf_name, const ModelConfig& c) {
    // llama.cpp's converter permutes the Q/K rows of LlamaModel (llama, and Mistral, which it converts as llama)
    // only; Qwen2Model keeps Hugging Face's order (its RoPE is NEOX-style, rotate_half as in transformers).
    if (c.architecture == Architecture::Qwen2) return 0;
    auto ends_with = [&](const char* s) {
        const std::string suffix = s;
        return hf_name.size() >= suffix.size() && hf_name.compare(hf_name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (hf_name.rfind("model.layers.", 0) != 0) return 0;
    if (ends_with(".self_attn.q_proj.weight")) return c.num_heads;
    if (ends_with(".self_attn.k_proj.weight")) return c.num_kv_heads;
    return 0;
}

ModelConfig gguf_model_config(const GgufFile& f) {
    const auto arch = f.get_string("general.architecture");
    if (!arch)
        throw InputError(f.name() + ": key 'general.architecture': missing (expected llama, mistral or qwen2)");
    if (*arch != "llama" && *arch != "mistral" && *arch != "qwen2")
        throw InputError(f.name() + ": key 'general.architecture': unsupported architecture '" + *arch +
                         "' (supported: llama, mistral, qwen2; i.e. " + supported_architectures() + ")");
    const Meta m(f, *arch);
    ModelConfig c;
    // llama.cpp converts MistralForCausalLM as "llama" and writes no window for llama or qwen2 (its runtime reads
    // none for them). A window key, when a file has one, is honoured: on every layer (Mistral's meaning) for llama and
    // mistral; Qwen2's windowed layers depend on max_window_layers, which GGUF does not carry: refused.
    c.architecture = *arch == "qwen2" ? Architecture::Qwen2 : Architecture::Llama;
    if (const auto sw = m.positive(m.key("attention.sliding_window"))) {
        if (c.architecture == Architecture::Qwen2)
            m.fail(m.key("attention.sliding_window"), "a sliding window in a qwen2 GGUF is not supported (its layer "
                                                      "pattern, max_window_layers, is not in the file)");
        c.architecture = Architecture::Mistral;
        c.sliding_window = *sw;
    }
    c.hidden_size = m.required_positive(m.key("embedding_length"));
    c.intermediate_size = m.required_positive(m.key("feed_forward_length"));
    c.num_layers = m.required_positive(m.key("block_count"));
    c.max_position_embeddings = m.required_positive(m.key("context_length"));
    c.num_heads = m.required_positive(m.key("attention.head_count"));
    c.num_kv_heads = m.positive(m.key("attention.head_count_kv")).value_or(c.num_heads);
    if (const auto kl = m.positive(m.key("attention.key_length"))) {
        c.head_dim = *kl;
    } else {
        if (c.hidden_size % c.num_heads != 0)
            m.fail(m.key("embedding_length"), "must be a multiple of attention.head_count when attention.key_length "
                                              "is absent");
        c.head_dim = c.hidden_size / c.num_heads;
    }
    if (const auto vl = m.positive(m.key("attention.value_length")); vl && *vl != c.head_dim)
        m.fail(m.key("attention.value_length"), std::to_string(*vl) + " differs from the key length " +
                                                    std::to_string(c.head_dim) + " (expected equal lengths)");
    if (const auto rd = m.positive(m.key("rope.dimension_count")); rd && *rd != c.head_dim)
        m.fail(m.key("rope.dimension_count"), std::to_string(*rd) + " differs from the head dimension " +
                                                  std::to_string(c.head_dim) +
                                                  " (partial rotary embeddings are not supported)");
    const auto eps = m.number(m.key("attention.layer_norm_rms_epsilon"));
    if (!eps) m.fail(m.key("attention.layer_norm_rms_epsilon"), "missing (expected a float32)");
    c.rms_norm_eps = *eps;
    c.rope_theta = m.number(m.key("rope.freq_base")).value_or(10000.0);

    // Vocabulary: the explicit size, else the token list, else the embedding's rows.
    if (const auto v = m.positive(m.key("vocab_size"))) {
        c.vocab_size = *v;
    } else if (const GgufArray* tokens = f.get_array("tokenizer.ggml.tokens")) {
        if (tokens->count == 0 || tokens->count > (uint64_t(1) << 30))
            throw InputError(f.name() + ": key 'tokenizer.ggml.tokens': " + std::to_string(tokens->count) +
                             " tokens (expected 1 .. 2^30)");
        c.vocab_size = int(tokens->count);
    } else if (const GgufTensorInfo* e = f.find("token_embd.weight"); e && e->ne.size() == 2 && e->ne[1] > 0 &&
                                                                      e->ne[1] <= (int64_t(1) << 30)) {
        c.vocab_size = int(e->ne[1]);
    } else {
        throw InputError(f.name() + ": no vocabulary size (expected " + m.key("vocab_size") +
                         ", tokenizer.ggml.tokens or a 2-D token_embd.weight)");
    }
    c.tie_word_embeddings = f.find("output.weight") == nullptr;
    if (const auto bos = f.get_uint("tokenizer.ggml.bos_token_id")) {
        if (*bos >= uint64_t(c.vocab_size))
            throw InputError(f.name() + ": key 'tokenizer.ggml.bos_token_id': id " + std::to_string(*bos) +
                             " outside the vocabulary of " + std::to_string(c.vocab_size));
        c.bos_token_id = int(*bos);
    }
    if (const auto eos = f.get_uint("tokenizer.ggml.eos_token_id")) {
        if (*eos >= uint64_t(c.vocab_size))
            throw InputError(f.name() + ": key 'tokenizer.ggml.eos_token_id': id " + std::to_string(*eos) +
                             " outside the vocabulary of " + std::to_string(c.vocab_size));
        c.eos_token_ids = {int(*eos)};
    }
    c.torch_dtype = DType::F32;  // the weights are dequantized to fp32 on load
    c.window_layers.assign(c.sliding_window > 0 ? c.num_layers : 0, true);

    if (f.find("rope_freqs.weight"))
        throw InputError(f.name() + ": tensor 'rope_freqs.weight': rotary frequency factors (Llama 3 rope scaling) "
                                    "are not supported");
    const std::string type = f.get_string(m.key("rope.scaling.type")).value_or("none");
    const std::string factor_key = m.key("rope.scaling.factor");
    if (type == "linear" || type == "yarn") {
        const auto factor = m.number(factor_key);
        if (!factor) m.fail(factor_key, "missing (expected a float32 for " + type + " rope scaling)");
        c.rope.factor = *factor;
        if (type == "linear") {
            c.rope.type = RopeType::Linear;
        } else {
            c.rope.type = RopeType::Yarn;
            c.rope.original_max_position_embeddings =
                m.positive(m.key("rope.scaling.original_context_length")).value_or(c.max_position_embeddings);
            c.rope.beta_fast = m.number(m.key("rope.scaling.yarn_beta_fast")).value_or(32.0);
            c.rope.beta_slow = m.number(m.key("rope.scaling.yarn_beta_slow")).value_or(1.0);
        }
    } else if (type != "none") {
        m.fail(m.key("rope.scaling.type"), "unsupported rope scaling '" + type + "' (expected none, linear or yarn)");
    }

    // The checks of a config.json (head counts, head_dim parity, token ids, rope frequencies) apply unchanged.
    return parse_model_config(model_config_to_json(c), f.name() + " (GGUF metadata as config.json fields)");
}

namespace {

// The GGUF tensor of `hf_name` with its HF-order shape checked.
const GgufTensorInfo& find_checked(const GgufFile& f, const std::string& hf_name,
                                   std::span<const int64_t> expected_shape) {
    const auto gname = gguf_name_from_hf(hf_name);
    const GgufTensorInfo* t = gname ? f.find(*gname) : nullptr;
    if (!t)
        throw InputError(f.name() + ": tensor '" + hf_name + "' (GGUF '" + gname.value_or("?") + "') not found (" +
                         std::to_string(f.tensors().size()) + " tensors)");
    const std::vector<int64_t> shape = t->shape();
    if (!std::equal(expected_shape.begin(), expected_shape.end(), shape.begin(), shape.end()))
        throw InputError(f.name() + ": tensor '" + hf_name + "' (GGUF '" + *gname + "'): shape mismatch: Expected " +
                         shape_to_string(expected_shape) + ", Actual " + shape_to_string(shape));
    return *t;
}

}  // namespace

std::vector<float> gguf_load_tensor_f32(const GgufFile& f, const ModelConfig& c, const std::string& hf_name,
                                        std::span<const int64_t> expected_shape) {
    const GgufTensorInfo& t = find_checked(f, hf_name, expected_shape);
    std::vector<float> out = dequantize_tensor(f, t);
    const int heads = gguf_permuted_heads(hf_name, c);
    if (heads > 0) {
        const int64_t rows = t.rows(), cols = t.cols();
        if (rows % (2 * heads) != 0 || rows > (int64_t(1) << 30))
            throw InputError(f.name() + ": tensor '" + hf_name + "': " + std::to_string(rows) +
                             " rows are not " + std::to_string(heads) + " heads of an even size");
        const std::vector<int> order = gguf_unpermute_rows(int(rows), heads);
        std::vector<float> hf(out.size());
        for (int64_t r = 0; r < rows; ++r)
            std::copy_n(out.begin() + order[size_t(r)] * cols, cols, hf.begin() + r * cols);
        out = std::move(hf);
    }
    return out;
}

LlamaWeightsF32 load_llama_weights_f32_gguf(const GgufFile& f, const ModelConfig& c) {
    auto get = [&](const std::string& name, std::initializer_list<int64_t> shape) {
        return gguf_load_tensor_f32(f, c, name, std::span<const int64_t>(shape.begin(), shape.size()));
    };
    auto linear = [&](int l, const char* name, int64_t rows, int64_t cols) {
        return get(LlamaTensorNames::layer(l, name) + ".weight", {rows, cols});
    };
    return assemble_llama_weights_f32(c, get, linear);
}

Int4FromGguf gguf_load_linear_int4(const GgufFile& f, const ModelConfig& c, const std::string& hf_name, int rows,
                                   int cols) {
    const int64_t shape[2] = {rows, cols};
    const GgufTensorInfo& t = find_checked(f, hf_name, shape);
    if (t.type != GgmlType::Q4_0 && t.type != GgmlType::Q4_1)
        throw InputError(f.name() + ": tensor '" + hf_name + "': type " + ggml_type_name(t.type) +
                         " (expected Q4_0 or Q4_1 for an int4 conversion)");
    const int heads = gguf_permuted_heads(hf_name, c);
    std::vector<int> order;
    if (heads > 0) {
        if (rows % (2 * heads) != 0)
            throw InputError(f.name() + ": tensor '" + hf_name + "': " + std::to_string(rows) + " rows are not " +
                             std::to_string(heads) + " heads of an even size");
        order = gguf_unpermute_rows(rows, heads);
    }
    return int4_from_gguf_q4(t.type, f.bytes(t).data(), rows, cols, order);
}

}  // namespace quest

#include <cstring>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/spm_gguf.h"
#include "tokenizer/spm_write.h"

namespace quest {

namespace {

// A string array of the tokenizer metadata; nullptr when absent, InputError when it holds another element type.
const std::vector<std::string>* string_array(const GgufFile& f, const std::string& key) {
    const GgufArray* a = f.get_array(key);
    if (!a) return nullptr;
    if (a->type != GgufType::String)
        throw InputError(f.name() + ": key '" + key + "': expected an array of string, found an array of " +
                         std::string(gguf_type_name(a->type)));
    return &a->strings;
}

// A token id of the tokenizer metadata, -1 when absent.
int token_id_key(const GgufFile& f, const std::string& key, size_t vocab) {
    const auto v = f.get_uint(key);
    if (!v) return -1;
    if (*v >= vocab)
        throw InputError(f.name() + ": key '" + key + "': id " + std::to_string(*v) + " outside the vocabulary of " +
                         std::to_string(vocab) + " tokens");
    return static_cast<int>(*v);
}

// tokenizer.ggml.token_type: an array of int32 (or uint32, as some writers store it), one per token.
std::vector<int32_t> token_types(const GgufFile& f, size_t n_tokens, bool required) {
    const GgufArray* t = f.get_array("tokenizer.ggml.token_type");
    if (!t) {
        if (required)
            throw InputError(f.name() + ": key 'tokenizer.ggml.token_type': missing (a SentencePiece vocabulary needs "
                                        "its token types: unknown, control, byte, ...)");
        return std::vector<int32_t>(n_tokens, 1);
    }
    if (t->type != GgufType::Int32 && t->type != GgufType::UInt32)
        throw InputError(f.name() + ": key 'tokenizer.ggml.token_type': expected an array of int32, found an array of " +
                         std::string(gguf_type_name(t->type)));
    std::vector<int32_t> types(t->count);
    if (!types.empty()) std::memcpy(types.data(), t->raw.data(), types.size() * 4);  // little-endian, as the host
    return types;
}

// tokenizer.ggml.model "llama": SentencePiece pieces, scores and token types (tokenizer/spm_gguf.h).
std::unique_ptr<Tokenizer> gguf_spm_tokenizer(const GgufFile& f, const std::vector<std::string>& tokens) {
    SpmVocab v;
    v.file = f.name();
    v.tokens = tokens;
    const GgufArray* scores = f.get_array("tokenizer.ggml.scores");
    if (!scores)
        throw InputError(f.name() + ": key 'tokenizer.ggml.scores': missing (a SentencePiece vocabulary merges by "
                                    "the pieces' scores)");
    if (scores->type != GgufType::Float32)
        throw InputError(f.name() + ": key 'tokenizer.ggml.scores': expected an array of float32, found an array of " +
                         std::string(gguf_type_name(scores->type)));
    v.scores.resize(scores->count);
    if (!v.scores.empty()) std::memcpy(v.scores.data(), scores->raw.data(), v.scores.size() * 4);
    v.types = token_types(f, tokens.size(), true);
    v.bos = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens.size());
    v.eos = token_id_key(f, "tokenizer.ggml.eos_token_id", tokens.size());
    v.unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", tokens.size());
    v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
    v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
    v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    v.remove_extra_ws = f.get_bool("tokenizer.ggml.remove_extra_whitespaces").value_or(false);
    return std::make_unique<SpmGgufTokenizer>(std::move(v));
}

}  // namespace

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f) {
    const auto model = f.get_string("tokenizer.ggml.model");
    if (!model)
        throw InputError(f.name() + ": no tokenizer in the file (key 'tokenizer.ggml.model' missing; expected a GGUF "
                                    "with its vocabulary, as convert_hf_to_gguf.py writes it)");
    if (*model != "gpt2" && *model != "llama")
        throw InputError(f.name() + ": tokenizer.ggml.model '" + *model +
                         "' is not supported (expected 'llama', a SentencePiece vocabulary, or 'gpt2', a byte-level "
                         "BPE one)");
    const auto* tokens = string_array(f, "tokenizer.ggml.tokens");
    if (!tokens) throw InputError(f.name() + ": key 'tokenizer.ggml.tokens': missing (the vocabulary)");
    if (*model == "llama") return gguf_spm_tokenizer(f, *tokens);
    const auto* merges = string_array(f, "tokenizer.ggml.merges");
    if (!merges) throw InputError(f.name() + ": key 'tokenizer.ggml.merges': missing (a BPE vocabulary has merges)");
    std::vector<int32_t> types = token_types(f, tokens->size(), false);
    const int bos = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens->size());
    const int eos = token_id_key(f, "tokenizer.ggml.eos_token_id", tokens->size());
    const auto pre = f.get_string("tokenizer.ggml.pre");
    if (!pre)
        throw InputError(f.name() + ": key 'tokenizer.ggml.pre': missing (the pre-tokenizer of a 'gpt2' vocabulary; "
                                    "expected gpt2, smollm, llama-bpe or qwen2)");
    return std::make_unique<BpeTokenizer>(
        BpeTokenizer::from_gguf_vocab(*tokens, *merges, types, bos, eos, *pre, f.name()));
}

void gguf_check_tensors_present(const GgufFile& f, const ModelConfig& c) {
    auto need = [&](const std::string& hf, const std::string& why) {
        const auto g = gguf_name_from_hf(hf);
        if (!g || !f.find(*g))
            throw InputError(f.name() + ": tensor '" + g.value_or(hf) + "' not found, but " + why);
    };
    need(LlamaTensorNames::embed(), "the file describes a Llama model (token_embd.weight)");
    for (int l = 0; l < c.num_layers; ++l)
        for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"})
            need(LlamaTensorNames::layer(l, norm), "its metadata says block_count " + std::to_string(c.num_layers) +
                                                       " (the file has " + std::to_string(l) + " layers)");
    need(LlamaTensorNames::final_norm(), "the file describes a Llama model (output_norm.weight)");
}

std::string gguf_chat_template(const GgufFile& f) { return f.get_string("tokenizer.chat_template").value_or(""); }

TokenizerJsonFiles gguf_tokenizer_json(const GgufFile& f, const ModelConfig& c) {
    const std::unique_ptr<Tokenizer> tok = gguf_tokenizer(f);
    const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
    if (!bpe) throw std::logic_error("gguf_tokenizer returned a tokenizer that is not byte-level BPE");
    return write_tokenizer_json(bpe->data(), gguf_chat_template(f), c.max_position_embeddings);
}

std::vector<std::pair<std::string, std::string>> gguf_tokenizer_files(const GgufFile& f, const ModelConfig& c) {
    const std::unique_ptr<Tokenizer> tok = gguf_tokenizer(f);
    const auto* spm = dynamic_cast<const SpmGgufTokenizer*>(tok.get());
    if (!spm) {
        TokenizerJsonFiles tj = gguf_tokenizer_json(f, c);
        return {{"tokenizer.json", std::move(tj.tokenizer_json)},
                {"tokenizer_config.json", std::move(tj.tokenizer_config_json)}};
    }
    const SpmVocab& v = spm->vocab();
    if (!v.add_bos)
        throw InputError(f.name() + ": key 'tokenizer.ggml.add_bos_token': false, but a tokenizer.model folder "
                                    "always adds BOS");
    if (v.add_eos)
        throw InputError(f.name() + ": key 'tokenizer.ggml.add_eos_token': true, but a tokenizer.model folder adds "
                                    "no EOS");
    nlohmann::json cfg = {{"tokenizer_class", "LlamaTokenizer"},
                          {"add_bos_token", true},
                          {"add_eos_token", false},
                          {"model_max_length", c.max_position_embeddings}};
    if (v.bos >= 0) cfg["bos_token"] = v.tokens[v.bos];
    if (v.eos >= 0) cfg["eos_token"] = v.tokens[v.eos];
    cfg["unk_token"] = v.tokens[v.unk];
    if (const std::string t = gguf_chat_template(f); !t.empty()) cfg["chat_template"] = t;
    return {{"tokenizer.model", spm_model_proto(v)}, {"tokenizer_config.json", cfg.dump(2) + "\n"}};
}

}  // namespace quest
