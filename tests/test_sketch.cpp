// Token-level key sketch selectors (kernels/select/sketch.h): the quantizer's levels, the selection against a
// brute-force ranking of the same score, full attention when B covers the context, and the bytes model (exact,
// never above fp16 Quest's at the same step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/select/quest.h"
#include "kernels/select/registry.h"
#include "kernels/select/sketch.h"
#include "model/core/config.h"
#include "model/core/quest_settings.h"
#include "model/core/step_bytes.h"

using namespace quest;

namespace {

const char* kNames[] = {"sketch2",      "sketch2-lse", "sketch1-lse", "sketch4h-lse",
                        "sketch16c-lse", "rerank4",     "rerank2",     "rerank-exact"};

// A random cache of one layer: keys (with per-channel scales, as RoPE'd keys have) and their page min / max.
struct Cache {
    int NH, NKV, D, S, len, cap_pages;
    std::vector<float> keys, kmin, kmax, q;
    Cache(int nh, int nkv, int d, int s, int l, uint32_t seed) : NH(nh), NKV(nkv), D(d), S(s), len(l) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> n(0.0f, 1.0f);
        cap_pages = (len + S - 1) / S;
        keys.resize(size_t(NKV) * len * D);
        std::vector<float> scale(D);
        for (auto& x : scale) x = std::exp(n(rng));
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = n(rng) * scale[i % D] + 0.3f * scale[i % D];
        kmin.assign(size_t(NKV) * cap_pages * D, INFINITY);
        kmax.assign(size_t(NKV) * cap_pages * D, -INFINITY);
        for (int h = 0; h < NKV; ++h)
            for (int t = 0; t < len; ++t)
                for (int i = 0; i < D; ++i) {
                    const float x = keys[(size_t(h) * len + t) * D + i];
                    const size_t m = (size_t(h) * cap_pages + t / S) * D + i;
                    kmin[m] = std::min(kmin[m], x);
                    kmax[m] = std::max(kmax[m], x);
                }
        q.resize(size_t(NH) * D);
        for (auto& x : q) x = n(rng);
    }
    QuestSelectArgs args(PageSelector sel, int budget, GqaPolicy policy) const {
        QuestSelectArgs a;
        a.q = q.data(), a.kmin = kmin.data(), a.kmax = kmax.data();
        a.num_heads = NH, a.num_kv_heads = NKV, a.head_dim = D, a.page_capacity = cap_pages;
        a.len = len, a.page_size = S, a.page_budget = budget / S, a.policy = policy, a.selector = sel;
        a.keys = keys.data(), a.key_capacity = len, a.scale = 1.0f / std::sqrt(float(D));
        return a;
    }
};

PageSelector id_of(const char* name) {
    PageSelector id;
    EXPECT_TRUE(page_selector_from_name(name, id)) << name;
    return id;
}

// Brute force, written from the header's definitions: per token the decoded dot product, per page max or the
// share of exp(scale * s), aggregated over the group, every page sorted (higher first, ties -> lower index).
std::vector<int> brute_force(const Cache& c, const SketchConfig& cfg, const QuestSelectArgs& a, int kvh,
                             const std::vector<int>& heads, int n, int sketched) {
    const int P = (c.len + c.S - 1) / c.S, last = P - 1, D = c.D;
    const float* keys = c.keys.data() + size_t(kvh) * c.len * D;
    const SketchCalibration cal = sketch_calibrate_ref(keys, last * c.S, D);
    const int ch = cfg.channels(D);
    auto agg = [&](std::vector<std::vector<double>>& per) {
        std::vector<double> r = per[0];
        for (size_t g = 1; g < per.size(); ++g)
            for (size_t i = 0; i < r.size(); ++i)
                r[i] = a.policy == GqaPolicy::KvSum ? r[i] + per[g][i] : std::max(r[i], per[g][i]);
        return r;
    };
    auto rank = [](const std::vector<double>& s) {
        std::vector<int> o(s.size());
        std::iota(o.begin(), o.end(), 0);
        std::stable_sort(o.begin(), o.end(), [&](int x, int y) { return s[x] > s[y]; });
        return o;
    };
    std::vector<int> cand(last);
    std::iota(cand.begin(), cand.end(), 0);
    if (cfg.shortlist) {
        std::vector<std::vector<double>> u;
        for (int h : heads) {
            std::vector<double> uh(last);
            for (int p = 0; p < last; ++p) {
                const size_t off = (size_t(kvh) * c.cap_pages + p) * D;
                const Int8Page code = quantize_page_codes_ref(&c.kmin[off], &c.kmax[off], D, MetadataFormat::Int4);
                uh[p] = page_score_int8_ref(&c.q[size_t(h) * D], code);
            }
            u.push_back(uh);
        }
        std::vector<int> o = rank(agg(u));
        o.resize(std::min<size_t>(o.size(), size_t(sketched)));
        std::sort(o.begin(), o.end());
        cand = o;
    }
    std::vector<std::vector<double>> sc;
    for (int h : heads) {
        const float* q = &c.q[size_t(h) * D];
        std::vector<double> tok(size_t(last) * c.S);
        for (int t = 0; t < last * c.S; ++t) {
            double s = 0;
            for (int i = 0; i < D; ++i) {
                const bool sketched_ch = std::find(cal.order.begin(), cal.order.begin() + ch, i) != cal.order.begin() + ch;
                s += q[i] * (sketched_ch ? sketch_decode_ref(keys[size_t(t) * D + i], cal.mu[i], cal.sd[i], cfg.bits)
                                         : cal.mu[i]);
            }
            tok[t] = s;
        }
        std::vector<double> ps(cand.size());
        double mx = -INFINITY, z = 0;
        for (int p : cand)
            for (int t = p * c.S; t < (p + 1) * c.S; ++t) mx = std::max(mx, tok[t]);
        for (size_t j = 0; j < cand.size(); ++j) {
            double m = -INFINITY, e = 0;
            for (int t = cand[j] * c.S; t < (cand[j] + 1) * c.S; ++t) {
                m = std::max(m, tok[t]);
                e += std::exp(a.scale * (tok[t] - mx));
            }
            ps[j] = cfg.lse ? e : m;
            z += e;
        }
        if (cfg.lse)
            for (auto& x : ps) x /= z;
        sc.push_back(ps);
    }
    std::vector<int> o = rank(agg(sc));
    o.resize(std::min<size_t>(o.size(), size_t(n)));
    std::vector<int> pages;
    for (int j : o) pages.push_back(cand[j]);
    std::sort(pages.begin(), pages.end());
    pages.push_back(last);
    return pages;
}

}  // namespace

TEST(Sketch, DecodeLevelsAreTheGaussianQuantizers) {
    // mu = 1, sd = 2: z = (x - 1) / 2.
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f, 1.0f, 2.0f, 1), 1.0f + 2.0f * 0.7979f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(0.9f, 1.0f, 2.0f, 1), 1.0f - 2.0f * 0.7979f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f + 2.0f * 0.98f, 1.0f, 2.0f, 2), 1.0f + 2.0f * 0.4528f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f + 2.0f * 0.99f, 1.0f, 2.0f, 2), 1.0f + 2.0f * 1.5104f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f - 2.0f * 5.0f, 1.0f, 2.0f, 2), 1.0f - 2.0f * 1.5104f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f + 2.0f * 0.1f, 1.0f, 2.0f, 4), 1.0f + 2.0f * 0.5f * 0.3352f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f + 2.0f * 9.0f, 1.0f, 2.0f, 4), 1.0f + 2.0f * 7.5f * 0.3352f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(1.0f - 2.0f * 9.0f, 1.0f, 2.0f, 4), 1.0f - 2.0f * 7.5f * 0.3352f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(3.25f, 1.0f, 2.0f, 16), 3.25f);
    EXPECT_FLOAT_EQ(sketch_decode_ref(3.25f, 1.0f, 0.0f, 2), 1.0f);  // a constant channel decodes to its mean
    EXPECT_THROW(sketch_decode_ref(0.0f, 0.0f, 1.0f, 3), std::invalid_argument);
}

TEST(Sketch, SelectionEqualsBruteForceRankingOfTheSameScore) {
    for (const char* name : kNames) {
        const SketchConfig& cfg = *sketch_config_of(name);
        for (GqaPolicy pol : {GqaPolicy::KvSum, GqaPolicy::KvMax, GqaPolicy::PerHead})
            for (int budget : {32, 64, 128}) {
                const Cache c(4, 2, 32, 16, 16 * 37 + 5, 11u + budget);
                const QuestSelectArgs a = c.args(id_of(name), budget, pol);
                Selection s;
                select_blocks_ref(a, s);
                const SelectionReads r = page_selector_def(a.selector).step_reads(
                    StepShape{a.len, a.page_size, a.num_kv_heads, pol == GqaPolicy::PerHead ? a.num_heads : a.num_kv_heads, 0,
                              a.page_budget, a.head_dim, a.num_heads, pol});
                const int group = c.NH / c.NKV, rows_per_kv = pol == GqaPolicy::PerHead ? group : 1;
                const int n = int((r.kv_tokens / r.rows - (c.len % c.S ? c.len % c.S : c.S)) / c.S);
                const int P = (c.len + c.S - 1) / c.S;
                const int sketched = cfg.shortlist ? std::min(P - 1, cfg.shortlist * n) : P - 1;
                for (int kvh = 0; kvh < c.NKV; ++kvh)
                    for (int row = 0; row < rows_per_kv; ++row) {
                        std::vector<int> heads;
                        for (int g = 0; g < group; ++g)
                            if (pol != GqaPolicy::PerHead || g == row) heads.push_back(kvh * group + g);
                        const std::vector<int> want = brute_force(c, cfg, a, kvh, heads, n, sketched);
                        for (int h : heads)
                            EXPECT_EQ(s.blocks[h], want) << name << " B=" << budget << " head " << h << " policy "
                                                         << gqa_policy_name(pol);
                    }
                EXPECT_EQ(s.block_size, c.S);
                EXPECT_EQ(s.reads.kv_tokens, r.kv_tokens) << name;
                EXPECT_EQ(s.reads.sketch_bytes, r.sketch_bytes) << name;
                EXPECT_EQ(s.reads.rows, r.rows) << name;
            }
    }
}

TEST(Sketch, BudgetCoveringTheContextIsFullAttention) {
    const Cache c(4, 2, 32, 16, 16 * 9 + 3, 5u);
    for (const char* name : kNames) {
        const QuestSelectArgs a = c.args(id_of(name), 16 * 10, GqaPolicy::KvSum);
        Selection s;
        select_blocks_ref(a, s);
        std::vector<int> all(10);
        std::iota(all.begin(), all.end(), 0);
        for (const auto& b : s.blocks) EXPECT_EQ(b, all) << name;
        EXPECT_TRUE(s.reads.dense);
        EXPECT_EQ(s.reads.sketch_bytes, 0);
    }
}

// The bytes model: exactly the header's formula, never above fp16 Quest at the same step, and the same
// through quest_step_bytes_model (quest bench's rows) as through the selector's own count.
TEST(Sketch, BytesModelIsExactAndWithinQuest) {
    for (const char* name : kNames) {
        const SketchConfig& cfg = *sketch_config_of(name);
        for (int D : {32, 64, 128})
            for (int budget : {32, 64, 256, 2048})
                for (int len : {budget + 1, budget + 17, 1000, 4096, 4099, 32768})
                    for (GqaPolicy pol : {GqaPolicy::KvSum, GqaPolicy::PerHead}) {
                        const int S = 16, NH = 8, NKV = 2, K = budget / S, P = (len + S - 1) / S;
                        if (P <= K) continue;
                        const int rows = pol == GqaPolicy::PerHead ? NH : NKV;
                        const StepShape sh{len, S, NKV, rows, K, K, D, NH, pol};
                        const SelectionReads r = page_selector_def(id_of(name)).step_reads(sh);
                        SelectionReads qr;
                        qr.pages_scored = int64_t(P - 1) * NKV;
                        qr.rows = rows;
                        const int last_tokens = len - (P - 1) * S;
                        qr.kv_tokens = int64_t(rows) * ((K - 1) * S + last_tokens);
                        const int64_t quest = selection_bytes(qr, D, MetadataFormat::Fp16);
                        const int64_t ours = selection_bytes(r, D, MetadataFormat::Fp16);
                        EXPECT_LE(ours, quest) << name << " D=" << D << " B=" << budget << " len=" << len;
                        // Exact: the sketches, tables, write and bounds of the header, then the matched pages.
                        const int n = int((r.kv_tokens / rows - last_tokens) / S);
                        const int c = cfg.channels(D), tb = (c * cfg.bits + 7) / 8;
                        const int sk = cfg.shortlist ? std::min(P - 1, cfg.shortlist * n) : P - 1;
                        const int64_t own = int64_t(sk) * ((S * c * cfg.bits + 7) / 8) + 5ll * c + tb +
                                            (cfg.shortlist ? int64_t(P - 1) * (D + 4) : 0);
                        EXPECT_EQ(r.sketch_bytes, own * NKV) << name;
                        EXPECT_EQ(r.kv_tokens % rows, 0);
                        // n is the largest page count that fits (n + 1 would not, unless every page is read).
                        const int64_t per_row_page = int64_t(S) * 4 * D * (rows / NKV);
                        if (n < P - 1 && !cfg.shortlist) {
                            EXPECT_GT(ours + per_row_page * NKV, quest) << name;
                        }
                        EXPECT_EQ(ours, r.sketch_bytes + r.kv_tokens * 4ll * D);
                    }
        // quest_step_bytes_model (bench's rows) uses the selector's own count.
        ModelConfig mc;
        mc.num_layers = 4, mc.num_heads = 8, mc.num_kv_heads = 2, mc.head_dim = 32, mc.hidden_size = 256;
        QuestSettings qs;
        qs.selector = id_of(name);
        qs.budget = 64;
        const auto [total, meta] = quest_step_bytes_model(mc, qs, 4096);
        const SelectionReads r = page_selector_def(qs.selector).step_reads(
            StepShape{4096, 16, 2, 2, 4, 4, 32, 8, qs.gqa_policy});
        const double dense = 2.0 * selection_bytes(dense_reads(4096, 2), 32, MetadataFormat::Fp16);
        EXPECT_DOUBLE_EQ(total, dense + 2.0 * selection_bytes(r, 32, MetadataFormat::Fp16)) << name;
        EXPECT_DOUBLE_EQ(meta, 2.0 * r.sketch_bytes) << name;
    }
}
