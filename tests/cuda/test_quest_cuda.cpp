// GPU Quest decode path (kernels/select/quest.cuh) against the CPU references: page_scores_ref / quest_select_ref /
// top_k_ref (kernels/select/quest.h) and attention_pages_ref / attention_full_ref (kernels/attention/attention.h).
//
// Inputs are seeded random values rounded to fp16 (to_half) so the CPU sees exactly what the GPU sees; outputs are
// poisoned with 0xFF bytes (NaN, or -1 for page ids) before every launch; K/V tokens and page metadata beyond the
// sequence are NaN on the device, so reading them poisons the result.
//
// Tolerances:
//   scores    |gpu - cpu| <= 1e-5 * sum_g sum_i |max(q_i kmin_i, q_i kmax_i)| per score (the fp32 summation bound for
//             head_dim <= 256 terms is ~1.5e-5 of that sum in the worst case and the GPU sums in the same order, so in
//             practice the scores are bit-identical; the number of non-identical scores is printed).
//   top-k     identical index sets (exact algorithm, ties -> lower index).
//   selection identical page sets, except rows whose CPU scores of the (K-1)-th and K-th candidates are within 1e-4
//             relative (counted and printed; bounded).
//   attention rel_err (L2 over a head's output) <= 2e-3: fp16 output rounding (~2.4e-4) plus exp2 and summation
//             order differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/select/quest.cuh"
#include "kernels/select/quest.h"
#include "kernels/common/rope.cuh"
#include "tests/cuda/cuda_test_util.h"

namespace quest {
namespace {

using test::rel_err;
using test::to_half;

using test::half_nan;

int ceil_div_i(int a, int b) { return (a + b - 1) / b; }

struct Shape {
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int page_size;
    int len;
    int page_budget;
    GqaPolicy policy;
    int window = 0;  // sliding window (KvLayerView::window), 0: none
};

std::string describe(const Shape& s) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "H=%d Hkv=%d D=%d S=%d len=%d K=%d policy=%s window=%d", s.num_heads,
                  s.num_kv_heads, s.head_dim, s.page_size, s.len, s.page_budget,
                  std::string(gqa_policy_name(s.policy)).c_str(), s.window);
    return buf;
}

// The page holding the window's first token (0 without a window): the first page the step may select.
int first_page(const Shape& s) { return window_start_of(s.len, s.window) / s.page_size; }

using Cache = test::LayerCache;

// Keys: N(0,1) plus a per-page offset along a per-KV-head direction (so the pages' scores spread out); values N(0,1).
// Tokens < valid_len are valid and the metadata of their pages is their min/max (page_metadata_update_ref); on the
// device, K/V of tokens >= valid_len and the metadata of pages >= ceil(valid_len / S) are NaN. Without K/V
// (with_kv = false) the metadata is drawn directly: min/max of two random vectors around the page offset.
Cache make_cache(std::mt19937& rng, int hkv, int d, int s, int cap, int valid_len, bool with_kv) {
    Cache c = Cache::empty(hkv, d, s, cap);
    const int valid_pages = ceil_div_i(valid_len, s);
    const test::PageSpread spread(rng, hkv, d, c.max_pages);
    if (with_kv) {
        test::fill_paged_kv(c, rng, valid_len, spread.dir, spread.off);
    } else {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int h = 0; h < hkv; ++h)
            for (int p = 0; p < valid_pages; ++p)
                for (int i = 0; i < d; ++i) {
                    const size_t at = (static_cast<size_t>(h) * c.max_pages + p) * d + i;
                    const float base = spread.off[static_cast<size_t>(h) * c.max_pages + p] * spread.dir[h * d + i];
                    const float a = base + nd(rng), b = base + nd(rng);
                    c.kmin[at] = std::min(a, b);
                    c.kmax[at] = std::max(a, b);
                }
    }
    test::upload_page_metadata(c, valid_pages);  // fp16: exact min/max of fp16 keys, or rounded here
    return c;
}

using Workspace = test::QuestBuffers;

// The CPU score row of selection row `row` (aggregated exactly as quest_select_ref does) over n candidates, and the
// magnitude sum used by the tolerance.
// first: the first candidate page (a window's); entry p of `out` is page first + p.
void cpu_row_scores(const Cache& c, const std::vector<float>& q, const Shape& s, int row, int n,
                    std::vector<float>& out, std::vector<double>* mag, int first = 0) {
    const int G = s.num_heads / s.num_kv_heads;
    const int kvh = s.policy == GqaPolicy::PerHead ? row / G : row;
    const int g0 = s.policy == GqaPolicy::PerHead ? row % G : 0;
    const int g1 = s.policy == GqaPolicy::PerHead ? g0 + 1 : G;
    const float* kmin = c.kmin.data() + (static_cast<size_t>(kvh) * c.max_pages + first) * c.d;
    const float* kmax = c.kmax.data() + (static_cast<size_t>(kvh) * c.max_pages + first) * c.d;
    out.assign(n, 0.0f);
    if (mag) mag->assign(n, 0.0);
    std::vector<float> hs(n);
    for (int g = g0; g < g1; ++g) {
        const float* qh = q.data() + static_cast<size_t>(kvh * G + g) * c.d;
        page_scores_ref(hs.data(), qh, kmin, kmax, n, c.d);
        for (int p = 0; p < n; ++p) {
            if (g == g0)
                out[p] = hs[p];
            else if (s.policy == GqaPolicy::KvMax)
                out[p] = std::max(out[p], hs[p]);
            else
                out[p] += hs[p];
            if (mag)
                for (int i = 0; i < c.d; ++i) {
                    const size_t at = static_cast<size_t>(p) * c.d + i;
                    (*mag)[p] += std::fabs(std::max(qh[i] * kmin[at], qh[i] * kmax[at]));
                }
        }
    }
}

// True when the CPU scores of the (k)-th and (k+1)-th largest candidates are within 1e-4 relative (k = K - 1).
bool near_tie(std::vector<float> row, int k) {
    if (k <= 0 || k >= static_cast<int>(row.size())) return false;
    std::nth_element(row.begin(), row.begin() + k, row.end(), std::greater<float>());
    const float b = row[k];  // (k+1)-th largest
    const float a = *std::min_element(row.begin(), row.begin() + k);  // k-th largest
    return std::fabs(a - b) <= 1e-4f * std::max(std::fabs(a), std::fabs(b));
}

std::vector<float> random_q(std::mt19937& rng, int n) {
    std::vector<float> q = test::random_floats(rng, n);
    return q;
}

// ---------------------------------------------------------------------------------------------------------------------
// 1. Page scores
// ---------------------------------------------------------------------------------------------------------------------
TEST(QuestCuda, PageScoresMatchReference) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {32, 32, 128, 16, 16 * 300 + 5, 8, GqaPolicy::KvMax},  // MHA (Llama-2-7B heads)
        {32, 8, 128, 16, 16 * 257 + 1, 8, GqaPolicy::KvMax},   // G = 4
        {32, 8, 128, 16, 16 * 257 + 1, 8, GqaPolicy::KvSum},
        {32, 8, 128, 16, 16 * 257 + 1, 8, GqaPolicy::PerHead},
        {64, 8, 64, 8, 8 * 140 + 3, 4, GqaPolicy::KvMax},  // G = 8
        {64, 8, 64, 8, 8 * 140 + 3, 4, GqaPolicy::KvSum},
        {64, 8, 64, 8, 8 * 140 + 3, 4, GqaPolicy::PerHead},
        {24, 2, 64, 16, 16 * 129, 2, GqaPolicy::KvMax},  // G = 12: two batches of heads
        {24, 2, 64, 16, 16 * 129, 2, GqaPolicy::KvSum},
        {24, 2, 64, 16, 16 * 129, 2, GqaPolicy::PerHead},
        {6, 2, 256, 32, 32 * 200 + 31, 16, GqaPolicy::KvSum},  // G = 3, D = 256
        {4, 4, 8, 16, 16 * 500 + 2, 3, GqaPolicy::KvMax},      // D = 8
        {8, 4, 16, 64, 64 * 90 + 9, 3, GqaPolicy::KvMax},      // D = 16
        {8, 2, 32, 1, 1000, 7, GqaPolicy::PerHead},            // D = 32, S = 1
        {4, 2, 128, 256, 256 * 9 + 100, 2, GqaPolicy::KvMax},  // S = 256
    };
    std::mt19937 rng(1234);
    for (const Shape& s : shapes) {
        SCOPED_TRACE(describe(s));
        const int cap = (ceil_div_i(s.len, s.page_size) + 3) * s.page_size;
        const Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, cap, s.len, false);
        std::vector<float> q = random_q(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
        DeviceBuffer<__half> dq(q.size());
        dq.upload(to_half(q));
        Workspace w(s, c.max_pages);
        w.poison();
        DeviceBuffer<int> dpos(1);
        dpos.upload(std::vector<int>{s.len - 1});
        quest_page_scores(w.scores.get(), dq.get(), c.view(), dpos.get(), s.num_heads, s.page_budget, s.policy,
                          nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got = w.scores.download();
        const int P = ceil_div_i(s.len, s.page_size), n = P - 1;
        ASSERT_GT(P, s.page_budget);
        int bad = 0, inexact = 0, unpoisoned = 0;
        double worst = 0.0;
        std::vector<float> ref;
        std::vector<double> mag;
        for (int r = 0; r < w.sz.rows; ++r) {
            cpu_row_scores(c, q, s, r, n, ref, &mag);
            for (int p = 0; p < c.max_pages; ++p) {
                const float g = got[static_cast<size_t>(r) * c.max_pages + p];
                if (p >= n) {  // nothing written at p >= P - 1
                    uint32_t bits;
                    std::memcpy(&bits, &g, 4);
                    unpoisoned += bits != 0xFFFFFFFFu;
                    continue;
                }
                const double err = std::fabs(double(g) - double(ref[p]));
                const double tol = 1e-5 * mag[p] + 1e-30;
                if (!(err <= tol)) ++bad;
                if (g != ref[p]) ++inexact;
                worst = std::max(worst, err / (mag[p] + 1e-30));
            }
        }
        EXPECT_EQ(bad, 0) << "worst |err| / sum|terms| = " << worst;
        EXPECT_EQ(unpoisoned, 0) << "scores written beyond the candidates";
        std::printf("[scores] %s: %d rows x %d candidates, %d not bit-identical, worst err/mag %.3g\n",
                    describe(s).c_str(), w.sz.rows, n, inexact, worst);
    }
}

// A dense step (P <= K) writes no scores.
TEST(QuestCuda, PageScoresDenseStepWritesNothing) {
    QUEST_REQUIRE_GPU();
    const Shape s{8, 2, 64, 16, 16 * 10 + 3, 11, GqaPolicy::KvMax};
    std::mt19937 rng(77);
    const Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, 16 * 32, s.len, false);
    std::vector<float> q = random_q(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
    DeviceBuffer<__half> dq(q.size());
    dq.upload(to_half(q));
    Workspace w(s, c.max_pages);
    w.poison();
    DeviceBuffer<int> dpos(1);
    dpos.upload(std::vector<int>{s.len - 1});
    quest_page_scores(w.scores.get(), dq.get(), c.view(), dpos.get(), s.num_heads, s.page_budget, s.policy, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (float x : w.scores.download()) {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        ASSERT_EQ(bits, 0xFFFFFFFFu);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// 2. Top-k
// ---------------------------------------------------------------------------------------------------------------------

// Rows: 0 continuous normal, 1 integers in [0, 8) (massive ties), 2 all equal, 3 values in {-2, -1, -0, +0, 1}
// (ties across signed zeros), 4 distinct integers in random order, 5 tiny subnormal-range and huge magnitudes,
// 6 a narrow range (1000 + j/1024: one exponent, the digits below the top bits decide, with ties).
std::vector<float> topk_rows(std::mt19937& rng, int rows, int n, int stride) {
    std::vector<float> v(static_cast<size_t>(rows) * stride, NAN);  // NaN beyond n: must not be read
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::uniform_int_distribution<int> small(0, 7), pick(0, 4), coin(0, 1), fine(0, 4095);
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < n; ++i) {
            float x = 0.0f;
            switch (r % 7) {
                case 0: x = nd(rng); break;
                case 1: x = static_cast<float>(small(rng)); break;
                case 2: x = 3.0f; break;
                case 3: {
                    const float vals[5] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f};
                    x = vals[pick(rng)];
                    break;
                }
                case 4: x = static_cast<float>(perm[i]) - n / 2; break;
                case 5: x = (coin(rng) ? 1e-40f : -1e30f) * static_cast<float>(small(rng)); break;
                default: x = 1000.0f + static_cast<float>(fine(rng)) / 1024.0f; break;
            }
            v[static_cast<size_t>(r) * stride + i] = x;
        }
    return v;
}

// quest_top_k on `rows` score rows of n candidates (row stride `stride`) against top_k_ref, K pages per row.
void check_top_k_rows(const std::vector<float>& scores, int rows, int n, int stride, int K, int page_size,
                      uint32_t seed) {
    SCOPED_TRACE("n=" + std::to_string(n) + " K=" + std::to_string(K) + " S=" + std::to_string(page_size));
    // n candidates -> P = n + 1 pages; len anywhere in the last page.
    const int P = n + 1;
    const int len = (P - 1) * page_size + 1 + static_cast<int>(seed % page_size);
    DeviceBuffer<float> dscores(scores.size());
    dscores.upload(scores);
    DeviceBuffer<int> dsel(static_cast<size_t>(rows) * K), dpos(1);
    dsel.fill_bytes(0xFF);
    dpos.upload(std::vector<int>{len - 1});
    quest_top_k(dsel.get(), dscores.get(), stride, dpos.get(), rows, page_size, K, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int> sel = dsel.download();
    for (int r = 0; r < rows; ++r) {
        SCOPED_TRACE("row " + std::to_string(r));
        const int* got = sel.data() + static_cast<size_t>(r) * K;
        std::vector<int> want;
        if (P <= K) {
            want.resize(P);
            std::iota(want.begin(), want.end(), 0);
        } else {
            want = top_k_ref(std::span<const float>(scores.data() + static_cast<size_t>(r) * stride, n), K - 1);
            want.push_back(n);
        }
        const int cnt = std::min(P, K);
        ASSERT_EQ(static_cast<int>(want.size()), cnt);
        int first_diff = -1;
        for (int i = 0; i < cnt && first_diff < 0; ++i)
            if (got[i] != want[i]) first_diff = i;
        EXPECT_EQ(first_diff, -1) << "at " << first_diff << ": got " << got[std::max(first_diff, 0)] << ", want "
                                  << want[std::max(first_diff, 0)];
        for (int i = cnt; i < K; ++i) EXPECT_EQ(got[i], -1) << "entry " << i << " beyond the count was written";
    }
}

void check_top_k(int n, int K, int page_size, int extra_stride, uint32_t seed) {
    const int rows = 7, stride = std::max(n, 1) + extra_stride;
    std::mt19937 rng(seed);
    check_top_k_rows(topk_rows(rng, rows, n, stride), rows, n, stride, K, page_size, seed);
}

TEST(QuestCuda, TopKMatchesReference) {
    QUEST_REQUIRE_GPU();
    uint32_t seed = 1;
    // Keys in registers (strides up to 2048 / 4096 / 8192: 4, 8, 16 per thread), the shared-memory key cache
    // (8192 < n <= 32768) and global re-reads (n = 65536), K - 1 in {1, 63, 127, 4095}.
    for (int n : {2, 100, 2047, 2048, 3000, 5000, 8192, 8193, 65536})
        for (int k : {1, 63, 127, 4095})
            if (k < n) check_top_k(n, k + 1, 1, 0, seed++);
    check_top_k(40000, 4096, 1, 3, seed++);  // global path with a padded stride
    check_top_k(65536, 32769, 1, 0, seed++);  // half the candidates
    check_top_k(3000, 2999, 1, 0, seed++);    // all but one (k = n - 1)
}

// Rows built so that the first digit pass leaves the K-1-th largest key in a bin of m keys that it must split: 100
// keys far above (1000 + i), m keys in one bin (5 + c 2^-18, c in [0, 12): ties among them), the rest below (row 0:
// in [-1, 0), so the sign bit differs; row 1: in (0, 0.5)), at shuffled positions. m <= 32 is resolved by ranking in
// one warp (the register select), m = 33 by another pass; k - 100 takes part of the bin, ties to the lower index.
TEST(QuestCuda, TopKThresholdBinSplitByRankOrByAnotherPass) {
    QUEST_REQUIRE_GPU();
    const int n = 2047;
    for (int m : {2, 20, 32, 33})
        for (int take : {1, m / 2, m - 1}) {
            SCOPED_TRACE("m=" + std::to_string(m) + " take=" + std::to_string(take));
            const int rows = 2;
            std::mt19937 rng(static_cast<uint32_t>(1000 + 64 * m + take));
            std::uniform_real_distribution<float> low(0.0f, 1.0f);
            std::uniform_int_distribution<int> tie(0, 11);
            std::vector<float> scores(static_cast<size_t>(rows) * n);
            for (int r = 0; r < rows; ++r) {
                std::vector<float> v;
                for (int i = 0; i < 100; ++i) v.push_back(1000.0f + static_cast<float>(i));
                for (int i = 0; i < m; ++i) v.push_back(5.0f + static_cast<float>(tie(rng)) * 0x1p-18f);
                while (static_cast<int>(v.size()) < n) v.push_back(r == 0 ? -low(rng) : 0.5f * low(rng) + 1e-3f);
                std::shuffle(v.begin(), v.end(), rng);
                std::copy(v.begin(), v.end(), scores.begin() + static_cast<size_t>(r) * n);
            }
            check_top_k_rows(scores, rows, n, n, 100 + take + 1, 16, static_cast<uint32_t>(m));
        }
}

TEST(QuestCuda, TopKDenseAndSmallBudgets) {
    QUEST_REQUIRE_GPU();
    uint32_t seed = 100;
    check_top_k(0, 1, 16, 1, seed++);     // len <= S: one page, K = 1
    check_top_k(0, 5, 16, 1, seed++);     // one page, K = 5
    check_top_k(50, 64, 16, 0, seed++);   // P = 51 <= K: dense
    check_top_k(63, 64, 16, 0, seed++);   // P = 64 == K: dense
    check_top_k(64, 64, 16, 0, seed++);   // P = 65 > K: sparse by one page
    check_top_k(500, 1, 16, 0, seed++);   // K = 1: only the last page
    check_top_k(500, 2, 8, 0, seed++);    // K = 2
    check_top_k(777, 100, 32, 5, seed++);
}

// ---------------------------------------------------------------------------------------------------------------------
// 3-5. Selection and sparse attention (quest_decode end to end)
// ---------------------------------------------------------------------------------------------------------------------
struct CaseStats {
    int rows = 0, near_ties = 0, mismatched = 0;
    double worst_attn = 0.0;
};

// Validates the GPU page lists, compares them with quest_select_ref (near-tied rows are counted, not compared) and
// the output with attention_pages_ref on the GPU's page lists (and attention_full_ref on dense steps).
void check_step(const Shape& s, const Cache& c, const std::vector<float>& q, const std::vector<int>& sel,
                const std::vector<float>& out, CaseStats& st) {
    const int D = s.head_dim, G = s.num_heads / s.num_kv_heads;
    const int f = first_page(s), t0 = window_start_of(s.len, s.window);
    const int P = ceil_div_i(s.len, s.page_size), cnt = std::min(P - f, s.page_budget);
    const int rows = quest_selection_rows(s.num_heads, s.num_kv_heads, s.policy);
    QuestSelectArgs a;
    a.q = q.data();
    a.kmin = c.kmin.data();
    a.kmax = c.kmax.data();
    a.num_heads = s.num_heads;
    a.num_kv_heads = s.num_kv_heads;
    a.head_dim = D;
    a.page_capacity = c.max_pages;
    a.len = s.len;
    a.page_size = s.page_size;
    a.page_budget = s.page_budget;
    a.policy = s.policy;
    a.window_start = t0;
    std::vector<std::vector<int>> ref_sel;
    quest_select_ref(a, ref_sel);
    std::vector<float> row_scores;
    for (int r = 0; r < rows; ++r) {
        const std::vector<int> got(sel.begin() + static_cast<size_t>(r) * s.page_budget,
                                   sel.begin() + static_cast<size_t>(r) * s.page_budget + cnt);
        // A valid page list: strictly ascending, within [f, P) (the window's pages), ending with the last page.
        bool valid = got.back() == P - 1;
        for (int i = 0; i < cnt; ++i) valid = valid && got[i] >= f && got[i] < P && (i == 0 || got[i - 1] < got[i]);
        ASSERT_TRUE(valid) << "row " << r << ": invalid page list";
        ++st.rows;
        const int h = s.policy == GqaPolicy::PerHead ? r : r * G;
        if (got != ref_sel[h]) {
            bool tie = false;
            if (P - f > s.page_budget) {
                cpu_row_scores(c, q, s, r, P - f - 1, row_scores, nullptr, f);
                tie = near_tie(row_scores, s.page_budget - 1);
            }
            if (tie)
                ++st.near_ties;
            else
                ++st.mismatched;
            EXPECT_TRUE(tie) << "row " << r << ": page set differs from quest_select_ref";
        }
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::vector<float> ref(D), full(D), got(D);
    for (int h = 0; h < s.num_heads; ++h) {
        const int kvh = h / G;
        const int r = s.policy == GqaPolicy::PerHead ? h : kvh;
        const std::span<const int> pages(sel.data() + static_cast<size_t>(r) * s.page_budget, cnt);
        const float* qh = q.data() + static_cast<size_t>(h) * D;
        attention_pages_ref(ref.data(), qh, c.kh(kvh), c.vh(kvh), D, s.len, s.page_size, pages, scale, t0);
        std::copy(out.begin() + static_cast<size_t>(h) * D, out.begin() + static_cast<size_t>(h + 1) * D,
                  got.begin());
        const double e = rel_err(got, ref);
        EXPECT_LE(e, 2e-3) << "head " << h;
        st.worst_attn = std::isnan(e) ? INFINITY : std::max(st.worst_attn, e);
        if (P - f <= s.page_budget) {  // dense step: the full attention (within the window)
            attention_full_ref(full.data(), qh, c.kh(kvh), c.vh(kvh), D, s.len, scale, t0);
            EXPECT_LE(rel_err(got, full), 2e-3) << "head " << h << " (dense: vs attention_full_ref)";
        }
    }
}

void run_decode_case(const Shape& s, uint32_t seed, CaseStats& st, int pages_per_split = 0,
                     QuestDecodeOptions opts = {}) {
    SCOPED_TRACE(describe(s) + " pages_per_split=" + std::to_string(pages_per_split) +
                 (opts.fused ? " fused" : " unfused"));
    std::mt19937 rng(seed);
    const int cap = (ceil_div_i(s.len, s.page_size) + 2) * s.page_size;
    const Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, cap, s.len, true);
    std::vector<float> q = random_q(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
    DeviceBuffer<__half> dq(q.size()), dout(q.size());
    dq.upload(to_half(q));
    Workspace w(s, c.max_pages, pages_per_split);
    w.poison();
    dout.fill_bytes(0xFF);
    DeviceBuffer<int> dpos(1);
    dpos.upload(std::vector<int>{s.len - 1});
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    KvLayerView kv = c.view();
    kv.window = s.window;
    quest_decode(dout.get(), dq.get(), kv, dpos.get(), s.num_heads, s.page_budget, s.policy, scale, w.ws(), nullptr,
                 opts);
    CUDA_CHECK(cudaDeviceSynchronize());
    check_step(s, c, q, w.selected.download(), test::to_float(dout.download()), st);
    EXPECT_TRUE(w.counters_zero()) << "merge counters not reset";
}

TEST(QuestCuda, DecodeMatchesReference) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {8, 8, 128, 16, 1000, 16, GqaPolicy::KvMax},  // MHA
        {16, 4, 128, 16, 1237, 12, GqaPolicy::KvMax},  // G = 4
        {16, 4, 128, 16, 1237, 12, GqaPolicy::KvSum},
        {16, 4, 128, 16, 1237, 12, GqaPolicy::PerHead},
        {32, 4, 64, 8, 901, 40, GqaPolicy::KvMax},  // G = 8
        {32, 4, 64, 32, 901, 5, GqaPolicy::PerHead},
        {32, 4, 64, 32, 901, 5, GqaPolicy::KvSum},
        {8, 2, 64, 64, 1500, 3, GqaPolicy::KvMax},  // S = 64
        {8, 2, 128, 16, 500, 1, GqaPolicy::KvMax},  // K = 1 (B < 2S): only the last page
        {8, 2, 128, 16, 500, 1, GqaPolicy::PerHead},
        {8, 2, 128, 16, 777, 64, GqaPolicy::KvMax},     // dense: P = 49 <= K
        {8, 8, 128, 16, 16 * 64, 64, GqaPolicy::KvMax},  // dense, P == K, len a multiple of S
        {8, 8, 128, 16, 16 * 64 + 1, 64, GqaPolicy::KvMax},  // sparse by one page, last page holds one token
        {4, 1, 128, 16, 1, 4, GqaPolicy::KvMax},             // len = 1
        {4, 1, 128, 16, 1, 1, GqaPolicy::PerHead},           // len = 1, K = 1
        {4, 4, 8, 16, 333, 6, GqaPolicy::KvMax},             // D = 8
        {8, 4, 16, 8, 333, 6, GqaPolicy::KvSum},             // D = 16
        {8, 2, 32, 32, 333, 3, GqaPolicy::PerHead},          // D = 32
        {8, 1, 256, 16, 643, 10, GqaPolicy::KvMax},          // D = 256, G = 8 (MQA)
        {12, 1, 64, 16, 700, 9, GqaPolicy::KvMax},           // G = 12: two head slabs per KV head
        {6, 2, 128, 1, 300, 40, GqaPolicy::KvMax},           // S = 1, G = 3
        {4, 2, 64, 256, 1100, 3, GqaPolicy::KvMax},          // S = 256: tiles inside a page, partial last page
        {4, 2, 256, 256, 300, 1, GqaPolicy::KvMax},          // S = 256, K = 1, D = 256
        {8, 8, 128, 8, 4000, 256, GqaPolicy::KvMax},         // many splits
    };
    CaseStats st;
    for (const bool fused : {true, false}) {  // the default path and the three separate launches
        QuestDecodeOptions opts;
        opts.fused = fused;
        uint32_t seed = 500;
        for (const Shape& s : shapes) run_decode_case(s, seed++, st, 0, opts);
        // Forced split sizes: one page per block (many splits, merged by the last block), odd sizes, one split.
        for (int pps : {1, 3, 128}) {
            run_decode_case({16, 4, 128, 16, 1237, 12, GqaPolicy::KvMax}, seed++, st, pps, opts);
            run_decode_case({16, 4, 64, 8, 2001, 77, GqaPolicy::PerHead}, seed++, st, pps, opts);
            run_decode_case({24, 2, 128, 32, 3000, 20, GqaPolicy::KvSum}, seed++, st, pps, opts);
        }
    }
    std::printf("[decode] %d selection rows, %d near-tied (not compared), %d mismatched; "
                "worst attention rel_err %.3g\n",
                st.rows, st.near_ties, st.mismatched, st.worst_attn);
    EXPECT_EQ(st.mismatched, 0);
    EXPECT_LE(st.near_ties, st.rows / 10);
}

// A sliding window: the pages from the one holding the window's first token on are the candidates, renumbered as
// select_blocks_ref renumbers them; the attention masks that page's tokens before the window. Windows shorter than
// a page, not a multiple of S, exactly the sequence, longer than it; dense and selecting steps inside the window;
// rows of up to 1,000 candidates.
TEST(QuestCuda, DecodeInAWindowMatchesReference) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {16, 4, 128, 16, 1237, 12, GqaPolicy::KvSum, 500},    // 32 pages of window, 12 selected
        {16, 4, 128, 16, 1237, 12, GqaPolicy::KvMax, 500},
        {16, 4, 128, 16, 1237, 12, GqaPolicy::PerHead, 500},
        {8, 8, 128, 16, 1000, 16, GqaPolicy::KvMax, 256},     // window a multiple of S, len not
        {8, 8, 128, 16, 1024, 16, GqaPolicy::KvMax, 256},     // both multiples: the window starts a page
        {8, 2, 64, 16, 900, 40, GqaPolicy::KvSum, 600},       // dense inside the window (38 pages <= 40)
        {8, 2, 64, 16, 900, 8, GqaPolicy::KvSum, 5},          // a window shorter than a page
        {8, 2, 64, 16, 900, 8, GqaPolicy::KvSum, 900},        // window = the sequence
        {8, 2, 64, 16, 900, 8, GqaPolicy::KvSum, 4000},       // window longer than the sequence
        {32, 4, 64, 8, 901, 20, GqaPolicy::KvMax, 333},       // G = 8, S = 8
        {8, 2, 128, 16, 500, 1, GqaPolicy::KvMax, 100},       // K = 1: the last page only
        {4, 2, 64, 256, 3000, 3, GqaPolicy::KvMax, 1100},     // S = 256
        {8, 2, 128, 16, 20000, 64, GqaPolicy::KvSum, 16000},  // 1,000 candidates
    };
    CaseStats st;
    uint32_t seed = 9100;
    for (const Shape& s : shapes) run_decode_case(s, seed++, st);
    for (int pps : {1, 3}) run_decode_case({24, 2, 128, 32, 3000, 20, GqaPolicy::KvSum, 1700}, seed++, st, pps);
    std::printf("[decode in a window] %d selection rows, %d near-tied (not compared), %d mismatched; "
                "worst attention rel_err %.3g\n",
                st.rows, st.near_ties, st.mismatched, st.worst_attn);
    EXPECT_EQ(st.mismatched, 0);
    EXPECT_LE(st.near_ties, st.rows / 10);
    // The fused scoring + top-k does not honour a window: refused, not run without it.
    const Shape s{8, 2, 64, 16, 900, 8, GqaPolicy::KvSum, 300};
    std::mt19937 rng(1);
    const Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, 960, s.len, true);
    Workspace w(s, c.max_pages, 0);
    DeviceBuffer<__half> dq(size_t(s.num_heads) * s.head_dim), dout(dq.size());
    DeviceBuffer<int> dpos(1);
    KvLayerView kv = c.view();
    kv.window = s.window;
    QuestDecodeOptions fused;
    fused.fused = true;
    EXPECT_THROW(quest_decode(dout.get(), dq.get(), kv, dpos.get(), s.num_heads, s.page_budget, s.policy, 0.125f,
                              w.ws(), nullptr, fused),
                 std::invalid_argument);
}

// Selection only, over many random caches and policies: the page sets of quest_page_scores + quest_top_k equal
// quest_select_ref's.
TEST(QuestCuda, SelectionMatchesReference) {
    QUEST_REQUIRE_GPU();
    CaseStats st;
    std::mt19937 pick(42);
    const int dims[] = {64, 128};
    const int sizes[] = {8, 16, 32, 64};
    const int groups[] = {1, 4, 8};
    const GqaPolicy pols[] = {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead};
    for (int it = 0; it < 24; ++it) {
        const int G = groups[it % 3], S = sizes[(it / 3) % 4];
        const int hkv = G == 1 ? 8 : 2;
        const int len = 1 + static_cast<int>(pick() % (S * 300));
        const int K = 1 + static_cast<int>(pick() % 40);
        const Shape s{hkv * G, hkv, dims[it % 2], S, len, K, pols[(it / 2) % 3]};
        SCOPED_TRACE(describe(s));
        std::mt19937 rng(9000 + it);
        const int cap = (ceil_div_i(len, S) + 1) * S;
        const Cache c = make_cache(rng, hkv, s.head_dim, S, cap, len, false);
        std::vector<float> q = random_q(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
        DeviceBuffer<__half> dq(q.size());
        dq.upload(to_half(q));
        Workspace w(s, c.max_pages);
        w.poison();
        DeviceBuffer<int> dpos(1);
        dpos.upload(std::vector<int>{len - 1});
        quest_page_scores(w.scores.get(), dq.get(), c.view(), dpos.get(), s.num_heads, K, s.policy, nullptr);
        quest_top_k(w.selected.get(), w.scores.get(), c.max_pages, dpos.get(), w.sz.rows, S, K, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<int> sel = w.selected.download();
        QuestSelectArgs a;
        a.q = q.data();
        a.kmin = c.kmin.data();
        a.kmax = c.kmax.data();
        a.num_heads = s.num_heads;
        a.num_kv_heads = hkv;
        a.head_dim = s.head_dim;
        a.page_capacity = c.max_pages;
        a.len = len;
        a.page_size = S;
        a.page_budget = K;
        a.policy = s.policy;
        std::vector<std::vector<int>> ref;
        quest_select_ref(a, ref);
        const int P = ceil_div_i(len, S), cnt = std::min(P, K);
        std::vector<float> row_scores;
        for (int r = 0; r < w.sz.rows; ++r) {
            ++st.rows;
            const std::vector<int> got(sel.begin() + static_cast<size_t>(r) * K,
                                       sel.begin() + static_cast<size_t>(r) * K + cnt);
            const int h = s.policy == GqaPolicy::PerHead ? r : r * G;
            if (got == ref[h]) continue;
            bool tie = false;
            if (P > K) {
                cpu_row_scores(c, q, s, r, P - 1, row_scores, nullptr);
                tie = near_tie(row_scores, K - 1);
            }
            st.near_ties += tie;
            st.mismatched += !tie;
            EXPECT_TRUE(tie) << "row " << r << " differs from quest_select_ref";
        }
    }
    std::printf("[selection] %d rows, %d near-tied (not compared), %d mismatched\n", st.rows, st.near_ties,
                st.mismatched);
    EXPECT_LE(st.near_ties, st.rows / 10);
}

// The attention kernel alone, fed quest_select_ref's page sets (independent of the GPU top-k).
TEST(QuestCuda, SparseAttentionOnReferencePages) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {16, 4, 128, 16, 2000, 20, GqaPolicy::KvMax},
        {16, 4, 64, 8, 1500, 33, GqaPolicy::PerHead},
        {8, 1, 128, 32, 999, 4, GqaPolicy::KvSum},
    };
    uint32_t seed = 3000;
    for (const Shape& s : shapes) {
        SCOPED_TRACE(describe(s));
        std::mt19937 rng(seed++);
        const int cap = (ceil_div_i(s.len, s.page_size) + 2) * s.page_size;
        const Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, cap, s.len, true);
        std::vector<float> q = random_q(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
        QuestSelectArgs a;
        a.q = q.data();  // (q is rounded below; selection on the unrounded q is as good a page set)
        a.kmin = c.kmin.data();
        a.kmax = c.kmax.data();
        a.num_heads = s.num_heads;
        a.num_kv_heads = s.num_kv_heads;
        a.head_dim = s.head_dim;
        a.page_capacity = c.max_pages;
        a.len = s.len;
        a.page_size = s.page_size;
        a.page_budget = s.page_budget;
        a.policy = s.policy;
        std::vector<std::vector<int>> ref_sel;
        quest_select_ref(a, ref_sel);
        const int rows = quest_selection_rows(s.num_heads, s.num_kv_heads, s.policy);
        const int G = s.num_heads / s.num_kv_heads;
        std::vector<int> sel(static_cast<size_t>(rows) * s.page_budget, -1);
        for (int r = 0; r < rows; ++r) {
            const std::vector<int>& pages = ref_sel[s.policy == GqaPolicy::PerHead ? r : r * G];
            std::copy(pages.begin(), pages.end(), sel.begin() + static_cast<size_t>(r) * s.page_budget);
        }
        DeviceBuffer<__half> dq(q.size()), dout(q.size());
        dq.upload(to_half(q));
        Workspace w(s, c.max_pages);
        w.poison();
        w.selected.upload(sel);
        dout.fill_bytes(0xFF);
        DeviceBuffer<int> dpos(1);
        dpos.upload(std::vector<int>{s.len - 1});
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
        attention_decode_sparse(dout.get(), dq.get(), c.view(), dpos.get(), w.selected.get(), s.num_heads,
                                s.page_budget, s.policy, scale, w.ws(), nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> out = test::to_float(dout.download());
        const int cnt = std::min(ceil_div_i(s.len, s.page_size), s.page_budget);
        std::vector<float> ref(s.head_dim), got(s.head_dim);
        for (int h = 0; h < s.num_heads; ++h) {
            const int r = s.policy == GqaPolicy::PerHead ? h : h / G;
            attention_pages_ref(ref.data(), q.data() + static_cast<size_t>(h) * s.head_dim, c.kh(h / G), c.vh(h / G),
                                s.head_dim, s.len, s.page_size,
                                std::span<const int>(sel.data() + static_cast<size_t>(r) * s.page_budget, cnt), scale);
            std::copy(out.begin() + static_cast<size_t>(h) * s.head_dim,
                      out.begin() + static_cast<size_t>(h + 1) * s.head_dim, got.begin());
            EXPECT_LE(rel_err(got, ref), 2e-3) << "head " << h;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// 6. Graph replay: one captured step, replayed at lengths that change from launch to launch (only *d_pos changes).
// ---------------------------------------------------------------------------------------------------------------------
TEST(QuestCuda, GraphReplayAtChangingLengths) {
    QUEST_REQUIRE_GPU();
    for (int mode = 0; mode < 4; ++mode) {
        const GqaPolicy pol = mode % 2 ? GqaPolicy::PerHead : GqaPolicy::KvMax;
        QuestDecodeOptions opts;
        opts.fused = mode < 2;
        const int H = 16, Hkv = 4, D = 128, S = 16, cap = 2048, K = 16;
        SCOPED_TRACE(std::string(gqa_policy_name(pol)) + (opts.fused ? " fused" : " unfused"));
        std::mt19937 rng(pol == GqaPolicy::KvMax ? 11 : 12);
        // Every token of the capacity is valid and every page's metadata covers its full page: the complete pages
        // of any length then have exactly their metadata (the last page's is never scored).
        const Cache c = make_cache(rng, Hkv, D, S, cap, cap, true);
        std::vector<float> q = random_q(rng, static_cast<size_t>(H) * D);
        DeviceBuffer<__half> dq(q.size()), dout(q.size());
        dq.upload(to_half(q));
        Shape s{H, Hkv, D, S, 1, K, pol};
        Workspace w(s, c.max_pages);
        DeviceBuffer<int> dpos(1);
        dpos.upload(std::vector<int>{cap - 1});
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        // Warm-up launch (first-use attribute/occupancy queries happen outside the capture), then capture.
        quest_decode(dout.get(), dq.get(), c.view(), dpos.get(), H, K, pol, scale, w.ws(), stream, opts);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        quest_decode(dout.get(), dq.get(), c.view(), dpos.get(), H, K, pol, scale, w.ws(), stream, opts);
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CaseStats st;
        for (int len : {1, 17, 255, 256, 257, 1000, 300, 2048, 16 * 16, 16 * 16 + 1, 2047, 5, 1500}) {
            SCOPED_TRACE("len " + std::to_string(len));
            w.poison();
            dout.fill_bytes(0xFF);
            dpos.upload(std::vector<int>{len - 1});
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            s.len = len;
            check_step(s, c, q, w.selected.download(), test::to_float(dout.download()), st);
            EXPECT_TRUE(w.counters_zero()) << "merge counters not reset";
        }
        std::printf("[graph %s %s] %d selection rows, %d near-tied, %d mismatched; worst attention rel_err %.3g\n",
                    std::string(gqa_policy_name(pol)).c_str(), opts.fused ? "fused" : "unfused", st.rows, st.near_ties,
                    st.mismatched, st.worst_attn);
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
        CUDA_CHECK(cudaStreamDestroy(stream));
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// 7. The fused scoring + top-k (quest_page_scores_top_k, quest_decode's default) against the separate launches
//    (quest_page_scores + quest_top_k, QuestDecodeOptions{.fused = false}): identical page lists and identical
//    written entries (the buffers are poisoned before each path and compared whole, poison included), bit-identical
//    scores and outputs (the attention kernel is the same), counters left zero. The fused path runs twice in a row
//    (the second launch relies on the first leaving its tickets zero).
// ---------------------------------------------------------------------------------------------------------------------

// Overwrites the metadata of the valid pages with tie-heavy values: page p's min/max depend only on p % 5 and are
// small integers, so (with an integer q) many pages have exactly equal scores and the lower page id must win.
void make_ties(Cache& c, int valid_len) {
    const int valid_pages = std::min(ceil_div_i(valid_len, c.s), c.max_pages);
    const size_t meta_n = static_cast<size_t>(c.hkv) * c.max_pages * c.d;
    std::vector<__half> hmin(meta_n, half_nan()), hmax(meta_n, half_nan());
    for (int h = 0; h < c.hkv; ++h)
        for (int p = 0; p < valid_pages; ++p)
            for (int i = 0; i < c.d; ++i) {
                const size_t at = (static_cast<size_t>(h) * c.max_pages + p) * c.d + i;
                const int a = (p % 5 + i + h) % 3 - 1, b = a + (p % 5 == 2 ? 0 : 1);
                c.kmin[at] = static_cast<float>(a);
                c.kmax[at] = static_cast<float>(b);
                hmin[at] = __float2half(c.kmin[at]);
                hmax[at] = __float2half(c.kmax[at]);
            }
    c.dmin.upload(hmin);
    c.dmax.upload(hmax);
}

struct PathResult {
    std::vector<int> selected;
    std::vector<float> scores;
    std::vector<uint16_t> out;  // fp16 bits (empty without K/V)
};

std::vector<uint16_t> half_bits(const std::vector<__half>& h) {
    std::vector<uint16_t> b(h.size());
    std::memcpy(b.data(), h.data(), h.size() * sizeof(uint16_t));
    return b;
}

// One path on freshly poisoned buffers. With K/V: quest_decode; without: the selection launches only.
PathResult run_path(const Shape& s, const Cache& c, const DeviceBuffer<__half>& dq, const DeviceBuffer<int>& dpos,
                    Workspace& w, bool with_kv, bool fused) {
    w.poison();
    DeviceBuffer<__half> dout(static_cast<size_t>(s.num_heads) * s.head_dim);
    dout.fill_bytes(0xFF);
    if (with_kv) {
        QuestDecodeOptions opts;
        opts.fused = fused;
        quest_decode(dout.get(), dq.get(), c.view(), dpos.get(), s.num_heads, s.page_budget, s.policy,
                     1.0f / std::sqrt(static_cast<float>(s.head_dim)), w.ws(), nullptr, opts);
    } else if (fused) {
        quest_page_scores_top_k(w.selected.get(), w.scores.get(), w.counters.get() + s.num_heads, dq.get(), c.view(),
                                dpos.get(), s.num_heads, s.page_budget, s.policy, nullptr);
    } else {
        quest_page_scores(w.scores.get(), dq.get(), c.view(), dpos.get(), s.num_heads, s.page_budget, s.policy,
                          nullptr);
        quest_top_k(w.selected.get(), w.scores.get(), c.max_pages, dpos.get(), w.sz.rows, s.page_size, s.page_budget,
                    nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    PathResult r;
    r.selected = w.selected.download();
    r.scores = w.scores.download();
    if (with_kv) r.out = half_bits(dout.download());
    return r;
}

// extra_pages: capacity beyond the sequence's pages (0: the sequence fills the cache, P == max_pages).
void compare_fused(const Shape& s, uint32_t seed, bool with_kv, bool ties, int extra_pages) {
    SCOPED_TRACE(describe(s) + (with_kv ? " decode" : " selection") + (ties ? " ties" : "") +
                 " extra_pages=" + std::to_string(extra_pages));
    std::mt19937 rng(seed);
    const int cap = (ceil_div_i(s.len, s.page_size) + extra_pages) * s.page_size;
    Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, cap, s.len, with_kv);
    std::vector<float> q = random_q(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
    if (ties) {
        ASSERT_FALSE(with_kv);
        make_ties(c, s.len);
        std::uniform_int_distribution<int> qi(-1, 2);
        for (float& x : q) x = static_cast<float>(qi(rng));
    }
    DeviceBuffer<__half> dq(q.size());
    dq.upload(to_half(q));
    DeviceBuffer<int> dpos(1);
    dpos.upload(std::vector<int>{s.len - 1});
    Workspace w(s, c.max_pages);
    const PathResult ref = run_path(s, c, dq, dpos, w, with_kv, false);
    EXPECT_TRUE(w.counters_zero()) << "counters not reset (separate launches)";
    for (int rep = 0; rep < 2; ++rep) {
        SCOPED_TRACE("fused launch " + std::to_string(rep));
        const PathResult got = run_path(s, c, dq, dpos, w, with_kv, true);
        EXPECT_TRUE(w.counters_zero()) << "counters not reset (fused)";
        const int K = s.page_budget, P = ceil_div_i(s.len, s.page_size), cnt = std::min(P, K);
        int first_diff = -1;
        for (size_t i = 0; i < ref.selected.size() && first_diff < 0; ++i)
            if (got.selected[i] != ref.selected[i]) first_diff = static_cast<int>(i);
        EXPECT_EQ(first_diff, -1) << "selected differs at row " << first_diff / K << " entry " << first_diff % K
                                  << ": fused " << got.selected[std::max(first_diff, 0)] << ", separate "
                                  << ref.selected[std::max(first_diff, 0)] << " (count " << cnt << ")";
        // Every row's written entries are a valid page list: cnt ascending ids ending with P - 1.
        for (int r = 0; r < w.sz.rows && first_diff < 0; ++r) {
            const int* row = got.selected.data() + static_cast<size_t>(r) * K;
            for (int i = 0; i < cnt; ++i) {
                ASSERT_TRUE(row[i] >= 0 && row[i] < P && (i == 0 || row[i] > row[i - 1])) << "row " << r;
            }
            ASSERT_EQ(row[cnt - 1], P - 1) << "row " << r;
        }
        EXPECT_EQ(std::memcmp(got.scores.data(), ref.scores.data(), ref.scores.size() * sizeof(float)), 0)
            << "scores differ";
        EXPECT_EQ(got.out, ref.out) << "attention outputs differ";
    }
}

TEST(QuestCuda, FusedSelectionMatchesSeparateLaunches) {
    QUEST_REQUIRE_GPU();
    // {H, Hkv, D, S, len, K, policy}; K = B / S pages.
    const std::vector<Shape> shapes = {
        {32, 32, 128, 16, 32768, 128, GqaPolicy::KvMax},        // Llama-2-7B, 32K, B = 2048
        {32, 32, 128, 16, 32768 - 5, 256, GqaPolicy::KvMax},    // B = 4096, partial last page
        {32, 32, 128, 16, 4096 + 1, 32, GqaPolicy::KvMax},      // 4K, B = 512, last page holds one token
        {32, 8, 128, 16, 131072, 256, GqaPolicy::KvSum},        // 128K, G = 4
        {32, 8, 128, 16, 131072 - 7, 64, GqaPolicy::PerHead},   // 32 rows
        {32, 8, 128, 8, 4096 + 3, 64, GqaPolicy::KvMax},        // S = 8
        {16, 4, 64, 32, 32 * 700 + 13, 32, GqaPolicy::KvMax},   // S = 32
        {16, 4, 64, 64, 64 * 300 + 63, 16, GqaPolicy::PerHead}, // S = 64
        {24, 2, 64, 32, 32 * 700 + 13, 32, GqaPolicy::PerHead}, // G = 12: two head batches, 24 rows
        {24, 2, 64, 32, 32 * 700 + 13, 32, GqaPolicy::KvSum},
        {6, 2, 256, 32, 32 * 200 + 31, 16, GqaPolicy::KvMax},   // D = 256
        {8, 4, 16, 64, 64 * 300 + 1, 5, GqaPolicy::KvMax},      // D = 16
        {4, 4, 8, 16, 16 * 3000 + 9, 100, GqaPolicy::KvMax},    // D = 8: keys beyond the fused shared cache
        {8, 2, 32, 1, 5000, 7, GqaPolicy::PerHead},             // S = 1
        {8, 2, 64, 16, 1000, 1, GqaPolicy::KvMax},              // K = 1 (B < 2S): only the last page
        {8, 2, 64, 16, 1000, 1, GqaPolicy::PerHead},
        {8, 2, 64, 16, 1000, 2, GqaPolicy::KvSum},              // K = 2
        {8, 2, 64, 16, 16 * 100, 100, GqaPolicy::KvMax},        // dense: P == K (B >= context)
        {8, 2, 64, 16, 16 * 50 + 1, 200, GqaPolicy::PerHead},   // dense: P < K
        {8, 2, 64, 16, 16 * 100 + 1, 100, GqaPolicy::KvMax},    // sparse by one page
        {4, 1, 128, 16, 1, 4, GqaPolicy::KvMax},                // len = 1
        {4, 2, 64, 16, 20000 * 16 + 5, 2048, GqaPolicy::KvMax}, // n = 20000: keys cached in the ring
        {4, 2, 64, 16, 65536 * 16, 128, GqaPolicy::KvMax},      // 65,536 pages (1M tokens): keys from L2
        {4, 2, 64, 16, 65536 * 16 - 3, 4096, GqaPolicy::PerHead},
        {4, 2, 64, 16, 65536 * 16, 32768, GqaPolicy::KvSum},    // half the candidates
    };
    uint32_t seed = 7000;
    for (size_t i = 0; i < shapes.size(); ++i)  // every third case fills the cache (P == max_pages)
        compare_fused(shapes[i], seed++, false, false, i % 3 == 0 ? 0 : 2);
    // Exact ties everywhere (ties -> lower page id), every policy.
    for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        compare_fused({16, 4, 64, 16, 16 * 3000 + 7, 300, pol}, seed++, false, true, 1);
        compare_fused({8, 8, 128, 16, 16 * 2048, 128, pol}, seed++, false, true, 0);
        compare_fused({4, 2, 64, 16, 16 * 40000, 1024, pol}, seed++, false, true, 0);  // beyond the ring cache
    }
}

TEST(QuestCuda, FusedDecodeMatchesSeparateLaunches) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {8, 8, 128, 16, 16 * 300 + 5, 64, GqaPolicy::KvMax},
        {16, 4, 128, 8, 8 * 500 + 3, 40, GqaPolicy::PerHead},
        {16, 4, 64, 32, 32 * 100 + 17, 9, GqaPolicy::KvSum},
        {8, 2, 64, 64, 64 * 60 + 63, 12, GqaPolicy::KvMax},
        {8, 2, 128, 16, 500, 1, GqaPolicy::KvMax},   // K = 1
        {8, 2, 128, 16, 777, 64, GqaPolicy::KvMax},  // dense
        {12, 1, 64, 16, 700, 9, GqaPolicy::KvMax},   // G = 12
        {8, 8, 128, 16, 16 * 1024, 128, GqaPolicy::KvMax},
    };
    uint32_t seed = 8000;
    for (const Shape& s : shapes) compare_fused(s, seed++, true, false, 1);
}

// RoPE + KV append folded into the scoring kernel (QuestDecodeOptions::rope, the decode step's default Quest path)
// against rope_append_kv followed by quest_decode, on two copies of the same cache: the rotated q, the whole K / V
// cache, the page bounds, the selection and the attention output must be the same bits. The cache holds len - 1
// tokens (K/V and bounds beyond them NaN: an append that writes too little shows); the token at len - 1 is appended.
// Covers a first token of a page (its bounds start over), a page's last token, dense steps (P <= K: the scoring
// exits early but still appends), blocks without a scoring item (they only append) and grids whose blocks score
// more than one item (the append finished after them), len = 1, GQA policies, head_dim 8 .. 256 and a dynamic-NTK /
// scaled RoPE.
void compare_rope_append(const Shape& s, uint32_t seed, bool dynamic) {
    SCOPED_TRACE(describe(s) + (dynamic ? " dynamic rope" : ""));
    const int D = s.head_dim, q_dim = s.num_heads * D, kv_dim = s.num_kv_heads * D;
    const int cap = (ceil_div_i(s.len, s.page_size) + 1) * s.page_size;
    Cache a, b;
    {
        std::mt19937 rng(seed);
        a = make_cache(rng, s.num_kv_heads, D, s.page_size, cap, s.len - 1, true);
    }
    {
        std::mt19937 rng(seed);
        b = make_cache(rng, s.num_kv_heads, D, s.page_size, cap, s.len - 1, true);
    }
    std::mt19937 rng(seed + 1);
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
    if (dynamic) {
        rope.dynamic = true;
        rope.factor = 2.0;
        rope.max_position_embeddings = std::max(2, s.len / 3);
        rope.attention_scaling = 1.1f;
    }
    DeviceBuffer<int> dpos(1);
    dpos.upload(std::vector<int>{s.len - 1});
    Workspace wa(s, a.max_pages), wb(s, b.max_pages);
    wa.poison();
    wb.poison();
    DeviceBuffer<__half> qa(q_dim), qb(q_dim), oa(q_dim), ob(q_dim);
    for (auto* buf : {&qa, &qb, &oa, &ob}) buf->fill_bytes(0xFF);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    rope_append_kv(qa.get(), a.view(), dqkv.get(), dpos.get(), 1, s.num_heads, rope, nullptr);
    quest_decode(oa.get(), qa.get(), a.view(), dpos.get(), s.num_heads, s.page_budget, s.policy, scale, wa.ws(),
                 nullptr);
    QuestRopeAppend ra;
    ra.qkv = dqkv.get();
    ra.q_out = qb.get();
    ra.rope = rope;
    QuestDecodeOptions opts;
    opts.rope = &ra;
    quest_decode(ob.get(), qb.get(), b.view(), dpos.get(), s.num_heads, s.page_budget, s.policy, scale, wb.ws(),
                 nullptr, opts);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(half_bits(qb.download()), half_bits(qa.download())) << "rotated q";
    EXPECT_EQ(half_bits(b.dk.download()), half_bits(a.dk.download())) << "K cache";
    EXPECT_EQ(half_bits(b.dv.download()), half_bits(a.dv.download())) << "V cache";
    EXPECT_EQ(half_bits(b.dmin.download()), half_bits(a.dmin.download())) << "page minima";
    EXPECT_EQ(half_bits(b.dmax.download()), half_bits(a.dmax.download())) << "page maxima";
    EXPECT_EQ(wb.selected.download(), wa.selected.download()) << "selection";
    const std::vector<uint16_t> out_a = half_bits(oa.download()), out_b = half_bits(ob.download());
    EXPECT_EQ(out_b, out_a) << "attention output";
    // The separate path's output is a real result (not poison): finite everywhere.
    for (const __half h : oa.download()) ASSERT_TRUE(std::isfinite(__half2float(h)));
}

TEST(QuestCuda, RopeAppendInScoringMatchesSeparateLaunch) {
    QUEST_REQUIRE_GPU();
    // {H, Hkv, D, S, len, K, policy}
    const std::vector<Shape> shapes = {
        {32, 32, 128, 16, 16 * 256 + 1, 32, GqaPolicy::KvMax},   // 7B heads, first token of a page
        {32, 32, 128, 16, 16 * 256, 32, GqaPolicy::KvMax},       // last token of a page
        {32, 8, 128, 16, 16 * 300 + 7, 64, GqaPolicy::KvSum},    // G = 4
        {32, 8, 128, 16, 16 * 300 + 7, 64, GqaPolicy::PerHead},
        {24, 2, 64, 32, 32 * 70 + 13, 9, GqaPolicy::PerHead},    // G = 12: two head batches
        {6, 2, 256, 32, 32 * 40 + 31, 8, GqaPolicy::KvMax},      // D = 256
        {8, 4, 16, 64, 64 * 30 + 1, 5, GqaPolicy::KvMax},        // D = 16
        {4, 4, 8, 16, 16 * 90 + 9, 10, GqaPolicy::KvMax},        // D = 8
        {8, 2, 64, 16, 16 * 50 + 1, 200, GqaPolicy::KvMax},      // dense: P < K
        {8, 2, 64, 16, 16 * 100, 100, GqaPolicy::PerHead},       // dense: P == K
        {8, 2, 64, 16, 1000, 1, GqaPolicy::KvMax},               // K = 1
        {4, 1, 128, 16, 1, 4, GqaPolicy::KvMax},                 // len = 1: the first token of the sequence
        {4, 4, 8, 16, 16 * 20000 + 3, 12, GqaPolicy::KvMax},     // 628 scoring items: > 1 per block on any GPU
        {8, 8, 64, 16, 16 * 4500 + 2, 64, GqaPolicy::KvMax},     // 288 items: > 1 for some blocks on an H200
    };
    uint32_t seed = 9100;
    for (const Shape& sh : shapes) compare_rope_append(sh, seed++, false);
    compare_rope_append({32, 8, 128, 16, 16 * 300 + 7, 64, GqaPolicy::KvSum}, seed++, true);
    compare_rope_append({8, 2, 64, 16, 16 * 50 + 1, 200, GqaPolicy::KvMax}, seed++, true);
}

// Preconditions are checked on the host.
TEST(QuestCuda, RejectsBadShapes) {
    QUEST_REQUIRE_GPU();
    EXPECT_THROW(quest_workspace_sizes(8, 3, 128, 16, 64, 8, GqaPolicy::KvMax), std::invalid_argument);
    EXPECT_THROW(quest_workspace_sizes(8, 2, 96, 16, 64, 8, GqaPolicy::KvMax), std::invalid_argument);
    EXPECT_THROW(quest_workspace_sizes(8, 2, 128, 12, 64, 8, GqaPolicy::KvMax), std::invalid_argument);
    EXPECT_THROW(quest_workspace_sizes(8, 2, 128, 16, 64, 0, GqaPolicy::KvMax), std::invalid_argument);
    const QuestWorkspaceSizes z = quest_workspace_sizes(32, 32, 128, 16, 2048, 128, GqaPolicy::KvMax);
    EXPECT_EQ(z.rows, 32);
    EXPECT_EQ(z.scores, 32u * 2048u);
    EXPECT_EQ(z.selected, 32u * 128u);
    EXPECT_EQ(z.partial_o, static_cast<size_t>(32) * z.max_splits * 128);
    EXPECT_GE(z.max_splits * z.pages_per_split, 128);
    // The RoPE append folded into the scoring launch checks its arguments as rope_append_kv does (require_rope_append).
    std::mt19937 rng(5);
    const Shape s{8, 2, 64, 16, 40, 2, GqaPolicy::KvMax};
    const Cache c = make_cache(rng, s.num_kv_heads, s.head_dim, s.page_size, 64, s.len, true);
    Workspace w(s, c.max_pages);
    DeviceBuffer<__half> q(static_cast<size_t>(s.num_heads) * s.head_dim);
    DeviceBuffer<int> pos(1);
    QuestRopeAppend ra;
    ra.q_out = q.get();  // no qkv, no rotary table
    EXPECT_THROW(quest_page_scores(w.scores.get(), q.get(), c.view(), pos.get(), s.num_heads, s.page_budget, s.policy,
                                   nullptr, &ra),
                 std::invalid_argument);
    DeviceBuffer<float> qkv(static_cast<size_t>(s.num_heads + 2 * s.num_kv_heads) * s.head_dim);
    ra.qkv = qkv.get();  // the rotary table still missing
    EXPECT_THROW(quest_page_scores(w.scores.get(), q.get(), c.view(), pos.get(), s.num_heads, s.page_budget, s.policy,
                                   nullptr, &ra),
                 std::invalid_argument);
}

}  // namespace
}  // namespace quest
