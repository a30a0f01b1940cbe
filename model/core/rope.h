#pragma once
// Rotary position embedding frequencies with Hugging Face's scaling semantics (transformers 5,
// modeling_rope_utils): default, linear, dynamic (NTK), yarn, llama3.
#include <vector>

#include "model/core/config.h"

namespace quest {

struct RopeFrequencies {
    std::vector<float> inv_freq;     // [head_dim / 2]: angle of pair i at position p is p * inv_freq[i] (fp32)
    float attention_scaling = 1.0f;  // multiplies cos and sin (yarn's mscale; 1 for the other types)
};

// `seq_len` is the number of positions the current forward pass covers (its largest position + 1). Only the
// dynamic type depends on it: Hugging Face recomputes the base when seq_len exceeds max_position_embeddings, and
// keys already in the cache keep the rotation they were given (so prefill and each decode step may differ).
RopeFrequencies rope_frequencies(const ModelConfig& c, int seq_len);

// True when the frequencies depend on seq_len (dynamic NTK): the engine must recompute them per forward pass.
inline bool rope_depends_on_length(const ModelConfig& c) { return c.rope.type == RopeType::Dynamic; }

}  // namespace quest
