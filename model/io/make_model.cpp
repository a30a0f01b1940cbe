#include "model/io/make_model.h"

#include <cmath>
#include <fstream>

#include "model/io/atomic_file.h"
#include "kernels/common/error.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"

namespace quest {

namespace {
// SplitMix64: tiny, fast, and specified bit for bit (unlike the std distributions).
struct SplitMix64 {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform(float a) {  // in [-a, a)
        return static_cast<float>((static_cast<double>(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a);
    }
};

void append_value(std::vector<std::byte>& out, DType t, float v) {
    if (t == DType::F32) {
        const auto* p = reinterpret_cast<const std::byte*>(&v);
        out.insert(out.end(), p, p + 4);
        return;
    }
    const uint16_t h = t == DType::F16 ? float_to_half(v) : float_to_bf16(v);
    const auto* p = reinterpret_cast<const std::byte*>(&h);
    out.insert(out.end(), p, p + 2);
}
}  // namespace

void write_random_llama(const std::filesystem::path& dir, const ModelConfig& config, const RandomModelOptions& opts) {
    if (!dtype_is_float(opts.dtype)) throw InputError("make-model: dtype must be F32, F16 or BF16");
    std::filesystem::create_directories(dir);
    ModelConfig c = config;
    c.torch_dtype = opts.dtype;

    SplitMix64 rng{opts.seed};
    const std::vector<TensorSpec> specs = llama_tensor_specs(c);
    std::vector<std::vector<std::byte>> storage(specs.size());
    std::vector<TensorToWrite> tensors;
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& s = specs[i];
        int64_t numel = 1;
        for (int64_t d : s.shape) numel *= d;
        const bool is_bias = s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
        const bool is_norm = s.shape.size() == 1 && !is_bias;  // biases (Qwen2): centred on 0, +-0.5
        const bool is_embedding = s.name == LlamaTensorNames::embed();
        const float bound = is_bias ? 0.5f : is_norm ? 0.1f : is_embedding ? 1.0f : 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
        storage[i].reserve(static_cast<size_t>(numel) * dtype_size(opts.dtype));
        for (int64_t j = 0; j < numel; ++j)
            append_value(storage[i], opts.dtype, (is_norm ? 1.0f : 0.0f) + rng.uniform(bound));
        tensors.push_back({s.name, opts.dtype, s.shape, storage[i]});
    }
    write_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}, {"generator", "quest make-model"}});
    write_file_atomic(dir / "config.json", model_config_to_json(c));
}

}  // namespace quest
