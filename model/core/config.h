#pragma once
// The model hyper-parameters read from a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM or
// Qwen2ForCausalLM: one decoder with architecture-specific q/k/v biases and sliding-window layers), with the RoPE
// scaling parameters in either spelling: Llama-2-era `rope_theta` + `rope_scaling {type|rope_type, factor, ...}` or
// transformers-5 `rope_parameters {rope_type, rope_theta, ...}`.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/dtype.h"

namespace quest {

// The decoder families served. They share the Llama layer (RMSNorm, RoPE, GQA attention, SwiGLU MLP) and differ in:
//   Mistral: sliding_window (when set) on every layer; Qwen2: biases on q_proj, k_proj and v_proj, and a sliding
//   window on the layers transformers' Qwen2Config marks "sliding_attention" (only with use_sliding_window).
enum class Architecture { Llama, Mistral, Qwen2 };
std::string_view architecture_name(Architecture a);  // the config.json spelling: "LlamaForCausalLM", ...
// "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM": for --help and error messages.
std::string supported_architectures();

enum class RopeType { Default, Linear, Dynamic, Yarn, Llama3 };
std::string_view rope_type_name(RopeType t);

// Hugging Face semantics (transformers modeling_rope_utils). Fields a type does not use keep their defaults.
struct RopeScaling {
    RopeType type = RopeType::Default;
    double factor = 1.0;                       // linear, dynamic, yarn, llama3
    int original_max_position_embeddings = 0;  // yarn, llama3 (defaults to max_position_embeddings)
    // yarn
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    std::optional<double> attention_factor;  // explicit cos/sin scale; otherwise derived from factor and mscale
    std::optional<double> mscale;
    std::optional<double> mscale_all_dim;
    bool truncate = true;
    // llama3
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
};

// The sane range of each config.json dimension, checked at parse time (the largest public Llama-family models are
// far inside: 126 layers, hidden 16384, 128 heads, vocabulary 256K, intermediate 53248, head_dim 128, 1M positions).
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxHiddenSize = 65536;
inline constexpr int kMaxHeads = 1024;
inline constexpr int kMaxVocabSize = 4 << 20;
inline constexpr int kMaxIntermediateSize = 1 << 20;
inline constexpr int kMaxHeadDim = 1024;
inline constexpr int kMaxPositions = 16 << 20;

struct ModelConfig {
    int hidden_size = 0;           // d_model
    int intermediate_size = 0;     // MLP width
    int num_layers = 0;            // num_hidden_layers
    int num_heads = 0;             // query heads
    int num_kv_heads = 0;          // key/value heads (GQA when < num_heads)
    int head_dim = 0;              // config head_dim, else hidden_size / num_heads
    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    int max_position_embeddings = 2048;
    int vocab_size = 0;
    bool tie_word_embeddings = false;
    int bos_token_id = 1;
    std::vector<int> eos_token_ids = {2};  // config may give one id or a list
    DType torch_dtype = DType::F32;        // dtype the checkpoint declares (weights are checked on load)
    RopeScaling rope;
    Architecture architecture = Architecture::Llama;
    bool qkv_bias = false;  // q_proj, k_proj, v_proj carry biases (Qwen2)
    // Sliding-window attention (transformers' semantics): a token at position p of a windowed layer attends the keys
    // at positions (p - sliding_window, p], i.e. the last sliding_window tokens, itself included. 0: no window.
    int sliding_window = 0;
    std::vector<bool> window_layers;  // [num_layers] when sliding_window > 0: the layers that use the window

    // The window of layer l in tokens, 0 for full attention.
    int attention_window(int l) const {
        return sliding_window > 0 && l >= 0 && l < static_cast<int>(window_layers.size()) && window_layers[l]
                   ? sliding_window
                   : 0;
    }
    // True when some layer's window is shorter than `tokens` (below it a window changes nothing).
    bool window_matters(int64_t tokens) const { return sliding_window > 0 && sliding_window < tokens; }

    int q_dim() const { return num_heads * head_dim; }
    int kv_dim() const { return num_kv_heads * head_dim; }
    int group_size() const { return num_heads / num_kv_heads; }
    bool is_eos(int token) const;
    // Longest context the model supports without extrapolating its position encoding.
    int max_context() const { return max_position_embeddings; }
};

// The context rule of every subcommand that runs a model: `positions` (what the KV cache must hold) must not exceed
// max_context(); beyond it RoPE extrapolates and the output is noise. Throws InputError "<what> exceeds the model's
// maximum context of M tokens (max_position_embeddings in <source>)". `what` names the flag and the number, e.g.
// "-c 100000" or "--contexts 9000 (+ 8 answer tokens)".
void check_context(const ModelConfig& c, int64_t positions, const std::string& what,
                   const std::string& source = "config.json");

// Parses config.json text. `source` names the file in error messages. Throws InputError naming the field.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& config_json);
// Serialises a config back to a Hugging Face style config.json (used by `quest make-model` and `quantize`).
std::string model_config_to_json(const ModelConfig& c);

}  // namespace quest
