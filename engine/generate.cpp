#include "engine/generate.h"

#include <algorithm>

#include "kernels/common/error.h"

namespace quest {

GenerateResult generate(Backend& backend, Sampler& sampler, std::span<const int> prompt, int max_new_tokens,
                        const std::function<bool(int token)>& on_token, bool stop_at_eos,
                        std::span<const int> stop_tokens) {
    GenerateResult r;
    r.prompt_tokens = static_cast<int>(prompt.size());
    if (backend.position() + static_cast<int>(prompt.size()) > backend.capacity())
        throw ResourceError("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit in the context (" +
                            std::to_string(backend.capacity() - backend.position()) + " tokens free)");
    Stopwatch sw;
    std::span<const float> logits = backend.prefill(prompt);
    r.prefill_ms = sw.ms();
    r.stop_reason = "max_tokens";
    for (int i = 0; i < max_new_tokens; ++i) {
        const int token = sampler.sample(logits);
        r.tokens.push_back(token);
        if (!on_token(token)) {
            r.stop_reason = "stopped";
            break;
        }
        if (stop_at_eos && (backend.config().is_eos(token) ||
                            std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end())) {
            r.stop_reason = "eos";
            break;
        }
        if (i + 1 == max_new_tokens) break;
        if (backend.position() >= backend.capacity()) {
            r.stop_reason = "context_full";
            break;
        }
        logits = backend.decode(token);
        r.decode_ms.push_back(backend.last_decode_ms());
    }
    return r;
}

}  // namespace quest
