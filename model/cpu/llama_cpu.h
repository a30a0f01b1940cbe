#pragma once
// The CPU reference backend: a Llama forward pass in fp32, with a paged KV cache, page metadata and Quest page
// selection in the layers from `dense_layers` on. Plain loops over the ops in kernels/, meant to be obviously
// right: it is the oracle for the CUDA backend.
#include <functional>
#include <memory>

#include "model/core/backend.h"
#include "model/io/model_folder.h"
#include "model/cpu/kv_cache.h"
#include "model/io/weights.h"

namespace quest {

// The inputs of the linear layers of a decoder layer: q|k|v, o, gate|up, down.
enum class LinearSite { Qkv = 0, O = 1, GateUp = 2, Down = 3 };
// Calibration (`quest quantize --awq-calib`): receives the fp32 input [tokens][cols] of each site in each layer.
using ActivationObserver = std::function<void(int layer, LinearSite site, const float* x, int tokens, int cols)>;

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
    const ReadStats& read_stats() const { return reads_; }
    void reset_read_stats() { reads_ = ReadStats{}; }
    // Makes this backend's cache hold `other`'s tokens (same model; the metadata rebuilt for this backend's page
    // sizes): several selectors then decode from one prefill (eval). The position becomes other's.
    void copy_cache_from(const CpuLlama& other);
    const KvCache& cache() const { return cache_; }
    // Selection diagnostics (costs a full attention pass per head and step): on/off, and the sums so far.
    void set_selection_diagnostics(bool on);
    const SelectionDiagnostics& selection_diagnostics() const { return diag_; }
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

// The CPU reference backend over a folder's weights (read into fp32). Before anything is read, the memory plan
// (model/core/memory.h) is checked against `memory_limit` bytes (0: the host's available memory): ResourceError with the
// numbers when it does not fit.
std::unique_ptr<Backend> make_cpu_backend(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                          size_t memory_limit = 0);

}  // namespace quest
