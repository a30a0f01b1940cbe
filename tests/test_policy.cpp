// Page-selection policies beyond Quest (issue 8): int8 page bounds, the two-level selector (coarse shortlist,
// uint8 sub-page re-rank), the adaptive budget, and the bytes model. Every policy is checked against a brute-force
// reference computed from the keys themselves, on random (never zero) inputs at odd sizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "engine/eval.h"
#include "model/cpu/kv_cache.h"
#include "model/core/quest_settings.h"
#include "kernels/attention/attention.h"
#include "kernels/select/quest.h"
#include "model/core/step_bytes.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "tokenizer/sentencepiece.h"
#include "test_util.h"

using namespace quest;

namespace {

// Normal values shifted away from 0 (never an exact zero), with a per-token drift so pages differ.
std::vector<float> random_vec(std::mt19937& rng, size_t n, float scale = 1.0f, float shift = 0.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) {
        x = d(rng) + shift;
        if (x == 0.0f) x = 0.5f;
    }
    return v;
}

// One layer of keys (and values) at the given sizes, written through KvCache (so its page and sub-page metadata
// are the cache's), plus a copy of the keys for the brute force.
struct Layer {
    int kv_heads, head_dim, page_size, sub_page, len;
    KvCache cache;
    Layer(std::mt19937& rng, int kv_heads_, int head_dim_, int page_size_, int sub_page_, int len_)
        : kv_heads(kv_heads_), head_dim(head_dim_), page_size(page_size_), sub_page(sub_page_), len(len_),
          cache(KvCacheShape{1, kv_heads_, head_dim_, page_size_, len_, sub_page_}) {
        for (int t = 0; t < len; ++t) {
            const auto k = random_vec(rng, size_t(kv_heads) * head_dim, 1.0f, 1.5f * std::sin(0.29f * t));
            const auto v = random_vec(rng, size_t(kv_heads) * head_dim);
            cache.write(0, t, k.data(), v.data());
        }
    }
    const float* key(int kvh, int t) const { return cache.keys(0, kvh) + size_t(t) * head_dim; }
    // Exact min/max over tokens [t0, t1) of KV head kvh, from the keys.
    void range(int kvh, int t0, int t1, std::vector<float>& mn, std::vector<float>& mx) const {
        mn.assign(head_dim, INFINITY);
        mx.assign(head_dim, -INFINITY);
        for (int t = t0; t < std::min(t1, len); ++t)
            for (int i = 0; i < head_dim; ++i) {
                mn[i] = std::min(mn[i], key(kvh, t)[i]);
                mx[i] = std::max(mx[i], key(kvh, t)[i]);
            }
    }
    QuestSelectArgs args(const std::vector<float>& q, int num_heads, int K, GqaPolicy policy, PageSelector sel) const {
        QuestSelectArgs a;
        a.q = q.data();
        a.kmin = cache.kmin(0);
        a.kmax = cache.kmax(0);
        a.num_heads = num_heads;
        a.num_kv_heads = kv_heads;
        a.head_dim = head_dim;
        a.page_capacity = cache.shape().pages();
        a.len = len;
        a.page_size = page_size;
        a.page_budget = K;
        a.policy = policy;
        a.selector = sel;
        a.keys = cache.keys(0, 0);
        a.key_capacity = cache.shape().capacity;
        a.scale = 1.0f / std::sqrt(float(head_dim));
        a.sub_kmin = cache.sub_kmin(0);
        a.sub_kmax = cache.sub_kmax(0);
        a.sub_capacity = cache.shape().sub_pages();
        a.sub_page = sub_page;
        return a;
    }
};

double dot(const float* a, const float* b, int n) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += double(a[i]) * b[i];
    return s;
}

// Brute-force ranking: item i is among the top n iff fewer than n items beat it (higher, or equal and lower index).
std::set<int> brute_top(const std::vector<float>& s, int n) {
    std::set<int> out;
    for (int i = 0; i < int(s.size()); ++i) {
        int better = 0;
        for (int j = 0; j < int(s.size()); ++j) better += s[j] > s[i] || (s[j] == s[i] && j < i);
        if (better < n) out.insert(i);
    }
    return out;
}

float aggregate(GqaPolicy p, const std::vector<float>& per_head) {
    float a = per_head[0];
    for (size_t g = 1; g < per_head.size(); ++g) a = p == GqaPolicy::KvSum ? a + per_head[g] : std::max(a, per_head[g]);
    return a;
}

std::vector<int> heads_of_row(GqaPolicy p, int h, int group) {
    std::vector<int> hs;
    if (p == GqaPolicy::PerHead) return {h};
    for (int g = 0; g < group; ++g) hs.push_back((h / group) * group + g);
    return hs;
}

}  // namespace

// ---------------------------------------------------------------- bounds

TEST(Policy, Int8PageBoundEnclosesAndBoundsEveryKey) {
    std::mt19937 rng(11);
    for (MetadataFormat fmt : {MetadataFormat::Int8, MetadataFormat::Int4})
    for (int trial = 0; trial < 24; ++trial) {
        const int d = 5 + 2 * trial, S = 1 << (1 + trial % 5), len = 31 + 17 * trial;
        Layer L(rng, 1, d, S, 0, len);
        const int P = (len + S - 1) / S;
        const auto q = random_vec(rng, d, 2.0f, 0.1f);
        for (int p = 0; p < P; ++p) {
            const float* mn = L.cache.kmin(0) + size_t(p) * d;
            const float* mx = L.cache.kmax(0) + size_t(p) * d;
            const Int8Page c = quantize_page_codes_ref(mn, mx, d, fmt);
            ASSERT_GT(c.scale, 0.0f);
            const int qmax = fmt == MetadataFormat::Int4 ? 7 : 127;
            for (int i = 0; i < d; ++i) {
                EXPECT_GE(c.cmin[i], -qmax - 1);
                EXPECT_LE(c.cmax[i], qmax);
                EXPECT_LE(float(c.cmin[i]) * c.scale, mn[i]) << "kmin rounded down";
                EXPECT_GE(float(c.cmax[i]) * c.scale, mx[i]) << "kmax rounded up";
                EXPECT_LE(c.cmin[i], c.cmax[i]);
            }
            const float u8 = page_score_int8_ref(q.data(), c);
            float u = 0;
            page_scores_ref(&u, q.data(), mn, mx, 1, d);
            EXPECT_GE(u8 + 1e-4f * (std::abs(u8) + 1.0f), u) << "int8 bound >= exact bound";
            // Looser by at most one code per channel: sum_i |q_i| * scale.
            double slack = 0;
            for (int i = 0; i < d; ++i) slack += std::abs(q[i]) * c.scale;
            EXPECT_LE(u8, u + slack + 1e-4f * (std::abs(u) + 1.0f));
            for (int t = p * S; t < std::min(len, (p + 1) * S); ++t)
                EXPECT_GE(u8 + 1e-4f * (std::abs(u8) + 1.0f), dot(q.data(), L.key(0, t), d)) << "token " << t;
        }
    }
}

TEST(Policy, SubPageU8BoundEnclosesAndBoundsEveryKey) {
    std::mt19937 rng(12);
    for (int trial = 0; trial < 24; ++trial) {
        const int d = 3 + 2 * trial, S = 4 << (trial % 3), s = S >> (1 + trial % 2), len = 2 * S + 37 * trial + 5;
        Layer L(rng, 2, d, S, s, len);
        const auto q = random_vec(rng, d, 2.0f, -0.2f);
        std::vector<uint8_t> cmin(d), cmax(d);
        std::vector<float> lo, hi, mn, mx;
        for (int kvh = 0; kvh < 2; ++kvh)
            for (int p = 0; p < len / S; ++p) {  // complete pages
                L.range(kvh, p * S, (p + 1) * S, lo, hi);
                for (int j = 0; j < S / s; ++j) {
                    const int t0 = p * S + j * s;
                    L.range(kvh, t0, t0 + s, mn, mx);
                    // The cache's sub-page metadata is the exact min/max of the sub-page.
                    const float* cmn = L.cache.sub_kmin(0) + (size_t(kvh) * L.cache.shape().sub_pages() + t0 / s) * d;
                    const float* cmx = L.cache.sub_kmax(0) + (size_t(kvh) * L.cache.shape().sub_pages() + t0 / s) * d;
                    for (int i = 0; i < d; ++i) {
                        ASSERT_EQ(cmn[i], mn[i]);
                        ASSERT_EQ(cmx[i], mx[i]);
                    }
                    quantize_sub_page_u8_ref(cmin.data(), cmax.data(), mn.data(), mx.data(), lo.data(), hi.data(), d);
                    for (int i = 0; i < d; ++i) {
                        EXPECT_LE(sub_page_decode_u8(cmin[i], lo[i], hi[i]), mn[i]);
                        EXPECT_GE(sub_page_decode_u8(cmax[i], lo[i], hi[i]), mx[i]);
                        // Tight: one code step of outward rounding at most (plus fp32 slack).
                        const float step = (hi[i] - lo[i]) / 255.0f;
                        EXPECT_GE(sub_page_decode_u8(cmin[i], lo[i], hi[i]), mn[i] - step * 1.01f - 1e-6f);
                        EXPECT_LE(sub_page_decode_u8(cmax[i], lo[i], hi[i]), mx[i] + step * 1.01f + 1e-6f);
                    }
                    const float u = sub_page_score_u8_ref(q.data(), cmin.data(), cmax.data(), lo.data(), hi.data(), d);
                    for (int t = t0; t < t0 + s; ++t)
                        EXPECT_GE(u + 1e-4f * (std::abs(u) + 1.0f), dot(q.data(), L.key(kvh, t), d)) << "token " << t;
                }
            }
    }
}

// ---------------------------------------------------------------- selectors vs brute force

TEST(Policy, QuestInt8MatchesBruteForce) {
    std::mt19937 rng(13);
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
        for (int trial = 0; trial < 12; ++trial) {
            const int kvh = 1 + trial % 3, group = 1 + trial % 3, nh = kvh * group, d = 7 + 4 * trial;
            const int S = 2 << (trial % 3), len = 3 * S + 1 + 29 * trial, K = 2 + trial % 5;
            Layer L(rng, kvh, d, S, 0, len);
            const auto q = random_vec(rng, size_t(nh) * d, 1.5f, 0.3f);
            QuestSelectArgs a = L.args(q, nh, K, policy, PageSelector::Quest);
            const MetadataFormat fmt = trial % 2 ? MetadataFormat::Int4 : MetadataFormat::Int8;
            a.metadata = fmt;
            Selection sel;
            select_blocks_ref(a, sel);
            const int P = (len + S - 1) / S;
            ASSERT_GT(P, K);
            EXPECT_EQ(sel.block_size, S);
            std::vector<float> mn, mx;
            for (int h = 0; h < nh; ++h) {
                std::vector<float> agg(P - 1);
                for (int p = 0; p < P - 1; ++p) {
                    L.range(h / group, p * S, (p + 1) * S, mn, mx);
                    const Int8Page c = quantize_page_codes_ref(mn.data(), mx.data(), d, fmt);
                    std::vector<float> per;
                    for (int hh : heads_of_row(policy, h, group)) per.push_back(page_score_int8_ref(q.data() + hh * d, c));
                    agg[p] = aggregate(policy, per);
                }
                std::set<int> want = brute_top(agg, K - 1);
                want.insert(P - 1);
                EXPECT_EQ(std::set<int>(sel.blocks[h].begin(), sel.blocks[h].end()), want)
                    << gqa_policy_name(policy) << " trial " << trial << " head " << h;
                EXPECT_TRUE(std::is_sorted(sel.blocks[h].begin(), sel.blocks[h].end()));
            }
        }
}

TEST(Policy, TwoLevelMatchesBruteForce) {
    std::mt19937 rng(14);
    for (MetadataFormat fmt : {MetadataFormat::Fp16, MetadataFormat::Int8, MetadataFormat::Int4})
        for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
            for (int trial = 0; trial < 10; ++trial) {
                const int kvh = 1 + trial % 2, group = 1 + trial % 3, nh = kvh * group, d = 9 + 6 * trial;
                const int S = 4 << (trial % 3), s = S >> (1 + trial % 2), len = 5 * S + 3 + 41 * trial;
                const int K = 2 + trial % 4, shortlist = 1 + trial % 3;
                Layer L(rng, kvh, d, S, s, len);
                const auto q = random_vec(rng, size_t(nh) * d, 1.5f, -0.4f);
                QuestSelectArgs a = L.args(q, nh, K, policy, PageSelector::TwoLevel);
                a.metadata = fmt;
                a.shortlist = shortlist;
                Selection sel;
                select_blocks_ref(a, sel);
                const int P = (len + S - 1) / S, per = S / s;
                ASSERT_GT(P, K);
                EXPECT_EQ(sel.block_size, s);
                std::vector<float> mn, mx, lo, hi;
                std::vector<uint8_t> cmin(d), cmax(d);
                for (int h = 0; h < nh; ++h) {
                    const int kv = h / group;
                    const auto heads = heads_of_row(policy, h, group);
                    // Coarse level: bounds from the keys' page ranges (decoded int8 when fmt is int8).
                    std::vector<float> coarse(P - 1);
                    std::vector<std::vector<float>> plo(P - 1), phi(P - 1);
                    for (int p = 0; p < P - 1; ++p) {
                        L.range(kv, p * S, (p + 1) * S, mn, mx);
                        if (fmt != MetadataFormat::Fp16) {
                            const Int8Page c = quantize_page_codes_ref(mn.data(), mx.data(), d, fmt);
                            for (int i = 0; i < d; ++i) {
                                mn[i] = float(c.cmin[i]) * c.scale;
                                mx[i] = float(c.cmax[i]) * c.scale;
                            }
                        }
                        plo[p] = mn;
                        phi[p] = mx;
                        std::vector<float> pr;
                        for (int hh : heads) {
                            double u = 0;
                            for (int i = 0; i < d; ++i) u += std::max(q[hh * d + i] * mn[i], q[hh * d + i] * mx[i]);
                            pr.push_back(float(u));
                        }
                        coarse[p] = aggregate(policy, pr);
                    }
                    const std::set<int> listed = brute_top(coarse, std::min(P - 1, shortlist * (K - 1)));
                    // Fine level over the listed pages' sub-pages (item order: page ascending, then sub-page).
                    std::vector<int> item_block;
                    std::vector<float> fine;
                    for (int p : listed)
                        for (int j = 0; j < per; ++j) {
                            const int t0 = p * S + j * s;
                            L.range(kv, t0, t0 + s, mn, mx);
                            quantize_sub_page_u8_ref(cmin.data(), cmax.data(), mn.data(), mx.data(), plo[p].data(),
                                                     phi[p].data(), d);
                            std::vector<float> pr;
                            for (int hh : heads)
                                pr.push_back(sub_page_score_u8_ref(q.data() + hh * d, cmin.data(), cmax.data(),
                                                                   plo[p].data(), phi[p].data(), d));
                            fine.push_back(aggregate(policy, pr));
                            item_block.push_back(p * per + j);
                        }
                    std::set<int> want;
                    for (int i : brute_top(fine, (K - 1) * per)) want.insert(item_block[i]);
                    for (int b = (P - 1) * per; b * s < len; ++b) want.insert(b);
                    EXPECT_EQ(std::set<int>(sel.blocks[h].begin(), sel.blocks[h].end()), want)
                        << metadata_format_name(fmt) << " " << gqa_policy_name(policy) << " trial " << trial << " head " << h;
                    EXPECT_TRUE(std::is_sorted(sel.blocks[h].begin(), sel.blocks[h].end()));
                    // The tokens read: (K - 1) * S from the shortlist plus the last page's, never more.
                    int tokens = 0;
                    for (int b : sel.blocks[h]) tokens += std::min(len, (b + 1) * s) - b * s;
                    EXPECT_EQ(tokens, std::min(int(listed.size()) * S, (K - 1) * S) + (len - (P - 1) * S));
                }
            }
}

TEST(Policy, TwoLevelWithFullShortlistBeatsOrMatchesQuestOnBoundTightness) {
    // With every page shortlisted the sub-page bound of each selected block is <= its page's bound (a sub-page is
    // a subset of the page) up to the uint8 rounding: the re-rank can only tighten.
    std::mt19937 rng(15);
    Layer L(rng, 1, 17, 16, 4, 301);
    const auto q = random_vec(rng, 17, 1.0f, 0.2f);
    std::vector<float> lo, hi, mn, mx;
    std::vector<uint8_t> cmin(17), cmax(17);
    for (int p = 0; p < 301 / 16; ++p) {
        L.range(0, p * 16, (p + 1) * 16, lo, hi);
        float u = 0;
        page_scores_ref(&u, q.data(), lo.data(), hi.data(), 1, 17);
        for (int j = 0; j < 4; ++j) {
            L.range(0, p * 16 + j * 4, p * 16 + j * 4 + 4, mn, mx);
            quantize_sub_page_u8_ref(cmin.data(), cmax.data(), mn.data(), mx.data(), lo.data(), hi.data(), 17);
            EXPECT_LE(sub_page_score_u8_ref(q.data(), cmin.data(), cmax.data(), lo.data(), hi.data(), 17),
                      u + 1e-4f * (std::abs(u) + 1.0f));
        }
    }
}

// ---------------------------------------------------------------- the adaptive budget

TEST(Policy, AdaptivePrefixIsTheShortestReachingTheTarget) {
    std::mt19937 rng(16);
    std::uniform_real_distribution<double> u(0.01, 3.0);
    for (int trial = 0; trial < 200; ++trial) {
        const int n = 1 + trial % 23, heads = 1 + trial % 4, max_n = trial % 29;
        std::vector<int> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<std::vector<double>> est(heads, std::vector<double>(n));
        std::vector<double> fixed(heads), total(heads);
        for (int g = 0; g < heads; ++g) {
            fixed[g] = u(rng);
            total[g] = fixed[g] + u(rng);  // plus mass nobody can select
            for (double& e : est[g]) total[g] += e = u(rng);
        }
        const double target = (trial % 10) / 9.0;
        const int got = adaptive_prefix_ref(order, est, fixed, total, target, max_n);
        // Brute force: the first prefix length that reaches the target for every head, else the cap.
        int want = std::min(n, max_n);
        for (int len = 0; len <= std::min(n, max_n); ++len) {
            bool ok = true;
            for (int g = 0; g < heads; ++g) {
                double acc = fixed[g];
                for (int j = 0; j < len; ++j) acc += est[g][order[j]];
                ok = ok && acc >= target * total[g];
            }
            if (ok) {
                want = len;
                break;
            }
        }
        EXPECT_EQ(got, want) << "trial " << trial;
    }
}

TEST(Policy, AdaptiveBudgetIsMonotoneInTargetAndCappedAtB) {
    std::mt19937 rng(17);
    for (PageSelector selector : {PageSelector::Quest, PageSelector::TwoLevel})
        for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::PerHead})
            for (int trial = 0; trial < 6; ++trial) {
                const int kvh = 1 + trial % 2, group = 2 + trial % 2, nh = kvh * group, d = 11 + 2 * trial;
                const int S = 8, s = 2, len = 200 + 53 * trial, K = 3 + 2 * trial;
                Layer L(rng, kvh, d, S, s, len);
                const auto q = random_vec(rng, size_t(nh) * d, 1.0f, 0.2f);
                QuestSelectArgs a = L.args(q, nh, K, policy, selector);
                Selection full;
                select_blocks_ref(a, full);
                std::vector<std::set<int>> prev(nh);
                int64_t prev_tokens = -1;
                bool grew = false, below_cap = false;
                for (float p : {1e-4f, 0.05f, 0.3f, 0.6f, 0.9f, 0.99f, 0.999999f, 1.0f}) {
                    a.mass_target = p;
                    Selection sel;
                    select_blocks_ref(a, sel);
                    EXPECT_GE(sel.reads.kv_tokens, prev_tokens) << "monotone in p";
                    grew = grew || (prev_tokens >= 0 && sel.reads.kv_tokens > prev_tokens);
                    below_cap = below_cap || sel.reads.kv_tokens < full.reads.kv_tokens;
                    if (p == 1.0f) {
                        EXPECT_EQ(sel.reads.kv_tokens, full.reads.kv_tokens) << "p = 1 needs every page: the cap";
                    }
                    EXPECT_LE(sel.reads.kv_tokens, full.reads.kv_tokens) << "capped at the budget";
                    prev_tokens = sel.reads.kv_tokens;
                    for (int h = 0; h < nh; ++h) {
                        const std::set<int> cur(sel.blocks[h].begin(), sel.blocks[h].end());
                        EXPECT_TRUE(std::includes(cur.begin(), cur.end(), prev[h].begin(), prev[h].end()))
                            << "a larger target keeps every block of a smaller one";
                        // Every block is one the fixed budget would also read (the same ranking, a prefix).
                        const std::set<int> cap(full.blocks[h].begin(), full.blocks[h].end());
                        EXPECT_TRUE(std::includes(cap.begin(), cap.end(), cur.begin(), cur.end()));
                        prev[h] = cur;
                    }
                }
                EXPECT_TRUE(below_cap) << "a small target reads fewer tokens than B";
                EXPECT_TRUE(grew) << "a larger target reads more";
            }
}

TEST(Policy, AdaptiveEstimateUsesPageSizeScaledSoftmaxOfBounds) {
    // One KV head, one query head: with target p the selection is the shortest prefix of the bound ranking whose
    // share of sum_p n_p exp(scale * U_p) reaches p (the last page always counted).
    std::mt19937 rng(18);
    const int d = 13, S = 4, len = 4 * 30 + 3, K = 12;
    Layer L(rng, 1, d, S, 0, len);
    const auto q = random_vec(rng, d, 3.0f, 0.4f);
    QuestSelectArgs a = L.args(q, 1, K, GqaPolicy::KvMax, PageSelector::Quest);
    const int P = (len + S - 1) / S;
    std::vector<float> u(P);
    page_scores_ref(u.data(), q.data(), L.cache.kmin(0), L.cache.kmax(0), P, d);
    std::vector<double> w(P);
    double total = 0;
    for (int p = 0; p < P; ++p) total += w[p] = std::min(S, len - p * S) * std::exp(double(a.scale) * u[p]);
    std::vector<int> order(P - 1);
    for (int p = 0; p < P - 1; ++p) order[p] = p;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return u[x] > u[y]; });
    for (float target : {0.2f, 0.5f, 0.8f, 0.95f}) {
        a.mass_target = target;
        Selection sel;
        select_blocks_ref(a, sel);
        double acc = w[P - 1];
        int n = 0;
        while (n < K - 1 && acc < target * total * (1 - 1e-9)) acc += w[order[n++]];
        std::set<int> want(order.begin(), order.begin() + n);
        want.insert(P - 1);
        EXPECT_EQ(std::set<int>(sel.blocks[0].begin(), sel.blocks[0].end()), want) << "target " << target;
    }
}

// ---------------------------------------------------------------- the bytes model

TEST(Policy, BytesModelByHand) {
    // D = 8, 2 KV heads, 4 query heads (kv-max), S = 4, len = 23: P = 6 pages, the last holding 3 tokens; K = 3.
    std::mt19937 rng(19);
    Layer L(rng, 2, 8, 4, 2, 23);
    const auto q = random_vec(rng, 4 * 8, 1.0f, 0.3f);
    Selection sel;
    QuestSelectArgs a = L.args(q, 4, 3, GqaPolicy::KvMax, PageSelector::Quest);
    select_blocks_ref(a, sel);
    // Quest, fp16: 5 complete pages x 2 KV heads x (2 x 8 values x 2 bytes) = 320; KV: per row 2 pages x 4 + 3 = 11
    // tokens, 2 rows: 22 tokens x (2 x 8 x 2) = 704.
    EXPECT_EQ(sel.reads.pages_scored, 10);
    EXPECT_EQ(sel.reads.kv_tokens, 22);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Fp16), 320 + 704);
    // Int8 metadata: 10 pages x (16 + 4) = 200; int4: 10 x (8 + 4) = 120.
    a.metadata = MetadataFormat::Int8;
    select_blocks_ref(a, sel);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Int8), 200 + 704);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Int4), 120 + 704);
    // Two-level, int8, shortlist 1 x (K - 1) = 2 pages, sub-pages of 2: coarse 200; the 2 shortlisted pages re-read
    // (2 x 20 per KV head = 80 in all) with their 2 sub-pages each (4 x 16 bytes per KV head = 128 in all); KV the same 704.
    a.selector = PageSelector::TwoLevel;
    a.shortlist = 1;
    select_blocks_ref(a, sel);
    EXPECT_EQ(sel.reads.shortlist_pages, 4);
    EXPECT_EQ(sel.reads.sub_pages_scored, 8);
    EXPECT_EQ(sel.reads.kv_tokens, 22);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Int8), 200 + 80 + 128 + 704);
    // Oracle: every key of both KV heads (23 x 2 x 16 bytes = 736) plus the KV it selects (704).
    a.selector = PageSelector::Oracle;
    a.metadata = MetadataFormat::Fp16;
    select_blocks_ref(a, sel);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Fp16), 736 + 704);
    // Streaming: no metadata; per-head policy: 4 rows of 11 tokens.
    a.selector = PageSelector::Streaming;
    a.policy = GqaPolicy::PerHead;
    select_blocks_ref(a, sel);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Fp16), 44 * 32);
    // A dense step (K >= P): every token of both KV heads, nothing else.
    a.page_budget = 6;
    select_blocks_ref(a, sel);
    EXPECT_TRUE(sel.reads.dense);
    EXPECT_EQ(selection_bytes(sel.reads, 8, MetadataFormat::Fp16), 23 * 2 * 32);
}

TEST(Policy, BytesMatchedTwoLevelNeverReadsMoreThanQuest) {
    std::mt19937 rng(21);
    for (MetadataFormat fmt : {MetadataFormat::Fp16, MetadataFormat::Int8})
        for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::PerHead})
            for (int trial = 0; trial < 10; ++trial) {
                const int kvh = 1 + trial % 2, group = 1 + trial % 4, nh = kvh * group, d = 7 + 10 * trial;
                const int S = 8 << (trial % 2), s = 2 << (trial % 2), len = 301 + 97 * trial, K = 3 + 3 * trial;
                Layer L(rng, kvh, d, S, s, len);
                const auto q = random_vec(rng, size_t(nh) * d, 1.0f, 0.1f);
                QuestSelectArgs a = L.args(q, nh, K, policy, PageSelector::Quest);
                Selection quest_sel, ours;
                select_blocks_ref(a, quest_sel);
                const int64_t quest_bytes = selection_bytes(quest_sel.reads, d, MetadataFormat::Fp16);
                a.selector = PageSelector::TwoLevel;
                a.metadata = fmt;
                a.match_bytes = true;
                a.shortlist = 1 + trial % 4;
                select_blocks_ref(a, ours);
                const int64_t our_bytes = selection_bytes(ours.reads, d, fmt);
                EXPECT_LE(our_bytes, quest_bytes) << "trial " << trial;
                // Tight: one more sub-page per row would not fit, unless every shortlisted sub-page is read.
                const int P = (len + S - 1) / S;
                const int64_t listed_tokens = ours.reads.shortlist_pages * S;  // over rows
                const int64_t read = ours.reads.kv_tokens - int64_t(ours.reads.rows) * (len - (P - 1) * S);
                if (read < listed_tokens) {
                    EXPECT_GT(our_bytes + int64_t(ours.reads.rows) * s * 4 * d, quest_bytes) << "trial " << trial;
                }
                // The matched counts: the formula of two_level_budget, by hand.
                const int rows_per_kv = policy == GqaPolicy::PerHead ? group : 1;
                const int64_t last_tokens = len - (P - 1) * S, meta = page_metadata_bytes(fmt, d);
                auto left = [&](int64_t n) {
                    return (P - 1) * 4ll * d + rows_per_kv * ((K - 1) * S + last_tokens) * 4ll * d - (P - 1) * meta -
                           rows_per_kv * (n * (meta + (S / s) * 2ll * d) + last_tokens * 4ll * d);
                };
                int64_t n = std::min(P - 1, a.shortlist * (K - 1));
                while (n > 0 && left(n) < 0) --n;
                const int64_t want = std::min<int64_t>(std::max<int64_t>(left(n), 0) / rows_per_kv / (s * 4ll * d), n * (S / s));
                const TwoLevelBudget got = two_level_budget(a);
                EXPECT_EQ(got.shortlist_pages, n);
                EXPECT_EQ(got.sub_pages, want);
            }
}

TEST(Policy, BytesMatchedQuestInt8ReadsMorePagesInNoMoreBytes) {
    std::mt19937 rng(22);
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::PerHead})
        for (int trial = 0; trial < 10; ++trial) {
            const int kvh = 1 + trial % 2, group = 1 + trial % 4, nh = kvh * group, d = 9 + 8 * trial;
            const int S = 4 << (trial % 3), len = 403 + 71 * trial, K = 2 + 2 * trial;
            Layer L(rng, kvh, d, S, 0, len);
            const auto q = random_vec(rng, size_t(nh) * d, 1.0f, -0.1f);
            QuestSelectArgs a = L.args(q, nh, K, policy, PageSelector::Quest);
            Selection fp16, ours, plain8;
            select_blocks_ref(a, fp16);
            a.metadata = trial % 2 ? MetadataFormat::Int4 : MetadataFormat::Int8;
            select_blocks_ref(a, plain8);
            a.match_bytes = true;
            select_blocks_ref(a, ours);
            const int64_t budget = selection_bytes(fp16.reads, d, MetadataFormat::Fp16);
            const int64_t used = selection_bytes(ours.reads, d, a.metadata);
            const int P = (len + S - 1) / S, rows = ours.reads.rows;
            EXPECT_LE(used, budget) << "trial " << trial;
            if (int(ours.blocks[0].size()) - 1 < P - 1) {  // one more page per row would not fit
                EXPECT_GT(used + int64_t(rows) * S * 4 * d, budget) << "trial " << trial;
            }
            EXPECT_GE(ours.reads.kv_tokens, plain8.reads.kv_tokens);
            // The same ranking: the matched selection extends the int8 top-(K-1).
            for (int h = 0; h < nh; ++h)
                EXPECT_TRUE(std::includes(ours.blocks[h].begin(), ours.blocks[h].end(), plain8.blocks[h].begin(),
                                          plain8.blocks[h].end()));
        }
}

namespace {
std::shared_ptr<LlamaWeightsF32> tiny_weights(const std::string& name) {
    const auto dir = test::temp_dir(name);
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 6,
            "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 1024})",
        "inline");
    write_random_llama(dir, c, {7, DType::F32});
    return std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(dir), c));
}
}  // namespace

TEST(Policy, EngineCountsBytesPerStepByHand) {
    // 3 layers (1 dense), head_dim 8, 2 KV heads, S = 4, B = 12 (K = 3); decode at position 45 -> len 46, P = 12.
    auto w = tiny_weights("policy_bytes");
    QuestSettings q;
    q.selector = PageSelector::Quest;
    q.page_size = 4;
    q.budget = 12;
    q.dense_layers = 1;
    CpuLlama b(w, q, 64);
    std::vector<int> prompt(45);
    for (int i = 0; i < 45; ++i) prompt[i] = 3 + (i * 31) % 90;
    b.prefill(prompt);
    b.decode(5);
    const ReadStats& r = *b.read_stats();
    EXPECT_EQ(r.steps, 1);
    // Dense layer: 46 tokens x 2 KV heads x 32 bytes.
    EXPECT_EQ(r.dense_layer_bytes, 46 * 2 * 32);
    // Each Quest layer: metadata 11 pages x 2 KV heads x 32 bytes; KV per row 2 x 4 + 2 (the last page) = 10 tokens.
    EXPECT_EQ(r.metadata_bytes, 2 * (11 * 2 * 32));
    EXPECT_EQ(r.quest_layer_bytes, 2 * (11 * 2 * 32 + 10 * 2 * 32));
    EXPECT_EQ(r.selected_tokens, 2 * 2 * 10);
    EXPECT_DOUBLE_EQ(r.tokens_per_row(), 10.0);
}

// Selection reuse (reuse_cos): at 1 the queries of consecutive steps are never parallel, so nothing is reused and the
// run equals plain Quest bit for bit; at -1 every step after the first of a page keeps that page's
// selection (no metadata read), and a new page always selects afresh.
TEST(Policy, ReuseKeepsTheSelectionWithinAPageAndSkipsTheMetadata) {
    auto w = tiny_weights("policy_reuse");
    std::vector<int> prompt(61);
    for (int i = 0; i < 61; ++i) prompt[i] = 3 + (i * 29) % 90;
    QuestSettings q;
    q.selector = PageSelector::Quest;
    q.page_size = 4;
    q.budget = 12;
    q.dense_layers = 1;
    QuestSettings strict = q, loose = q;
    strict.reuse_cos = 1.0;
    loose.reuse_cos = -1;  // whenever the page is unchanged
    CpuLlama plain(w, q, 128), same(w, strict, 128), reuse(w, loose, 128);
    for (CpuLlama* b : {&plain, &same, &reuse}) b->prefill(prompt);
    const std::vector<int> next = {5, 9, 40, 11, 77, 23, 50, 8, 61, 19, 2, 33};
    std::vector<std::vector<std::vector<int>>> prev;
    int reused_expected = 0;
    for (size_t i = 0; i < next.size(); ++i) {
        const auto x = plain.decode(next[i]);
        const std::vector<float> xa(x.begin(), x.end());
        const auto y = same.decode(next[i]);
        EXPECT_EQ(xa, std::vector<float>(y.begin(), y.end())) << "reuse_cos 1 must equal plain Quest, step " << i;
        reuse.decode(next[i]);
        const int len = 61 + int(i) + 1, pages = (len + 3) / 4;
        const bool new_page = i == 0 || (len - 1) % 4 == 0;  // the first token of a page starts it
        for (int l = 1; l < 3; ++l) {
            const auto& sel = reuse.last_selection()[l];
            ASSERT_EQ(int(sel.size()), 6);
            for (const auto& blocks : sel) EXPECT_EQ(blocks.back(), pages - 1) << "the last page is always read";
            if (!new_page) {
                EXPECT_EQ(sel, prev[l]) << "step " << i << " layer " << l << " kept its selection";
            }
        }
        if (!new_page) reused_expected += 2;  // both Quest layers
        prev = reuse.last_selection();
    }
    EXPECT_EQ(same.read_stats()->reused_steps, 0);
    EXPECT_EQ(same.read_stats()->metadata_bytes, plain.read_stats()->metadata_bytes);
    EXPECT_EQ(reuse.read_stats()->reused_steps, reused_expected);
    EXPECT_GT(reused_expected, 0);
    // Metadata is read only at the fresh selections: (steps * 2 layers - reused) x 2 KV heads x (P - 1) pages x 32
    // bytes, P at each fresh step; count it by hand.
    int64_t meta = 0;
    for (size_t i = 0; i < next.size(); ++i) {
        const int len = 61 + int(i) + 1, pages = (len + 3) / 4;
        if (i == 0 || (len - 1) % 4 == 0) meta += 2 * 2 * int64_t(pages - 1) * 32;
    }
    EXPECT_EQ(reuse.read_stats()->metadata_bytes, meta);
    // A prefill forgets the anchors: the next step selects afresh.
    reuse.reset();
    reuse.prefill(prompt);
    const int64_t before = reuse.read_stats()->reused_steps;
    reuse.decode(5);
    EXPECT_EQ(reuse.read_stats()->reused_steps, before);
}

// ---------------------------------------------------------------- engine plumbing

TEST(Policy, KvCacheSubPageMetadataSurvivesCopyAndTruncate) {
    std::mt19937 rng(20);
    Layer L(rng, 3, 5, 8, 2, 77);
    KvCache copy(KvCacheShape{1, 3, 5, 16, 90, 4});
    copy.copy_tokens_from(L.cache, 77);
    copy.truncate(70);
    std::vector<float> mn, mx;
    for (int h = 0; h < 3; ++h) {
        for (int j = 0; j * 4 < 70; ++j) {
            L.range(h, j * 4, std::min(70, j * 4 + 4), mn, mx);
            for (int i = 0; i < 5; ++i) {
                EXPECT_EQ(copy.sub_kmin(0)[(size_t(h) * copy.shape().sub_pages() + j) * 5 + i], mn[i]);
                EXPECT_EQ(copy.sub_kmax(0)[(size_t(h) * copy.shape().sub_pages() + j) * 5 + i], mx[i]);
            }
        }
        for (int p = 0; p * 16 < 70; ++p) {
            L.range(h, p * 16, std::min(70, p * 16 + 16), mn, mx);
            for (int i = 0; i < 5; ++i) EXPECT_EQ(copy.kmin(0)[(size_t(h) * copy.shape().pages() + p) * 5 + i], mn[i]);
        }
    }
}

TEST(Policy, DecodingFromACopiedCacheEqualsDecodingAfterItsOwnPrefill) {
    auto w = tiny_weights("policy_copy");
    std::vector<int> prompt(150);
    for (int i = 0; i < 150; ++i) prompt[i] = 3 + (i * 17) % 90;
    QuestSettings full;
    full.full_attention = true;
    CpuLlama base(w, full, 200);
    base.prefill(prompt);
    for (const char* spec : {"quest", "two-level+s2+x2", "quest+int8+S8", "quest+p0.9"}) {
        QuestSettings q = parse_policy_spec(spec, QuestSettings{}).settings;
        q.page_size = std::min(q.page_size, 8);
        q.budget = 24;
        CpuLlama own2(w, q, 200), copied2(w, q, 200);
        own2.prefill(prompt);
        copied2.copy_cache_from(base);
        for (int t : {5, 9, 40}) {
            const auto x = own2.decode(t);
            const std::vector<float> xa(x.begin(), x.end());
            const auto y = copied2.decode(t);
            EXPECT_EQ(xa, std::vector<float>(y.begin(), y.end())) << spec;
        }
    }
}

TEST(Policy, PolicySpecsAndSettings) {
    const QuestSettings base;
    EXPECT_TRUE(parse_policy_spec("two-level+int8+s2+m", base).settings.match_bytes);
    EXPECT_THROW(parse_quest_settings(R"({"match_bytes": true, "selector": "oracle"})", "t.json"), InputError);
    PolicySpec p = parse_policy_spec("two-level+int8+s2+x3+S8+p0.9", base);
    EXPECT_EQ(p.settings.selector, PageSelector::TwoLevel);
    EXPECT_EQ(p.settings.metadata, MetadataFormat::Int8);
    EXPECT_EQ(p.settings.sub_page, 2);
    EXPECT_EQ(p.settings.shortlist, 3);
    EXPECT_EQ(p.settings.page_size, 8);
    EXPECT_DOUBLE_EQ(p.settings.mass_target, 0.9);
    EXPECT_EQ(p.settings.policy_label(), "two-level+int8+S8+s2+x3+p0.9");
    for (const char* spec : {"quest", "streaming", "oracle", "two-level", "quest+int8+S8", "two-level+s2+x2+p0.5",
                             "two-level+int8+s2+m", "quest+int8+m", "quest+int4+m"}) {
        const QuestSettings a = parse_policy_spec(spec, base).settings;
        const QuestSettings b = parse_policy_spec(a.policy_label(), base).settings;
        EXPECT_EQ(a.describe(), b.describe()) << spec;
        EXPECT_EQ(a.policy_label(), spec);
    }
    EXPECT_THROW(parse_policy_spec("h2o", base), InputError);
    EXPECT_THROW(parse_policy_spec("quest+q3", base), InputError);
    EXPECT_THROW(parse_policy_spec("quest+S8x", base), InputError);
    QuestSettings s = parse_quest_settings(
        R"({"selector": "two-level", "metadata": "int8", "sub_page": 8, "shortlist": 2, "mass_target": 0.5})", "t.json");
    EXPECT_EQ(s.selector, PageSelector::TwoLevel);
    EXPECT_EQ(s.cache_sub_page(), 8);
    EXPECT_THAT(s.describe(), ::testing::HasSubstr("shortlist=2 sub_page=8"));
    EXPECT_THROW(parse_quest_settings(R"({"selector": "two-level", "sub_page": 16})", "t.json"), InputError);
    EXPECT_THROW(parse_quest_settings(R"({"mass_target": 1.5})", "t.json"), InputError);
    EXPECT_THROW(parse_quest_settings(R"({"selector": "oracle", "mass_target": 0.5})", "t.json"), InputError);
    EXPECT_THROW(parse_quest_settings(R"({"metadata": "int2"})", "t.json"), InputError);
    EXPECT_DOUBLE_EQ(parse_policy_spec("quest+r0.95", base).settings.reuse_cos, 0.95);
    EXPECT_EQ(parse_policy_spec("quest+int8+r0.9", base).settings.policy_label(), "quest+int8+r0.9");
    EXPECT_DOUBLE_EQ(parse_quest_settings(R"({"reuse_cos": 0.8, "selector": "quest"})", "t.json").reuse_cos, 0.8);
    // A setting the selector does not take is an error, not a no-op (sparq, the default, reads no page bounds).
    EXPECT_THROW(parse_quest_settings(R"({"metadata": "int4"})", "t.json"), InputError);
    EXPECT_THROW(parse_quest_settings(R"({"selector": "quest", "sub_page": 8})", "t.json"), InputError);
    EXPECT_THROW(parse_quest_settings(R"({"reuse_cos": 1.5})", "t.json"), InputError);
    EXPECT_EQ(parse_policy_spec("quest+r-1", base).settings.policy_label(), "quest+r-1");
    EXPECT_THROW(parse_quest_settings(R"({"reuse_cos": 0.9, "selector": "streaming"})", "t.json"), InputError);
    EXPECT_THROW(parse_policy_spec("two-level+r0.9", base).settings.validate(), InputError);
}

TEST(Policy, JsonlSetRunsEveryPolicyFromOnePrefill) {
    auto w = tiny_weights("policy_jsonl");
    const auto dir = test::temp_dir("policy_jsonl_set");
    {
        std::ofstream f(dir / "set.jsonl");
        for (int i = 0; i < 3; ++i) {
            f << R"({"id": "s)" << i << R"(", "context": 120, "answer": "42", "prefill_ids": [1)";
            for (int t = 0; t < 110 + i; ++t) f << ", " << 3 + (t * 13 + i) % 90;
            f << R"(], "question_ids": [7, 8, 9], "answer_ids": [5, 6]})" << "\n";
        }
    }
    const SentencePieceTokenizer tok(test::source_dir() / "models/demo/tokenizer.model");
    BackendMaker make = [w](const QuestSettings& q, int cap) -> std::unique_ptr<Backend> {
        return std::make_unique<CpuLlama>(w, q, cap);
    };
    JsonlRequest r;
    r.set = (dir / "set.jsonl").string();
    r.budgets = {0, 32};
    r.policies = {"quest", "oracle", "two-level+s4", "quest+p0.01"};
    r.diagnostics = true;
    r.base.page_size = 8;
    const auto rows = run_jsonl(make, tok, r, [](const std::string&) {});
    ASSERT_EQ(rows.size(), 5u);
    EXPECT_EQ(rows[0].policy, "full");
    for (const auto& row : rows) {
        EXPECT_EQ(row.samples, 3);
        ASSERT_TRUE(row.bytes.valid);
        EXPECT_GT(row.bytes.bytes_per_step, 0);
    }
    // Full attention reads every token; the budgeted policies read at most B per row at a selecting step.
    EXPECT_EQ(rows[0].bytes.metadata_bytes_per_step, 0);
    for (size_t i = 1; i < rows.size(); ++i) {
        EXPECT_LE(rows[i].bytes.tokens_per_row, 32.0) << rows[i].policy;
        EXPECT_LT(rows[i].bytes.quest_bytes_per_step, rows[0].bytes.quest_bytes_per_step) << rows[i].policy;
        EXPECT_TRUE(rows[i].selection.valid);
    }
    EXPECT_LT(rows[4].bytes.tokens_per_row, rows[1].bytes.tokens_per_row) << "p = 0.01 reads fewer tokens than B";
    EXPECT_THAT(jsonl_table(rows), ::testing::HasSubstr("two-level+s4"));
    EXPECT_THAT(jsonl_json(rows), ::testing::HasSubstr("\"kv_tokens_per_row\""));
}

// ---------------------------------------------------------------- the rules shared with the GPU (kernels/select/page_codes.h)

// The device's page count of a bytes-matched budget (codes::step_pages, computed from the position inside the CUDA
// graph) is quest_matched_pages + 1 on a selecting step and P on a dense one, and its maximum over the lengths is its
// value at the capacity (the workspace's size).
TEST(Policy, DeviceMatchedCountEqualsQuestMatchedPages) {
    std::mt19937 rng(21);
    int checked = 0;
    for (MetadataFormat fmt : {MetadataFormat::Fp16, MetadataFormat::Int8, MetadataFormat::Int4})
        for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
            for (int trial = 0; trial < 12; ++trial) {
                const int d = 16 << (trial % 4), S = 1 << (trial % 6), kvh = 1 + trial % 3, group = 1 + trial % 4;
                const int K = 1 + static_cast<int>(rng() % 40), max_pages = 1 + static_cast<int>(rng() % 3000);
                const codes::MatchedBudget m = matched_budget(fmt, d, kvh * group, kvh, policy);
                int largest = 0;
                for (int len = 1; len <= max_pages * S; len += 1 + static_cast<int>(rng() % (S * 7))) {
                    QuestSelectArgs a;
                    a.num_heads = kvh * group;
                    a.num_kv_heads = kvh;
                    a.head_dim = d;
                    a.len = len;
                    a.page_size = S;
                    a.page_budget = K;
                    a.policy = policy;
                    a.metadata = fmt;
                    a.match_bytes = true;
                    const int P = (len + S - 1) / S;
                    const int n = codes::step_pages(len, S, K, m);
                    if (P <= K) {
                        ASSERT_EQ(n, P);
                    } else {
                        ASSERT_EQ(n, quest_matched_pages(a) + 1) << "len " << len;
                    }
                    ASSERT_GE(n, std::min(P, K));
                    ASSERT_LE(n, P);
                    if (fmt == MetadataFormat::Fp16) {
                        ASSERT_EQ(n, std::min(P, K)) << "fp16 metadata: K pages";
                    }
                    largest = std::max(largest, n);
                    ++checked;
                }
                ASSERT_EQ(codes::max_step_pages(max_pages, S, K, m), std::max(largest, codes::step_pages(max_pages * S, S, K, m)));
                ASSERT_EQ(codes::step_pages(max_pages * S, S, K, codes::MatchedBudget{}), std::min(max_pages, K));
            }
    EXPECT_GT(checked, 1000);
}

// The device layout: every (KV head, page, piece) has its own 16 bytes inside the layer's array, consecutive pages'
// piece j are adjacent (a warp reads 512 contiguous bytes), and piece_set / piece_get round-trip every code.
TEST(Policy, PageCodeLayoutRoundTrips) {
    std::mt19937 rng(22);
    for (bool int4 : {false, true})
        for (int d : {16, 32, 128, 256}) {
            const int hkv = 3, max_pages = 70, padded = codes::code_padded_pages(max_pages), np = codes::code_pieces_per_page(int4, d);
            ASSERT_EQ(padded, 96);
            ASSERT_EQ(np * codes::kCodePieceBytes, codes::code_page_bytes(int4, d));
            const int64_t total = int64_t(hkv) * padded * codes::code_page_bytes(int4, d);
            std::vector<int> seen(total / codes::kCodePieceBytes, 0);
            for (int h = 0; h < hkv; ++h)
                for (int p = 0; p < padded; ++p)
                    for (int j = 0; j < np; ++j) {
                        const int64_t off = codes::code_piece_offset(h, p, j, np, padded);
                        ASSERT_EQ(off % codes::kCodePieceBytes, 0);
                        ASSERT_GE(off, 0);
                        ASSERT_LT(off, total);
                        ++seen[off / codes::kCodePieceBytes];
                        if (p % codes::kCodeTile) {
                            ASSERT_EQ(off, codes::code_piece_offset(h, p - 1, j, np, padded) + codes::kCodePieceBytes);
                        }
                    }
            for (int s : seen) ASSERT_EQ(s, 1);
            const int qmax = codes::code_max(int4), C = codes::code_piece_channels(int4);
            std::uniform_int_distribution<int> code(-qmax - 1, qmax);
            for (int rep = 0; rep < 50; ++rep) {
                uint32_t w[4] = {0, 0, 0, 0};
                std::vector<int> mn(C), mx(C);
                for (int k = 0; k < C; ++k) {
                    mn[k] = code(rng);
                    mx[k] = code(rng);
                    codes::piece_set(w, k, false, int4, mn[k]);
                    codes::piece_set(w, k, true, int4, mx[k]);
                }
                for (int k = 0; k < C; ++k) {
                    ASSERT_EQ(codes::piece_get(w, k, false, int4), mn[k]);
                    ASSERT_EQ(codes::piece_get(w, k, true, int4), mx[k]);
                }
            }
        }
}

// The GPU kernel's arithmetic (codes::piece_mask_word, codes::piece_fma: the select masks, the byte-permute decode
// and the FMA chain over the packed pieces, in the device layout's channel order) reproduces page_score_int8_ref bit
// for bit for fp16 q (every product q_i * c_i is exact in fp32), zeros and negative zeros in q included.
TEST(Policy, GpuPieceArithmeticEqualsPageScoreInt8Ref) {
    std::mt19937 rng(23);
    int pages = 0;
    for (MetadataFormat fmt : {MetadataFormat::Int8, MetadataFormat::Int4})
        for (int trial = 0; trial < 300; ++trial) {
            const bool int4 = fmt == MetadataFormat::Int4;
            const int d = (int4 ? 16 : 8) << (trial % 5), C = codes::code_piece_channels(int4), np = d / C;
            auto mn = random_vec(rng, d, 1.0f + trial % 17, -0.5f), mx = mn;
            for (int i = 0; i < d; ++i) mx[i] = mn[i] + std::fabs(random_vec(rng, 1, 2.0f)[0]);
            const Int8Page c = quantize_page_codes_ref(mn.data(), mx.data(), d, fmt);
            auto q = random_vec(rng, d, 3.0f);
            for (float& x : q) x = half_to_float(float_to_half(x));  // the GPU's q is fp16
            if (trial % 3 == 0) q[trial % d] = 0.0f;
            if (trial % 5 == 0) q[(trial + 1) % d] = -0.0f;
            float u = 0.0f;
            for (int j = 0; j < np; ++j) {
                uint32_t w[4] = {0, 0, 0, 0};
                for (int k = 0; k < C; ++k) {
                    codes::piece_set(w, k, false, int4, c.cmin[j * C + k]);
                    codes::piece_set(w, k, true, int4, c.cmax[j * C + k]);
                }
                const float* qp = q.data() + j * C;
                const uint32_t m0 = int4 ? codes::piece_mask_word<true>(qp) : codes::piece_mask_word<false>(qp);
                const uint32_t m1 =
                    int4 ? codes::piece_mask_word<true>(qp + C / 2) : codes::piece_mask_word<false>(qp + C / 2);
                u = int4 ? codes::piece_fma<true>(w, m0, m1, qp, u) : codes::piece_fma<false>(w, m0, m1, qp, u);
            }
            const float gpu = u * c.scale;
            const float ref = page_score_int8_ref(q.data(), c);
            ASSERT_EQ(gpu, ref) << metadata_format_name(fmt) << " trial " << trial;
            ++pages;
        }
    EXPECT_EQ(pages, 600);
}

// quest bench's bytes columns for CUDA rows come from quest_step_bytes_model (the GPU does not count its reads): it
// equals what the CPU backend counts for the same settings and position, with int8 / int4 metadata, bytes-matched
// budgets (the page count of kernels/select/page_codes.h) and every GQA policy; the streaming and oracle selectors too.
TEST(Policy, StepBytesModelEqualsWhatTheCpuCounts) {
    const auto dir = test::temp_dir("policy_bytes_model");
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "max_position_embeddings": 1024})",
        "inline");
    write_random_llama(dir, c, {7, DType::F32});
    auto w = std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(dir), c));
    int checked = 0;
    // One decode step at length len: the model's bytes against the CPU's counts; returns the model's metadata bytes.
    auto check = [&](QuestSettings q, int len) {
        q.page_size = 4;
        q.budget = 12;
        q.dense_layers = 1;
        CpuLlama b(w, q, 400);
        std::vector<int> prompt(len - 1);
        for (int i = 0; i < len - 1; ++i) prompt[i] = 3 + (i * 31) % 90;
        b.prefill(prompt);
        b.reset_read_stats();
        b.decode(5);
        const auto model = quest_step_bytes_model(c, q, len);
        EXPECT_EQ(model.first, b.read_stats()->bytes_per_step()) << q.policy_label() << " len " << len;
        EXPECT_EQ(model.second, b.read_stats()->metadata_bytes_per_step()) << q.policy_label() << " len " << len;
        ++checked;
        return model.second;
    };
    for (MetadataFormat f : {MetadataFormat::Fp16, MetadataFormat::Int8, MetadataFormat::Int4})
        for (bool match : {false, true})
            for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
                for (int len : {30, 46, 101, 333}) {
                    QuestSettings q;
                    q.selector = PageSelector::Quest;
                    q.metadata = f;
                    q.match_bytes = match;
                    q.gqa_policy = pol;
                    check(q, len);
                }
    // The streaming (no metadata), oracle (every key, keys_scanned) and sparq (its sketch; K pages and bytes-matched)
    // selectors: what the CUDA backend runs besides quest.
    const std::pair<PageSelector, bool> others[] = {{PageSelector::Streaming, false}, {PageSelector::Oracle, false},
                                                    {PageSelector::Sparq, false}, {PageSelector::Sparq, true}};
    for (const auto& [sel, match] : others)
        for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
            for (int len : {10, 46, 333}) {
                QuestSettings q;
                q.selector = sel;
                q.match_bytes = match;
                q.gqa_policy = pol;
                const double meta = check(q, len);
                if (sel == PageSelector::Oracle && len > 12) {  // a selecting step: the key pass in the metadata part
                    const double keys = 2.0 * len * c.num_kv_heads * 2 * c.head_dim;  // 2 Quest layers
                    EXPECT_EQ(meta, keys) << q.policy_label() << " len " << len;
                }
            }
    EXPECT_EQ(checked, 72 + 36);
}
