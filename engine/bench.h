#pragma once
// `quest bench`: decode latency over a grid of contexts x budgets. For each combination: prefill a context
// (random tokens, fixed seed), decode warm-up steps, then time `steps` decode steps (sampling excluded: the token
// fed back is drawn from a fixed sequence). Reports p50/p90/p99/mean ms per token, tokens/s, the bytes the step
// must read and the achieved GB/s, prefill seconds and device memory.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/timing.h"

namespace quest {

struct BenchRequest {
    std::string model;          // model folder, or a config.json with random_weights
    bool random_weights = false;
    BackendOptions backend;     // kind, quest settings (budget overridden per row), graph
    std::vector<int> contexts;  // prompt lengths
    std::vector<int> budgets;   // 0 = full attention
    int steps = 64;
    int warmup = 8;
    uint64_t seed = 1;
    std::string text_file;  // prefill with this text's tokens (repeated to the context length) instead of random ids
    // Linear-layer formats, one row each per context and budget (parse_weights_list): "fp16", "int4-g<G>";
    // empty: as stored.
    std::vector<std::string> weights;
};

struct BenchRow {
    std::string backend, weights = "fp16";
    int context = 0;
    int budget = 0;  // 0 = full attention
    int page_size = 0;
    LatencyStats ms;
    double tokens_per_s = 0;
    size_t bytes = 0;     // bytes one step must read (mid-run position)
    std::string selector = "quest";  // the page-selection policy (QuestSettings::policy_label; "full")
    // The bytes model of the attention (kernels/select/quest.h selection_bytes: FP16 KV and metadata), per decode step,
    // every layer: measured over the timed steps on the CPU backend (every selector), counted from the quest rule on
    // CUDA (quest_step_bytes_model, model/core/quest_settings.h, at the mid-run position).
    double attention_bytes = 0;
    double metadata_bytes = 0;  // the metadata part of attention_bytes
    double gbps = 0;      // bytes / p50 (every GPU's reads: under --tp, gbps / gpus per GPU)
    int gpus = 1;         // --tp
    double prefill_s = 0;
    size_t device_memory = 0;
};


std::vector<BenchRow> run_bench(const BenchRequest& r, const std::function<void(const std::string&)>& progress);
// --weights: comma-separated fp16, int4 (group 128) or int4-g<G> (G a power of two >= 32), normalised to "fp16"
// and "int4-g<G>"; "" gives an empty list (as stored). InputError otherwise.
std::vector<std::string> parse_weights_list(const std::string& s);
std::string bench_table(const std::vector<BenchRow>& rows);
std::string bench_json(const std::vector<BenchRow>& rows);
std::string bench_csv(const std::vector<BenchRow>& rows);

}  // namespace quest
