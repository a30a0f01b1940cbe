// The sparq selector's CPU reference (kernels/select/sparq.h) and its rules (kernels/select/sparq_rule.h): e4m3
// rounding against values of the format worked by hand, the channel choice and the selection against a brute force
// written from the header's definitions, the dense step, and the bytes: never above fp16 Quest's at the same step,
// the page count the largest that fits, the bytes model (step_reads) equal to what the running selector counts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/select/quest.h"
#include "kernels/select/registry.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "test_util.h"
#include "kernels/select/sparq.h"
#include "kernels/select/sparq_rule.h"

using namespace quest;

namespace {

TEST(Sparq, E4m3RoundingByHand) {
    using sparq::e4m3_round;
    EXPECT_EQ(e4m3_round(0.0f), 0.0f);
    EXPECT_EQ(e4m3_round(1.0f), 1.0f);
    EXPECT_EQ(e4m3_round(1.0625f), 1.0f);     // halfway between 1 and 1.125: to the even mantissa (000)
    EXPECT_EQ(e4m3_round(1.1875f), 1.25f);    // halfway between 1.125 (001) and 1.25 (010): even
    EXPECT_EQ(e4m3_round(1.2f), 1.25f);
    EXPECT_EQ(e4m3_round(-0.3f), -0.3125f);   // [0.25, 0.5): steps of 1/32; 9.6 steps -> 10
    EXPECT_EQ(e4m3_round(240.0f), 240.0f);    // 1.875 * 2^7
    EXPECT_EQ(e4m3_round(440.0f), 448.0f);    // [256, 448]: steps of 32
    EXPECT_EQ(e4m3_round(500.0f), 448.0f);    // saturates
    EXPECT_EQ(e4m3_round(-1e6f), -448.0f);
    EXPECT_EQ(e4m3_round(0.015625f), 0.015625f);        // 2^-6, the smallest normal
    EXPECT_EQ(e4m3_round(0.0009765625f), 0.0f);         // 2^-10: halfway between 0 and 2^-9, to even (0)
    EXPECT_EQ(e4m3_round(0.0029296875f), 0.00390625f);  // 3 * 2^-10: halfway between 1 and 2 quanta, to 2
    EXPECT_EQ(e4m3_round(0.01f), 0.009765625f);         // 5.12 quanta of 2^-9 -> 5
    EXPECT_EQ(sparq::channels(128, 16), 16);  // D / 8
    EXPECT_EQ(sparq::channels(64, 16), 8);
    EXPECT_EQ(sparq::channels(128, 64), 4);   // 2 D / S: a page's sketch at most half of Quest's 4 D bytes
    EXPECT_TRUE(sparq::supported(64, 128));
    EXPECT_FALSE(sparq::supported(64, 256));
    EXPECT_FALSE(sparq::supported(60, 16));
}

struct Case {
    int heads, kv_heads, d, s, len, budget;
    GqaPolicy policy;
};

struct Inputs {
    std::vector<float> q, keys, kmin, kmax;
    int cap = 0, pages = 0;
};

Inputs make(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    Inputs in;
    in.cap = c.len + c.s;
    in.pages = (in.cap + c.s - 1) / c.s;
    in.q.resize(static_cast<size_t>(c.heads) * c.d);
    for (float& x : in.q) x = n(rng);
    in.keys.resize(static_cast<size_t>(c.kv_heads) * in.cap * c.d);
    for (size_t i = 0; i < in.keys.size(); ++i) in.keys[i] = n(rng) + 0.8f * std::sin(0.37f * static_cast<float>(i / c.d));
    in.kmin.assign(static_cast<size_t>(c.kv_heads) * in.pages * c.d, 0.0f);  // unused by sparq
    in.kmax = in.kmin;
    return in;
}

QuestSelectArgs args(const Case& c, const Inputs& in) {
    QuestSelectArgs a;
    a.q = in.q.data();
    a.kmin = in.kmin.data();
    a.kmax = in.kmax.data();
    a.num_heads = c.heads;
    a.num_kv_heads = c.kv_heads;
    a.head_dim = c.d;
    a.page_capacity = in.pages;
    a.len = c.len;
    a.page_size = c.s;
    a.page_budget = std::max(1, c.budget / c.s);  // Case::budget in tokens
    a.policy = c.policy;
    a.selector = PageSelector::Sparq;
    a.keys = in.keys.data();
    a.key_capacity = in.cap;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    return a;
}

// (Case::budget is in pages here.) fp16 Quest's bytes of one selecting step of one KV head, and the pages besides the last that fit after ours:
// written from the header's definition (sparq_rule.h), not from the code.
struct Budget {
    int64_t quest = 0, ours_fixed = 0;
    int pages = 0;
};
Budget brute_budget(const Case& c, int rows_per_kv) {
    const int P = (c.len + c.s - 1) / c.s, last = P - 1, last_tokens = c.len - last * c.s;
    const int64_t token = 4ll * c.d;
    Budget b;
    b.quest = static_cast<int64_t>(last) * 4 * c.d + rows_per_kv * ((c.budget - 1ll) * c.s + last_tokens) * token;
    const int r = std::min(c.d / 8, 2 * c.d / c.s);
    b.ours_fixed = static_cast<int64_t>(last) * c.s * r + c.d + rows_per_kv * last_tokens * token;
    while (b.pages < last && b.ours_fixed + rows_per_kv * (b.pages + 1ll) * c.s * token <= b.quest) ++b.pages;
    return b;
}

const std::vector<Case> kCases = {
    {8, 2, 32, 16, 1000, 64, GqaPolicy::KvSum},   {8, 2, 32, 16, 1000, 256, GqaPolicy::KvMax},
    {9, 3, 64, 16, 2047, 64, GqaPolicy::KvSum},   {12, 3, 64, 32, 3001, 128, GqaPolicy::PerHead},
    {4, 4, 128, 16, 777, 32, GqaPolicy::KvSum},   {16, 2, 64, 8, 900, 64, GqaPolicy::KvMax},
    {6, 2, 16, 4, 301, 12, GqaPolicy::PerHead},   {32, 8, 128, 16, 4100, 2048, GqaPolicy::KvSum},
};

TEST(Sparq, SelectionEqualsBruteForce) {
    int checked = 0;
    for (bool match : {false, true})
    for (const Case& c : kCases) {
        SCOPED_TRACE(testing::Message() << "H=" << c.heads << " Hkv=" << c.kv_heads << " D=" << c.d << " S=" << c.s
                                        << " len=" << c.len << " B=" << c.budget << (match ? " bytes-matched" : ""));
        const Inputs in = make(c, 1234 + c.len);
        QuestSelectArgs a = args(c, in);
        a.match_bytes = match;
        Selection sel;
        select_blocks_ref(a, sel);
        const int G = c.heads / c.kv_heads, P = (c.len + c.s - 1) / c.s, last = P - 1, K = c.budget / c.s;
        if (P <= K) {  // dense
            for (const auto& b : sel.blocks) EXPECT_EQ(static_cast<int>(b.size()), P);
            continue;
        }
        const int rows_per_kv = c.policy == GqaPolicy::PerHead ? G : 1;
        Case ck = c;
        ck.budget = K;
        const Budget bud = brute_budget(ck, rows_per_kv);
        const int n = match ? bud.pages : K - 1;  // pages besides the last
        for (int kvh = 0; kvh < c.kv_heads; ++kvh) {
            // Channels: the r largest sum |q| over the group, ties to the lower channel.
            std::vector<double> w(c.d, 0.0);
            for (int g = 0; g < G; ++g)
                for (int i = 0; i < c.d; ++i) w[i] += std::fabs(in.q[(kvh * G + g) * c.d + i]);
            std::set<int> ch;
            for (int i = 0; i < c.d; ++i) {
                int better = 0;
                for (int j = 0; j < c.d; ++j) better += w[j] > w[i] || (w[j] == w[i] && j < i);
                if (better < std::min(c.d / 8, 2 * c.d / c.s)) ch.insert(i);
            }
            EXPECT_EQ(std::vector<int>(ch.begin(), ch.end()), sparq_channels_ref(a, kvh));
            // Per head: each complete page's best token on those channels (keys rounded to e4m3), in double.
            std::vector<std::vector<double>> best(G, std::vector<double>(last, -INFINITY));
            for (int g = 0; g < G; ++g)
                for (int p = 0; p < last; ++p)
                    for (int t = p * c.s; t < (p + 1) * c.s; ++t) {
                        double s = 0;
                        for (int i : ch)
                            s += double(in.q[(kvh * G + g) * c.d + i]) *
                                 sparq::e4m3_round(in.keys[(static_cast<size_t>(kvh) * in.cap + t) * c.d + i]);
                        best[g][p] = std::max(best[g][p], s);
                    }
            // Each head's shares of the pages: exp(scale * best - max) normalised over the complete pages.
            const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
            for (int g = 0; g < G; ++g) {
                double m = -INFINITY, z = 0;
                for (double b : best[g]) m = std::max(m, scale * b);
                for (double b : best[g]) z += std::exp(scale * b - m);
                for (double& b : best[g]) b = std::exp(scale * b - m) / z;
            }
            auto check_row = [&](const std::vector<double>& score, int head) {
                // Top n by score (ties: lower page), plus the last page. The double arithmetic equals the
                // reference's fp32 up to rounding: a page whose score is within 1e-5 relative of the cut may swap.
                std::vector<int> order(last);
                for (int p = 0; p < last; ++p) order[p] = p;
                std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return score[x] > score[y]; });
                std::set<int> want(order.begin(), order.begin() + n);
                const std::vector<int>& got = sel.blocks[head];
                ASSERT_EQ(static_cast<int>(got.size()), n + 1);
                EXPECT_EQ(got.back(), last);
                const double cut = n > 0 && n < last ? score[order[n - 1]] : 0.0;
                for (int i = 0; i + 1 < static_cast<int>(got.size()); ++i)
                    if (!want.count(got[i])) {
                        EXPECT_NEAR(score[got[i]], cut, 1e-5 * std::fabs(cut) + 1e-12) << got[i];
                    }
                ++checked;
            };
            if (c.policy == GqaPolicy::PerHead) {
                for (int g = 0; g < G; ++g) check_row(best[g], kvh * G + g);
            } else {
                std::vector<double> row(last);
                for (int p = 0; p < last; ++p) {
                    row[p] = best[0][p];
                    for (int g = 1; g < G; ++g)
                        row[p] = c.policy == GqaPolicy::KvSum ? row[p] + best[g][p] : std::max(row[p], best[g][p]);
                }
                check_row(row, kvh * G);
            }
        }
        // Bytes: the selector's own (sketch of the complete pages + the append) and its pages, never above Quest's.
        const int64_t total = selection_bytes(sel.reads, c.d, MetadataFormat::Fp16);
        EXPECT_LE(total, bud.quest * c.kv_heads);
        EXPECT_EQ(sel.reads.sketch_bytes,
                  c.kv_heads * (static_cast<int64_t>(last) * c.s * std::min(c.d / 8, 2 * c.d / c.s) + c.d));
    }
    EXPECT_GT(checked, 40);
}

TEST(Sparq, NeverReadsMoreThanQuestAndStepReadsAgree) {
    int checked = 0;
    for (int d : {32, 64, 128})
        for (int s : {8, 16, 32, 64})
            for (int budget : {32, 64, 256, 2048})
                for (GqaPolicy pol : {GqaPolicy::KvSum, GqaPolicy::PerHead})
                    for (int len : {budget + 1, 3 * budget + 7, 4097, 32768}) {
                        const int heads = 8, kv = 2, K = std::max(1, budget / s), P = (len + s - 1) / s;
                        if (P <= K) continue;
                        Case c{heads, kv, d, s, len, K, pol};
                        const int rows_per_kv = pol == GqaPolicy::PerHead ? heads / kv : 1;
                        const Budget b = brute_budget(c, rows_per_kv);
                        const int last_tokens = len - (P - 1) * s;
                        EXPECT_EQ(sparq::matched_pages(P - 1, last_tokens, s, K, d, rows_per_kv), b.pages);
                        const codes::MatchedBudget m = sparq::budget(s, d, rows_per_kv);
                        EXPECT_EQ(codes::step_pages(len, s, K, m), b.pages + 1);
                        for (int kv_pages : {K, b.pages + 1}) {  // K pages, bytes-matched
                            StepShape sh;
                            sh.len = len;
                            sh.page_size = s;
                            sh.num_kv_heads = kv;
                            sh.rows = pol == GqaPolicy::PerHead ? heads : kv;
                            sh.kv_pages = kv_pages;
                            sh.head_dim = d;
                            const SelectionReads r = page_selector_def(PageSelector::Sparq).step_reads(sh);
                            EXPECT_LE(selection_bytes(r, d, MetadataFormat::Fp16), b.quest * kv)
                                << "d " << d << " s " << s << " B " << budget << " len " << len;
                            EXPECT_EQ(r.kv_tokens, static_cast<int64_t>(sh.rows) *
                                                       (static_cast<int64_t>(kv_pages - 1) * s + last_tokens));
                            EXPECT_EQ(r.sketch_bytes, kv * sparq::own_bytes(P - 1, s, d));
                        }
                        ++checked;
                    }
    EXPECT_GT(checked, 100);
}

TEST(Sparq, StepReadsEqualTheRunningSelector) {
    for (bool match : {false, true})
    for (const Case& c : kCases) {
        const Inputs in = make(c, 99 + c.d);
        QuestSelectArgs a = args(c, in);
        a.match_bytes = match;
        Selection sel;
        select_blocks_ref(a, sel);
        if (sel.reads.dense) continue;
        const int rows_per_kv = c.policy == GqaPolicy::PerHead ? c.heads / c.kv_heads : 1;
        StepShape sh;
        sh.len = c.len;
        sh.page_size = c.s;
        sh.num_kv_heads = c.kv_heads;
        sh.rows = c.policy == GqaPolicy::PerHead ? c.heads : c.kv_heads;
        sh.kv_pages = codes::step_pages(c.len, c.s, a.page_budget,
                                        match ? sparq::budget(c.s, c.d, rows_per_kv) : codes::MatchedBudget{});
        sh.head_dim = c.d;
        const SelectionReads r = page_selector_def(PageSelector::Sparq).step_reads(sh);
        EXPECT_EQ(r.sketch_bytes, sel.reads.sketch_bytes);
        EXPECT_EQ(r.kv_tokens, sel.reads.kv_tokens);
        EXPECT_EQ(r.rows, sel.reads.rows);
    }
}

TEST(Sparq, NeedsTheKeys) {
    const Case c{8, 2, 32, 16, 500, 64, GqaPolicy::KvSum};
    const Inputs in = make(c, 3);
    QuestSelectArgs a = args(c, in);
    a.page_budget = 4;
    a.keys = nullptr;
    Selection sel;
    EXPECT_THROW(select_blocks_ref(a, sel), std::invalid_argument);
}

// The CPU backend refuses a page size the rule cannot serve (a page's sketch would exceed half of Quest's
// metadata of it), naming the selector and both numbers, before anything runs; at a page size it serves, it decodes
// and counts its own bytes.
TEST(Sparq, CpuBackendRefusesPagesAboveTwiceTheHeadDim) {
    const auto dir = test::temp_dir("sparq_cpu_backend");
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "max_position_embeddings": 1024})",
        "inline");
    write_random_llama(dir, c, {7, DType::F32});
    auto w = std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(dir), c));
    QuestSettings q;
    q.selector = PageSelector::Sparq;
    q.page_size = 64;  // > 2 x head_dim 16
    EXPECT_THAT([&] { CpuLlama b(w, q, 400); },
                testing::ThrowsMessage<InputError>(testing::AllOf(testing::HasSubstr("sparq"),
                                                                   testing::HasSubstr("head_dim 16"),
                                                                   testing::HasSubstr("page size 64"))));
    q.page_size = 4;
    q.budget = 12;
    q.dense_layers = 1;
    CpuLlama b(w, q, 400);
    std::vector<int> prompt(300);
    for (int i = 0; i < 300; ++i) prompt[i] = 3 + (i * 31) % 90;
    b.prefill(prompt);
    b.reset_read_stats();
    const auto l = b.decode(5);
    for (float x : l) ASSERT_TRUE(std::isfinite(x));
    EXPECT_GT(b.read_stats()->metadata_bytes_per_step(), 0.0);  // the sketch's bytes, counted
}

}  // namespace
