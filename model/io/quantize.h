#pragma once
// 4-bit model folders: reading (the project's own "quest-int4" folders and AutoAWQ "GEMM" checkpoints) and writing
// (`quest quantize`), round-to-nearest or with AWQ-style activation-aware scaling.
//
// A quest-int4 folder (written by `quest quantize`) is a Hugging Face folder whose config.json holds
//   "quantization_config": {"quant_method": "quest-int4", "bits": 4, "group_size": G, "zero_point": true,
//                           "layout": "quest-int4-rowmajor-awqorder", "layout_version": 1,
//                           "modules_not_quantized": [names of linear layers kept in FP16]}
// and whose safetensors hold, for each quantized linear layer <p> (e.g. model.layers.0.self_attn.q_proj), in place
// of <p>.weight:
//   <p>.q4_weight  I32 [out, in / 8]   codes, layout of kernels/linear/quant.h
//   <p>.q4_scales  F16 [out, in / G]
//   <p>.q4_zeros   U8  [out, in / G]   0..15
// Linear layers kept in FP16 keep <p>.weight (F16); embeddings and lm_head stay F16, norm weights are F32.
//
// An AutoAWQ "GEMM" folder: config.json "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": G,
// "zero_point": true, "version": "gemm"} (or the older quant_config.json {"w_bit": 4, "q_group_size": G,
// "zero_point": true, "version": "GEMM"}), each quantized linear <p> stored as WQLinear_GEMM does:
//   <p>.qweight I32 [in, out / 8], <p>.qzeros I32 [in / G, out / 8], <p>.scales F16 [in / G, out]
// (kernels/linear/quant.h, int4_from_awq, gives the bit order). Converted to the quest-int4 layout at load time, exactly.
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kernels/linear/quant.h"
#include "model/core/config.h"
#include "model/io/safetensors.h"

namespace quest {

struct LlamaWeightsF32;

inline constexpr const char* kQuestInt4Method = "quest-int4";
inline constexpr const char* kQuestInt4Layout = "quest-int4-rowmajor-awqorder";
inline constexpr int kQuestInt4LayoutVersion = 1;

// What config.json (or quant_config.json) says about the weights.
struct QuantizationInfo {
    enum class Method { None, QuestInt4, Awq };
    Method method = Method::None;
    int group = 0;  // group_size (AWQ's -1, one group per row, is kept as 0 and taken from the tensor shapes)
    std::string describe() const;  // "fp16", "quest-int4 g128", "awq g128"
};
// Throws InputError (naming the file and field) for a quantization this engine cannot read: another quant_method
// (gptq, bitsandbytes, ...), bits != 4, zero_point false, an AWQ version other than gemm, an unknown layout.
QuantizationInfo read_quantization_info(const std::filesystem::path& model_dir);

// How one linear layer is stored in a folder.
struct LinearInfo {
    enum class Storage { Float, Int4, Awq };
    Storage storage = Storage::Float;
    int group = 0;  // Int4 / Awq: the group size (from the tensor shapes)
    bool int4() const { return storage != Storage::Float; }
};

// Reads the linear layers of a model folder whatever their storage. `prefix` names the layer without the tensor
// suffix ("model.layers.0.self_attn.q_proj"); rows = out_features, cols = in_features. Every read checks dtypes and
// shapes (InputError naming the file, the tensor, Expected and Actual).
class LinearReader {
public:
    LinearReader(const ModelFiles& files, QuantizationInfo info);
    const QuantizationInfo& info() const { return info_; }
    LinearInfo inspect(const std::string& prefix, int64_t rows, int64_t cols) const;
    // fp32 weights [rows][cols] (dequantized when stored in 4 bits).
    std::vector<float> load_f32(const std::string& prefix, int64_t rows, int64_t cols) const;
    // The int4 matrix of a 4-bit layer (inspect().int4() must hold; an AWQ group the layout cannot hold throws).
    Int4Matrix load_int4(const std::string& prefix, int64_t rows, int64_t cols) const;

private:
    const ModelFiles& files_;
    QuantizationInfo info_;
};

// The 7 linear layers of a Llama decoder layer, in file order, with their shapes.
struct LinearSpec {
    std::string prefix;  // model.layers.<l>.<name>
    int64_t rows = 0, cols = 0;
};
std::vector<LinearSpec> llama_linear_specs(const ModelConfig& c, int layer);

// Replaces every linear weight of `w` whose input dimension the group divides by dequant(quantize(W)) (the CPU
// backend's view of a model quantized on the fly, e.g. `bench --weights int4`). Returns how many were quantized.
int fake_quantize_llama_weights(LlamaWeightsF32& w, int group, int threads = 0);

// Activation-aware scaling (AWQ, Lin et al. 2024), computed on a calibration text run through the CPU backend:
// per decoder layer and input site (q|k|v, o, gate|up, down) a per-input-channel scale s = mean|x|^alpha
// (normalised by sqrt(max s * min s)), alpha in {0, 0.05, ..., 0.95} chosen to minimise the output error
// sum ||X W^T - X (Q(W diag(s)) diag(s)^-1)^T||^2 over the site's matrices on the calibration inputs X (alpha 0 is
// round-to-nearest, so the search never does worse than it on those inputs). W becomes W diag(s) and 1/s is folded
// into the op before the site (RMSNorm weight for q|k|v and gate|up, up_proj rows for down, v_proj rows for o, one
// scale per KV channel under GQA), so the model computes the same function in full precision. On stories260K it
// lowers the held-out KL to the fp32 model by 5-19% (tests/test_quant.cpp); round-to-nearest stays the default.
struct AwqStats {
    int sites_scaled = 0;        // sites where alpha > 0 won
    double loss_rtn = 0;         // summed output error ||X (W - Q(W))^T||^2 on the calibration inputs
    double loss_awq = 0;         // the same with the chosen scales
    int calib_tokens = 0;
};
AwqStats apply_awq_scaling(LlamaWeightsF32& w, std::span<const int> calib_tokens, int group, int threads = 0);

struct QuantizeOptions {
    int group = 0;                      // 0: kInt4DefaultGroup, or the input's group when it is already 4-bit
    std::filesystem::path calib_file;   // AWQ-style scaling from this text (empty: round-to-nearest)
    int calib_tokens = 512;             // at most this many tokens of it (and the model's maximum context)
    int threads = 0;
};

struct QuantizeSummary {
    int group = 0;
    int quantized = 0;                     // linear layers written in 4 bits
    std::vector<std::string> kept_fp16;    // "<prefix>: <why>"
    double weight_rel_err = 0;             // ||W - Q(W)|| / ||W|| over all quantized layers
    size_t bytes_in = 0, bytes_out = 0;    // safetensors bytes
    bool awq = false;
    AwqStats awq_stats;
    std::string text() const;              // the summary `quest quantize` prints
};

// `quest quantize`: reads a model folder (F32/F16/BF16, quest-int4 or AWQ), writes `out` (config.json with the
// quantization_config above, model.safetensors, the tokenizer and the small tokenizer/generation JSON files).
// Layers already in 4 bits are copied exactly when their group equals the requested one, re-quantized otherwise.
// `progress` receives one line per step (may be empty).
QuantizeSummary quantize_model(const std::filesystem::path& in, const std::filesystem::path& out,
                               const QuantizeOptions& opts,
                               const std::function<void(const std::string&)>& progress = {});

}  // namespace quest
