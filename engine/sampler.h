#pragma once
// Next-token sampling from logits: greedy (temperature 0), or temperature -> top-k -> top-p (nucleus) -> draw, in
// that order (as Hugging Face's generate applies them). The same seed gives the same tokens on every platform.
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace quest {

struct SamplerSettings {
    float temperature = 0.8f;  // 0: greedy (argmax, lowest index on ties)
    int top_k = 40;            // 0: off
    float top_p = 0.95f;       // 1: off
    uint64_t seed = 0;
};

class Sampler {
public:
    // Throws InputError when a setting is out of range (temperature < 0, top_k < 0, top_p not in (0, 1]).
    explicit Sampler(const SamplerSettings& settings);
    int sample(std::span<const float> logits);
    const SamplerSettings& settings() const { return settings_; }

private:
    double uniform01();  // platform-independent: built from the raw 64-bit engine output
    SamplerSettings settings_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int>> scratch_;  // (logit / T, id), reused across calls: no per-token allocation
    std::vector<double> probs_;
};

int argmax(std::span<const float> logits);

}  // namespace quest
