// The oracle selector on the GPU (kernels/select/page_oracle.cuh) against its CPU reference: attention_page_mass_ref
// (kernels/attention/attention.h) for the page masses, oracle_policy_ref through quest_select_ref (kernels/select/quest.h) for the
// selection; a captured graph against eager launches; the CUDA backend with --selector oracle against the CPU backend.
//
// Inputs: seeded random fp16 q and keys (N(0,1), never all zero; keys get a per-page offset along a per-KV-head
// direction so the page masses spread out), rounded before the CPU sees them (to_half); keys beyond len are NaN on the
// device. Outputs are poisoned (0xFF bytes: NaN floats, page id -1) before every launch, so an entry that should have
// been written and was not, or one written beyond its count, shows.
//
// Tolerances:
//   masses     |gpu - cpu| <= 1e-6 + 1e-3 * cpu per (head, page). Both sides are fp32: the reference rounds each
//              token's share exp(l - max) / denom and sums a page's shares in fp32 (~S ulps), the GPU computes
//              exp(lse_p - M) / Z from the page's log-sum-exp (a few ulps of |lse| ~ 10-20); observed errors are
//              ~1e-6 relative (the worst is printed). Each head's masses sum to 1 within 1e-4.
//   selection  identical page sets, except where they differ: every swapped page (picked by one side only) must have
//              a reference row score within kNearTie of every other swapped page's: hi - lo <= 1e-9 + 1e-4 * hi, i.e.
//              a near-tie at the (K-1)-th place. Such rows are counted, printed, and bounded (<= 10% of the rows).
//   graph      bit-identical to eager launches (selected rows, poison included, and the attention output).
//   model      logits rel_err <= 5e-2 per step against the CPU backend on the same fp16-rounded weights (the CUDA
//              model tests' tolerance), and the same greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "follow_cpu.h"
#include "model/core/backend.h"
#include "engine/eval.h"
#include "model/core/quest_settings.h"
#include "kernels/attention/attention.h"
#include "kernels/select/page_oracle.cuh"
#include "kernels/select/quest.cuh"
#include "kernels/select/quest.h"
#include "model/cpu/llama_cpu.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace quest {
namespace {

using test::to_half;

int ceil_div_i(int a, int b) { return (a + b - 1) / b; }

struct Shape {
    int num_heads, num_kv_heads, head_dim, page_size, len, page_budget;
    GqaPolicy policy = GqaPolicy::KvMax;
};

std::string describe(const Shape& s) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "H=%d Hkv=%d D=%d S=%d len=%d K=%d %s", s.num_heads, s.num_kv_heads, s.head_dim,
                  s.page_size, s.len, s.page_budget, std::string(gqa_policy_name(s.policy)).c_str());
    return buf;
}

// One layer's keys and values (host: fp16-exact floats [hkv][cap][d]; device: fp16, NaN from valid_len on) and q.
struct OracleInput {
    test::LayerCache c;
    std::vector<float> q;  // [num_heads][head_dim], fp16-exact
    DeviceBuffer<__half> dq;
};

OracleInput make_input(const Shape& s, int cap, int valid_len, uint32_t seed) {
    std::mt19937 rng(seed);
    OracleInput in;
    test::LayerCache& c = in.c;
    c = test::LayerCache::empty(s.num_kv_heads, s.head_dim, s.page_size, cap);
    const test::PageSpread spread(rng, c.hkv, c.d, c.max_pages);
    test::fill_paged_kv(c, rng, valid_len, spread.dir, spread.off);
    // The oracle reads no page metadata: NaN on the device (a read would poison the result).
    c.dmin = DeviceBuffer<__half>(c.kmin.size());
    c.dmax = DeviceBuffer<__half>(c.kmax.size());
    c.dmin.fill_bytes(0xFF);
    c.dmax.fill_bytes(0xFF);
    in.q = test::random_floats(rng, static_cast<size_t>(s.num_heads) * s.head_dim);
    in.dq = DeviceBuffer<__half>(in.q.size());
    in.dq.upload(to_half(in.q));
    return in;
}

QuestSelectArgs reference_args(const Shape& s, const OracleInput& in) {
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
    a.selector = PageSelector::Oracle;
    a.keys = in.c.k.data();
    a.key_capacity = in.c.cap;
    a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    return a;
}

// The reference row score of every complete page of selection row r: each head's attention_page_mass_ref,
// aggregated as oracle_policy_ref does (kv-max: max; kv-sum: sum in head order; per-head: the head's).
std::vector<float> reference_row_scores(const Shape& s, const OracleInput& in, int r) {
    const int G = s.num_heads / s.num_kv_heads, P = ceil_div_i(s.len, s.page_size);
    const bool per_head = s.policy == GqaPolicy::PerHead;
    const int kvh = per_head ? r / G : r, h0 = per_head ? r : r * G, nh = per_head ? 1 : G;
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    std::vector<float> mass(P), row(P - 1);
    for (int g = 0; g < nh; ++g) {
        attention_page_mass_ref(mass.data(), in.q.data() + static_cast<size_t>(h0 + g) * s.head_dim, in.c.kh(kvh),
                                s.head_dim, s.len, s.page_size, scale);
        for (int p = 0; p < P - 1; ++p)
            row[p] = g == 0 ? mass[p] : s.policy == GqaPolicy::KvSum ? row[p] + mass[p] : std::max(row[p], mass[p]);
    }
    return row;
}

struct SelectStats {
    int rows = 0, near_ties = 0;
};

// Checks a GPU selection (rows of stride K, poisoned with -1 beyond the written count) against the reference's
// page sets, with the near-tie rule of the header.
void check_selection(const Shape& s, const OracleInput& in, const std::vector<int>& sel, SelectStats& st) {
    const int G = s.num_heads / s.num_kv_heads, K = s.page_budget, P = ceil_div_i(s.len, s.page_size);
    const int rows = quest_selection_rows(s.num_heads, s.num_kv_heads, s.policy), cnt = std::min(P, K);
    std::vector<std::vector<int>> ref;
    quest_select_ref(reference_args(s, in), ref);
    for (int r = 0; r < rows; ++r) {
        ++st.rows;
        const int* row = sel.data() + static_cast<size_t>(r) * K;
        for (int i = cnt; i < K; ++i) ASSERT_EQ(row[i], -1) << "row " << r << ": entry " << i << " beyond the count";
        const std::vector<int> got(row, row + cnt);
        const std::vector<int>& want = ref[s.policy == GqaPolicy::PerHead ? r : r * G];
        ASSERT_EQ(static_cast<int>(want.size()), cnt);
        if (got == want) continue;
        // Only a selecting step may differ, and only in complete pages swapped at a near-tie.
        ASSERT_GT(P, K) << "row " << r << ": a dense step selects every page";
        for (int i = 0; i < cnt; ++i)
            ASSERT_TRUE(got[i] >= 0 && got[i] < P && (i == 0 || got[i] > got[i - 1])) << "row " << r << " not ascending";
        ASSERT_EQ(got.back(), P - 1) << "row " << r << ": the last page must be selected";
        std::vector<int> swapped;
        std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(swapped));
        const std::vector<float> score = reference_row_scores(s, in, r);
        float lo = INFINITY, hi = -INFINITY;
        for (int p : swapped) {
            ASSERT_LT(p, P - 1) << "row " << r;
            lo = std::min(lo, score[p]);
            hi = std::max(hi, score[p]);
        }
        const bool near_tie = hi - lo <= 1e-9f + 1e-4f * hi;
        EXPECT_TRUE(near_tie) << "row " << r << ": " << swapped.size() << " swapped pages with reference scores in ["
                              << lo << ", " << hi << "]";
        st.near_ties += near_tie;
    }
}

// The workspace of oracle_select + attention_decode_sparse (quest_workspace_sizes plus the page log-sum-exps).
// The Quest buffers and the oracle's page log-sum-exps.
struct Workspace : test::QuestBuffers {
    DeviceBuffer<float> lse;
    Workspace(const Shape& s, int max_pages)
        : QuestBuffers(s, max_pages), lse(oracle_workspace_floats(s.num_heads, max_pages)) {}
    void poison() {
        QuestBuffers::poison();
        lse.fill_bytes(0xFF);
    }
};

// ---------------------------------------------------------------------------------------------------------------------
// 1. Page masses (oracle_page_lse + oracle_row_scores' mass output) against attention_page_mass_ref, every head and
//    page; nothing written beyond the sequence's pages.
// ---------------------------------------------------------------------------------------------------------------------
TEST(PageOracleCuda, PageMassesMatchReference) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {32, 8, 128, 16, 4099, 1},  // Llama-2-7B-like heads with GQA 4:1, a partial last page
        {4, 4, 64, 8, 37, 1},       // odd sizes, group 1
        {8, 2, 64, 8, 37, 1},       // odd sizes, group 4
        {32, 2, 64, 16, 1000, 1},   // group 16: two batches of 8 heads over the keys
        {8, 1, 256, 32, 999, 1},    // head_dim 256 (one key row per warp load), group 8
        {6, 2, 8, 1, 50, 1},        // head_dim 8, one-token pages, group 3
        {16, 4, 128, 16, 2048, 1},  // the last page full
    };
    uint32_t seed = 100;
    double worst = 0;
    for (const Shape& s : shapes) {
        SCOPED_TRACE(describe(s));
        const int P = ceil_div_i(s.len, s.page_size), cap = (P + 2) * s.page_size, mp = cap / s.page_size;
        const OracleInput in = make_input(s, cap, s.len, seed++);
        DeviceBuffer<float> lse(oracle_workspace_floats(s.num_heads, mp)), mass(lse.size());
        DeviceBuffer<float> scores(static_cast<size_t>(s.num_kv_heads) * mp);
        for (DeviceBuffer<float>* b : {&lse, &mass, &scores}) b->fill_bytes(0xFF);
        DeviceBuffer<int> dpos(1);
        dpos.upload(std::vector<int>{s.len - 1});
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
        oracle_page_lse(lse.get(), in.dq.get(), in.c.view(), dpos.get(), s.num_heads, s.page_budget, scale, nullptr);
        oracle_row_scores(scores.get(), mass.get(), lse.get(), dpos.get(), s.num_heads, s.num_kv_heads, mp,
                          s.page_size, s.page_budget, GqaPolicy::KvMax, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got = mass.download(), got_lse = lse.download(), got_scores = scores.download();
        const int G = s.num_heads / s.num_kv_heads;
        std::vector<float> ref(P);
        for (int h = 0; h < s.num_heads; ++h) {
            attention_page_mass_ref(ref.data(), in.q.data() + static_cast<size_t>(h) * s.head_dim, in.c.kh(h / G),
                                    s.head_dim, s.len, s.page_size, scale);
            const float* g = got.data() + static_cast<size_t>(h) * mp;
            double sum = 0;
            for (int p = 0; p < P; ++p) {
                ASSERT_TRUE(std::isfinite(g[p]) && std::isfinite(got_lse[static_cast<size_t>(h) * mp + p]))
                    << "head " << h << " page " << p << " not written";
                EXPECT_LE(std::fabs(g[p] - ref[p]), 1e-6 + 1e-3 * ref[p]) << "head " << h << " page " << p;
                worst = std::max(worst, std::fabs(double(g[p]) - ref[p]) / std::max(double(ref[p]), 1e-30));
                sum += g[p];
            }
            EXPECT_NEAR(sum, 1.0, 1e-4) << "head " << h;
            for (int p = P; p < mp; ++p) {
                ASSERT_TRUE(std::isnan(g[p])) << "head " << h << ": mass written beyond the pages, at " << p;
                ASSERT_TRUE(std::isnan(got_lse[static_cast<size_t>(h) * mp + p])) << "head " << h << ": lse at " << p;
            }
        }
        // The kv-max row scores: the complete pages only, each the max of its group's masses.
        for (int r = 0; r < s.num_kv_heads; ++r)
            for (int p = 0; p < mp; ++p) {
                const float v = got_scores[static_cast<size_t>(r) * mp + p];
                if (p >= P - 1) {
                    ASSERT_TRUE(std::isnan(v)) << "row " << r << ": score written at page " << p;
                    continue;
                }
                float m = got[static_cast<size_t>(r * G) * mp + p];
                for (int g = 1; g < G; ++g) m = std::max(m, got[static_cast<size_t>(r * G + g) * mp + p]);
                ASSERT_EQ(v, m) << "row " << r << " page " << p;
            }
    }
    std::printf("[oracle masses] worst relative error %.3g\n", worst);
}

// A dense step (P <= K) and a length beyond the cache write nothing in steps 1 and 2.
TEST(PageOracleCuda, DenseStepWritesNoScores) {
    QUEST_REQUIRE_GPU();
    const Shape s{8, 2, 64, 16, 300, 19};  // P = 19 <= K
    const int cap = 320, mp = cap / s.page_size;
    const OracleInput in = make_input(s, cap, cap, 7);
    DeviceBuffer<float> lse(oracle_workspace_floats(s.num_heads, mp)), scores(static_cast<size_t>(s.num_heads) * mp);
    DeviceBuffer<int> dpos(1);
    for (int len : {300, 1, 16, cap + 1}) {
        SCOPED_TRACE("len " + std::to_string(len));
        lse.fill_bytes(0xFF);
        scores.fill_bytes(0xFF);
        dpos.upload(std::vector<int>{len - 1});
        oracle_page_lse(lse.get(), in.dq.get(), in.c.view(), dpos.get(), s.num_heads, s.page_budget, 0.125f, nullptr);
        oracle_row_scores(scores.get(), nullptr, lse.get(), dpos.get(), s.num_heads, s.num_kv_heads, mp, s.page_size,
                          s.page_budget, GqaPolicy::PerHead, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (float x : lse.download()) ASSERT_TRUE(std::isnan(x));
        for (float x : scores.download()) ASSERT_TRUE(std::isnan(x));
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// 2. Selections (oracle_select) against oracle_policy_ref for the three GQA policies: realistic and odd sizes, B < 2S
//    (K = 1: the last page only), B >= context (dense), a group of 16.
// ---------------------------------------------------------------------------------------------------------------------
TEST(PageOracleCuda, SelectionMatchesReference) {
    QUEST_REQUIRE_GPU();
    const std::vector<Shape> shapes = {
        {32, 8, 128, 16, 4099, 64},   // B = 1024 of 4099
        {32, 8, 128, 16, 4099, 1},    // K = 1 (B < 2S): the last page only
        {32, 8, 128, 16, 4099, 300},  // B >= context: dense
        {4, 4, 64, 8, 37, 2},         // odd sizes, group 1
        {8, 2, 64, 8, 37, 3},         // odd sizes, group 4
        {8, 2, 64, 8, 37, 1},         // odd sizes, K = 1
        {32, 2, 64, 16, 2000, 20},    // group 16
        {16, 4, 128, 16, 2048, 32},   // the last page full
        {8, 1, 256, 32, 999, 4},      // head_dim 256, group 8
    };
    SelectStats st;
    uint32_t seed = 200;
    for (const Shape& base : shapes)
        for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
            Shape s = base;
            s.policy = pol;
            SCOPED_TRACE(describe(s));
            const int P = ceil_div_i(s.len, s.page_size), cap = (P + 1) * s.page_size;
            const OracleInput in = make_input(s, cap, s.len, seed++);
            Workspace w(s, cap / s.page_size);
            w.poison();
            DeviceBuffer<int> dpos(1);
            dpos.upload(std::vector<int>{s.len - 1});
            oracle_select(w.selected.get(), w.scores.get(), w.lse.get(), in.dq.get(), in.c.view(), dpos.get(),
                          s.num_heads, s.page_budget, s.policy, 1.0f / std::sqrt(static_cast<float>(s.head_dim)),
                          nullptr);
            CUDA_CHECK(cudaDeviceSynchronize());
            check_selection(s, in, w.selected.download(), st);
        }
    std::printf("[oracle selection] %d rows, %d near-tied swaps\n", st.rows, st.near_ties);
    EXPECT_LE(st.near_ties, st.rows / 10);
}

// ---------------------------------------------------------------------------------------------------------------------
// 3. One captured graph (oracle_select + attention_decode_sparse), replayed at several lengths (only *d_pos changes),
//    against eager launches at the same lengths: bit-identical selections and outputs.
// ---------------------------------------------------------------------------------------------------------------------
TEST(PageOracleCuda, GraphReplayEqualsEagerLaunches) {
    QUEST_REQUIRE_GPU();
    for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::PerHead}) {
        const Shape base{16, 4, 128, 16, 2048, 16, pol};
        SCOPED_TRACE(gqa_policy_name(pol));
        const int cap = 2048;
        const OracleInput in = make_input(base, cap, cap, pol == GqaPolicy::KvMax ? 31 : 32);  // every token valid
        Workspace w(base, cap / base.page_size);
        DeviceBuffer<__half> dout(in.q.size());
        DeviceBuffer<int> dpos(1);
        const float scale = 1.0f / std::sqrt(static_cast<float>(base.head_dim));
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        auto enqueue = [&] {
            oracle_select(w.selected.get(), w.scores.get(), w.lse.get(), in.dq.get(), in.c.view(), dpos.get(),
                          base.num_heads, base.page_budget, pol, scale, stream);
            attention_decode_sparse(dout.get(), in.dq.get(), in.c.view(), dpos.get(), w.selected.get(),
                                    base.num_heads, base.page_budget, pol, scale, w.ws(), stream);
        };
        // Poisoned buffers and the position, settled before the (non-blocking) stream runs.
        auto prepare = [&](int len) {
            w.poison();
            dout.fill_bytes(0xFF);
            dpos.upload(std::vector<int>{len - 1});
            CUDA_CHECK(cudaDeviceSynchronize());
        };
        prepare(cap);
        enqueue();  // warm-up: one-time attribute set-up outside the capture
        CUDA_CHECK(cudaStreamSynchronize(stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        enqueue();
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        SelectStats st;
        for (int len : {1000, 257, 2048, 100, 1000}) {  // 100: a dense step (P = 7 <= K)
            SCOPED_TRACE("len " + std::to_string(len));
            prepare(len);
            enqueue();
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const std::vector<int> eager_sel = w.selected.download();
            const std::vector<__half> eager_out = dout.download();
            prepare(len);
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            const std::vector<int> graph_sel = w.selected.download();
            const std::vector<__half> graph_out = dout.download();
            EXPECT_EQ(graph_sel, eager_sel);
            ASSERT_EQ(graph_out.size(), eager_out.size());
            EXPECT_EQ(std::memcmp(graph_out.data(), eager_out.data(), eager_out.size() * sizeof(__half)), 0)
                << "attention outputs differ";
            for (float x : test::to_float(graph_out)) ASSERT_TRUE(std::isfinite(x));
            Shape s = base;
            s.len = len;
            check_selection(s, in, graph_sel, st);
        }
        std::printf("[oracle graph %s] %d rows, %d near-tied swaps\n", std::string(gqa_policy_name(pol)).c_str(),
                    st.rows, st.near_ties);
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
        CUDA_CHECK(cudaStreamDestroy(stream));
    }
}

TEST(PageOracleCuda, RejectsBadArguments) {
    QUEST_REQUIRE_GPU();
    const Shape s{8, 2, 64, 16, 100, 4};
    const OracleInput in = make_input(s, 128, 100, 5);
    DeviceBuffer<float> lse(oracle_workspace_floats(8, 8)), scores(64);
    DeviceBuffer<int> dpos(1), sel(64);
    KvLayerView kv = in.c.view();
    EXPECT_THROW(oracle_page_lse(nullptr, in.dq.get(), kv, dpos.get(), 8, 4, 0.125f, nullptr), std::invalid_argument);
    EXPECT_THROW(oracle_page_lse(lse.get(), in.dq.get(), kv, dpos.get(), 7, 4, 0.125f, nullptr), std::invalid_argument);
    EXPECT_THROW(oracle_page_lse(lse.get(), in.dq.get(), kv, dpos.get(), 8, 0, 0.125f, nullptr), std::invalid_argument);
    EXPECT_THROW(oracle_page_lse(lse.get(), in.dq.get(), kv, dpos.get(), 8, 4, 0.0f, nullptr), std::invalid_argument);
    EXPECT_THROW(oracle_row_scores(scores.get(), nullptr, lse.get(), dpos.get(), 8, 2, 8, 12, 4, GqaPolicy::KvMax,
                                   nullptr),
                 std::invalid_argument);  // page size not a power of two
    kv.head_dim = 48;
    EXPECT_THROW(oracle_page_lse(lse.get(), in.dq.get(), kv, dpos.get(), 8, 4, 0.125f, nullptr), std::invalid_argument);
    kv = in.c.view();
    EXPECT_THROW(oracle_select(nullptr, scores.get(), lse.get(), in.dq.get(), kv, dpos.get(), 8, 4, GqaPolicy::KvMax,
                               0.125f, nullptr),
                 std::invalid_argument);
}

// The CUDA memory plan counts the oracle's page log-sum-exps (one layer's [num_heads][pages] floats).
TEST(PageOracleCuda, MemoryPlanCountsTheWorkspace) {
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 8192})",
        "inline");
    QuestSettings q;
    q.selector = PageSelector::Quest;  // no selector workspace
    q.page_size = 16;
    q.budget = 256;
    const size_t quest_ws = plan_memory(c, q, 8192, {}).workspace;
    q.selector = PageSelector::Oracle;
    const MemoryPlan oracle = plan_memory(c, q, 8192, {});
    EXPECT_EQ(oracle.workspace - quest_ws, size_t{8} * (8192 / 16) * 4);
}

// ---------------------------------------------------------------------------------------------------------------------
// 4. The CUDA backend with --selector oracle on the trained demo model (models/demo) follows the CPU backend (same
//    fp16-rounded weights) through quest eval's pass-key protocol (prefill, the question token by token, then greedy
//    decoding): logits at every step and the greedy tokens, for every GQA policy, at B = 64 of about 1024 tokens.
// ---------------------------------------------------------------------------------------------------------------------
TEST(PageOracleCuda, TrainedModelFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const auto demo = test::trained_demo(test::source_dir() / "models/demo");
    if (!demo) GTEST_SKIP() << "SKIPPED: models/demo is absent";
    const auto& [m, tok, w] = *demo;
    const PasskeyPrompt p = make_passkey_prompt(tok, 1024, 0.5, 12345);
    const int gen = 6;  // the 5-digit key and the '.' after it
    const int cap = static_cast<int>(p.prefill.size() + p.question.size()) + gen + 8;
    for (GqaPolicy pol : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        QuestSettings q;
        q.page_size = 16;
        q.budget = 64;
        q.gqa_policy = pol;
        q.selector = PageSelector::Oracle;
        SCOPED_TRACE(q.describe());
        CpuLlama cpu(w, q, cap);
        auto gpu = CudaLlama::from_folder(m, q, cap);
        QuestSettings qq = q;
        qq.selector = PageSelector::Quest;
        auto gpu_quest = CudaLlama::from_folder(m, qq, cap);
        cpu.prefill(p.prefill);
        gpu->prefill(p.prefill);
        gpu_quest->prefill(p.prefill);
        // The bytes model (both at the prompt's end, a selecting step): the oracle reads every key where Quest reads
        // the complete pages' fp16 min/max.
        {
            const size_t len = static_cast<size_t>(gpu->position()), P = (len + 15) / 16;
            const size_t layers = static_cast<size_t>(m.config.num_layers - q.dense_layers);
            const size_t per_layer_head_oracle = len * 2 * m.config.head_dim;
            const size_t per_layer_head_quest = (P - 1) * 4 * m.config.head_dim;
            EXPECT_EQ(gpu->decode_bytes() + layers * m.config.num_kv_heads * per_layer_head_quest,
                      gpu_quest->decode_bytes() + layers * m.config.num_kv_heads * per_layer_head_oracle);
        }
        const test::FollowCpu f = test::follow_cpu(cpu, *gpu, *gpu_quest, p.question, gen);
        EXPECT_EQ(f.gpu_tokens, f.cpu_tokens) << "cpu: " << tok.decode(f.cpu_tokens) << " | gpu: " << tok.decode(f.gpu_tokens);
        std::printf("[oracle %s] key %d: cpu \"%s\" gpu \"%s\"; worst logits rel_err %.3g (vs gpu quest %.3g)\n",
                    std::string(gqa_policy_name(pol)).c_str(), p.key, tok.decode(f.cpu_tokens).c_str(),
                    tok.decode(f.gpu_tokens).c_str(), f.worst, f.vs_other);
        // The oracle path really runs: Quest at the same budget selects other pages somewhere along the question.
        EXPECT_GT(f.vs_other, 2 * f.worst) << "oracle and quest must differ at B = 64 of ~1024 tokens";
    }
}

}  // namespace
}  // namespace quest
