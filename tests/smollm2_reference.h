#pragma once
// SmolLM2-135M-Instruct (Q4_1 GGUF) against Hugging Face transformers reading the same file in fp32
// (tools/make_smollm2_reference.py -> tests/fixtures/smollm2/): the fixture's reader and the per-position comparison
// the CPU test (tests/test_e2e_gguf.cpp) and the CUDA test (tests/cuda/test_gguf_cuda.cpp) share.
//
// A position is checked on the logits the fixture holds: transformers' top 32 ids and 64 fixed ids spread over the
// vocabulary (96 values, the head of the distribution and its tail), plus log-sum-exp over the whole vocabulary
// (every logit enters it) and the argmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "model/io/safetensors.h"

namespace quest::test {

struct SmolLM2Reference {
    std::vector<int> prompt_ids;    // [P] transformers' ids of `prompt`
    std::vector<int> decode_ids;    // [D] step i feeds decode_ids[i]; decode_ids[0] is the prompt's greedy token
    int last = -1;                  // the greedy token after the last step
    int K = 0, M = 0;               // top ids per position, probe ids
    std::vector<int> top_ids;       // [N, K], N = P + D positions (prompt positions, then the decode steps)
    std::vector<float> top_logits;  // [N, K]
    std::vector<int> probe_ids;     // [M]
    std::vector<float> probe_logits;  // [N, M]
    std::vector<float> logsumexp;     // [N]
    std::string prompt;
    int positions() const { return int(prompt_ids.size() + decode_ids.size()); }
    // The greedy token transformers chose after position n (a prompt position before the last one: -1).
    int greedy_after(int n) const {
        const int P = int(prompt_ids.size());
        if (n < P - 1) return -1;
        const int step = n - (P - 1);  // 0: the prompt's last position
        return step < int(decode_ids.size()) ? decode_ids[step] : last;
    }
};

inline std::filesystem::path smollm2_reference_dir(const std::filesystem::path& source) {
    return source / "tests/fixtures/smollm2";
}

template <typename T>
std::vector<T> smollm2_tensor(const SafeTensorsFile& f, const std::string& name, DType dtype, int64_t numel) {
    const TensorInfo* t = f.find(name);
    if (!t || t->dtype != dtype || t->numel() != numel)
        throw std::runtime_error(f.path().string() + ": tensor " + name + " missing or of another type / size");
    std::vector<T> out(size_t(t->numel()));
    std::memcpy(out.data(), f.data(*t), t->nbytes());
    return out;
}

inline int64_t smollm2_dim(const SafeTensorsFile& f, const std::string& name, size_t axis) {
    const TensorInfo* t = f.find(name);
    if (!t || t->shape.size() <= axis) throw std::runtime_error(f.path().string() + ": tensor " + name + " missing");
    return t->shape[axis];
}

inline SmolLM2Reference load_smollm2_reference(const std::filesystem::path& source) {
    const auto dir = smollm2_reference_dir(source);
    const auto f = SafeTensorsFile::open(dir / "reference.safetensors");
    SmolLM2Reference r;
    const int64_t P = smollm2_dim(*f, "prompt_ids", 0), D = smollm2_dim(*f, "decode_ids", 0);
    const int64_t N = P + D;
    r.K = int(smollm2_dim(*f, "top_ids", 1));
    r.M = int(smollm2_dim(*f, "probe_ids", 0));
    const auto p = smollm2_tensor<int32_t>(*f, "prompt_ids", DType::I32, P);
    const auto d = smollm2_tensor<int32_t>(*f, "decode_ids", DType::I32, D);
    r.prompt_ids.assign(p.begin(), p.end());
    r.decode_ids.assign(d.begin(), d.end());
    const auto ti = smollm2_tensor<int32_t>(*f, "top_ids", DType::I32, N * r.K);
    r.top_ids.assign(ti.begin(), ti.end());
    r.top_logits = smollm2_tensor<float>(*f, "top_logits", DType::F32, N * r.K);
    const auto pi = smollm2_tensor<int32_t>(*f, "probe_ids", DType::I32, r.M);
    r.probe_ids.assign(pi.begin(), pi.end());
    r.probe_logits = smollm2_tensor<float>(*f, "probe_logits", DType::F32, N * r.M);
    r.logsumexp = smollm2_tensor<float>(*f, "logsumexp", DType::F32, N);
    std::ifstream js(dir / "reference.json");
    const auto meta = nlohmann::json::parse(js);
    r.prompt = meta.at("prompt").get<std::string>();
    r.last = meta.at("last").get<int>();
    return r;
}

// One position's logits against the reference.
struct SmolLM2PositionError {
    double max_abs = 0;   // max |ours - ref| over the K + M stored logits
    double scale = 0;     // max |ref| over the same logits
    double lse_abs = 0;   // |logsumexp(ours) - ref logsumexp| (every logit of the vocabulary)
    int argmax = -1;      // ours, over the whole vocabulary
    int ref_argmax = -1;  // transformers' top id
    int ref_second = -1;  // transformers' second id
    double ref_gap = 0;   // transformers' top-1 minus top-2 logit
    double rel() const { return scale > 0 ? max_abs / scale : max_abs; }
};

inline SmolLM2PositionError compare_smollm2_position(const SmolLM2Reference& r, int n, std::span<const float> ours) {
    SmolLM2PositionError e;
    auto check = [&](int id, float ref) {
        e.max_abs = std::max(e.max_abs, std::fabs(double(ours[size_t(id)]) - ref));
        e.scale = std::max(e.scale, std::fabs(double(ref)));
    };
    for (int k = 0; k < r.K; ++k) check(r.top_ids[size_t(n) * r.K + k], r.top_logits[size_t(n) * r.K + k]);
    for (int m = 0; m < r.M; ++m) check(r.probe_ids[m], r.probe_logits[size_t(n) * r.M + m]);
    double mx = -INFINITY;
    for (float v : ours) mx = std::max(mx, double(v));
    double sum = 0;
    for (float v : ours) sum += std::exp(double(v) - mx);
    e.lse_abs = std::fabs(mx + std::log(sum) - r.logsumexp[size_t(n)]);
    e.argmax = int(std::max_element(ours.begin(), ours.end()) - ours.begin());
    e.ref_argmax = r.top_ids[size_t(n) * r.K];
    e.ref_second = r.top_ids[size_t(n) * r.K + 1];
    e.ref_gap = double(r.top_logits[size_t(n) * r.K]) - r.top_logits[size_t(n) * r.K + 1];
    return e;
}

// The worst position of a run.
struct SmolLM2RunError {
    double max_abs = 0, max_rel = 0, max_lse = 0;
    double prefill_max_abs = 0, decode_max_abs = 0;
    int greedy_same = 0, greedy_checked = 0;
};

// Prefills `b` (an empty cache of at least r.positions() tokens) with the fixture's prompt ids, then feeds its decode
// ids one by one (teacher forcing: one step's error cannot change the next step's input). Every position: the
// stored logits within `max_rel` of the reference's scale (max |ours - ref| / max |ref|), log-sum-exp within
// `max_lse`; from the prompt's last position on, the argmax is transformers' greedy token (where transformers'
// top two are closer than twice the tolerance, either of the two). Prints the measured errors.
inline SmolLM2RunError expect_smollm2_parity(Backend& b, const SmolLM2Reference& r, double max_rel, double max_lse,
                                             const std::string& label) {
    SmolLM2RunError run;
    const int P = int(r.prompt_ids.size());
    auto one = [&](int n, std::span<const float> logits) {
        const SmolLM2PositionError e = compare_smollm2_position(r, n, logits);
        EXPECT_LE(e.rel(), max_rel) << label << " position " << n << ": max abs " << e.max_abs << ", scale " << e.scale;
        EXPECT_LE(e.lse_abs, max_lse) << label << " position " << n;
        run.max_abs = std::max(run.max_abs, e.max_abs);
        run.max_rel = std::max(run.max_rel, e.rel());
        run.max_lse = std::max(run.max_lse, e.lse_abs);
        (n < P ? run.prefill_max_abs : run.decode_max_abs) =
            std::max(n < P ? run.prefill_max_abs : run.decode_max_abs, e.max_abs);
        const int greedy = r.greedy_after(n);
        if (greedy < 0) return;
        EXPECT_EQ(e.ref_argmax, greedy) << "fixture inconsistent at position " << n;
        ++run.greedy_checked;
        if (e.argmax == greedy) {
            ++run.greedy_same;
        } else if (e.ref_gap < 2 * max_rel * e.scale) {
            EXPECT_EQ(e.argmax, e.ref_second) << label << " position " << n << ": a near tie, but not of the top two";
        } else {
            ADD_FAILURE() << label << " position " << n << ": argmax " << e.argmax << ", transformers' greedy "
                          << greedy << " (its top-2 gap " << e.ref_gap << ")";
        }
    };
    std::vector<float> all;
    b.prefill(r.prompt_ids, &all);
    const size_t V = size_t(b.config().vocab_size);
    EXPECT_EQ(all.size(), size_t(P) * V);
    if (all.size() != size_t(P) * V) return run;
    for (int n = 0; n < P; ++n) one(n, {all.data() + size_t(n) * V, V});
    for (size_t i = 0; i < r.decode_ids.size(); ++i) {
        const auto logits = b.decode(r.decode_ids[i]);
        const std::vector<float> copy(logits.begin(), logits.end());
        one(P + int(i), copy);
    }
    std::printf("%s: %d positions (%d prompt + %zu decode), logits max abs err %.3g (prefill %.3g, decode %.3g), "
                "max rel %.3g, log-sum-exp max err %.3g, greedy token %d of %d the same\n",
                label.c_str(), r.positions(), P, r.decode_ids.size(), run.max_abs, run.prefill_max_abs,
                run.decode_max_abs, run.max_rel, run.max_lse, run.greedy_same, run.greedy_checked);
    return run;
}

}  // namespace quest::test
