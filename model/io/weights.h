#pragma once
// Llama weights fetched by name from a model folder, with shape checks (a mismatch names the file, the tensor,
// Expected and Actual). Tensor names are Hugging Face's (LlamaForCausalLM).
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

// Expected shape of every tensor of a Llama model, in file order (embed, layers, norm, lm_head when untied).
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

}  // namespace quest
