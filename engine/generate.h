#pragma once
// The engine loop: prefill the prompt, then sample and decode token by token, streaming each token to a callback.
// Timings: the prefill (host clock around the backend call) and every decode step as the backend measured it
// (sampling excluded).
#include <functional>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "engine/sampler.h"
#include "engine/timing.h"

namespace quest {

struct GenerateResult {
    std::vector<int> tokens;         // generated tokens (EOS included when it ended the answer)
    double prefill_ms = 0;           // prompt through the model, first logits ready
    int prompt_tokens = 0;
    std::vector<double> decode_ms;   // one entry per decode step
    std::string stop_reason;         // "eos", "max_tokens", "context_full", "stopped"
};

// Generates up to max_new_tokens after `prompt` (appended to what the backend's cache holds). on_token returns
// false to stop early (Ctrl-C). Stops at EOS (the config's) or one of `stop_tokens` (e.g. the tokenizer's
// end_of_turn_ids()) when stop_at_eos; the stop token is passed to on_token and kept in `tokens`.
GenerateResult generate(Backend& backend, Sampler& sampler, std::span<const int> prompt, int max_new_tokens,
                        const std::function<bool(int token)>& on_token, bool stop_at_eos = true,
                        std::span<const int> stop_tokens = {});

}  // namespace quest
