// backend_settings_table(): every BackendOptions setting once (engine/backend_factory.h).
#include <limits>

#include "engine/backend_factory.h"
#include "model/core/tensor_parallel.h"

namespace quest {

namespace {

using Entry = Setting<BackendOptions>;

template <class M>
Entry member(const char* key, const char* flag, SettingKind kind, M BackendOptions::*m, const char* help) {
    auto get = [m](const BackendOptions& o) -> double {
        if constexpr (std::is_enum_v<M>) return static_cast<int>(o.*m);
        else return static_cast<double>(o.*m);
    };
    auto set = [m](BackendOptions& o, double v) {
        if constexpr (std::is_same_v<M, bool>) o.*m = v != 0;
        else if constexpr (std::is_enum_v<M>) o.*m = static_cast<M>(static_cast<int>(v));
        else o.*m = static_cast<M>(v);
    };
    return Entry{key, flag, kind, help, get, set};
}

std::vector<Entry> make_table() {
    using K = SettingKind;
    std::vector<Entry> t;
    static const std::vector<const char*> kinds = {"cpu", "cuda"};
    Entry kind{"backend", "--backend", K::Enum, "cpu or cuda",
               [](const BackendOptions& o) { return o.kind == "cuda" ? 1.0 : 0.0; },
               [](BackendOptions& o, double v) { o.kind = kinds[static_cast<size_t>(v)]; }};
    kind.choices = kinds;
    t.push_back(kind);
    Entry tp = member("tp", "--tp", K::Int, &BackendOptions::tp,
                      "cuda: tensor parallel over this many GPUs of the host (NCCL; it must divide the model's KV heads; "
                      "docs/tensor_parallel.md)");
    tp.min = 1, tp.max = kMaxTpRanks;
    t.push_back(tp);
    // A Bool's flag sets the opposite of the default: --no-graph.
    t.push_back(member("graph", "--no-graph", K::Bool, &BackendOptions::graph,
                       "cuda: launch the decode step kernel by kernel instead of a CUDA graph"));
    Entry fused = member("fused_norms", "--fused-norms", K::Enum, &BackendOptions::fused_norms,
                         "cuda: the decode step's RMSNorms, residual adds and SwiGLU in the GEMV epilogues (on) or as "
                         "separate kernels (off; for comparison)");
    fused.choices = {"off", "on"};
    t.push_back(fused);
    t.push_back(member("quest_fused", "--quest-fused", K::Bool, &BackendOptions::quest_fused,
                       "cuda: Quest layers score pages and select the top-k in one launch (measured slower at 32K on "
                       "the H200 than the default separate launches; docs/measurements.md)"));
    t.push_back(member("memory_limit", "--memory-limit", K::Bytes, &BackendOptions::memory_limit,
                       "memory the backend may plan for, e.g. 24GiB or 512MiB (cuda: device memory, default what is "
                       "free; cpu: host memory, default what is available)"));
    Entry chunk = member("prefill_chunk", "--prefill-chunk", K::Int, &BackendOptions::prefill_chunk,
                         "cuda: tokens per prefill chunk (activations scale with it, not with the prompt)");
    chunk.min = 1, chunk.max = 1 << 20;
    t.push_back(chunk);
    Entry weights{"weights", nullptr, K::Enum,
                  "linear layers: as stored, fp16, or int4 with group int4_group (bench --weights)",
                  [](const BackendOptions& o) { return o.weights.stored ? 0.0 : 1.0 + static_cast<int>(o.weights.format); },
                  [](BackendOptions& o, double v) {
                      o.weights.stored = v == 0;
                      if (v > 0) o.weights.format = kLinearFormats[static_cast<size_t>(v) - 1];
                  }};
    weights.choices = {"stored"};
    for (LinearFormat f : kLinearFormats) weights.choices.push_back(linear_format_name(f));
    t.push_back(weights);
    Entry group{"int4_group", nullptr, K::Int, "int4 weights: columns per scale (a power of two, bench --weights int4-g<G>)",
                [](const BackendOptions& o) { return static_cast<double>(o.weights.group); },
                [](BackendOptions& o, double v) { o.weights.group = static_cast<int>(v); }};
    group.min = 32, group.max = 65536;
    t.push_back(group);
    return t;
}

}  // namespace

const std::vector<Setting<BackendOptions>>& backend_settings_table() {
    static const std::vector<Entry> table = make_table();
    return table;
}

}  // namespace quest
