// The sparq selector on the GPU (kernels/select/sparq.cuh) against its CPU reference (kernels/select/sparq.h): the
// fp8 sketch against e4m3 rounding decoded here, the page scores bit for bit, the selection page for page (with and
// without a sliding window), and the CUDA backend with --selector sparq against the CPU backend on the trained demo
// model.
//
// Inputs: seeded random fp16 q and keys (N(0,1) plus a per-page offset along a per-KV-head direction, some keys
// scaled past e4m3's 448 to test saturation), rounded before the CPU sees them. Outputs poisoned (0xFF: NaN floats
// and e4m3 NaN bytes, page id -1) before every launch.
//
// Tolerances: the sketch and the page values are exact (every product of an fp16 q and an e4m3 key is exact in fp32
// and both sides sum the chosen channels in ascending order; kernels/select/sparq_rule.h). The selection: identical,
// except that the heads' shares (fp32 exp and sums in different orders on the two sides) may swap pages whose
// reference row scores are within 1e-4 relative (near-ties, counted, at most 10% of the rows). The model:
// logits rel_err <= 5e-2 per step against the CPU backend (the CUDA model tests' tolerance) and the same greedy
// tokens; the CPU backend's keys are fp32 where the GPU rounds them to fp16 before the sketch, so this level is not
// bit-exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "follow_cpu.h"
#include "engine/eval.h"
#include "kernels/select/quest.h"
#include "kernels/select/sparq.cuh"
#include "kernels/select/sparq.h"
#include "kernels/select/sparq_rule.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/cuda/llama_cuda.h"

namespace quest {
namespace {

using test::to_half;

struct Shape {
    int num_heads, num_kv_heads, head_dim, page_size, len, page_budget;
    GqaPolicy policy = GqaPolicy::KvSum;
    int window = 0;  // a sliding window of this many tokens (KvLayerView::window), 0: none
};

std::string describe(const Shape& s) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "H=%d Hkv=%d D=%d S=%d len=%d K=%d %s window=%d", s.num_heads, s.num_kv_heads,
                  s.head_dim, s.page_size, s.len, s.page_budget, std::string(gqa_policy_name(s.policy)).c_str(),
                  s.window);
    return buf;
}

// e4m3 decoded from its bits (sign, 4 exponent bits with bias 7, 3 mantissa bits; exponent 0: subnormal m * 2^-9;
// S.1111.111: NaN), written from the format's definition.
float e4m3_decode(uint8_t b) {
    const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
    return sign ? -mag : mag;
}

struct Input {
    test::LayerCache c;
    std::vector<float> q;  // [num_heads][head_dim], fp16-exact
    DeviceBuffer<__half> dq;
    DeviceBuffer<uint8_t> k8;
    KeySketchView sketch() const {
        KeySketchView v;
        v.k8 = const_cast<uint8_t*>(k8.get());
        v.num_kv_heads = c.hkv;
        v.head_dim = c.d;
        v.capacity = sparq_sketch_capacity(c.cap);
        return v;
    }
};

Input make_input(const Shape& s, int cap, uint32_t seed) {
    std::mt19937 rng(seed);
    Input in;
    in.c = test::LayerCache::empty(s.num_kv_heads, s.head_dim, s.page_size, cap);
    const test::PageSpread spread(rng, in.c.hkv, in.c.d, in.c.max_pages);
    test::fill_paged_kv(in.c, rng, s.len, spread.dir, spread.off);
    // A few keys past e4m3's range (saturate to +-448) and a few tiny ones (subnormal e4m3).
    std::vector<__half> hk = in.c.dk.download();
    std::uniform_int_distribution<size_t> pick(0, in.c.k.size() - 1);
    for (int i = 0; i < 64; ++i) {
        const size_t j = pick(rng);
        if ((j / in.c.d) % in.c.cap >= static_cast<size_t>(s.len)) continue;
        float v = in.c.k[j] * (i % 2 ? 600.0f : 0.003f);
        std::vector<float> one{v};
        hk[j] = to_half(one)[0];
        in.c.k[j] = one[0];
    }
    in.c.dk.upload(hk);
    in.q = test::random_floats(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
    in.dq = DeviceBuffer<__half>(in.q.size());
    in.dq.upload(to_half(in.q));
    in.k8 = DeviceBuffer<uint8_t>(key_sketch_bytes(s.num_kv_heads, s.head_dim, cap));
    in.k8.fill_bytes(0xFF);
    return in;
}

QuestSelectArgs reference_args(const Shape& s, const Input& in) {
    QuestSelectArgs a;
    a.q = in.q.data();
    a.kmin = in.c.kmin.data();
    a.kmax = in.c.kmax.data();
    a.num_heads = s.num_heads;
    a.num_kv_heads = s.num_kv_heads;
    a.head_dim = s.head_dim;
    a.page_capacity = in.c.max_pages;
    a.len = s.len;
    a.page_size = s.page_size;
    a.page_budget = s.page_budget;
    a.policy = s.policy;
    a.selector = PageSelector::Sparq;
    a.keys = in.c.k.data();
    a.key_capacity = in.c.cap;
    a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    a.window_start = window_start_of(s.len, s.window);
    return a;
}

// The cache as the GPU sees it: the shape's sliding window on the layer view.
KvLayerView view_of(const Shape& s, const Input& in) {
    KvLayerView v = in.c.view();
    v.window = s.window;
    return v;
}

// The window's first page f (0 without a window) and the reference arguments renumbered from it, as
// select_blocks_ref hands them to the selector: the candidates are pages f .. P - 2, entry i of a row is page f + i.
int first_page(const Shape& s) { return window_start_of(s.len, s.window) / s.page_size; }
QuestSelectArgs window_args(const Shape& s, const Input& in) {
    QuestSelectArgs a = reference_args(s, in);
    const int skip = first_page(s) * s.page_size;
    a.len -= skip;
    a.window_start -= skip;
    a.keys += static_cast<int64_t>(skip) * s.head_dim;
    return a;
}

// The device position buffer at len - 1.
DeviceBuffer<int> position(int len) {
    DeviceBuffer<int> d(1);
    d.upload(std::vector<int>{len - 1});
    return d;
}

const std::vector<Shape> kShapes = {
    {8, 2, 64, 16, 1000, 8, GqaPolicy::KvSum},     {32, 8, 128, 16, 4100, 16, GqaPolicy::KvSum},
    {9, 3, 64, 16, 2047, 4, GqaPolicy::KvMax},     {12, 3, 64, 32, 3001, 8, GqaPolicy::PerHead},
    {16, 2, 256, 64, 1500, 4, GqaPolicy::KvSum},   {8, 1, 16, 16, 777, 4, GqaPolicy::KvMax},
    {56, 8, 128, 16, 5000, 32, GqaPolicy::KvSum},  {4, 4, 32, 16, 530, 2, GqaPolicy::PerHead},
    {32, 32, 128, 16, 4100, 16, GqaPolicy::KvSum},  // the 7B shape: rows of one head rank v (no shares launch)
    // Sliding windows: the window's first page inside a scoring block and at the start of one (page 256 = token
    // 4096), a window of fewer pages than the budget (a dense step inside the window), rows of one head, per-head.
    {8, 2, 64, 16, 1000, 8, GqaPolicy::KvSum, 300},     {9, 3, 64, 16, 2047, 4, GqaPolicy::KvMax, 100},
    {12, 3, 64, 32, 3001, 8, GqaPolicy::PerHead, 1000}, {32, 32, 128, 16, 4100, 16, GqaPolicy::KvSum, 2049},
    {56, 8, 128, 16, 5000, 32, GqaPolicy::KvSum, 5000 - 4096},  {8, 2, 64, 16, 1000, 8, GqaPolicy::KvSum, 100},
    // head_dim 8 (stories260K: 8 heads on 4, one channel), pages below 16 tokens (several pages per thread; a window
    // whose first page starts 8 tokens into a 16-token load), pages of 256 (16 threads per page), pages of 1.
    {8, 4, 8, 16, 1000, 8, GqaPolicy::KvSum},        {8, 4, 8, 8, 1003, 8, GqaPolicy::KvMax},
    {8, 8, 8, 4, 301, 16, GqaPolicy::KvSum},         {32, 8, 128, 8, 3001, 32, GqaPolicy::KvSum},
    {32, 8, 128, 8, 3001, 32, GqaPolicy::KvMax, 993}, {12, 3, 64, 4, 2001, 16, GqaPolicy::PerHead},
    {16, 2, 128, 256, 6000, 4, GqaPolicy::KvSum},    {8, 2, 64, 1, 700, 64, GqaPolicy::KvMax},
    {8, 2, 64, 2, 1001, 32, GqaPolicy::KvSum, 555},
    // Several scoring blocks per KV head (4096 tokens each) whose partials the shares combine, with and without a
    // window.
    {32, 8, 128, 16, 20000, 128, GqaPolicy::KvSum},  {32, 8, 128, 16, 20000, 128, GqaPolicy::KvMax, 9001},
};

int capacity_for(const Shape& s) { return ((s.len + 40 + s.page_size - 1) / s.page_size) * s.page_size; }

TEST(SparqCuda, SketchIsTheKeysInE4m3) {
    QUEST_REQUIRE_GPU();
    for (const Shape& s : {kShapes[0], kShapes[4], kShapes[6], kShapes[16]}) {  // [16]: S = 8, cap not of 16
        SCOPED_TRACE(describe(s));
        const int cap = capacity_for(s);
        Input in = make_input(s, cap, 11);
        const int t0 = 3, t1 = s.len - 1;  // a range that starts and ends inside pages
        sparq_sketch_write(in.sketch(), in.c.view(), t0, t1, nullptr);
        const std::vector<uint8_t> got = in.k8.download();
        const int kc = sparq_sketch_capacity(cap);
        int saturated = 0;
        for (int h = 0; h < s.num_kv_heads; ++h)
            for (int c = 0; c < s.head_dim; ++c)
                for (int t = 0; t < kc; ++t) {
                    const uint8_t b = got[(static_cast<size_t>(h) * s.head_dim + c) * kc + t];
                    if (t < t0 || t >= t1) {
                        ASSERT_EQ(b, 0xFF) << "token " << t << " outside the range was written";
                        continue;
                    }
                    const float k = in.c.kh(h)[static_cast<size_t>(t) * s.head_dim + c];
                    ASSERT_EQ(e4m3_decode(b), sparq::e4m3_round(k)) << "kvh " << h << " c " << c << " t " << t << " k " << k;
                    saturated += std::fabs(k) >= 448.0f;
                }
        EXPECT_GT(saturated, 0) << "the input must test saturation";
    }
}

// The reference page values of every head: scale * sparq_page_scores_ref (fp32) of the window's pages (every page
// without one), -inf at the last page; nothing at a dense step.
std::vector<float> reference_lse(const Shape& s, const Input& in) {
    const QuestSelectArgs a = window_args(s, in);
    const int G = s.num_heads / s.num_kv_heads, P = (a.len + s.page_size - 1) / s.page_size, mp = in.c.max_pages;
    std::vector<float> out(static_cast<size_t>(s.num_heads) * mp, NAN);
    if (P <= s.page_budget) return out;
    for (int kvh = 0; kvh < s.num_kv_heads; ++kvh) {
        const std::vector<int> ch = sparq_channels_ref(a, kvh);
        for (int g = 0; g < G; ++g) {
            const std::vector<float> u = sparq_page_scores_ref(a, kvh * G + g, kvh, ch, P - 1);
            for (int p = 0; p < P - 1; ++p) out[static_cast<size_t>(kvh * G + g) * mp + p] = a.scale * u[p];
            out[static_cast<size_t>(kvh * G + g) * mp + P - 1] = -INFINITY;
        }
    }
    return out;
}

// The reference row scores (the heads' shares aggregated by the policy) of the window's pages (entry i: page
// first_page(s) + i), for the near-tie rule.
std::vector<float> reference_row(const Shape& s, const Input& in, int r) {
    const QuestSelectArgs a = window_args(s, in);
    const int G = s.num_heads / s.num_kv_heads, P = (a.len + s.page_size - 1) / s.page_size;
    const bool per_head = s.policy == GqaPolicy::PerHead;
    const int kvh = per_head ? r / G : r;
    const std::vector<int> ch = sparq_channels_ref(a, kvh);
    std::vector<float> row;
    for (int g = 0; g < G; ++g) {
        const int h = kvh * G + g;
        if (per_head && h != r) continue;
        std::vector<float> w = sparq_page_scores_ref(a, h, kvh, ch, P - 1);
        if (sparq::rows_rank_values(per_head, G)) {  // v itself
            for (float& x : w) x *= a.scale;
        } else {
            w = sparq_page_shares_ref(w, a.scale);
        }
        if (row.empty()) {
            row = w;
            continue;
        }
        for (int p = 0; p < P - 1; ++p) row[p] = s.policy == GqaPolicy::KvSum ? row[p] + w[p] : std::max(row[p], w[p]);
    }
    return row;
}

TEST(SparqCuda, ScoresAreTheReferenceBits) {
    QUEST_REQUIRE_GPU();
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(describe(s));
        const int cap = capacity_for(s);
        Input in = make_input(s, cap, 23);
        DeviceBuffer<float> lse(sparq_workspace_floats(s.num_heads, in.c.max_pages));
        lse.fill_bytes(0xFF);
        sparq_sketch_write(in.sketch(), in.c.view(), 0, s.len - 1, nullptr);  // the step writes token len - 1
        const DeviceBuffer<int> pos = position(s.len);
        sparq_page_lse(lse.get(), in.sketch(), in.dq.get(), view_of(s, in), pos.get(), s.num_heads, s.page_budget,
                       1.0f / std::sqrt(static_cast<float>(s.head_dim)), nullptr);
        const std::vector<float> got = lse.download(), want = reference_lse(s, in);
        const int P = (s.len + s.page_size - 1) / s.page_size - first_page(s);  // the window's pages
        for (int h = 0; h < s.num_heads; ++h)
            for (int p = 0; p < in.c.max_pages; ++p) {
                const float g = got[static_cast<size_t>(h) * in.c.max_pages + p];
                const float w = want[static_cast<size_t>(h) * in.c.max_pages + p];
                if (p >= P || std::isnan(w)) {  // beyond the window's pages, or a dense step
                    ASSERT_TRUE(std::isnan(g)) << "head " << h << " entry " << p << ": written, " << g;
                    continue;
                }
                ASSERT_EQ(std::memcmp(&g, &w, sizeof g), 0) << "head " << h << " page " << p << ": " << g << " vs " << w;
            }
        // The step wrote its token's sketch.
        const std::vector<uint8_t> k8 = in.k8.download();
        const int kc = sparq_sketch_capacity(cap);
        for (int h = 0; h < s.num_kv_heads; ++h)
            for (int c = 0; c < s.head_dim; ++c)
                ASSERT_EQ(e4m3_decode(k8[(static_cast<size_t>(h) * s.head_dim + c) * kc + s.len - 1]),
                          sparq::e4m3_round(in.c.kh(h)[static_cast<size_t>(s.len - 1) * s.head_dim + c]));
    }
}

// The shares of rows of several heads (sparq_row_shares, from the scoring blocks' partials) against the CPU's
// (sparq_page_shares_ref, aggregated in head order): the page values are the same bits on both sides, M_h too; Z_h is
// summed in another order (per block, then the blocks), so a share is within 1e-5 relative (a few ulps of fp32 sums
// of up to 1250 terms; exp of the same arguments) of the reference. Entries from the last page on stay unwritten.
TEST(SparqCuda, SharesAreTheReferenceShares) {
    QUEST_REQUIRE_GPU();
    int rows_checked = 0;
    for (const Shape& s : kShapes) {
        if (sparq::rows_rank_values(s.policy == GqaPolicy::PerHead, s.num_heads / s.num_kv_heads)) continue;
        SCOPED_TRACE(describe(s));
        const int cap = capacity_for(s);
        Input in = make_input(s, cap, 29);
        const int mp = in.c.max_pages;
        DeviceBuffer<float> lse(sparq_workspace_floats(s.num_heads, mp)), scores(static_cast<size_t>(s.num_kv_heads) * mp);
        lse.fill_bytes(0xFF);
        scores.fill_bytes(0xFF);
        sparq_sketch_write(in.sketch(), in.c.view(), 0, s.len - 1, nullptr);
        const DeviceBuffer<int> pos = position(s.len);
        sparq_page_lse(lse.get(), in.sketch(), in.dq.get(), view_of(s, in), pos.get(), s.num_heads, s.page_budget,
                       1.0f / std::sqrt(static_cast<float>(s.head_dim)), nullptr);
        sparq_row_shares(scores.get(), lse.get(), pos.get(), s.num_heads, s.num_kv_heads, mp, s.page_size,
                         s.page_budget, s.policy, nullptr, s.window);
        const std::vector<float> got = scores.download();
        const int P = (s.len + s.page_size - 1) / s.page_size - first_page(s);
        for (int r = 0; r < s.num_kv_heads; ++r) {
            const std::vector<float> want = P > s.page_budget ? reference_row(s, in, r) : std::vector<float>{};
            for (int p = 0; p < mp; ++p) {
                const float g = got[static_cast<size_t>(r) * mp + p];
                if (p >= static_cast<int>(want.size())) {  // the last page, beyond the window's pages, a dense step
                    ASSERT_TRUE(std::isnan(g)) << "row " << r << " entry " << p << ": written, " << g;
                    continue;
                }
                ASSERT_NEAR(g, want[p], 1e-5f * want[p] + 1e-30f) << "row " << r << " entry " << p;
            }
            ++rows_checked;
        }
    }
    std::printf("[sparq shares] %d rows within 1e-5 of the reference\n", rows_checked);
    EXPECT_GT(rows_checked, 40);
}

TEST(SparqCuda, DenseStepWritesTheTokenAndNoScores) {
    QUEST_REQUIRE_GPU();
    const Shape s{8, 2, 64, 16, 60, 4, GqaPolicy::KvSum};  // P = 4 <= K
    Input in = make_input(s, 128, 5);
    DeviceBuffer<float> lse(sparq_workspace_floats(s.num_heads, in.c.max_pages));
    lse.fill_bytes(0xFF);
    const DeviceBuffer<int> pos = position(s.len);
    sparq_page_lse(lse.get(), in.sketch(), in.dq.get(), in.c.view(), pos.get(), s.num_heads, s.page_budget, 0.125f,
                   nullptr);
    for (float v : lse.download()) ASSERT_TRUE(std::isnan(v));
    const std::vector<uint8_t> k8 = in.k8.download();
    for (int h = 0; h < s.num_kv_heads; ++h)
        for (int c = 0; c < s.head_dim; ++c)
            for (int t = 0; t < 128; ++t) {
                const uint8_t b = k8[(static_cast<size_t>(h) * s.head_dim + c) * 128 + t];
                if (t != s.len - 1) {
                    ASSERT_EQ(b, 0xFF) << "token " << t;
                } else {
                    ASSERT_EQ(e4m3_decode(b), sparq::e4m3_round(in.c.kh(h)[static_cast<size_t>(t) * s.head_dim + c]));
                }
            }
}

TEST(SparqCuda, DecodeSelectsTheReferencePages) {
    QUEST_REQUIRE_GPU();
    int rows_checked = 0, near_ties = 0;
    for (bool matched : {false, true})
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(describe(s) + (matched ? " bytes-matched" : ""));
        const int cap = capacity_for(s);
        Input in = make_input(s, cap, 41);
        test::upload_page_metadata(in.c, (s.len + s.page_size - 1) / s.page_size);
        const int rows_per_kv = s.policy == GqaPolicy::PerHead ? s.num_heads / s.num_kv_heads : 1;
        const MatchedBudget match = matched ? sparq::budget(s.page_size, s.head_dim, rows_per_kv) : MatchedBudget{};
        test::QuestBuffers ws(s, in.c.max_pages, 0, match);
        ws.poison();
        sparq_sketch_write(in.sketch(), in.c.view(), 0, s.len - 1, nullptr);
        const DeviceBuffer<int> pos = position(s.len);
        DeviceBuffer<__half> out(static_cast<size_t>(s.num_heads) * s.head_dim);
        DeviceBuffer<float> lse(sparq_workspace_floats(s.num_heads, in.c.max_pages));
        lse.fill_bytes(0xFF);
        sparq_decode(out.get(), in.sketch(), lse.get(), in.dq.get(), view_of(s, in), pos.get(), s.num_heads,
                     s.page_budget, s.policy, 1.0f / std::sqrt(static_cast<float>(s.head_dim)), match, ws.ws(),
                     nullptr);
        QuestSelectArgs ra = reference_args(s, in);
        ra.match_bytes = matched;
        Selection ref;
        select_blocks_ref(ra, ref);
        const int rows = quest_selection_rows(s.num_heads, s.num_kv_heads, s.policy);
        const int G = s.num_heads / s.num_kv_heads, stride = ws.sz.select_stride;
        const std::vector<int> sel = ws.selected.download();
        for (int r = 0; r < rows; ++r) {
            const std::vector<int>& want = ref.blocks[s.policy == GqaPolicy::PerHead ? r : r * G];
            const std::vector<int> got(sel.begin() + static_cast<size_t>(r) * stride,
                                       sel.begin() + static_cast<size_t>(r) * stride + want.size());
            if (static_cast<int>(want.size()) < stride) {
                ASSERT_EQ(sel[static_cast<size_t>(r) * stride + want.size()], -1);
            }
            ++rows_checked;
            if (got == want) continue;
            // The shares are fp32 on both sides, summed in different orders: only near-ties may swap.
            ASSERT_EQ(got.back(), want.back());
            std::vector<int> swapped;
            std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(swapped));
            const std::vector<float> score = reference_row(s, in, r);
            float lo = INFINITY, hi = -INFINITY;
            for (int p : swapped) {
                const int e = p - first_page(s);  // the row's entry of page p
                ASSERT_TRUE(e >= 0 && e < static_cast<int>(score.size())) << "row " << r << " page " << p;
                lo = std::min(lo, score[e]);
                hi = std::max(hi, score[e]);
            }
            EXPECT_LE(hi - lo, 1e-9f + 1e-4f * std::fabs(hi)) << "row " << r << ": " << swapped.size() << " pages swapped";
            ++near_ties;
        }
        // Bytes-matched: more pages than K where the sketch's bytes leave room (half of Quest's metadata at S = 16);
        // else K.
        const int P = (s.len + s.page_size - 1) / s.page_size - first_page(s);  // the window's pages
        if (matched && s.page_size == 16 && P > 4 * s.page_budget) {
            EXPECT_GT(static_cast<int>(ref.blocks[0].size()), s.page_budget);
        }
        if (!matched && P > s.page_budget) {
            EXPECT_EQ(static_cast<int>(ref.blocks[0].size()), s.page_budget);
        }
        for (const __half& h : out.download()) ASSERT_TRUE(std::isfinite(__half2float(h)));
    }
    std::printf("[sparq selection] %d rows, %d differ from the reference at a near-tie\n", rows_checked, near_ties);
    EXPECT_LE(near_ties * 10, rows_checked) << "near-ties must stay rare";
}

// The token's RoPE + append folded into the scoring launch against rope_append_kv then the unfolded launch: the
// same q, K, V, page bounds, sketch, selection and attention output, bit for bit.
TEST(SparqCuda, RopeAppendInScoringMatchesSeparateLaunch) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {32, 8, 128, 16, 16 * 300 + 7, 64, GqaPolicy::KvSum}, {9, 3, 64, 16, 16 * 64, 4, GqaPolicy::KvMax},
        {12, 3, 64, 32, 32 * 40 + 1, 8, GqaPolicy::PerHead},  {8, 2, 64, 16, 16 * 3 + 5, 8, GqaPolicy::KvSum},
        {56, 8, 128, 16, 16 * 200 + 3, 16, GqaPolicy::KvSum}, {8, 4, 8, 8, 8 * 60 + 3, 8, GqaPolicy::KvSum},
        {32, 8, 128, 4, 4 * 500 + 1, 64, GqaPolicy::KvMax},
    };
    for (const Shape& s : shapes) {
        SCOPED_TRACE(describe(s));
        const int D = s.head_dim, q_dim = s.num_heads * D, kv_dim = s.num_kv_heads * D, cap = capacity_for(s);
        Input a = make_input(s, cap, 77), b = make_input(s, cap, 77);
        const int pages = (s.len + s.page_size - 1) / s.page_size;
        test::upload_page_metadata(a.c, pages);
        test::upload_page_metadata(b.c, pages);
        sparq_sketch_write(a.sketch(), a.c.view(), 0, s.len - 1, nullptr);
        sparq_sketch_write(b.sketch(), b.c.view(), 0, s.len - 1, nullptr);
        std::mt19937 rng(5);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> qkv(static_cast<size_t>(q_dim + 2 * kv_dim));
        for (float& x : qkv) x = nd(rng) * 2.0f;
        DeviceBuffer<float> dqkv(qkv.size());
        dqkv.upload(qkv);
        std::vector<float> inv(static_cast<size_t>(D / 2));
        for (int i = 0; i < D / 2; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / D));
        DeviceBuffer<float> dinv(inv.size());
        dinv.upload(inv);
        RopeDeviceParams rope;
        rope.inv_freq = dinv.get();
        const DeviceBuffer<int> pos = position(s.len);
        const int rows_per_kv = s.policy == GqaPolicy::PerHead ? s.num_heads / s.num_kv_heads : 1;
        const MatchedBudget match = sparq::budget(s.page_size, D, rows_per_kv);
        test::QuestBuffers wa(s, a.c.max_pages, 0, match), wb(s, b.c.max_pages, 0, match);
        wa.poison();
        wb.poison();
        DeviceBuffer<__half> qa(q_dim), qb(q_dim), oa(q_dim), ob(q_dim);
        for (auto* buf : {&qa, &qb, &oa, &ob}) buf->fill_bytes(0xFF);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        rope_append_kv(qa.get(), a.c.view(), dqkv.get(), pos.get(), 1, s.num_heads, rope, nullptr);
        DeviceBuffer<float> la(sparq_workspace_floats(s.num_heads, a.c.max_pages)), lb(la.size());
        la.fill_bytes(0xFF);
        lb.fill_bytes(0xFF);
        sparq_decode(oa.get(), a.sketch(), la.get(), qa.get(), a.c.view(), pos.get(), s.num_heads, s.page_budget,
                     s.policy, scale, match, wa.ws(), nullptr);
        QuestRopeAppend ra;
        ra.qkv = dqkv.get();
        ra.q_out = qb.get();
        ra.rope = rope;
        sparq_decode(ob.get(), b.sketch(), lb.get(), qb.get(), b.c.view(), pos.get(), s.num_heads, s.page_budget,
                     s.policy, scale, match, wb.ws(), nullptr, &ra);
        CUDA_CHECK(cudaDeviceSynchronize());
        auto bits = [](const std::vector<__half>& v) {
            std::vector<uint16_t> o(v.size());
            std::memcpy(o.data(), v.data(), v.size() * 2);
            return o;
        };
        EXPECT_EQ(bits(qb.download()), bits(qa.download())) << "rotated q";
        EXPECT_EQ(bits(b.c.dk.download()), bits(a.c.dk.download())) << "K cache";
        EXPECT_EQ(bits(b.c.dv.download()), bits(a.c.dv.download())) << "V cache";
        EXPECT_EQ(bits(b.c.dmin.download()), bits(a.c.dmin.download())) << "page minima";
        EXPECT_EQ(bits(b.c.dmax.download()), bits(a.c.dmax.download())) << "page maxima";
        EXPECT_EQ(b.k8.download(), a.k8.download()) << "sketch";
        EXPECT_EQ(wb.selected.download(), wa.selected.download()) << "selection";
        EXPECT_EQ(bits(ob.download()), bits(oa.download())) << "attention output";
        for (const __half h : oa.download()) ASSERT_TRUE(std::isfinite(__half2float(h)));
    }
}

TEST(SparqCuda, RefusesWhatItCannotRun) {
    QUEST_REQUIRE_GPU();
    EXPECT_THROW(require_sparq_supported(64, 256), std::invalid_argument);  // head_dim < page size / 2
    EXPECT_THROW(require_sparq_supported(8, 32), std::invalid_argument);
    EXPECT_THROW(require_sparq_supported(128, 512), std::invalid_argument);
    EXPECT_THROW(require_sparq_supported(96, 16), std::invalid_argument);  // not a power of two
    EXPECT_THROW(require_sparq_supported(4, 8), std::invalid_argument);
    EXPECT_THROW(require_sparq_supported(64, 12), std::invalid_argument);
    for (const auto& [d, ps] : std::vector<std::pair<int, int>>{{8, 16}, {8, 1}, {64, 8}, {128, 1}, {128, 256}, {256, 16}})
        EXPECT_NO_THROW(require_sparq_supported(d, ps)) << "head_dim " << d << " page " << ps;
    const auto demo = test::trained_demo(test::source_dir() / "models/demo");
    if (!demo) GTEST_SKIP() << "SKIPPED: models/demo is absent";
    QuestSettings q;
    q.selector = PageSelector::Sparq;
    q.page_size = 128;  // the demo's head_dim is 32
    q.budget = 1024;
    EXPECT_THROW(CudaLlama::from_folder(demo->folder, q, 256), InputError);
}

TEST(SparqCuda, TrainedModelFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const auto demo = test::trained_demo(test::source_dir() / "models/demo");
    if (!demo) GTEST_SKIP() << "SKIPPED: models/demo is absent";
    const auto& [m, tok, w] = *demo;
    const PasskeyPrompt p = make_passkey_prompt(tok, 1024, 0.5, 12345);
    const int gen = 6;
    const int cap = static_cast<int>(p.prefill.size() + p.question.size()) + gen + 8;
    for (int page : {16, 8})
    for (bool match : {false, true})
    for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        if (page == 8 && (match || pol != GqaPolicy::KvSum)) continue;  // pages of 8: two per 16-token load
        QuestSettings q;
        q.page_size = page;
        q.budget = 64;
        q.gqa_policy = pol;
        q.selector = PageSelector::Sparq;
        q.match_bytes = match;
        SCOPED_TRACE(q.describe());
        CpuLlama cpu(w, q, cap);
        CudaOptions o;
        o.record_selections = true;
        auto gpu = CudaLlama::from_folder(m, q, cap, o);
        QuestSettings qq = q;
        qq.selector = PageSelector::Quest;
        auto gpu_quest = CudaLlama::from_folder(m, qq, cap);
        cpu.prefill(p.prefill);
        gpu->prefill(p.prefill);
        gpu_quest->prefill(p.prefill);
        // The bytes model (both at the prompt's end): never above Quest's at the same step.
        EXPECT_LE(gpu->decode_bytes(), gpu_quest->decode_bytes());
        // The two backends' activations differ (fp16 against fp32), and the sketch rounds keys to 3 mantissa bits:
        // a key near an e4m3 rounding boundary rounds to neighbours 12.5% apart on the two sides, so a step's
        // selections may part well away from a near-tie of the scores (seen on the H200: 1-7 of 17 steps, 4-20 of
        // 544 head rows, the swapped pages' shares 6-30% apart). Such steps are not compared; they must stay rare (a
        // wrong channel choice or score parts nearly every row).
        int rows = 0, rows_parted = 0;
        auto agree = [&] {
            bool same = true;
            for (int l = q.dense_layers; l < m.config.num_layers; ++l) {
                const SelectionTrace g = gpu->last_selection(l);
                const auto& c = cpu.last_selection()[static_cast<size_t>(l)];
                for (size_t h = 0; h < g.pages.size(); ++h) {
                    std::vector<int> a = g.pages[h], b = c[h];
                    std::sort(a.begin(), a.end());
                    std::sort(b.begin(), b.end());
                    ++rows;
                    if (a != b) ++rows_parted, same = false;
                }
            }
            return same;
        };
        const test::FollowCpu f = test::follow_cpu(cpu, *gpu, *gpu_quest, p.question, gen, 5e-2, agree);
        EXPECT_EQ(f.gpu_tokens, f.cpu_tokens) << "cpu: " << tok.decode(f.cpu_tokens) << " | gpu: " << tok.decode(f.gpu_tokens);
        std::printf("[sparq%s %s] key %d: cpu \"%s\" gpu \"%s\"; worst logits rel_err %.3g (vs gpu quest %.3g); "
                    "selections parted in %d of %d steps, %d of %d head rows\n",
                    match ? "+m" : "", std::string(gqa_policy_name(pol)).c_str(), p.key, tok.decode(f.cpu_tokens).c_str(),
                    tok.decode(f.gpu_tokens).c_str(), f.worst, f.vs_other, f.parted, f.steps, rows_parted, rows);
        EXPECT_LE(rows_parted * 10, rows) << "selections parted in more than 10% of the head rows";
        EXPECT_LE(f.parted * 2, f.steps) << "selections parted in more than half of the steps";
        EXPECT_GT(f.vs_other, 2 * f.worst) << "sparq and quest must differ at B = 64 of ~1024 tokens";
    }
}

}  // namespace
}  // namespace quest
