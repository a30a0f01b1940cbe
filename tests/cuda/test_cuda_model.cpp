// The CUDA backend against the CPU backend, whole model: logits at prefill and decode on the HF fixtures, the
// stories260K greedy text, Quest with a budget covering the context against full attention.
//
// The CPU side runs on the same FP16-rounded weights as the GPU (norm weights stay fp32 on both), so the remaining
// difference is the GPU's fp16 activations and summation order: logits within 2e-2 relative L2 error and the same
// top-1 token (FP16 tolerance).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <cstdio>
#include <filesystem>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "model/core/backend.h"
#include "engine/eval.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "tokenizer/tokenizer.h"

using namespace quest;

namespace {

constexpr double kLogitTol = 2e-2;

QuestSettings full() {
    QuestSettings s;
    s.full_attention = true;
    return s;
}

int top1(std::span<const float> l) { return int(std::max_element(l.begin(), l.end()) - l.begin()); }

std::vector<float> slice(const std::vector<float>& v, size_t i, size_t n) {
    return {v.begin() + i * n, v.begin() + (i + 1) * n};
}

}  // namespace

class CudaHfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHfParity, CudaMatchesCpu) {
    QUEST_REQUIRE_GPU();
    const auto dir = test::source_dir() / "tests/fixtures/hf" / GetParam();
    const ModelFolder m = open_model_folder(dir);
    const auto prompt = test::reference_ids(dir / "reference.safetensors", "prompt_ids");
    const auto steps = test::reference_ids(dir / "reference.safetensors", "decode_ids");
    const int cap = int(prompt.size() + steps.size());
    const int V = m.config.vocab_size;
    auto cpu = test::cpu_fp16_weights(m, full(), cap);
    CudaOptions opts;
    opts.prefill_chunk = 7;  // several chunks, the last one partial
    auto gpu = CudaLlama::from_folder(m, full(), cap, opts);
    std::vector<float> a, b;
    cpu->prefill(prompt, &a);
    gpu->prefill(prompt, &b);
    for (size_t t = 0; t < prompt.size(); ++t) {
        EXPECT_LE(test::rel_err(slice(b, t, V), slice(a, t, V)), kLogitTol) << "prefill " << t;
        EXPECT_EQ(top1(slice(b, t, V)), top1(slice(a, t, V))) << "prefill " << t;
    }
    for (size_t i = 0; i < steps.size(); ++i) {
        const auto la = cpu->decode(steps[i]);
        const std::vector<float> ca(la.begin(), la.end());
        const auto lb = gpu->decode(steps[i]);
        const std::vector<float> cb(lb.begin(), lb.end());
        EXPECT_LE(test::rel_err(cb, ca), kLogitTol) << "decode " << i;
        EXPECT_EQ(top1(cb), top1(ca)) << "decode " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaHfParity,
                         ::testing::Values("mha_hd64", "gqa4_hd128", "gqa8_hd64_tied", "linear_x4_legacy",
                                           "dynamic_x2", "yarn_x4_legacy", "llama3_x8", "bf16_gqa2", "f16_gqa4",
                                           "qwen2_gqa2", "qwen2_swa24", "mistral_swa24"));

TEST(CudaModel, Stories260KGreedyTextEqualsCpu) {
    QUEST_REQUIRE_GPU();
    const auto dir = test::shared_dir() / "models/stories260K";
    QUEST_REQUIRE_PATH(dir);
    const ModelFolder m = open_model_folder(dir);
    const auto tok_owner = load_tokenizer(m.dir);
    const Tokenizer& tok = *tok_owner;
    auto text = [&](Backend& b) {
        Sampler greedy({0.0f, 0, 1.0f, 0});
        const auto r = generate(b, greedy, tok.encode(""), 200, [](int) { return true; });
        return tok.decode(r.tokens);
    };
    for (PageSelector sel : {PageSelector::Quest, PageSelector::Sparq})
    for (bool quest : {false, true}) {
        if (!quest && sel == PageSelector::Sparq) continue;
        QuestSettings q = quest ? QuestSettings{} : full();
        q.selector = sel;  // sparq: head_dim 8, one channel, the sketch written every step
        q.budget = 512;  // >= context: Quest must give full attention's text
        auto cpu = make_cpu_backend(m, q, 512);
        auto gpu = CudaLlama::from_folder(m, q, 512);
        const std::string a = text(*cpu), b = text(*gpu);
        EXPECT_EQ(b, a) << (quest ? q.describe() : "full");
        EXPECT_THAT(b, ::testing::StartsWith("Once upon a time, there was a little girl named Lily."));
    }
}

// Quest on the GPU with B >= context gives the full-attention logits (every page attended; a different kernel, so
// equal to rounding: 1e-3 relative and the same top-1 token at every step); with a small budget it differs.
TEST(CudaModel, QuestBudgetCoveringContextEqualsFull) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    std::vector<int> prompt(700);
    for (int i = 0; i < 700; ++i) prompt[i] = 3 + (i * 37) % 500;
    auto run = [&](const QuestSettings& q) {
        auto b = CudaLlama::from_folder(m, q, 800);
        b->prefill(prompt);
        std::vector<std::vector<float>> out;
        for (int t = 0; t < 40; ++t) {
            auto l = b->decode(3 + (t * 11) % 500);
            out.emplace_back(l.begin(), l.end());
        }
        return out;
    };
    QuestSettings big;
    big.page_size = 16;
    big.budget = 1024;
    QuestSettings small = big;
    small.budget = 64;
    const auto f = run(full()), qb = run(big), qs = run(small);
    for (size_t t = 0; t < f.size(); ++t) {
        EXPECT_LE(test::rel_err(qb[t], f[t]), 1e-3) << t;
        EXPECT_EQ(top1(qb[t]), top1(f[t])) << t;
    }
    double big_err = 0, small_err = 0;
    for (size_t t = 0; t < f.size(); ++t) {
        big_err += test::rel_err(qb[t], f[t]);
        small_err += test::rel_err(qs[t], f[t]);
    }
    EXPECT_GT(small_err, 10 * big_err) << "a 64-token budget over 740 tokens must change the logits beyond rounding";
}

// Quest inside a 24-token sliding window (the fixtures' prompt, then their decode tokens: lengths 57..64, pages of
// 8): with a budget of 2 pages the GPU selects what the CPU selects, in every Quest layer at every step (or a near
// tie of the page scores, after which the caches differ and the comparison stops), always inside the window, and
// the logits follow the CPU's; a budget of 4 pages covers the window (a dense step over its pages) and equals the
// GPU's windowed full attention to rounding. The fused scoring + top-k, which has no window, is refused.
TEST(CudaModel, SlidingWindowQuestFollowsCpu) {
    QUEST_REQUIRE_GPU();
    for (const char* name : {"mistral_swa24", "qwen2_swa24"}) {
        SCOPED_TRACE(name);
        const auto dir = test::source_dir() / "tests/fixtures/hf" / name;
        const ModelFolder m = open_model_folder(dir);
        const ModelConfig& c = m.config;
        const auto prompt = test::reference_ids(dir / "reference.safetensors", "prompt_ids");
        const auto steps = test::reference_ids(dir / "reference.safetensors", "decode_ids");
        const int cap = int(prompt.size() + steps.size());
        QuestSettings q;
        q.selector = PageSelector::Quest;  // sparq in a window: SelectorParity.EverySelectorFollowsCpuInASlidingWindow
        q.page_size = 8;
        q.budget = 16;
        q.dense_layers = c.attention_window(0) > 0 ? 0 : 1;  // Quest in every windowed layer
        QuestSettings covering = q;
        covering.budget = 32;
        CudaOptions o;
        o.record_selections = true;
        auto cpu = test::cpu_fp16_weights(m, q, cap);
        auto gpu = CudaLlama::from_folder(m, q, cap, o);
        auto gpu_cov = CudaLlama::from_folder(m, covering, cap);
        auto gpu_full = CudaLlama::from_folder(m, full(), cap);
        cpu->prefill(prompt);
        gpu->prefill(prompt);
        gpu_cov->prefill(prompt);
        gpu_full->prefill(prompt);
        bool parted = false;
        int compared = 0, selecting = 0;
        for (size_t i = 0; i < steps.size(); ++i) {
            const auto la = cpu->decode(steps[i]);
            const std::vector<float> a(la.begin(), la.end());
            const auto lb = gpu->decode(steps[i]);
            const std::vector<float> b(lb.begin(), lb.end());
            const auto lc = gpu_cov->decode(steps[i]);
            const std::vector<float> cv(lc.begin(), lc.end());
            const auto lf = gpu_full->decode(steps[i]);
            const std::vector<float> fl(lf.begin(), lf.end());
            EXPECT_LE(test::rel_err(cv, fl), 1e-3) << "covering budget, step " << i;
            const int len = int(prompt.size() + i + 1);
            const auto& cpu_sel = dynamic_cast<CpuLlama&>(*cpu).last_selection();
            for (int l = q.dense_layers; l < c.num_layers && !parted; ++l) {
                const SelectionTrace g = gpu->last_selection(l);
                const int w = c.attention_window(l);
                const int first_page = window_start_of(len, w) / q.page_size;
                for (const auto& pages : g.pages) {
                    ASSERT_EQ(pages.size(), 2u) << "layer " << l;
                    EXPECT_GE(pages.front(), first_page) << "layer " << l << " step " << i;
                    EXPECT_EQ(pages.back(), (len - 1) / q.page_size);
                }
                selecting += !g.scores.front().empty();
                const test::SelectionCompare cmp = test::compare_selections(g.pages, cpu_sel[l], g.scores, 1e-2);
                if (cmp.equal) continue;
                EXPECT_TRUE(cmp.near_tie) << "layer " << l << " step " << i << ": " << cmp.what;
                std::printf("[ note ] %s: the selections part at step %zu, layer %d: %s\n", name, i, l,
                            cmp.what.c_str());
                parted = true;
            }
            if (parted) break;
            ++compared;
            EXPECT_LE(test::rel_err(b, a), kLogitTol) << "decode " << i;
            EXPECT_EQ(top1(b), top1(a)) << "decode " << i;
        }
        EXPECT_GE(compared, 4) << "steps compared before the selections parted";
        EXPECT_GT(selecting, 0) << "no step selected inside the window";
        CudaOptions fused;
        fused.quest_fused = true;
        try {
            CudaLlama::from_folder(m, q, cap, fused);
            ADD_FAILURE() << "expected an InputError for --quest-fused with a window";
        } catch (const InputError& e) {
            EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("sliding window of 24 tokens"));
        }
    }
}

TEST(CudaModel, MemoryPlanRefusesWhatDoesNotFit) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    CudaOptions o;
    o.memory_limit = 1 << 20;  // 1 MiB
    try {
        CudaLlama::from_folder(m, full(), 4096, o);
        FAIL() << "expected a ResourceError";
    } catch (const ResourceError& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("KV cache"));
        EXPECT_THAT(e.what(), ::testing::HasSubstr("-c"));
    }
}

// A conversation on the GPU: prefill, decode, then a second prefill appended after decoded tokens (the next chat
// turn), more decoding, then a reset and a fresh start — logits follow the CPU backend all along, under each GQA
// policy. Both backends' page selections are compared at every step in every Quest layer: while they agree, the
// logits must agree; a different selection must be a near tie of the page scores (the random-weight model's pages
// score alike, and the GPU's fp16 activations move scores by about 1e-3 of their range), after which the two caches
// legitimately differ: both are reset and re-prefilled with the conversation so far, and the turn goes on from there.
TEST(CudaModel, MultiTurnPrefillAfterDecodeFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    const auto weights = test::fp16_rounded_weights(m);
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        const std::string name(gqa_policy_name(policy));
        SCOPED_TRACE(name);
        QuestSettings q;
        q.selector = PageSelector::Quest;  // sparq against the CPU: tests/cuda/test_sparq.cpp
        q.page_size = 16;
        q.budget = 64;
        q.gqa_policy = policy;
        CpuLlama cpu(weights, q, 700);
        CudaOptions o;
        o.record_selections = true;
        auto gpu = CudaLlama::from_folder(m, q, 700, o);
        std::vector<int> history;  // the conversation's tokens since the last reset
        int compared = 0, steps = 0;
        auto prefill_both = [&](const std::vector<int>& tokens) {
            const auto la = cpu.prefill(tokens);
            const std::vector<float> ca(la.begin(), la.end());
            const auto lb = gpu->prefill(tokens);
            const std::vector<float> cb(lb.begin(), lb.end());
            EXPECT_LE(test::rel_err(cb, ca), 5e-2) << "prefill at " << cpu.position();
        };
        auto turn = [&](int first, int n_prompt, int n_decode) {
            std::vector<int> prompt(n_prompt);
            for (int i = 0; i < n_prompt; ++i) prompt[i] = 3 + (first + i * 29) % 500;
            prefill_both(prompt);
            history.insert(history.end(), prompt.begin(), prompt.end());
            for (int t = 0; t < n_decode; ++t) {
                const int tok = 3 + (first + t * 13) % 500;
                const auto da = cpu.decode(tok);
                const std::vector<float> a(da.begin(), da.end());
                const auto db = gpu->decode(tok);
                const std::vector<float> b(db.begin(), db.end());
                history.push_back(tok);
                ++steps;
                bool parted = false;
                for (int l = q.dense_layers; l < m.config.num_layers && !parted; ++l) {
                    const SelectionTrace g = gpu->last_selection(l);
                    const test::SelectionCompare c = test::compare_selections(g.pages, cpu.last_selection()[l],
                                                                              g.scores, 1e-2);
                    if (c.equal) continue;
                    EXPECT_TRUE(c.near_tie) << "layer " << l << " at " << cpu.position() << ": " << c.what;
                    std::printf("[ note ] %s: the selections part at position %d, layer %d: %s; re-prefilled\n",
                                name.c_str(), cpu.position(), l, c.what.c_str());
                    parted = true;
                }
                if (parted) {  // the caches now differ: start both again from the same history
                    cpu.reset();
                    gpu->reset();
                    prefill_both(history);
                    continue;
                }
                ++compared;
                EXPECT_LE(test::rel_err(b, a), 5e-2) << "decode at " << cpu.position();
            }
            EXPECT_EQ(gpu->position(), cpu.position());
        };
        turn(1, 300, 20);
        turn(7, 150, 20);  // appended after the decoded tokens, crossing into Quest selection with more pages
        cpu.reset();
        gpu->reset();
        history.clear();
        turn(11, 100, 10);
        std::printf("[ note ] %s: %d of %d decode steps compared\n", name.c_str(), compared, steps);
        EXPECT_GE(compared, steps * 3 / 4) << "too many near ties to test anything: choose other inputs";
    }
}

// Many conversations in one process: device memory stays flat (no allocation per reset or per step).
TEST(CudaModel, RepeatedResetsKeepDeviceMemoryFlat) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    auto gpu = CudaLlama::from_folder(m, QuestSettings{}, 512);
    std::vector<int> prompt(64, 5);
    size_t free0 = 0, free1 = 0, total = 0;
    for (int round = 0; round < 100; ++round) {
        gpu->reset();
        gpu->prefill(prompt);
        for (int t = 0; t < 5; ++t) gpu->decode(3 + t);
        if (round == 1) CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    }
    CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    EXPECT_EQ(free1, free0) << "device memory changed across 98 conversations";
}

// Loading the same folder again and again in one process gives bit-identical logits. Regression: the weight upload
// staged each tensor with a plain cudaMemcpy (which may return before its DMA lands) and converted it on the
// non-blocking stream, so about one load in four read the previous tensor's bytes (found by `quest eval` on the
// trained demo model, which makes one backend per budget).
TEST(CudaModel, RepeatedLoadsGiveBitIdenticalLogits) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    std::vector<int> prompt(300);
    for (int i = 0; i < 300; ++i) prompt[i] = 3 + (i * 37) % 500;
    QuestSettings q;
    q.page_size = 16;
    q.budget = 64;
    std::vector<float> first;
    for (int load = 0; load < 24; ++load) {
        auto gpu = CudaLlama::from_folder(m, q, 320);
        gpu->prefill(prompt);
        const auto l = gpu->decode(7);
        std::vector<float> got(l.begin(), l.end());
        if (load == 0) {
            first = got;
            continue;
        }
        ASSERT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * sizeof(float))) << "load " << load;
    }
}

// The trained demo model (models/demo: head_dim 32, GQA 4:1, vocabulary 2048) through quest eval's pass-key protocol
// (prefill, then the question token by token through the decode path): the CUDA backend follows the CPU backend
// (same fp16-rounded weights) at every step, for full attention and Quest at contexts and budgets that once
// disagreed on the GPU.
TEST(CudaModel, TrainedDemoPasskeyProtocolFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const auto demo = test::trained_demo(test::source_dir() / "models/demo");
    if (!demo) GTEST_SKIP() << "SKIPPED: models/demo is absent";
    const auto& [m, tok, w] = *demo;
    struct Case {
        int context, budget;
    };
    for (Case c : {Case{1024, 128}, Case{2048, 0}, Case{1024, 64}, Case{2048, 256}}) {
        const PasskeyPrompt p = make_passkey_prompt(tok, c.context, 0.5, 12345);
        const int cap = static_cast<int>(p.prefill.size() + p.question.size()) + 8;
        QuestSettings q;
        q.selector = PageSelector::Quest;  // sparq: SparqCuda.TrainedModelFollowsCpu
        q.page_size = 16;
        q.budget = c.budget > 0 ? c.budget : 64;
        q.full_attention = c.budget == 0;
        CpuLlama cpu(w, q, cap);
        auto gpu = CudaLlama::from_folder(m, q, cap);
        auto la = cpu.prefill(p.prefill);
        std::vector<float> ca(la.begin(), la.end());
        auto lb = gpu->prefill(p.prefill);
        std::vector<float> cb(lb.begin(), lb.end());
        double err = test::rel_err(cb, ca);
        std::printf("context %d budget %d: prefill rel err %.3g", c.context, c.budget, err);
        EXPECT_LE(err, 2e-2) << "context " << c.context << " budget " << c.budget << " prefill";
        int step = 0;
        for (int t : p.question) {
            la = cpu.decode(t);
            ca.assign(la.begin(), la.end());
            lb = gpu->decode(t);
            cb.assign(lb.begin(), lb.end());
            err = test::rel_err(cb, ca);
            std::printf(" | q%d %.3g", step, err);
            EXPECT_LE(err, 5e-2) << "context " << c.context << " budget " << c.budget << " question token " << step;
            ++step;
        }
        const int a = static_cast<int>(std::max_element(ca.begin(), ca.end()) - ca.begin());
        const int b = static_cast<int>(std::max_element(cb.begin(), cb.end()) - cb.begin());
        std::printf(" | answer token cpu %d gpu %d\n", a, b);
        EXPECT_EQ(a, b) << "context " << c.context << " budget " << c.budget;
    }
}

// Ctrl-C between prefill chunks on the GPU: the interrupted prefill is undone (position, and the metadata of the page
// it started in), so the same prefill and decode steps afterwards give the logits of a backend never interrupted.
TEST(CudaModel, PrefillInterruptLeavesNoTrace) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    QuestSettings q;
    q.page_size = 8;
    q.budget = 16;
    q.dense_layers = 1;
    CudaOptions o;
    o.prefill_chunk = 8;  // 30 tokens: four chunks, so interrupts can land between them
    std::vector<int> first(5), second(30);
    for (int i = 0; i < 5; ++i) first[i] = 3 + i * 11;
    for (int i = 0; i < 30; ++i) second[i] = 5 + (i * 29) % 400;
    auto fresh = CudaLlama::from_folder(m, q, 64, o);
    fresh->prefill(first);
    fresh->prefill(second);
    std::vector<std::vector<float>> want;
    for (int t : {7, 8, 9}) {
        const auto l = fresh->decode(t);
        want.emplace_back(l.begin(), l.end());
    }
    for (int stop_at : {1, 3}) {  // before the second chunk, before the fourth
        auto b = CudaLlama::from_folder(m, q, 64, o);
        b->prefill(first);
        int checks = 0;
        b->set_interrupt([&] { return ++checks >= stop_at; });
        EXPECT_THROW(b->prefill(second), Interrupted) << "stop_at " << stop_at;
        EXPECT_EQ(b->position(), 5);
        b->set_interrupt({});
        b->prefill(second);
        for (size_t i = 0; i < want.size(); ++i) {
            const auto l = b->decode(7 + static_cast<int>(i));
            EXPECT_LE(test::rel_err(std::vector<float>(l.begin(), l.end()), want[i]), 1e-5)
                << "stop_at " << stop_at << ", step " << i;
        }
    }
}
