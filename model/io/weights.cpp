#include "model/io/weights.h"

#include "kernels/common/error.h"
#include "model/io/quantize.h"

namespace quest {

std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c) {
    using N = LlamaTensorNames;
    const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size, V = c.vocab_size;
    std::vector<TensorSpec> specs;
    specs.push_back({N::embed(), {V, h}});
    for (int l = 0; l < c.num_layers; ++l) {
        specs.push_back({N::layer(l, "input_layernorm.weight"), {h}});
        specs.push_back({N::layer(l, "self_attn.q_proj.weight"), {q, h}});
        specs.push_back({N::layer(l, "self_attn.k_proj.weight"), {kv, h}});
        specs.push_back({N::layer(l, "self_attn.v_proj.weight"), {kv, h}});
        if (c.qkv_bias) {
            specs.push_back({N::layer(l, "self_attn.q_proj.bias"), {q}});
            specs.push_back({N::layer(l, "self_attn.k_proj.bias"), {kv}});
            specs.push_back({N::layer(l, "self_attn.v_proj.bias"), {kv}});
        }
        specs.push_back({N::layer(l, "self_attn.o_proj.weight"), {h, q}});
        specs.push_back({N::layer(l, "post_attention_layernorm.weight"), {h}});
        specs.push_back({N::layer(l, "mlp.gate_proj.weight"), {f, h}});
        specs.push_back({N::layer(l, "mlp.up_proj.weight"), {f, h}});
        specs.push_back({N::layer(l, "mlp.down_proj.weight"), {h, f}});
    }
    specs.push_back({N::final_norm(), {h}});
    if (!c.tie_word_embeddings) specs.push_back({N::lm_head(), {V, h}});
    return specs;
}

std::vector<float> load_tensor_f32(const ModelFiles& files, const std::string& name, std::span<const int64_t> shape) {
    const TensorRef t = files.get(name, shape);
    if (!dtype_is_float(t.info->dtype))
        throw InputError(t.file->path().string() + ": tensor '" + name + "': dtype mismatch: Expected F32, F16 or BF16, Actual " +
                         std::string(dtype_name(t.info->dtype)));
    std::vector<float> out(static_cast<size_t>(t.info->numel()));
    convert_to_f32(t.info->dtype, t.data(), out.data(), out.size());
    return out;
}

LlamaWeightsF32 load_llama_weights_f32(const ModelFiles& files, const ModelConfig& c) {
    auto get = [&](const std::string& name, std::initializer_list<int64_t> shape) {
        return load_tensor_f32(files, name, std::span<const int64_t>(shape.begin(), shape.size()));
    };
    // Linear layers may be stored in 4 bits (quest-int4 or AutoAWQ, model/io/quantize.h): dequantized to fp32.
    const LinearReader reader(files, read_quantization_info(files.dir()));
    auto linear = [&](int l, const char* name, int64_t rows, int64_t cols) {
        return reader.load_f32(LlamaTensorNames::layer(l, name), rows, cols);
    };
    return assemble_llama_weights_f32(c, get, linear);
}

void check_checkpoint_matches_config(const ModelFiles& files, const ModelConfig& config,
                                     const std::filesystem::path& config_file) {
    using N = LlamaTensorNames;
    const auto index = files.dir() / "model.safetensors.index.json";
    const std::string weights_file =
        (std::filesystem::exists(index) ? index : files.dir() / "model.safetensors").string();
    auto missing = [&](const std::string& name, const std::string& why) {
        throw InputError(weights_file + ": tensor '" + name + "' not found, but " + config_file.string() + " " + why);
    };
    if (!files.find(N::embed())) missing(N::embed(), "describes a Llama model (model.embed_tokens.weight)");
    for (int l = 0; l < config.num_layers; ++l)
        for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"})
            if (!files.find(N::layer(l, norm)))
                missing(N::layer(l, norm), "says num_hidden_layers " + std::to_string(config.num_layers) +
                                               " (the checkpoint has " + std::to_string(l) + ")");
    if (!files.find(N::final_norm())) missing(N::final_norm(), "describes a Llama model (model.norm.weight)");
}

}  // namespace quest
