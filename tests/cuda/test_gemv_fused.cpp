// The decode step's fused GEMV epilogues (kernels/linear/gemv_epilogue.h) against the composition of the unfused kernels
// they replace, FP16 (gemv.cuh, variant 0's kernel) and int4 (gemv_int4.cuh, the kernel gemv_int4 runs on the shape):
//   scaled   = rms_norm + gemv                       (qkv, lm_head)
//   swiglu   = rms_norm + gemv + swiglu, gate and up rows interleaved (gate+up)
//   residual = gemv + the residual add of rms_norm, plus xg = fp16(x g) and ss = sum x^2   (o, down)
// at Llama-2-7B shapes and odd ones (rows that do not fill a block or a tile, narrow rows), outputs poisoned (NaN)
// so that unwritten elements show; the residual epilogue's per-block partial sums of squares (what the consumer adds)
// bit-identical run to run; the whole chain in a captured graph replayed with new inputs; embedding_norm_prep and swiglu_interleaved; and
// the model with the fused decode step against the same model with the separate kernels.
//
// Tolerances (relative L2): the fused input is fp16(x g) instead of fp16(g (x inv)): one fp16 rounding of every input
// element either way, at different points, so the two outputs differ by about 2^-11 relative (FP16 GEMV, fp32 sums:
// 2e-3 allowed; int4, fp16 partial sums of 8 products on both sides: 3e-3, the int4 GEMV's own tolerance). SwiGLU's
// fp16 output adds its own rounding (3e-3 / 5e-3). The residual add uses the same row sums as the unfused GEMV of
// the same kernel: x is compared bit for bit; xg is fp16(x g) of that x (1e-3: one fp16 rounding of the same
// product); ss (the sum of the partials) is a sum of 4096 squares in another order (1e-5). The chain of four GEMVs: 5e-3 (FP16), 1e-2 (int4)
// on its output, 2e-3 on the residual stream.
// The model: 2e-2 on the logits, the CUDA-vs-CPU tolerance of the other model tests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "kernels/common/basic_ops.h"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/quant.h"
#include "model/core/config.h"
#include "model/cuda/llama_cuda.h"

using namespace quest;
using namespace quest::test;

namespace {

constexpr float kEps = 1e-5f;
constexpr double kHalfOutTol = 1.5e-3;

// A weight matrix in FP16 or int4 (group > 0), with the fused and the unfused GEMV of the same kernel.
struct Matrix {
    int rows = 0, cols = 0, group = 0;
    DeviceBuffer<__half> w16;
    std::unique_ptr<DeviceInt4> w4;

    Matrix(std::mt19937& g, int r, int c, int grp) : rows(r), cols(c), group(grp) {
        auto W = random_floats(g, size_t(r) * c, grp > 0 ? 0.02f : 1.0f / std::sqrt(float(c)));
        if (grp > 0) w4 = std::make_unique<DeviceInt4>(quantize_int4(W.data(), r, c, grp));
        else w16 = upload(to_half(W));
    }
    // The unfused GEMV (the same kernel as the fused one: gemv's vector kernel on these aligned shapes, or gemv_int4,
    // whose auto rule the fused int4 epilogues follow).
    void gemv(float* y, const __half* x, cudaStream_t s) const {
        if (w4) gemv_int4(y, w4->view, x, s);
        else ::quest::gemv(y, w16.get(), x, rows, cols, s);
    }
    void scaled(float* y, const __half* xg, const NormScale& n, cudaStream_t s) const {
        if (w4) gemv_int4_scaled(y, w4->view, xg, n, s);
        else gemv_scaled(y, w16.get(), xg, rows, cols, n, s);
    }
    void swiglu(__half* act, const __half* xg, const NormScale& n, cudaStream_t s) const {
        if (w4) gemv_int4_swiglu(act, w4->view, xg, n, s);
        else gemv_swiglu(act, w16.get(), xg, rows, cols, n, s);
    }
    void residual(const ResidualNorm& r, const __half* x, cudaStream_t s) const {
        if (w4) gemv_int4_residual(r, w4->view, x, s);
        else gemv_residual(r, w16.get(), x, rows, cols, s);
    }
    int partials() const { return w4 ? gemv_int4_residual_partials(w4->view) : gemv_residual_partials(rows); }
    std::string name() const {
        return std::to_string(rows) + "x" + std::to_string(cols) + (w4 ? " int4 g" + std::to_string(group) : " fp16");
    }
};

// The fused input of a norm with weight g over x: xg = fp16(x g) (as a residual epilogue writes it) and ss = sum x^2.
struct NormInput {
    DeviceBuffer<__half> xg;
    DeviceBuffer<float> ss;
    NormInput(const std::vector<float>& x, const std::vector<float>& g) : xg(x.size()), ss(1) {
        std::vector<float> v(x.size());
        double sum = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            v[i] = x[i] * g[i];
            sum += double(x[i]) * x[i];
        }
        xg.upload(to_half(v));
        ss.upload(std::vector<float>{float(sum)});
    }
    NormScale scale() const { return NormScale{ss.get(), 1, int(xg.size()), kEps}; }  // one partial: the whole sum
};

// Residual-stream values (|x| ~ 2) and norm weights in [0.8, 1.2) (Llama's are around 1).
std::vector<float> stream_values(std::mt19937& g, int n) { return random_floats(g, n, 2.0f); }
std::vector<float> norm_weights(std::mt19937& g, int n) {
    std::uniform_real_distribution<float> d(0.8f, 1.2f);
    std::vector<float> w(n);
    for (float& v : w) v = d(g);
    return w;
}

// Llama-2-7B's residual stream carries a few "massive activations" (|x| ~ 2.5K in fixed channels from layer 2 on):
// these channels of x at +-2500.
void add_massive_activations(std::vector<float>& x) {
    for (int c : {7, 1415, 2533, 3990})
        if (c < static_cast<int>(x.size())) x[c] = (c % 2 ? -1.0f : 1.0f) * 2500.0f;
}

// y = W rms_norm(x, g) by rms_norm + the unfused GEMV, and by the scaled GEMV on (xg, ss).
void check_scaled(std::mt19937& g, int rows, int cols, int group, double tol, bool massive = false) {
    const Matrix M(g, rows, cols, group);
    SCOPED_TRACE(M.name() + (massive ? " massive" : ""));
    auto x = stream_values(g, cols);
    const auto w = norm_weights(g, cols);
    if (massive) add_massive_activations(x);
    auto dx = upload(x);
    auto dw = upload(w);
    DeviceBuffer<__half> xn(cols);
    DeviceBuffer<float> want(rows), got(rows);
    rms_norm(xn.get(), dx.get(), nullptr, dw.get(), 1, cols, kEps, nullptr);
    M.gemv(want.get(), xn.get(), nullptr);
    const NormInput in(x, w);
    got.fill_bytes(0xFF);
    M.scaled(got.get(), in.xg.get(), in.scale(), nullptr);
    const auto r = got.download();
    EXPECT_TRUE(all_finite(r));
    EXPECT_LE(rel_err(r, want.download()), tol);
}

// Gate and up interleaved (rows 2i, 2i + 1): act = swiglu(W rms_norm(x, g)) by rms_norm + the unfused GEMV +
// swiglu (on the rows de-interleaved into gate | up), and by the swiglu GEMV.
void check_swiglu(std::mt19937& g, int rows, int cols, int group, double tol, bool massive = false) {
    const Matrix M(g, rows, cols, group);
    SCOPED_TRACE(M.name() + (massive ? " massive" : ""));
    const int F = rows / 2;
    auto x = stream_values(g, cols);
    const auto w = norm_weights(g, cols);
    if (massive) add_massive_activations(x);
    auto dx = upload(x);
    auto dw = upload(w);
    DeviceBuffer<__half> xn(cols), want(F), got(F);
    DeviceBuffer<float> gu(rows);
    rms_norm(xn.get(), dx.get(), nullptr, dw.get(), 1, cols, kEps, nullptr);
    M.gemv(gu.get(), xn.get(), nullptr);
    const auto inter = gu.download();
    std::vector<float> split(rows);
    for (int i = 0; i < F; ++i) {
        split[i] = inter[2 * i];
        split[F + i] = inter[2 * i + 1];
    }
    auto dsplit = upload(split);
    swiglu(want.get(), dsplit.get(), 1, F, nullptr);
    const NormInput in(x, w);
    got.fill_bytes(0xFF);
    M.swiglu(got.get(), in.xg.get(), in.scale(), nullptr);
    const auto r = to_float(got.download());
    EXPECT_TRUE(all_finite(r));
    EXPECT_LE(rel_err(r, to_float(want.download())), tol);
}

// x += W a; xg = fp16(x g); partials whose sum is sum x^2: x bit for bit against the unfused GEMV + add (rms_norm's
// residual add), xg and the partials' sum against the host on that x, every partial written (poisoned before), and
// the partials bit-identical on a second launch.
void check_residual(std::mt19937& g, int rows, int cols, int group) {
    const Matrix M(g, rows, cols, group);
    SCOPED_TRACE(M.name());
    auto a = random_floats(g, cols);
    const auto da = upload(to_half(a));
    const auto x0 = stream_values(g, rows), w = norm_weights(g, rows);
    auto dw = upload(w);
    // Unfused: proj = W a, then rms_norm adds it into x (its normalised output is not what is compared).
    DeviceBuffer<float> proj(rows), xref(rows);
    DeviceBuffer<__half> xn(rows);
    xref.upload(x0);
    M.gemv(proj.get(), da.get(), nullptr);
    rms_norm(xn.get(), xref.get(), proj.get(), dw.get(), 1, rows, kEps, nullptr);
    const auto want_x = xref.download();
    std::vector<float> want_xg(rows);
    double ss = 0;
    for (int i = 0; i < rows; ++i) {
        want_xg[i] = want_x[i] * w[i];
        ss += double(want_x[i]) * want_x[i];
    }
    to_half(want_xg);

    const int np = M.partials();
    DeviceBuffer<float> x(rows), partials(np + 3);
    DeviceBuffer<__half> xg(rows);
    ResidualNorm r{x.get(), xg.get(), dw.get(), partials.get(), int(partials.size())};
    std::vector<float> first;
    for (int launch = 0; launch < 2; ++launch) {
        SCOPED_TRACE(launch);
        x.upload(x0);
        xg.fill_bytes(0xFF);
        partials.fill_bytes(0xFF);
        M.residual(r, da.get(), nullptr);
        const auto got_x = x.download();
        const auto got_xg = to_float(xg.download());
        auto got_p = partials.download();
        got_p.resize(np);
        double got_ss = 0;
        for (float p : got_p) got_ss += p;
        EXPECT_EQ(0, std::memcmp(got_x.data(), want_x.data(), rows * sizeof(float))) << "x: the same sums as the GEMV";
        EXPECT_TRUE(all_finite(got_xg));
        EXPECT_LE(rel_err(got_xg, want_xg), 1e-3);
        EXPECT_TRUE(all_finite(got_p)) << "every block writes its partial";
        EXPECT_NEAR(got_ss, ss, 1e-5 * ss);
        if (launch == 0) first = got_p;
        else EXPECT_EQ(0, std::memcmp(got_p.data(), first.data(), np * sizeof(float))) << "partials bit-identical";
    }
    // partials_capacity below what the launch needs is refused.
    r.partials_capacity = M.partials() - 1;
    EXPECT_THROW(M.residual(r, da.get(), nullptr), std::invalid_argument);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------

TEST(CudaFused, ScaledGemvEqualsRmsNormThenGemv) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(41);
    // Llama-2-7B qkv, o and lm_head shapes; rows not a multiple of the FP16 block's 4 rows or the int4 tile's 2
    // (a last block with one row); narrow rows (17 chunks of 8 columns; int4: 5 chunks of 32, one group of 128, a
    // group of 64 over 3 segments). Several rows each: the relative L2 error of a single short dot product has no
    // useful bound (it can cancel to ~0).
    for (auto [rows, cols] : {std::pair{4096, 4096}, {12288, 4096}, {32000, 4096}, {4102, 136}, {5, 64}, {7, 8}})
        check_scaled(g, rows, cols, 0, 2e-3);
    // int4 16902 rows: the default kernel's 4-row tiles (at least 2 x 16 per SM on up to 132 SMs), a partial last one.
    for (auto [rows, cols, grp] : {std::tuple{4096, 4096, 128}, {12288, 4096, 128}, {4103, 160, 32}, {9, 128, 128},
                                   {9001, 384, 128}, {37, 192, 64}, {13, 11008, 128}, {16902, 256, 128}})
        check_scaled(g, rows, cols, grp, 3e-3);
}

TEST(CudaFused, SwigluGemvEqualsRmsNormGemvSwiglu) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(42);
    // 22016 = 2 x 11008 (Llama-2-7B gate+up); 4102 / 38 rows: the last FP16 block holds one gate/up pair; int4:
    // more tiles than warps, one group per row; 22016 and 16902 rows take the default kernel's 4-row tiles (16902: a
    // last tile with one gate/up pair).
    for (auto [rows, cols] : {std::pair{22016, 4096}, {4102, 136}, {38, 40}, {18, 8}})
        check_swiglu(g, rows, cols, 0, 3e-3);
    for (auto [rows, cols, grp] :
         {std::tuple{22016, 4096, 128}, {4102, 160, 32}, {18, 128, 128}, {9002, 384, 128}, {38, 192, 64},
          {16902, 256, 128}})
        check_swiglu(g, rows, cols, grp, 5e-3);
}

// The fused input xg = fp16(x g) is not normalised: with massive activations (|x g| ~ 2.5K) the int4 kernel's fp16
// partial sums (8 products of |q - z| <= 15) would overflow if it multiplied xg as it is; it normalises xg while
// copying it to shared memory, so its partial sums see what they see after rms_norm (and FP16 sums are fp32 anyway).
TEST(CudaFused, NormGemvsWithMassiveActivations) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(44);
    check_scaled(g, 4096, 4096, 0, 2e-3, true);
    check_scaled(g, 12288, 4096, 128, 3e-3, true);
    check_swiglu(g, 22016, 4096, 0, 3e-3, true);
    check_swiglu(g, 22016, 4096, 128, 5e-3, true);
}

TEST(CudaFused, ResidualGemvAddsAndPreparesTheNextNorm) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(43);
    // Llama-2-7B o (4096 x 4096) and down (4096 x 11008); odd rows; one row; more rows than warps in the int4 grid;
    // int4 16902 rows: 4-row tiles (as in the scaled test).
    for (auto [rows, cols] : {std::pair{4096, 4096}, {4096, 11008}, {4102, 136}, {1, 64}, {7, 8}})
        check_residual(g, rows, cols, 0);
    for (auto [rows, cols, grp] : {std::tuple{4096, 4096, 128}, {4096, 11008, 128}, {4103, 160, 32}, {1, 128, 128},
                                   {9001, 384, 128}, {37, 192, 64}, {16902, 256, 128}})
        check_residual(g, rows, cols, grp);
}

// Without the int4 limit (x in shared memory) or FP16 alignment the launchers refuse; the model then keeps the
// separate kernels.
TEST(CudaFused, RejectsUnsupportedShapes) {
    QUEST_REQUIRE_GPU();
    DeviceBuffer<__half> W(64 * 64), x(64), act(64);
    DeviceBuffer<float> y(64), ss(1);
    const NormScale n{ss.get(), 1, 64, kEps};
    EXPECT_FALSE(gemv_fused_supported(W.get(), x.get(), 60));
    EXPECT_FALSE(gemv_fused_supported(W.get(), x.get() + 1, 64));
    EXPECT_THROW(gemv_scaled(y.get(), W.get(), x.get(), 64, 60, n, nullptr), std::invalid_argument);
    EXPECT_THROW(gemv_swiglu(act.get(), W.get(), x.get(), 63, 64, n, nullptr), std::invalid_argument);
    Int4View wide{reinterpret_cast<const uint32_t*>(W.get()), W.get(), reinterpret_cast<const uint8_t*>(W.get()), 2,
                  32768, 128};
    EXPECT_FALSE(gemv_int4_fused_supported(wide));
    EXPECT_THROW(gemv_int4_scaled(y.get(), wide, x.get(), n, nullptr), std::invalid_argument);
}

// The fused layer chain (o residual -> gate+up swiglu -> down residual -> qkv scaled) captured in a graph behind a
// producer kernel, replayed with new inputs: equal to the unfused chain each time (each consumer adds the partials of
// the residual GEMV before it).
TEST(CudaFused, LayerChainInAGraphEqualsTheSeparateKernels) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(44);
    const int H = 1024, F = 2816, Q = 3072;
    for (int group : {0, 128}) {
        SCOPED_TRACE(group ? "int4" : "fp16");
        const Matrix Wo(g, H, H, group), Wgu(g, 2 * F, H, group), Wd(g, H, F, group), Wq(g, Q, H, group);
        const auto g1 = norm_weights(g, H), g2 = norm_weights(g, H);
        auto dg1 = upload(g1), dg2 = upload(g2);
        DeviceBuffer<float> x(H), a32(H), xref(H), proj(H), gu(2 * F), yref(Q), y(Q);
        DeviceBuffer<__half> a(H), xg(H), xn(H), act(F), actref(F);
        DeviceBuffer<float> partials(std::max(Wo.partials(), Wd.partials()));
        const ResidualNorm r1{x.get(), xg.get(), dg1.get(), partials.get(), int(partials.size())};
        ResidualNorm r2 = r1;
        r2.g = dg2.get();
        const NormScale n1{partials.get(), Wo.partials(), H, kEps}, n2{partials.get(), Wd.partials(), H, kEps};
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreate(&s));
        auto fused = [&] {
            half_to_float_device(a32.get(), a.get(), H, s);  // a plain kernel before the chain (its input's producer)
            Wo.residual(r1, a.get(), s);
            Wgu.swiglu(act.get(), xg.get(), n1, s);
            Wd.residual(r2, act.get(), s);
            Wq.scaled(y.get(), xg.get(), n2, s);
        };
        fused();  // warm-up outside the capture (one-time attributes)
        CUDA_CHECK(cudaStreamSynchronize(s));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        fused();
        CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int replay = 0; replay < 3; ++replay) {
            SCOPED_TRACE(replay);
            const auto x0 = random_floats(g, H, 1.0f + replay);
            auto av = random_floats(g, H);
            const auto ah = to_half(av);
            // Unfused reference.
            xref.upload(x0);
            a.upload(ah);
            Wo.gemv(proj.get(), a.get(), s);
            rms_norm(xn.get(), xref.get(), proj.get(), dg1.get(), 1, H, kEps, s);
            Wgu.gemv(gu.get(), xn.get(), s);
            swiglu_interleaved(actref.get(), gu.get(), 1, F, s);
            Wd.gemv(proj.get(), actref.get(), s);
            rms_norm(xn.get(), xref.get(), proj.get(), dg2.get(), 1, H, kEps, s);
            Wq.gemv(yref.get(), xn.get(), s);
            // Fused, replayed.
            x.upload(x0);
            y.fill_bytes(0xFF);
            xg.fill_bytes(0xFF);
            act.fill_bytes(0xFF);
            CUDA_CHECK(cudaStreamSynchronize(s));
            CUDA_CHECK(cudaGraphLaunch(exec, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            const auto got = y.download();
            EXPECT_TRUE(all_finite(got));
            EXPECT_LE(rel_err(got, yref.download()), group ? 1e-2 : 5e-3);
            EXPECT_LE(rel_err(x.download(), xref.download()), 2e-3);
            EXPECT_LE(rel_err(to_float(act.download()), to_float(actref.download())), group ? 5e-3 : 3e-3);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
    }
}

// Layer 0's first norm: x = embedding row, xg = fp16(x g), ss = sum x^2 (NaN for an id outside the vocabulary).
TEST(CudaFused, EmbeddingNormPrep) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(45);
    for (int dim : {4096, 4100, 64, 8}) {
        const int V = 50;
        auto table = random_floats(g, size_t(V) * dim);
        auto dt = upload(to_half(table));
        const auto w = norm_weights(g, dim);
        auto dw = upload(w);
        for (int token : {0, 49, 17, 50}) {
            auto dtok = upload(std::vector<int>{token});
            DeviceBuffer<float> x(dim), ss(1);
            DeviceBuffer<__half> xg(dim);
            x.fill_bytes(0xFF);
            xg.fill_bytes(0xFF);
            ss.fill_bytes(0xFF);
            embedding_norm_prep(x.get(), xg.get(), ss.get(), dt.get(), dtok.get(), dw.get(), dim, V, nullptr);
            const auto gx = x.download();
            const float gss = ss.download()[0];
            if (token == V) {
                EXPECT_TRUE(std::isnan(gss));
                EXPECT_TRUE(std::isnan(gx[0]));
                continue;
            }
            std::vector<float> want_xg(dim);
            double sum = 0;
            for (int i = 0; i < dim; ++i) {
                const float v = table[size_t(token) * dim + i];
                ASSERT_EQ(gx[i], v) << dim << " " << token << " " << i;
                want_xg[i] = v * w[i];
                sum += double(v) * v;
            }
            to_half(want_xg);
            EXPECT_LE(rel_err(to_float(xg.download()), want_xg), 1e-3);
            EXPECT_NEAR(gss, sum, 1e-5 * sum);
        }
    }
}

// The prefill's SwiGLU on the interleaved gate+up rows equals swiglu on the same values side by side.
TEST(CudaFused, SwigluInterleavedEqualsSwiglu) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(46);
    for (int F : {172, 11008}) {
        const int T = 3;
        const auto inter = random_floats(g, size_t(T) * 2 * F, 2.0f);
        std::vector<float> split(inter.size());
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < F; ++i) {
                split[size_t(t) * 2 * F + i] = inter[size_t(t) * 2 * F + 2 * i];
                split[size_t(t) * 2 * F + F + i] = inter[size_t(t) * 2 * F + 2 * i + 1];
            }
        auto di = upload(inter), ds = upload(split);
        DeviceBuffer<__half> a(size_t(T) * F), b(size_t(T) * F);
        a.fill_bytes(0xFF);
        b.fill_bytes(0xFF);
        swiglu_interleaved(a.get(), di.get(), T, F, nullptr);
        swiglu(b.get(), ds.get(), T, F, nullptr);
        const auto ga = a.download(), gb = b.download();
        EXPECT_EQ(0, std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(__half))) << F;  // the same arithmetic
    }
}

// The model: the fused decode step against the separate kernels on the same random weights (FP16 and int4), prefill
// then decode steps in a graph, under each GQA policy; logits within the model tolerance while both runs select the
// same pages in the Quest layer (a different selection must be a near tie of the scores: the two norm paths round
// differently, and a random model's pages score alike; the runs part there, and most steps must still be compared).
TEST(CudaFused, ModelDecodeStepEqualsTheSeparateKernels) {
    QUEST_REQUIRE_GPU();
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 2048})",
        "inline");
    int compared = 0, steps = 0;
    for (GqaPolicy policy : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
        for (int group : {0, 128}) {
            SCOPED_TRACE(std::string(group ? "int4 " : "fp16 ") + std::string(gqa_policy_name(policy)));
            CudaOptions fused, separate;
            fused.weights = separate.weights = group ? WeightRequest::int4(group) : WeightRequest::as_stored();
            fused.record_selections = separate.record_selections = true;
            separate.fused_norms = false;
            QuestSettings q;
            q.selector = PageSelector::Quest;  // Quest's scores tell a near tie at 1e-2 apart
            q.budget = 64;
            q.page_size = 16;
            q.dense_layers = 1;
            q.gqa_policy = policy;
            auto a = CudaLlama::random(c, q, 512, 5, fused);
            auto b = CudaLlama::random(c, q, 512, 5, separate);
            ASSERT_TRUE(a->fused_decode());
            ASSERT_FALSE(b->fused_decode());
            std::vector<int> prompt(200);
            for (int i = 0; i < 200; ++i) prompt[i] = 3 + (i * 37) % 900;
            auto la = a->prefill(prompt);
            auto lb = b->prefill(prompt);
            for (int step = 0; step < 8; ++step) {
                const int token = 5 + step * 11;
                la = a->decode(token);
                lb = b->decode(token);
                const std::vector<float> va(la.begin(), la.end()), vb(lb.begin(), lb.end());
                EXPECT_TRUE(all_finite(va)) << step;
                ++steps;
                bool parted = false;
                for (int l = q.dense_layers; l < c.num_layers && !parted; ++l) {
                    const SelectionTrace ta = a->last_selection(l), tb = b->last_selection(l);
                    const test::SelectionCompare cmp = test::compare_selections(ta.pages, tb.pages, ta.scores, 1e-2);
                    if (cmp.equal) continue;
                    EXPECT_TRUE(cmp.near_tie) << "layer " << l << " step " << step << ": " << cmp.what;
                    std::printf("[ note ] the selections part at step %d, layer %d: %s\n", step, l, cmp.what.c_str());
                    parted = true;
                }
                if (parted) break;
                ++compared;
                EXPECT_LE(rel_err(va, vb), 2e-2) << step;
            }
        }
    std::printf("[ note ] %d of %d decode steps compared\n", compared, steps);
    EXPECT_GE(compared, steps / 2) << "too many near ties to test anything: choose other inputs";
}
