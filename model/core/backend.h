#pragma once
// What the engine loop needs from a model backend (CPU reference or CUDA): prefill a prompt into the KV cache,
// then decode one token at a time. Logits are fp32 on the host.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/core/quest_settings.h"
#include "model/core/config.h"

namespace quest {

// Selection quality (eval --diagnostics): per layer and query head, the softmax mass of the true attention that lies in
// the pages Quest selected, and in the pages an oracle would select at the same budget (the last page plus the K-1
// complete pages holding the most mass), summed over the decode steps that selected (P > K).
struct SelectionDiagnostics {
    std::vector<std::vector<double>> selected_mass;  // [layer][head]
    std::vector<std::vector<double>> oracle_mass;    // [layer][head]
    std::vector<int> steps;                          // [layer] steps that contributed
};

// Bytes the attention of the decode steps read under the bytes model (kernels/select/quest.h selection_bytes: FP16 KV and
// metadata), summed over decode steps since the last reset_read_stats().
struct ReadStats {
    int64_t steps = 0;              // decode steps
    int64_t quest_layer_bytes = 0;  // Quest layers: metadata + KV (a dense step, P <= K, counts every token)
    int64_t metadata_bytes = 0;     // the metadata part of quest_layer_bytes (an oracle's key pass included)
    int64_t dense_layer_bytes = 0;  // the dense layers' KV
    int64_t selecting_steps = 0;    // (layer, step) pairs that selected (P > K)
    int64_t selecting_rows = 0;     // selection rows at those, summed
    int64_t selected_tokens = 0;    // KV tokens read at those, summed over rows
    int64_t reused_steps = 0;       // of the selecting (layer, step) pairs, those that kept the last selection (reuse_cos)
    double bytes_per_step() const { return steps ? double(quest_layer_bytes + dense_layer_bytes) / steps : 0.0; }
    double quest_bytes_per_step() const { return steps ? double(quest_layer_bytes) / steps : 0.0; }
    double metadata_bytes_per_step() const { return steps ? double(metadata_bytes) / steps : 0.0; }
    // Mean KV tokens a selection row read at a selecting step.
    double tokens_per_row() const { return selecting_rows ? double(selected_tokens) / selecting_rows : 0.0; }
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "cpu", "cuda"
    virtual const ModelConfig& config() const = 0;
    virtual const QuestSettings& quest() const = 0;
    virtual int capacity() const = 0;  // tokens the KV cache holds
    virtual int position() const = 0;  // tokens in the cache now

    // Empties the cache (a new conversation).
    virtual void reset() = 0;
    // Runs `tokens` (appended after what the cache holds) with dense causal attention, writing their keys, values
    // and page metadata. Returns the logits of the last token. When `all_logits` is given it receives the logits of
    // every token, [tokens][vocab]. Throws ResourceError when the cache would overflow.
    virtual std::span<const float> prefill(std::span<const int> tokens, std::vector<float>* all_logits = nullptr) = 0;
    // Appends one token and returns its logits (Quest selection in the Quest layers).
    virtual std::span<const float> decode(int token) = 0;
    // Milliseconds the last decode() spent computing (device time for a GPU backend; sampling is not included).
    virtual double last_decode_ms() const = 0;
    // Device memory the backend holds (0 for the CPU backend).
    virtual size_t device_memory_bytes() const { return 0; }
    // Host memory the backend planned for (the CPU backend's weights, KV cache and activations; 0 for a GPU one).
    virtual size_t host_memory_bytes() const { return 0; }
    // Bytes one decode step reads at the current position: the weights as the backend holds them, and the attention
    // under the bytes model (kernels/select/selection.h selection_bytes).
    virtual size_t decode_bytes() const = 0;

    // Capabilities a backend may have (the app asks; a backend without one says so, and nothing else is used):
    // reads counted as the decode steps run, summed since reset_read_stats() (null: not counted).
    virtual const ReadStats* read_stats() const { return nullptr; }
    virtual void reset_read_stats() {}
    // Selection diagnostics (eval --diagnostics): returns false when the backend cannot compute them.
    virtual bool set_selection_diagnostics(bool on) { return !on; }
    virtual const SelectionDiagnostics* selection_diagnostics() const { return nullptr; }
    // Makes this backend's cache hold `other`'s tokens instead of a prefill (several selectors then decode from one
    // prefill); returns false when it cannot copy from that backend.
    virtual bool copy_cache_from(const Backend& other) { return false; }
    // Per-kernel-group timing of the decode step when the backend was built with profiling ("" otherwise).
    virtual std::string profile_report() const { return ""; }

    // Ctrl-C: a prefill asks `interrupt` between its chunks (CUDA) or layers (CPU) and, when it returns true, throws
    // Interrupted (kernels/common/error.h) with the cache as it was before the call. Empty: never interrupted.
    void set_interrupt(std::function<bool()> interrupt) { interrupt_ = std::move(interrupt); }

protected:
    bool interruptible() const { return static_cast<bool>(interrupt_); }
    bool interrupt_requested() const { return interrupt_ && interrupt_(); }

private:
    std::function<bool()> interrupt_;
};

}  // namespace quest
