// Quest page selection on random inputs: the bound is a bound, the selection is the brute-force ranking, the last
// page is always attended, and a budget covering the context reproduces full attention exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "model/cpu/kv_cache.h"
#include "model/core/quest_settings.h"
#include "kernels/attention/attention.h"
#include "cuda/cuda_model_util.h"  // compare_selections (host code, used by the CUDA model tests)
#include "kernels/select/quest.h"
#include "kernels/common/error.h"

using namespace quest;

namespace {

std::vector<float> random_vec(std::mt19937& rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// A KV cache for one layer filled with random keys (metadata through KvCache::write).
struct RandomLayer {
    int kv_heads, head_dim, page_size, len;
    KvCache cache;
    RandomLayer(std::mt19937& rng, int kv_heads_, int head_dim_, int page_size_, int len_)
        : kv_heads(kv_heads_), head_dim(head_dim_), page_size(page_size_), len(len_),
          cache(KvCacheShape{1, kv_heads_, head_dim_, page_size_, len_}) {
        for (int t = 0; t < len; ++t) {
            // Keys with a per-token offset so pages differ in more than noise.
            auto k = random_vec(rng, size_t(kv_heads) * head_dim);
            const float shift = std::sin(0.37f * t) * 2.0f;
            for (float& x : k) x += shift;
            auto v = random_vec(rng, size_t(kv_heads) * head_dim);
            cache.write(0, t, k.data(), v.data());
        }
    }
};

}  // namespace

TEST(Quest, MetadataIsPerPageMinMax) {
    std::mt19937 rng(1);
    RandomLayer L(rng, 2, 16, 8, 45);
    const int pages = L.cache.shape().pages();
    for (int h = 0; h < 2; ++h)
        for (int p = 0; p < (45 + 7) / 8; ++p)
            for (int i = 0; i < 16; ++i) {
                float mn = INFINITY, mx = -INFINITY;
                for (int t = p * 8; t < std::min(45, (p + 1) * 8); ++t) {
                    mn = std::min(mn, L.cache.keys(0, h)[t * 16 + i]);
                    mx = std::max(mx, L.cache.keys(0, h)[t * 16 + i]);
                }
                EXPECT_EQ(L.cache.kmin(0)[(h * pages + p) * 16 + i], mn);
                EXPECT_EQ(L.cache.kmax(0)[(h * pages + p) * 16 + i], mx);
            }
}

TEST(Quest, UpperBoundHoldsForEveryKey) {
    std::mt19937 rng(2);
    for (int trial = 0; trial < 20; ++trial) {
        const int d = trial % 2 ? 64 : 128, S = 1 << (2 + trial % 4), len = 50 + trial * 13;
        RandomLayer L(rng, 1, d, S, len);
        const int pages = (len + S - 1) / S;
        const auto q = random_vec(rng, d, 2.0f);
        std::vector<float> u(pages);
        page_scores_ref(u.data(), q.data(), L.cache.kmin(0), L.cache.kmax(0), pages, d);
        for (int t = 0; t < len; ++t) {
            double dot = 0;
            for (int i = 0; i < d; ++i) dot += double(q[i]) * L.cache.keys(0, 0)[t * d + i];
            // fp32 rounding of the two sums: allow a relative slack far below the typical gap.
            EXPECT_GE(u[t / S] + 1e-4f * (std::abs(u[t / S]) + 1.0f), dot) << "token " << t << " page " << t / S;
        }
    }
}

TEST(Quest, TopKIsBruteForceRanking) {
    std::mt19937 rng(3);
    for (int trial = 0; trial < 200; ++trial) {
        const int n = 1 + trial % 97;
        std::vector<float> s(n);
        std::uniform_int_distribution<int> small(0, 5);  // many ties
        for (float& x : s) x = trial % 2 ? float(small(rng)) : random_vec(rng, 1)[0];
        const int k = trial % 13;
        const std::vector<int> got = top_k_ref(s, k);
        // Brute force: an index is in the top-k iff fewer than k indices beat it (higher score, or equal and lower).
        std::vector<int> want;
        for (int i = 0; i < n; ++i) {
            int better = 0;
            for (int j = 0; j < n; ++j) better += s[j] > s[i] || (s[j] == s[i] && j < i);
            if (better < k) want.push_back(i);
        }
        EXPECT_EQ(got, want) << "n=" << n << " k=" << k;
    }
}

TEST(Quest, SelectionMatchesRankingAndKeepsLastPage) {
    std::mt19937 rng(4);
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        for (int trial = 0; trial < 30; ++trial) {
            const int kvh = 1 + trial % 3, group = 1 << (trial % 3), nh = kvh * group, d = 32;
            const int S = 4 << (trial % 3), len = 1 + (trial * 37) % 300, K = 1 + trial % 9;
            RandomLayer L(rng, kvh, d, S, len);
            const auto q = random_vec(rng, size_t(nh) * d);
            QuestSelectArgs a{q.data(), L.cache.kmin(0), L.cache.kmax(0), nh, kvh, d, L.cache.shape().pages(),
                              len, S, K, policy};
            std::vector<std::vector<int>> sel;
            quest_select_ref(a, sel);
            const int P = (len + S - 1) / S;
            ASSERT_EQ(int(sel.size()), nh);
            for (int h = 0; h < nh; ++h) {
                const auto& pages = sel[h];
                ASSERT_FALSE(pages.empty());
                EXPECT_EQ(pages.back(), P - 1) << "the last page is always attended";
                EXPECT_TRUE(std::is_sorted(pages.begin(), pages.end()));
                if (P <= K) {
                    EXPECT_EQ(int(pages.size()), P) << "dense when the sequence has <= K pages";
                    continue;
                }
                EXPECT_EQ(int(pages.size()), K);
                // Brute force: the group's aggregated score of each complete page, ranked.
                const int kv = h / group;
                std::vector<float> agg(P - 1);
                for (int p = 0; p < P - 1; ++p) {
                    float best = -INFINITY, sum = 0;
                    for (int g = 0; g < group; ++g) {
                        const int hh = policy == GqaPolicy::PerHead ? h : kv * group + g;
                        float u = 0;
                        const float* mn = L.cache.kmin(0) + (size_t(kv) * L.cache.shape().pages() + p) * d;
                        const float* mx = L.cache.kmax(0) + (size_t(kv) * L.cache.shape().pages() + p) * d;
                        for (int i = 0; i < d; ++i) u += std::max(q[hh * d + i] * mn[i], q[hh * d + i] * mx[i]);
                        best = std::max(best, u);
                        sum += u;
                        if (policy == GqaPolicy::PerHead) break;
                    }
                    agg[p] = policy == GqaPolicy::KvSum ? sum : best;
                }
                std::vector<int> order(P - 1);
                for (int p = 0; p < P - 1; ++p) order[p] = p;
                std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return agg[x] > agg[y]; });
                std::set<int> want(order.begin(), order.begin() + (K - 1));
                std::set<int> got(pages.begin(), pages.end() - 1);
                EXPECT_EQ(got, want) << gqa_policy_name(policy) << " trial " << trial << " head " << h;
            }
        }
    }
}

TEST(Quest, KvPoliciesShareOnePageSetPerGroup) {
    std::mt19937 rng(5);
    RandomLayer L(rng, 2, 16, 4, 200);
    const auto q = random_vec(rng, 8 * 16);
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum}) {
        QuestSelectArgs a{q.data(), L.cache.kmin(0), L.cache.kmax(0), 8, 2, 16, L.cache.shape().pages(), 200, 4, 6,
                          policy};
        std::vector<std::vector<int>> sel;
        quest_select_ref(a, sel);
        for (int h = 1; h < 4; ++h) EXPECT_EQ(sel[h], sel[0]);
        for (int h = 5; h < 8; ++h) EXPECT_EQ(sel[h], sel[4]);
    }
}

TEST(Quest, AllPagesGiveExactlyFullAttention) {
    std::mt19937 rng(6);
    RandomLayer L(rng, 1, 64, 16, 123);
    const auto q = random_vec(rng, 64);
    std::vector<int> all;
    for (int p = 0; p < 8; ++p) all.push_back(p);
    std::vector<float> a(64), b(64);
    attention_pages_ref(a.data(), q.data(), L.cache.keys(0, 0), L.cache.values(0, 0), 64, 123, 16, all, 0.125f);
    attention_full_ref(b.data(), q.data(), L.cache.keys(0, 0), L.cache.values(0, 0), 64, 123, 0.125f);
    EXPECT_EQ(a, b);  // bit for bit
}

TEST(Quest, SettingsValidation) {
    QuestSettings s;
    EXPECT_NO_THROW(s.validate());
    s.page_size = 12;
    EXPECT_THROW(s.validate(), InputError);
    s.page_size = 16;
    s.budget = 8;
    EXPECT_THROW(s.validate(), InputError);
    const QuestSettings d = default_quest_settings();
    EXPECT_EQ(d.budget, 2048);
    EXPECT_EQ(d.page_size, 16);
    EXPECT_EQ(d.dense_layers, 2);
    EXPECT_EQ(d.gqa_policy, GqaPolicy::KvSum);
    const QuestSettings o = parse_quest_settings(R"({"budget": 64, "gqa_policy": "per-head"})", "t.json", d);
    EXPECT_EQ(o.budget, 64);
    EXPECT_EQ(o.page_size, 16);
    EXPECT_EQ(o.gqa_policy, GqaPolicy::PerHead);
    EXPECT_THROW(parse_quest_settings(R"({"budgett": 64})", "t.json", d), InputError);
    EXPECT_THROW(parse_quest_settings(R"({"gqa_policy": "mean"})", "t.json", d), InputError);
}

TEST(Selectors, StreamingReadsTheFirstAndTheMostRecentPages) {
    std::mt19937 rng(7);
    RandomLayer L(rng, 2, 16, 8, 100);  // 13 pages, the last holds 4 tokens
    const auto q = random_vec(rng, 4 * 16);
    QuestSelectArgs a{q.data(), L.cache.kmin(0), L.cache.kmax(0), 4, 2, 16, L.cache.shape().pages(), 100, 8, 5,
                      GqaPolicy::KvMax};
    a.selector = PageSelector::Streaming;
    std::vector<std::vector<int>> sel;
    quest_select_ref(a, sel);
    for (const auto& pages : sel) EXPECT_EQ(pages, (std::vector<int>{0, 9, 10, 11, 12}));
    a.page_budget = 1;
    quest_select_ref(a, sel);
    for (const auto& pages : sel) EXPECT_EQ(pages, (std::vector<int>{12}));
}

TEST(Selectors, OracleRanksPagesByTrueSoftmaxMass) {
    std::mt19937 rng(8);
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        RandomLayer L(rng, 2, 16, 4, 97);  // 25 pages
        const int nh = 4, group = 2, P = 25, K = 6;
        const auto q = random_vec(rng, nh * 16, 2.0f);
        QuestSelectArgs a{q.data(), L.cache.kmin(0), L.cache.kmax(0), nh, 2, 16, L.cache.shape().pages(), 97, 4, K,
                          policy};
        a.selector = PageSelector::Oracle;
        a.keys = L.cache.keys(0, 0);
        a.key_capacity = L.cache.shape().capacity;
        a.scale = 0.25f;
        std::vector<std::vector<int>> sel;
        quest_select_ref(a, sel);
        for (int h = 0; h < nh; ++h) {
            // Brute force: aggregate the group's page masses like the policy, rank the complete pages.
            std::vector<float> agg(P - 1, 0.0f), mass(P);
            for (int g = 0; g < group; ++g) {
                const int hh = policy == GqaPolicy::PerHead ? h : (h / group) * group + g;
                attention_page_mass_ref(mass.data(), q.data() + hh * 16, L.cache.keys(0, h / group), 16, 97, 4, 0.25f);
                for (int p = 0; p < P - 1; ++p)
                    agg[p] = g == 0 ? mass[p] : policy == GqaPolicy::KvSum ? agg[p] + mass[p] : std::max(agg[p], mass[p]);
                if (policy == GqaPolicy::PerHead) break;
            }
            std::vector<int> want = top_k_ref(agg, K - 1);
            want.push_back(P - 1);
            EXPECT_EQ(sel[h], want) << gqa_policy_name(policy) << " head " << h;
        }
    }
}

TEST(Selectors, NamesAndSettings) {
    PageSelector s;
    EXPECT_TRUE(page_selector_from_name("streaming", s));
    EXPECT_EQ(s, PageSelector::Streaming);
    EXPECT_FALSE(page_selector_from_name("h2o", s));
    const QuestSettings o = parse_quest_settings(R"({"selector": "oracle", "budget": 64})", "t.json");
    EXPECT_EQ(o.selector, PageSelector::Oracle);
    EXPECT_THAT(o.describe(), ::testing::HasSubstr("oracle B=64"));
    EXPECT_THROW(parse_quest_settings(R"({"selector": "random"})", "t.json"), InputError);
}

// The judge the CUDA model tests use when two backends' selections differ (tests/cuda/cuda_model_util.h).
TEST(SelectionCompare, EqualNearTieAndRealDifference) {
    using test::compare_selections;
    const std::vector<std::vector<float>> scores = {{5.0f, 1.0f, 3.0f, 2.999f, 0.5f}, {5.0f, 1.0f, 3.0f, 2.999f, 0.5f}};
    // Equal (order within a head does not matter).
    auto c = compare_selections({{0, 2, 5}, {0, 3, 5}}, {{2, 0, 5}, {0, 3, 5}}, scores, 1e-2);
    EXPECT_TRUE(c.equal);
    EXPECT_FALSE(c.near_tie);
    // Head 1 swapped page 3 (2.999) for page 2 (3.0): a gap of 0.001 of max |score| 5 is a near tie at tol 1e-2 ...
    c = compare_selections({{0, 2, 5}, {0, 3, 5}}, {{0, 2, 5}, {0, 2, 5}}, scores, 1e-2);
    EXPECT_FALSE(c.equal);
    EXPECT_TRUE(c.near_tie) << c.what;
    EXPECT_THAT(c.what, ::testing::HasSubstr("head 1: 1 page(s) swapped"));
    // ... but not at tol 1e-5.
    c = compare_selections({{0, 2, 5}, {0, 3, 5}}, {{0, 2, 5}, {0, 2, 5}}, scores, 1e-5);
    EXPECT_FALSE(c.near_tie);
    EXPECT_THAT(c.what, ::testing::HasSubstr("NOT a near tie"));
    // Page 1 (1.0) for page 2 (3.0): a real difference.
    c = compare_selections({{0, 1, 5}, {0, 3, 5}}, {{0, 2, 5}, {0, 3, 5}}, scores, 1e-2);
    EXPECT_FALSE(c.equal);
    EXPECT_FALSE(c.near_tie);
    // A different count, or head counts that differ, never pass as a tie.
    c = compare_selections({{0, 2, 5}, {0, 3}}, {{0, 2, 5}, {0, 3, 5}}, scores, 1e-2);
    EXPECT_FALSE(c.near_tie);
    c = compare_selections({{0, 2, 5}}, {{0, 2, 5}, {0, 3, 5}}, scores, 1e-2);
    EXPECT_FALSE(c.equal);
    EXPECT_FALSE(c.near_tie);
}

// ---------------------------------------------------------------- sliding windows

// A window starting at token w0: the candidates are the complete pages from the one holding w0 on, ranked by the
// same bound; the selection equals the brute-force ranking over [w0 / S, P - 1) plus the last page, for every
// selector-independent rule (dense when the window's pages fit the budget), and reads exclude the masked head.
TEST(SlidingWindow, QuestCandidatesAreTheWindowsPages) {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 40; ++trial) {
        const int kvh = 1 + trial % 2, group = 1 + trial % 3, nh = kvh * group, d = 16, S = 8;
        const int len = 40 + (trial * 29) % 200, window = 9 + (trial * 13) % 60, K = 2 + trial % 4;
        const int w0 = std::max(0, len - window);
        RandomLayer L(rng, kvh, d, S, len);
        const auto q = random_vec(rng, size_t(nh) * d);
        QuestSelectArgs a{q.data(), L.cache.kmin(0), L.cache.kmax(0), nh, kvh, d, L.cache.shape().pages(),
                          len, S, K, GqaPolicy::KvSum};
        a.window_start = w0;
        Selection sel;
        select_blocks_ref(a, sel);
        const int P = (len + S - 1) / S, f = w0 / S, in_window = P - f;
        int64_t kv_tokens = 0;
        for (int h = 0; h < nh; ++h) {
            const auto& pages = sel.blocks[h];
            ASSERT_FALSE(pages.empty());
            EXPECT_EQ(pages.back(), P - 1);
            if (in_window <= K) {
                std::vector<int> want;
                for (int p = f; p < P; ++p) want.push_back(p);
                EXPECT_EQ(pages, want) << "dense over the window, trial " << trial;
            } else {
                const int kv = h / group;
                std::vector<float> agg(P - 1, 0.0f);
                for (int p = f; p < P - 1; ++p)
                    for (int g = 0; g < group; ++g) {
                        float u = 0;
                        const float* mn = L.cache.kmin(0) + (size_t(kv) * L.cache.shape().pages() + p) * d;
                        const float* mx = L.cache.kmax(0) + (size_t(kv) * L.cache.shape().pages() + p) * d;
                        const float* qh = &q[size_t(kv * group + g) * d];
                        for (int i = 0; i < d; ++i) u += std::max(qh[i] * mn[i], qh[i] * mx[i]);
                        agg[p] += u;
                    }
                std::vector<int> order;
                for (int p = f; p < P - 1; ++p) order.push_back(p);
                std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return agg[x] > agg[y]; });
                std::vector<int> want(order.begin(), order.begin() + (K - 1));
                std::sort(want.begin(), want.end());
                want.push_back(P - 1);
                EXPECT_EQ(pages, want) << "trial " << trial << " head " << h;
            }
            if (h % group == 0)
                for (int p : pages) kv_tokens += std::min(len, (p + 1) * S) - std::max(p * S, w0);
        }
        EXPECT_EQ(sel.reads.kv_tokens, kv_tokens) << "trial " << trial;
    }
}

// The sparse attention masks the head of the window's first page token by token: the same as attention over the
// window's tokens copied out on their own.
TEST(SlidingWindow, PagesAttentionMasksBeforeTheWindow) {
    std::mt19937 rng(12);
    const int d = 32, S = 8, len = 77, w0 = 77 - 30;  // the window starts inside page 5
    RandomLayer L(rng, 1, d, S, len);
    const auto q = random_vec(rng, d);
    const std::vector<int> pages = {5, 6, 7, 8, 9};
    std::vector<float> got(d), full(d), want(d);
    attention_pages_ref(got.data(), q.data(), L.cache.keys(0, 0), L.cache.values(0, 0), d, len, S, pages, 0.2f, w0);
    attention_full_ref(full.data(), q.data(), L.cache.keys(0, 0), L.cache.values(0, 0), d, len, 0.2f, w0);
    EXPECT_EQ(got, full);  // bit for bit
    const std::vector<float> k(L.cache.keys(0, 0) + size_t(w0) * d, L.cache.keys(0, 0) + size_t(len) * d);
    const std::vector<float> v(L.cache.values(0, 0) + size_t(w0) * d, L.cache.values(0, 0) + size_t(len) * d);
    attention_full_ref(want.data(), q.data(), k.data(), v.data(), d, len - w0, 0.2f);
    for (int i = 0; i < d; ++i) EXPECT_NEAR(got[i], want[i], 1e-5f * (1 + std::abs(want[i])));
}
