#pragma once
// The CPU reference backend: a Llama forward pass in fp32, with a paged KV cache, page metadata and Quest page
// selection in the layers from `dense_layers` on. Plain loops over the ops in kernels/, meant to be obviously
// right: it is the oracle for the CUDA backend.
#include <functional>
#include <memory>

#include "kernels/select/quest.h"
#include "model/core/backend.h"
#include "model/io/model_folder.h"
#include "model/cpu/kv_cache.h"
#include "model/io/weights.h"

namespace quest {

// The inputs of the linear layers of a decoder layer: q|k|v, o, gate|up, down.
enum class LinearSite { Qkv = 0, O = 1, GateUp = 2, Down = 3 };
// Calibration (`quest quantize --awq-calib`): receives the fp32 input [tokens][cols] of each site in each layer.
using ActivationObserver = std::function<void(int layer, LinearSite site, const float* x, int tokens, int cols)>;

class CpuLlama final : public Backend {
public:
    // capacity: tokens the KV cache holds. Settings are validated (InputError).
    CpuLlama(std::shared_ptr<const LlamaWeightsF32> weights, const QuestSettings& quest, int capacity);

    std::string name() const override { return "cpu"; }
    const ModelConfig& config() const override { return w_->config; }
    const QuestSettings& quest() const override { return quest_; }
    int capacity() const override { return cache_.shape().capacity; }
    int position() const override { return pos_; }
    void reset() override {
        pos_ = 0;
        reuse_.clear();
    }
    std::span<const float> prefill(std::span<const int> tokens, std::vector<float>* all_logits = nullptr) override;
    std::span<const float> decode(int token) override;
    double last_decode_ms() const override { return last_ms_; }

    // Blocks each query head attended at the last decode step, [layer][head]; empty for layers that were dense. A
    // block is last_selection_block_size(layer) tokens: the page size, or the sub-page size (two-level).
    const std::vector<std::vector<std::vector<int>>>& last_selection() const { return selection_; }
    int last_selection_block_size(int layer) const { return selection_block_[layer]; }
    // The bytes-model counters of the decode steps (always on; cheap).
    const ReadStats* read_stats() const override { return &reads_; }
    void reset_read_stats() override { reads_ = ReadStats{}; }
    // fp32 weights, and the attention: what the timed steps since reset_read_stats() read on average, else the
    // bytes model at the current position (selectors that have one).
    size_t decode_bytes() const override;
    size_t host_memory_bytes() const override;
    // Makes this backend's cache hold `other`'s tokens (another CPU backend of the same model; the metadata rebuilt
    // for this backend's page sizes): several selectors then decode from one prefill (eval). The position becomes
    // other's. False for any other backend.
    bool copy_cache_from(const Backend& other) override;
    const KvCache& cache() const { return cache_; }
    // Selection diagnostics (costs a full attention pass per head and step): on/off, and the sums so far.
    bool set_selection_diagnostics(bool on) override;
    const SelectionDiagnostics* selection_diagnostics() const override { return &diag_; }
    void set_activation_observer(ActivationObserver f) { observer_ = std::move(f); }

private:
    // Runs `tokens` at positions [pos_, pos_ + n): dense causal attention, or (n == 1 and quest_step) Quest
    // selection in the Quest layers. Writes the last token's logits to logits_ and, if given, all to all_logits.
    void forward(std::span<const int> tokens, bool quest_step, std::vector<float>* all_logits);

    void record_selection_mass(int layer, const float* q, int len, const std::vector<std::vector<int>>& blocks,
                               int block_size, float scale);

    std::shared_ptr<const LlamaWeightsF32> w_;
    bool diagnostics_ = false;
    SelectionDiagnostics diag_;
    QuestSettings quest_;
    KvCache cache_;
    int pos_ = 0;
    double last_ms_ = 0;
    std::vector<float> logits_;
    std::vector<std::vector<std::vector<int>>> selection_;
    std::vector<int> selection_block_;  // [layer] tokens per block of selection_
    // reuse_cos: per layer, the last fresh selection, the queries it was made for ([num_heads][head_dim]) and its page
    // count; empty after a reset or a prefill.
    struct ReuseAnchor {
        Selection sel;
        std::vector<float> q;
        int pages = 0;
    };
    std::vector<ReuseAnchor> reuse_;
    // True when layer l may keep its anchor's selection for query q at `pages` pages (reuse_cos).
    bool may_reuse(int l, const float* q, int pages) const;
    ReadStats reads_;
    ActivationObserver observer_;
};

// The page selection's arguments for layer `layer` of `cache`: query qt (num_heads x head_dim) at length len, keys
// before `window_start` outside the window, scores scaled by `scale`, the rest from the settings. What the CPU backend
// passes to select_blocks_ref; the tensor-parallel emulation (tests/test_tensor_parallel.cpp) builds each rank's the
// same way.
QuestSelectArgs quest_select_args(const QuestSettings& q, const KvCache& cache, int layer, const float* qt,
                                  int num_heads, int num_kv_heads, int head_dim, int len, int window_start, float scale);

// The CPU reference backend over a model's weights (read into fp32: a folder's safetensors, a GGUF file dequantized). Before anything is read, the memory plan
// (model/core/memory.h) is checked against `memory_limit` bytes (0: the host's available memory): ResourceError with the
// numbers when it does not fit.
std::unique_ptr<Backend> make_cpu_backend(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                          size_t memory_limit = 0);

}  // namespace quest
