#pragma once
// Deterministic random Llama models (the project's own test and demo models; random weights, no training).
#include <cstdint>
#include <filesystem>

#include "model/core/config.h"

namespace quest {

struct RandomModelOptions {
    uint64_t seed = 0;
    DType dtype = DType::F16;  // storage dtype of the weights (F32, F16 or BF16)
};

// Writes config.json and model.safetensors with weights drawn from a fixed generator (the same seed gives the same
// bytes on every platform): linear weights uniform in +-1/sqrt(fan_in), embeddings uniform in +-1, norm weights
// 1 + uniform in +-0.1.
void write_random_llama(const std::filesystem::path& dir, const ModelConfig& config, const RandomModelOptions& opts);

}  // namespace quest
