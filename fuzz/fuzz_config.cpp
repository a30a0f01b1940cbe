// libFuzzer target: parse_model_config on arbitrary text.
//
// A config that parses must be usable without a crash, an overflow or a division by zero: its derived sizes (q_dim,
// kv_dim, group size, the tensor shapes) are computed, the rotary frequencies are computed at the lengths the engine
// uses (1, the model's maximum, beyond it for dynamic NTK) and must be finite, and the config must survive the round
// trip through model_config_to_json (what `quest make-model` writes is read back unchanged).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "model/core/config.h"
#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"
#include "model/core/rope.h"
#include "model/io/weights.h"

using namespace quest;

#define FUZZ_CHECK(cond) QUEST_FUZZ_CHECK("fuzz_config", cond)

namespace {

void check_rope(const ModelConfig& c, int seq_len) {
    const RopeFrequencies f = rope_frequencies(c, seq_len);
    FUZZ_CHECK(f.inv_freq.size() == static_cast<size_t>(c.head_dim / 2));
    for (float v : f.inv_freq) FUZZ_CHECK(std::isfinite(v) && v >= 0);
    FUZZ_CHECK(std::isfinite(f.attention_scaling));
}

bool same(const ModelConfig& a, const ModelConfig& b) {
    const RopeScaling &r = a.rope, &s = b.rope;
    return a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
           a.num_layers == b.num_layers && a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads &&
           a.head_dim == b.head_dim && a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
           a.max_position_embeddings == b.max_position_embeddings && a.vocab_size == b.vocab_size &&
           a.tie_word_embeddings == b.tie_word_embeddings && a.bos_token_id == b.bos_token_id &&
           a.eos_token_ids == b.eos_token_ids && a.torch_dtype == b.torch_dtype && r.type == s.type &&
           r.factor == s.factor && r.original_max_position_embeddings == s.original_max_position_embeddings &&
           r.beta_fast == s.beta_fast && r.beta_slow == s.beta_slow && r.attention_factor == s.attention_factor &&
           r.mscale == s.mscale && r.mscale_all_dim == s.mscale_all_dim && r.truncate == s.truncate &&
           r.low_freq_factor == s.low_freq_factor && r.high_freq_factor == s.high_freq_factor;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    ModelConfig c;
    try {
        c = parse_model_config(text, "config.json");
    } catch (const InputError&) {
        return 0;
    }
    FUZZ_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 && c.vocab_size > 0);
    FUZZ_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0);
    FUZZ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0);
    FUZZ_CHECK(c.q_dim() > 0 && c.kv_dim() > 0 && c.group_size() >= 1);
    FUZZ_CHECK(c.max_context() > 0);
    // The parse-time ranges (config.h): what keeps llama_tensor_specs and the loaders small (21,474,836 layers ran the
    // target out of memory before the ranges).
    FUZZ_CHECK(c.num_layers <= kMaxLayers && c.hidden_size <= kMaxHiddenSize && c.num_heads <= kMaxHeads &&
               c.num_kv_heads <= kMaxHeads && c.vocab_size <= kMaxVocabSize &&
               c.intermediate_size <= kMaxIntermediateSize && c.head_dim <= kMaxHeadDim &&
               c.max_position_embeddings <= kMaxPositions);
    FUZZ_CHECK(c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size);
    for (int id : c.eos_token_ids) FUZZ_CHECK(id >= 0 && id < c.vocab_size);
    FUZZ_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0);
    FUZZ_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0);

    for (const TensorSpec& s : llama_tensor_specs(c))
        for (int64_t d : s.shape) FUZZ_CHECK(d > 0);

    check_rope(c, 1);
    check_rope(c, c.max_context());
    if (rope_depends_on_length(c)) {
        check_rope(c, c.max_context() < std::numeric_limits<int>::max() / 4 ? 4 * c.max_context() : c.max_context());
        check_rope(c, std::numeric_limits<int>::max());
    }

    const std::string written = model_config_to_json(c);
    ModelConfig back;
    try {
        back = parse_model_config(written, "round trip");
    } catch (const InputError& e) {
        std::fprintf(stderr, "fuzz_config: the written config is refused: %s\n%s\n", e.what(), written.c_str());
        std::abort();
    }
    if (!same(c, back)) {
        std::fprintf(stderr, "fuzz_config: the round trip changed the config:\n%s\n", written.c_str());
        std::abort();
    }
    return 0;
}
