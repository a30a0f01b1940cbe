#pragma once
// Llama weights fetched by name from a model folder, with shape checks (a mismatch names the file, the tensor,
// Expected and Actual). Tensor names are Hugging Face's (LlamaForCausalLM; Qwen2ForCausalLM adds the q/k/v biases
// model.layers.N.self_attn.{q,k,v}_proj.bias).
#include <initializer_list>
#include <string>
#include <vector>

#include "model/core/config.h"
#include "model/io/safetensors.h"

namespace quest {

// Hugging Face tensor names.
struct LlamaTensorNames {
    static std::string embed() { return "model.embed_tokens.weight"; }
    static std::string final_norm() { return "model.norm.weight"; }
    static std::string lm_head() { return "lm_head.weight"; }
    static std::string layer(int l, const char* suffix) { return "model.layers." + std::to_string(l) + "." + suffix; }
};

// Expected shape of every tensor of a Llama model, in file order (embed, layers, norm, lm_head when untied); the
// q/k/v biases after v_proj when config.qkv_bias.
struct TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
};
std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c);

// fp32 copies of the weights (CPU backend). Row-major [out][in] like the files.
struct LayerWeightsF32 {
    std::vector<float> attn_norm;  // [hidden]
    std::vector<float> wq;         // [num_heads * head_dim][hidden]
    std::vector<float> wk;         // [num_kv_heads * head_dim][hidden]
    std::vector<float> wv;         // [num_kv_heads * head_dim][hidden]
    std::vector<float> bq, bk, bv; // [q_dim], [kv_dim], [kv_dim] when config.qkv_bias (Qwen2), else empty
    std::vector<float> wo;         // [hidden][num_heads * head_dim]
    std::vector<float> mlp_norm;   // [hidden]
    std::vector<float> w_gate;     // [intermediate][hidden]
    std::vector<float> w_up;       // [intermediate][hidden]
    std::vector<float> w_down;     // [hidden][intermediate]
};

struct LlamaWeightsF32 {
    ModelConfig config;
    std::vector<float> embed;       // [vocab][hidden]
    std::vector<LayerWeightsF32> layers;
    std::vector<float> final_norm;  // [hidden]
    std::vector<float> lm_head;     // [vocab][hidden]; empty when tied to `embed`
    const std::vector<float>& output_matrix() const { return lm_head.empty() ? embed : lm_head; }
};

// Reads every tensor (F32, F16 or BF16 in the file) into fp32; linear layers stored in 4 bits (quest-int4 or AutoAWQ
// GEMM, model/io/quantize.h) are dequantized. Throws InputError on a missing tensor, a wrong shape, or a wrong dtype,
// naming the file and tensor.
LlamaWeightsF32 load_llama_weights_f32(const ModelFiles& files, const ModelConfig& config);

// The checkpoint holds what the config describes, checked from the tensor names alone (every format keeps the norms
// under their Hugging Face names): the embedding, each layer's two RMSNorm weights, the final norm. Run before any
// memory plan, so that a config claiming more layers than the file has is refused as what it is. InputError naming
// the missing tensor, the weights file and `config_file`.
void check_checkpoint_matches_config(const ModelFiles& files, const ModelConfig& config,
                                     const std::filesystem::path& config_file);

// One tensor converted to fp32 with its shape checked.
std::vector<float> load_tensor_f32(const ModelFiles& files, const std::string& name, std::span<const int64_t> shape);

// The record of a Llama model, read tensor by tensor in file order from any source: get(name, shape) returns a
// norm or an embedding as fp32, linear(layer, "self_attn.q_proj", rows, cols) a linear matrix. One record per layer
// as it is read, not num_layers up front: a config that claims more layers than the files hold fails at the first
// missing tensor instead of allocating records for all of them (2^30 layers: 200+ GB).
template <class Get, class Linear>
LlamaWeightsF32 assemble_llama_weights_f32(const ModelConfig& c, Get&& get, Linear&& linear) {
    using N = LlamaTensorNames;
    const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size, V = c.vocab_size;
    LlamaWeightsF32 w;
    w.config = c;
    w.embed = get(N::embed(), {V, h});
    for (int l = 0; l < c.num_layers; ++l) {
        LayerWeightsF32& L = w.layers.emplace_back();
        L.attn_norm = get(N::layer(l, "input_layernorm.weight"), {h});
        L.wq = linear(l, "self_attn.q_proj", q, h);
        L.wk = linear(l, "self_attn.k_proj", kv, h);
        L.wv = linear(l, "self_attn.v_proj", kv, h);
        if (c.qkv_bias) {
            L.bq = get(N::layer(l, "self_attn.q_proj.bias"), {q});
            L.bk = get(N::layer(l, "self_attn.k_proj.bias"), {kv});
            L.bv = get(N::layer(l, "self_attn.v_proj.bias"), {kv});
        }
        L.wo = linear(l, "self_attn.o_proj", h, q);
        L.mlp_norm = get(N::layer(l, "post_attention_layernorm.weight"), {h});
        L.w_gate = linear(l, "mlp.gate_proj", f, h);
        L.w_up = linear(l, "mlp.up_proj", f, h);
        L.w_down = linear(l, "mlp.down_proj", h, f);
    }
    w.final_norm = get(N::final_norm(), {h});
    if (!c.tie_word_embeddings) w.lm_head = get(N::lm_head(), {V, h});
    return w;
}

}  // namespace quest
