#pragma once
// The CPU backend on the same FP16-rounded weights as the GPU (norm weights stay fp32 on both), for the CUDA model
// tests: what remains between the two is the GPU's fp16 activations and summation order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "model/core/quest_settings.h"
#include "kernels/common/dtype.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"
#include "tests/fp16_weights.h"

namespace quest::test {

inline std::shared_ptr<LlamaWeightsF32> fp16_rounded_weights(const ModelFolder& m) {
    auto w = std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(m.dir), m.config));
    round_matrices_to_fp16(*w);
    return w;
}

// An int32 tensor of a fixture's reference.safetensors (prompt_ids, decode_ids) as token ids.
inline std::vector<int> reference_ids(const std::filesystem::path& file, const char* name) {
    const auto ref = SafeTensorsFile::open(file);
    const TensorInfo* t = ref->find(name);
    std::vector<int> v(t->numel());
    std::memcpy(v.data(), ref->data(*t), t->nbytes());
    return v;
}

inline std::unique_ptr<Backend> cpu_fp16_weights(const ModelFolder& m, const QuestSettings& q, int capacity) {
    return std::make_unique<CpuLlama>(fp16_rounded_weights(m), q, capacity);
}

// The trained demo model (models/demo) as the CUDA model tests use it: the folder, its tokenizer and the FP16-rounded
// weights for the CPU backend. nullopt when the model is absent (the caller skips: GTEST_SKIP must be in the test).
struct TrainedDemo {
    ModelFolder folder;
    SentencePieceTokenizer tok;  // the demo folders hold tokenizer.model
    std::shared_ptr<LlamaWeightsF32> weights;
};
inline std::optional<TrainedDemo> trained_demo(const std::filesystem::path& dir) {
    if (!std::filesystem::exists(dir / "model.safetensors")) return std::nullopt;
    ModelFolder m = open_model_folder(dir.string());
    SentencePieceTokenizer tok(m.dir / "tokenizer.model");
    auto w = fp16_rounded_weights(m);
    return TrainedDemo{std::move(m), std::move(tok), std::move(w)};
}

// Greedy decoding's choice: the index of the largest logit.
inline int argmax(std::span<const float> logits) {
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Two backends' page selections of one Quest layer at one step, per query head (ascending pages; SelectionTrace /
// CpuLlama::last_selection), judged with `scores`, the scores one of them ranked by ([head][P - 1]).
//   equal:     the same pages for every head;
//   near_tie:  they differ, and for every head each page only one side took scores within `tol` x the row's largest
//              |score| of every page only the other side took (rounding of inputs that agree to about tol can swap
//              them: a legitimate divergence, after which the two runs' caches differ);
//   otherwise: a difference no rounding explains (a bug); `what` says where.
struct SelectionCompare {
    bool equal = true;
    bool near_tie = false;
    std::string what;
};
inline SelectionCompare compare_selections(std::vector<std::vector<int>> a, std::vector<std::vector<int>> b,
                                           const std::vector<std::vector<float>>& scores, double tol) {
    SelectionCompare r;
    if (a.size() != b.size() || a.size() != scores.size()) {
        r.equal = false;
        r.what = "selections of " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " heads, scores of " +
                 std::to_string(scores.size());
        return r;
    }
    for (auto& v : a) std::sort(v.begin(), v.end());
    for (auto& v : b) std::sort(v.begin(), v.end());
    std::ostringstream os;
    bool explained = true;
    for (size_t h = 0; h < a.size(); ++h) {
        if (a[h] == b[h]) continue;
        r.equal = false;
        std::vector<int> only_a, only_b;
        std::set_difference(a[h].begin(), a[h].end(), b[h].begin(), b[h].end(), std::back_inserter(only_a));
        std::set_difference(b[h].begin(), b[h].end(), a[h].begin(), a[h].end(), std::back_inserter(only_b));
        const std::vector<float>& s = scores[h];
        double scale = 0, gap = 0;
        for (float v : s)
            if (std::isfinite(v)) scale = std::max(scale, double(std::fabs(v)));
        bool in_range = !only_a.empty() && only_a.size() == only_b.size();
        for (int p : only_a)
            for (int q : only_b) {
                if (p < 0 || q < 0 || p >= int(s.size()) || q >= int(s.size()) || !std::isfinite(s[p]) ||
                    !std::isfinite(s[q])) {  // out of range, or no candidate (before a window)
                    in_range = false;
                    continue;
                }
                gap = std::max(gap, std::fabs(double(s[p]) - double(s[q])));
            }
        const bool tie = in_range && gap <= tol * scale;
        explained = explained && tie;
        os << "head " << h << ": " << only_a.size() << " page(s) swapped, score gap " << gap << " of max |score| "
           << scale << (tie ? " (near tie)" : " (NOT a near tie)") << "; ";
    }
    r.near_tie = !r.equal && explained;
    r.what = os.str();
    return r;
}

}  // namespace quest::test
