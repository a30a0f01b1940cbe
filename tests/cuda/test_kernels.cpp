// Every dense CUDA op against its CPU reference: seeded random inputs (never zeros), rounded to fp16 where the GPU
// reads fp16 so that both sides see the same numbers, outputs poisoned with 0xFF (NaN) before the launch, realistic
// and odd sizes. Tolerances are relative L2 errors, stated per op.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cuda_test_util.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_decode.cuh"
#include "kernels/common/basic_ops.h"
#include "kernels/common/bias.cuh"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/select/quest.h"
#include "kernels/common/rope.cuh"
#include "model/core/config.h"
#include "model/core/rope.h"

using namespace quest;
using namespace quest::test;

namespace {

// fp16 outputs carry ~2^-11 relative rounding per element.
constexpr double kHalfOutTol = 1.5e-3;

}  // namespace

TEST(CudaOps, Embedding) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(1);
    const int V = 1000, dim = 4100, T = 5;
    auto table = random_floats(g, size_t(V) * dim);
    auto table_h = upload(to_half(table));
    std::vector<int> tokens = {0, 999, 17, 17, 500};
    auto d_tokens = upload(tokens);
    DeviceBuffer<float> out(size_t(T) * dim);
    out.fill_bytes(0xFF);
    embedding(out.get(), table_h.get(), d_tokens.get(), T, dim, V, nullptr);
    const auto got = out.download();
    for (int t = 0; t < T; ++t) {
        std::vector<float> want(dim);
        embedding_ref(want.data(), table.data(), tokens[t], dim);
        for (int i = 0; i < dim; ++i) ASSERT_EQ(got[size_t(t) * dim + i], want[i]) << t << "," << i;  // exact
    }
}

// A tensor-parallel rank's rows [first, first + rows) of a V-row table: its own ids give their row, every other id
// of the vocabulary zeros; the ranks' outputs summed are the whole table's embedding, exactly.
TEST(CudaOps, EmbeddingRowsOfARank) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(11);
    const int V = 1001, dim = 4100;
    auto table = random_floats(g, size_t(V) * dim);
    to_half(table);
    const std::vector<int> tokens = {0, 1000, 333, 334, 500, 17, 999};
    const int T = int(tokens.size());
    auto d_tokens = upload(tokens);
    std::vector<float> sum(size_t(T) * dim, 0.0f);
    for (const auto& [first, rows] : std::vector<std::pair<int, int>>{{0, 334}, {334, 334}, {668, 333}}) {
        std::vector<float> part(table.begin() + size_t(first) * dim, table.begin() + size_t(first + rows) * dim);
        auto part_h = upload(to_half(part));
        DeviceBuffer<float> out(size_t(T) * dim);
        out.fill_bytes(0xFF);
        embedding_rows(out.get(), part_h.get(), d_tokens.get(), T, dim, first, rows, nullptr);
        const auto got = out.download();
        for (int t = 0; t < T; ++t) {
            std::vector<float> want(dim, 0.0f);
            if (tokens[t] >= first && tokens[t] < first + rows) embedding_ref(want.data(), table.data(), tokens[t], dim);
            for (int i = 0; i < dim; ++i) {
                ASSERT_EQ(got[size_t(t) * dim + i], want[i]) << "rows from " << first << ", token " << tokens[t] << ", " << i;
                sum[size_t(t) * dim + i] += got[size_t(t) * dim + i];
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        std::vector<float> want(dim);
        embedding_ref(want.data(), table.data(), tokens[t], dim);
        for (int i = 0; i < dim; ++i) ASSERT_EQ(sum[size_t(t) * dim + i], want[i]) << t << "," << i;
    }
}

TEST(CudaOps, RmsNormWithResidual) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(2);
    for (int n : {64, 288, 4096, 5120, 8191}) {
        for (int rows : {1, 3}) {
            auto x = random_floats(g, size_t(rows) * n, 2.0f), r = random_floats(g, size_t(rows) * n);
            auto w = random_floats(g, n, 0.2f, 1.0f);
            auto dx = upload(x), dr = upload(r), dw = upload(w);
            DeviceBuffer<__half> out(size_t(rows) * n);
            out.fill_bytes(0xFF);
            rms_norm(out.get(), dx.get(), dr.get(), dw.get(), rows, n, 1e-5f, nullptr);
            std::vector<float> want(size_t(rows) * n), xs = x;
            for (int t = 0; t < rows; ++t) {
                add_inplace_ref(&xs[size_t(t) * n], &r[size_t(t) * n], n);
                rms_norm_ref(&want[size_t(t) * n], &xs[size_t(t) * n], w.data(), n, 1e-5f);
            }
            EXPECT_LE(rel_err(to_float(out.download()), want), kHalfOutTol) << n;
            EXPECT_LE(rel_err(dx.download(), xs), 1e-7) << "residual written back, n=" << n;
        }
    }
}

TEST(CudaOps, Swiglu) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(3);
    for (int F : {172, 11008}) {
        const int T = 3;
        auto gu = random_floats(g, size_t(T) * 2 * F, 2.0f);
        auto d = upload(gu);
        DeviceBuffer<__half> out(size_t(T) * F);
        out.fill_bytes(0xFF);
        swiglu(out.get(), d.get(), T, F, nullptr);
        std::vector<float> want(size_t(T) * F);
        for (int t = 0; t < T; ++t)
            swiglu_ref(&want[size_t(t) * F], &gu[size_t(t) * 2 * F], &gu[size_t(t) * 2 * F + F], F);
        EXPECT_LE(rel_err(to_float(out.download()), want), kHalfOutTol) << F;
    }
}

// fp32 accumulation of identical fp16 products: only the summation order differs.
TEST(CudaOps, GemvMatchesReferenceAtRealisticAndOddSizes) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(4);
    struct Shape { int rows, cols; };
    for (Shape s : {Shape{4096, 4096}, Shape{12288, 4096}, Shape{4096, 11008}, Shape{32000, 512}, Shape{37, 40},
                    Shape{5, 8}, Shape{172, 64}, Shape{64, 172}, Shape{1, 1}, Shape{33, 17}}) {
        auto W = random_floats(g, size_t(s.rows) * s.cols), x = random_floats(g, s.cols);
        auto dW = upload(to_half(W)), dx = upload(to_half(x));
        DeviceBuffer<float> y(s.rows);
        y.fill_bytes(0xFF);
        gemv(y.get(), dW.get(), dx.get(), s.rows, s.cols, nullptr);
        std::vector<float> want(s.rows);
        matvec_ref(want.data(), W.data(), x.data(), s.rows, s.cols);
        EXPECT_LE(rel_err(y.download(), want), 2e-6) << s.rows << "x" << s.cols;
    }
}

// cuBLAS with fp16 inputs and fp32 accumulation (tensor cores): products exact, sums in fp32.
TEST(CudaOps, GemmCublas) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(5);
    cublasHandle_t h;
    ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    struct Shape { int T, rows, cols; };
    for (Shape s : {Shape{1, 4096, 4096}, Shape{77, 768, 1024}, Shape{512, 344, 128}, Shape{3, 172, 64}, Shape{7, 64, 172}}) {
        auto W = random_floats(g, size_t(s.rows) * s.cols), X = random_floats(g, size_t(s.T) * s.cols);
        auto dW = upload(to_half(W)), dX = upload(to_half(X));
        DeviceBuffer<float> Y(size_t(s.T) * s.rows);
        Y.fill_bytes(0xFF);
        gemm_cublas(h, Y.get(), dW.get(), dX.get(), s.T, s.rows, s.cols, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> want(size_t(s.T) * s.rows);
        matmul_ref(want.data(), W.data(), X.data(), s.T, s.rows, s.cols, 1);
        EXPECT_LE(rel_err(Y.download(), want), 1e-5) << s.T << "x" << s.rows << "x" << s.cols;
    }
    cublasDestroy(h);
}

namespace {

// A layer's KV view over freshly allocated, poisoned device buffers.
struct DeviceKv {
    DeviceBuffer<__half> k, v, kmin, kmax;
    KvLayerView view;
    DeviceKv(int kv_heads, int D, int capacity, int S) {
        const int pages = (capacity + S - 1) / S;
        k = DeviceBuffer<__half>(size_t(kv_heads) * capacity * D);
        v = DeviceBuffer<__half>(k.size());
        kmin = DeviceBuffer<__half>(size_t(kv_heads) * pages * D);
        kmax = DeviceBuffer<__half>(kmin.size());
        for (auto* b : {&k, &v, &kmin, &kmax}) b->fill_bytes(0xFF);
        view = {k.get(), v.get(), kmin.get(), kmax.get(), kv_heads, D, capacity, S, pages};
    }
};

ModelConfig rope_config(const std::string& scaling, int D) {
    return parse_model_config(R"({"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "head_dim": )" + std::to_string(D) +
                                  R"(, "vocab_size": 10, "max_position_embeddings": 64 )" + scaling + "}",
                              "inline");
}

}  // namespace

// RoPE of every scaling type, the KV append, and the page metadata (O(1) per decoded token, rebuild after a chunk).
TEST(CudaOps, RopeAppendAndMetadata) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(6);
    const std::vector<std::string> scalings = {
        "", R"(, "rope_scaling": {"type": "linear", "factor": 4.0})",
        R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})",
        R"(, "rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16})",
        R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})"};
    for (const auto& scaling : scalings) {
        for (int D : {8, 64, 128}) {
            const ModelConfig c = rope_config(scaling, D);
            const int NH = 4, NKV = 2, S = 8, cap = 160, prompt = 100;
            DeviceKv kv(NKV, D, cap, S);
            const RopeFrequencies f = rope_frequencies(c, 1);
            auto inv = upload(f.inv_freq);
            RopeDeviceParams rp{inv.get(), f.attention_scaling, rope_depends_on_length(c), c.rope_theta, c.rope.factor,
                                c.max_position_embeddings, 0};
            DeviceBuffer<int> pos(1);
            std::vector<int> zero = {0};
            pos.upload(zero);
            const int row = (NH + 2 * NKV) * D;
            // Prefill chunk of `prompt` tokens, then 30 single tokens.
            auto qkv = random_floats(g, size_t(prompt) * row);
            auto dqkv = upload(qkv);
            DeviceBuffer<__half> q(size_t(prompt) * NH * D);
            q.fill_bytes(0xFF);
            rp.dynamic_len = prompt;
            rope_append_kv(q.get(), kv.view, dqkv.get(), pos.get(), prompt, NH, rp, nullptr);
            page_metadata_rebuild(kv.view, 0, (prompt - 1) / S, prompt, nullptr);
            advance_position(pos.get(), prompt, nullptr);
            // CPU: the same arithmetic on fp32 inputs.
            std::vector<float> kc(size_t(NKV) * cap * D), vc(kc.size());
            std::vector<float> q_want(size_t(prompt) * NH * D);
            const RopeFrequencies fp = rope_frequencies(c, prompt);
            for (int t = 0; t < prompt; ++t) {
                std::vector<float> r(qkv.begin() + size_t(t) * row, qkv.begin() + size_t(t + 1) * row);
                rope_ref(r.data(), NH + NKV, D, t, fp.inv_freq.data(), fp.attention_scaling);
                std::copy(r.begin(), r.begin() + NH * D, q_want.begin() + size_t(t) * NH * D);
                for (int h = 0; h < NKV; ++h)
                    for (int i = 0; i < D; ++i) {
                        kc[(size_t(h) * cap + t) * D + i] = r[NH * D + h * D + i];
                        vc[(size_t(h) * cap + t) * D + i] = r[(NH + NKV) * D + h * D + i];
                    }
            }
            EXPECT_LE(rel_err(to_float(q.download()), q_want), kHalfOutTol) << scaling << " D=" << D;
            rp.dynamic_len = 0;
            DeviceBuffer<__half> q1(size_t(NH) * D);
            for (int step = 0; step < 30; ++step) {
                const int t = prompt + step;
                auto one = random_floats(g, row);
                auto d1 = upload(one);
                rope_append_kv(q1.get(), kv.view, d1.get(), pos.get(), 1, NH, rp, nullptr);
                advance_position(pos.get(), 1, nullptr);
                const RopeFrequencies fs = rope_frequencies(c, t + 1);
                rope_ref(one.data(), NH + NKV, D, t, fs.inv_freq.data(), fs.attention_scaling);
                for (int h = 0; h < NKV; ++h)
                    for (int i = 0; i < D; ++i) {
                        kc[(size_t(h) * cap + t) * D + i] = one[NH * D + h * D + i];
                        vc[(size_t(h) * cap + t) * D + i] = one[(NH + NKV) * D + h * D + i];
                    }
                if (step == 29) {
                    EXPECT_LE(rel_err(to_float(q1.download()), std::vector<float>(one.begin(), one.begin() + NH * D)),
                              kHalfOutTol);
                }
            }
            const int len = prompt + 30;
            // Keys and values: compare the written positions only (the rest stays poisoned).
            const auto k_got = to_float(kv.k.download()), v_got = to_float(kv.v.download());
            std::vector<float> kg, kw, vg, vw;
            for (int h = 0; h < NKV; ++h)
                for (int t = 0; t < len; ++t)
                    for (int i = 0; i < D; ++i) {
                        const size_t o = (size_t(h) * cap + t) * D + i;
                        kg.push_back(k_got[o]);
                        kw.push_back(kc[o]);
                        vg.push_back(v_got[o]);
                        vw.push_back(vc[o]);
                    }
            EXPECT_LE(rel_err(kg, kw), kHalfOutTol) << scaling << " D=" << D;
            EXPECT_LE(rel_err(vg, vw), 1e-3) << scaling << " D=" << D;
            // Metadata: exactly the min and max of the stored fp16 keys of every page.
            const auto mn = to_float(kv.kmin.download()), mx = to_float(kv.kmax.download());
            const int pages = (len + S - 1) / S;
            for (int h = 0; h < NKV; ++h)
                for (int p = 0; p < pages; ++p)
                    for (int i = 0; i < D; ++i) {
                        float lo = INFINITY, hi = -INFINITY;
                        for (int t = p * S; t < std::min(len, (p + 1) * S); ++t) {
                            lo = std::min(lo, k_got[(size_t(h) * cap + t) * D + i]);
                            hi = std::max(hi, k_got[(size_t(h) * cap + t) * D + i]);
                        }
                        const size_t o = (size_t(h) * kv.view.max_pages + p) * D + i;
                        ASSERT_EQ(mn[o], lo) << "page " << p;
                        ASSERT_EQ(mx[o], hi) << "page " << p;
                    }
        }
    }
}

// Split-K decode attention against the fp32 reference on the same fp16 inputs; fp16 output.
// One split-K decode launch (attention_decode) on random K, V and q, workspace and output poisoned, against
// attention_full_ref over the window's tokens (window 0: all); `unwindowed` is the error against all tokens. The
// merging blocks must leave their counters zero.
namespace {
struct SplitKCase { int D, NKV, G, len, window, split, cap; };
struct SplitKErrors { double windowed, unwindowed; };
SplitKErrors run_split_k(std::mt19937& g, const SplitKCase& cs, bool balanced) {
    const int NH = cs.NKV * cs.G, D = cs.D;
    DeviceKv kv(cs.NKV, D, cs.cap, 16);
    kv.view.window = cs.window;
    auto k = random_floats(g, kv.k.size()), v = random_floats(g, kv.v.size());
    auto q = random_floats(g, size_t(NH) * D, 0.5f);
    kv.k.upload(to_half(k));
    kv.v.upload(to_half(v));
    auto dq = upload(to_half(q));
    DeviceBuffer<int> pos(1);
    pos.upload(std::vector<int>{cs.len - 1});
    // The smallest workspace (spans of split tokens) or the balancing one (decode_max_splits: whole waves).
    const int splits = balanced ? decode_max_splits(cs.cap, cs.split) : ceil_div(cs.cap, cs.split);
    DeviceBuffer<float> wsb(split_workspace_floats(NH, D, splits));
    wsb.fill_bytes(0xFF);
    DeviceBuffer<int> counters(cs.NKV);
    counters.fill_bytes(0);
    SplitWorkspace ws{wsb.get(), wsb.get() + size_t(NH) * splits * D, counters.get(), splits};
    DeviceBuffer<__half> out(size_t(NH) * D);
    out.fill_bytes(0xFF);
    const float scale = 1.0f / std::sqrt(float(D));
    attention_decode(out.get(), dq.get(), kv.view, pos.get(), NH, scale, cs.split, ws, nullptr);
    std::vector<float> want(size_t(NH) * D), unwindowed(want.size());
    for (int h = 0; h < NH; ++h) {
        const int kvh = h / cs.G;
        const float *qh = &q[size_t(h) * D], *kh = &k[size_t(kvh) * cs.cap * D], *vh = &v[size_t(kvh) * cs.cap * D];
        attention_full_ref(&want[size_t(h) * D], qh, kh, vh, D, cs.len, scale, window_start_of(cs.len, cs.window));
        attention_full_ref(&unwindowed[size_t(h) * D], qh, kh, vh, D, cs.len, scale);
    }
    for (int c : counters.download()) EXPECT_EQ(c, 0) << "the merging block resets its counter";
    const auto got = to_float(out.download());
    return {rel_err(got, want), rel_err(got, unwindowed)};
}
}  // namespace

TEST(CudaOps, AttentionDecodeSplitK) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(7);
    for (SplitKCase cs : {SplitKCase{128, 2, 1, 4096, 0, 256, 4200}, SplitKCase{128, 1, 4, 1000, 0, 256, 1024},
                          SplitKCase{64, 2, 8, 333, 0, 64, 400}, SplitKCase{8, 4, 2, 130, 0, 32, 512},
                          SplitKCase{16, 1, 1, 1, 0, 256, 16}, SplitKCase{32, 3, 2, 257, 0, 256, 300},
                          SplitKCase{256, 1, 2, 700, 0, 128, 800}, SplitKCase{64, 3, 3, 1000, 0, 128, 1024},
                          SplitKCase{128, 8, 1, 32768, 0, 256, 32768}, SplitKCase{128, 8, 1, 40000, 0, 1024, 49152}})
        for (const bool balanced : {false, true})
            EXPECT_LE(run_split_k(g, cs, balanced).windowed, 2e-3)
                << "D=" << cs.D << " G=" << cs.G << " len=" << cs.len << " balanced=" << balanced;
}

// Qwen2's q/k/v bias add against add_inplace_ref per row, at odd sizes (one decode row, a prefill chunk).
TEST(CudaOps, AddBiasRows) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(19);
    for (auto [rows, n] : {std::pair{1, 896 + 2 * 128}, std::pair{7, 37}, std::pair{2048, 1152}}) {
        auto y = random_floats(g, size_t(rows) * n), b = random_floats(g, n);
        auto dy = upload(y), db = upload(b);
        add_bias_rows(dy.get(), db.get(), rows, n, nullptr);
        for (int t = 0; t < rows; ++t) add_inplace_ref(&y[size_t(t) * n], b.data(), n);
        EXPECT_EQ(dy.download(), y) << rows << " x " << n;  // one fp32 add per element: exact
    }
}

// A sliding window (KvLayerView::window): the query attends the last `window` tokens; spans are cut over those.
TEST(CudaOps, AttentionDecodeSlidingWindow) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(17);
    for (SplitKCase cs : {SplitKCase{128, 2, 1, 4096, 1000, 256, 4200}, SplitKCase{64, 2, 4, 333, 24, 64, 400},
                          SplitKCase{32, 1, 3, 257, 1, 32, 300}, SplitKCase{64, 1, 2, 50, 64, 64, 64},
                          SplitKCase{128, 8, 1, 32768, 4096, 256, 32768}, SplitKCase{16, 2, 8, 700, 699, 128, 800}}) {
        const SplitKErrors e = run_split_k(g, cs, true);
        EXPECT_LE(e.windowed, 2e-3) << "D=" << cs.D << " len=" << cs.len << " window=" << cs.window;
        if (cs.window < cs.len) EXPECT_GT(e.unwindowed, 1e-2) << "the window changes the output";
    }
}

// The same launch replayed with a growing device-side length (what the captured graph does each step).
TEST(CudaOps, AttentionDecodeInsideAGraphFollowsTheDeviceLength) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(8);
    const int D = 64, NKV = 2, G = 4, NH = NKV * G, cap = 600, split = 128;
    DeviceKv kv(NKV, D, cap, 16);
    auto k = random_floats(g, kv.k.size()), v = random_floats(g, kv.v.size()), q = random_floats(g, NH * D, 0.5f);
    kv.k.upload(to_half(k));
    kv.v.upload(to_half(v));
    auto dq = upload(to_half(q));
    DeviceBuffer<int> pos(1);
    std::vector<int> p0 = {0};
    pos.upload(p0);
    const int splits = decode_max_splits(cap, split);  // the span count changes with the length inside the graph
    DeviceBuffer<float> wsb(split_workspace_floats(NH, D, splits));
    DeviceBuffer<int> counters(NKV);
    counters.fill_bytes(0);
    SplitWorkspace ws{wsb.get(), wsb.get() + size_t(NH) * splits * D, counters.get(), splits};
    DeviceBuffer<__half> out(size_t(NH) * D);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    attention_decode(out.get(), dq.get(), kv.view, pos.get(), NH, 0.125f, split, ws, s);  // warm-up (attributes)
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    attention_decode(out.get(), dq.get(), kv.view, pos.get(), NH, 0.125f, split, ws, s);
    advance_position(pos.get(), 97, s);
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    pos.upload(p0);
    for (int step = 0; step < 6; ++step) {
        const int len = 1 + 97 * step;
        out.fill_bytes(0xFF);
        CUDA_CHECK(cudaGraphLaunch(exec, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        std::vector<float> want(size_t(NH) * D);
        for (int h = 0; h < NH; ++h)
            attention_full_ref(&want[size_t(h) * D], &q[size_t(h) * D], &k[size_t(h / G) * cap * D],
                               &v[size_t(h / G) * cap * D], D, len, 0.125f);
        EXPECT_LE(rel_err(to_float(out.download()), want), 2e-3) << "len=" << len;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
}

TEST(CudaOps, ConvertToHalfClampsAndCounts) {
    QUEST_REQUIRE_GPU();
    std::vector<float> src = {1.0f, -2.5f, 70000.0f, -1e10f, 65504.0f, 3.14159f, NAN};
    auto d = upload(src);
    DeviceBuffer<__half> out(src.size());
    DeviceBuffer<unsigned long long> count(1);
    count.fill_bytes(0);
    convert_to_half(out.get(), d.get(), DType::F32, src.size(), count.get(), nullptr);
    const auto got = to_float(out.download());
    EXPECT_EQ(got[0], 1.0f);
    EXPECT_EQ(got[1], -2.5f);
    EXPECT_EQ(got[2], 65504.0f);
    EXPECT_EQ(got[3], -65504.0f);
    EXPECT_EQ(got[4], 65504.0f);
    EXPECT_NEAR(got[5], 3.14159f, 2e-3);
    EXPECT_TRUE(std::isnan(got[6]));
    EXPECT_EQ(count.download()[0], 3u);  // two out of range, one NaN
    // BF16 source.
    std::vector<uint16_t> bf = {float_to_bf16(1.5f), float_to_bf16(1e6f), float_to_bf16(-0.25f)};
    DeviceBuffer<uint16_t> dbf(bf.size());
    dbf.upload(bf);
    count.fill_bytes(0);
    DeviceBuffer<__half> out2(3);
    convert_to_half(out2.get(), dbf.get(), DType::BF16, 3, count.get(), nullptr);
    const auto got2 = to_float(out2.download());
    EXPECT_EQ(got2[0], 1.5f);
    EXPECT_EQ(got2[1], 65504.0f);
    EXPECT_EQ(got2[2], -0.25f);
    EXPECT_EQ(count.download()[0], 1u);
}
