#pragma once
// What the engine loop needs from a model backend (CPU reference or CUDA): prefill a prompt into the KV cache,
// then decode one token at a time. Logits are fp32 on the host.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/quest_settings.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace quest {

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
    // Per-kernel-group timing of the decode step when the backend was built with profiling ("" otherwise).
    virtual std::string profile_report() const { return ""; }

    // Ctrl-C: a prefill asks `interrupt` between its chunks (CUDA) or layers (CPU) and, when it returns true, throws
    // Interrupted (model/error.h) with the cache as it was before the call. Empty: never interrupted.
    void set_interrupt(std::function<bool()> interrupt) { interrupt_ = std::move(interrupt); }

protected:
    bool interruptible() const { return static_cast<bool>(interrupt_); }
    bool interrupt_requested() const { return interrupt_ && interrupt_(); }

private:
    std::function<bool()> interrupt_;
};

}  // namespace quest

#include <filesystem>
#include <memory>

namespace quest {

// A model folder: config.json, safetensors weights, tokenizer.json or tokenizer.model.
struct ModelFolder {
    std::filesystem::path dir;
    ModelConfig config;
    // The tokenizer file load_tokenizer(dir) reads: tokenizer.json when present, else tokenizer.model.
    std::filesystem::path tokenizer_file() const { return tokenizer_file_in(dir); }
};
// Checks the folder exists and parses its config.json (InputError naming the path otherwise).
ModelFolder open_model_folder(const std::filesystem::path& dir);
// `-m` of bench and soak: with random_weights, a config.json or a folder holding one (only the config is read; dir
// stays empty), else open_model_folder.
ModelFolder open_model_or_config(const std::filesystem::path& path, bool random_weights);

// The CPU reference backend over a folder's weights (read into fp32). Before anything is read, the memory plan
// (engine/memory.h) is checked against `memory_limit` bytes (0: the host's available memory): ResourceError with the
// numbers when it does not fit.
std::unique_ptr<Backend> make_cpu_backend(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                          size_t memory_limit = 0);

}  // namespace quest
