// The seams against the CPU, table-driven: every registered weight format (kernels/linear/linear.h) and every
// registered page selector the CUDA backend runs (kernels/select/registry_cuda.h). A new format or selector is covered
// by registering it; the kernel-specific edge cases stay in the per-kernel tests.
//
// Formats: each op of LinearFormatOps on random weights converted by the format's own from_f32, uploaded by its
// upload (contiguous and interleaved rows), against fp32 loops over the format's to_f32 values (the exact weights the
// device holds) on fp16-rounded inputs. Outputs poisoned (NaN) first. Tolerances, relative L2: 3e-3 for fp32 outputs
// (the int4 GEMV sums 8 fp16 products before its fp32 accumulation; fp16 GEMV well inside), 4e-3 for fp16 outputs and
// the fused norms (one more fp16 rounding of the input: tests/cuda/test_gemv_fused.cpp).
//
// Selectors: the trained demo model, a 500-token prompt and 20 decode steps at B = 64 (4 of 32 pages; with a
// 160-token sliding window, 4 of its 10): the CUDA backend's logits against the CPU backend's on the same
// FP16-rounded weights within 5e-2 on all but 3 steps, and (so the tolerance means something) the CPU's
// full-attention logits more than 5x as far.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "kernels/common/error.h"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/linear.h"
#include "kernels/select/registry.h"
#include "kernels/select/registry_cuda.h"
#include "model/cuda/llama_cuda.h"
#include "tests/selectors/recent_cuda.h"
#include "../test_util.h"

namespace quest {
namespace {

using test::rel_err;

constexpr double kOutTol = 3e-3;
constexpr double kHalfOutTol = 4e-3;

std::vector<LinearStorage> storages_under_test() {
    std::vector<LinearStorage> s;
    for (LinearFormat f : kLinearFormats) {
        if (f == LinearFormat::Int4) {
            s.push_back(LinearStorage::int4(32));
            s.push_back(LinearStorage::int4(128));
        } else {
            s.push_back(LinearStorage{f, 0});
        }
    }
    return s;
}

// One matrix of a format on the device, and the fp32 values it holds.
struct DeviceMatrix {
    DeviceBuffer<char> bytes;
    LinearWeight W;
    std::vector<float> values;  // [rows][cols]: the format's to_f32 of what was uploaded
};

// Random weights (fp16-rounded, ~N(0, 1/cols)) in `storage`, uploaded as two halves of interleaved rows when
// `interleave` (rows even), else in one piece.
DeviceMatrix make_matrix(std::mt19937& rng, const LinearStorage& storage, int rows, int cols, bool interleave) {
    const LinearFormatOps& ops = linear_format(storage.format);
    DeviceMatrix m;
    m.bytes = DeviceBuffer<char>(ops.device_bytes(rows, cols, storage));
    m.bytes.fill_bytes(0xFF);
    m.W = LinearWeight{storage, rows, cols, m.bytes.get()};
    DeviceBuffer<char> staging(static_cast<size_t>(rows) * cols * 4);
    DeviceBuffer<unsigned long long> overflow(1);
    const UploadStaging st{staging.get(), staging.size(), overflow.get(), nullptr};
    m.values.assign(static_cast<size_t>(rows) * cols, 0.0f);
    const int parts = interleave ? 2 : 1, part_rows = rows / parts;
    for (int p = 0; p < parts; ++p) {
        std::vector<float> w = test::random_floats(rng, static_cast<size_t>(part_rows) * cols, 1.0f / std::sqrt(float(cols)));
        test::to_half(w);
        const HostLinear h = ops.from_f32(std::move(w), part_rows, cols, storage);
        EXPECT_EQ(ops.upload(m.W, h, p, parts, st), 0u);
        const std::vector<float> v = ops.to_f32(h);
        for (int r = 0; r < part_rows; ++r)
            std::copy(v.begin() + size_t(r) * cols, v.begin() + size_t(r + 1) * cols,
                      m.values.begin() + size_t(r * parts + p) * cols);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    return m;
}

std::vector<float> matvec(const std::vector<float>& W, const std::vector<float>& x, int rows, int cols) {
    std::vector<float> y(rows);
    for (int r = 0; r < rows; ++r) {
        double s = 0;
        for (int c = 0; c < cols; ++c) s += double(W[size_t(r) * cols + c]) * x[c];
        y[r] = float(s);
    }
    return y;
}

std::vector<float> download_float(const DeviceBuffer<float>& d) { return d.download(); }

class FormatParity : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(FormatParity, EveryFormatFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const auto [rows, cols] = GetParam();
    for (const LinearStorage& storage : storages_under_test()) {
        if (!linear_storage_holds(storage, rows, cols)) continue;
        SCOPED_TRACE(storage.describe() + " " + std::to_string(rows) + " x " + std::to_string(cols));
        const LinearFormatOps& ops = linear_format(storage.format);
        std::mt19937 rng(rows * 131 + cols + storage.group);
        const DeviceMatrix m = make_matrix(rng, storage, rows, cols, rows % 2 == 0);
        std::vector<float> x = test::random_floats(rng, cols);
        const auto xh = test::to_half(x);
        const auto dx = test::upload(xh);
        const std::vector<float> want = matvec(m.values, x, rows, cols);

        DeviceBuffer<float> y(rows);
        y.fill_bytes(0xFF);
        ops.gemv(y.get(), m.W, dx.get(), nullptr);
        EXPECT_LE(rel_err(download_float(y), want), kOutTol) << "gemv";

        // Prefill: Y[T][rows] = X W^T, T = 5.
        const int T = 5;
        std::vector<float> X = test::random_floats(rng, size_t(T) * cols);
        const auto Xh = test::to_half(X);
        const auto dX = test::upload(Xh);
        DeviceBuffer<__half> scratch(ops.gemm_scratch(rows, cols, storage));
        DeviceBuffer<float> Y(size_t(T) * rows);
        Y.fill_bytes(0xFF);
        cublasHandle_t cublas = nullptr;
        CUBLAS_CHECK(cublasCreate(&cublas));
        ops.gemm(cublas, Y.get(), m.W, dX.get(), T, scratch.get(), nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        cublasDestroy(cublas);
        const std::vector<float> got_Y = Y.download();
        for (int t = 0; t < T; ++t) {
            const std::vector<float> xt(X.begin() + size_t(t) * cols, X.begin() + size_t(t + 1) * cols);
            const std::vector<float> yt(got_Y.begin() + size_t(t) * rows, got_Y.begin() + size_t(t + 1) * rows);
            EXPECT_LE(rel_err(yt, matvec(m.values, xt, rows, cols)), kOutTol) << "gemm row " << t;
        }

        if (!ops.fused_gap(m.W, dx.get()).empty()) continue;
        // Fused epilogues: the input's norm from one partial sum of squares.
        const float eps = 1e-5f;
        double ss = 0;
        for (float v : x) ss += double(v) * v;
        const float inv = 1.0f / std::sqrt(float(ss / cols) + eps);
        const auto partials = test::upload(std::vector<float>{float(ss)});
        const NormScale norm{partials.get(), 1, cols, eps};
        y.fill_bytes(0xFF);
        ops.gemv_scaled(y.get(), m.W, dx.get(), norm, nullptr);
        std::vector<float> want_scaled = want;
        for (float& v : want_scaled) v *= inv;
        EXPECT_LE(rel_err(download_float(y), want_scaled), kHalfOutTol) << "gemv_scaled";

        if (rows % 2 == 0) {
            DeviceBuffer<__half> act(rows / 2);
            act.fill_bytes(0xFF);
            ops.gemv_swiglu(act.get(), m.W, dx.get(), norm, nullptr);
            std::vector<float> want_act(rows / 2);
            for (int i = 0; i < rows / 2; ++i) {
                const float g = want_scaled[2 * i], u = want_scaled[2 * i + 1];
                want_act[i] = g / (1.0f + std::exp(-g)) * u;
            }
            EXPECT_LE(rel_err(test::to_float(act.download()), want_act), kHalfOutTol) << "gemv_swiglu";
        }

        // Residual: x_res += W x; xg = fp16(x_res g); the partials add up to sum x_res^2.
        std::vector<float> res = test::random_floats(rng, rows), g = test::random_floats(rng, rows, 0.1f, 1.0f);
        const auto dres = test::upload(res), dg = test::upload(g);
        DeviceBuffer<__half> xg(rows);
        xg.fill_bytes(0xFF);
        const int count = ops.residual_partials(m.W);
        DeviceBuffer<float> out_partials(count);
        out_partials.fill_bytes(0xFF);
        ResidualNorm r{const_cast<float*>(dres.get()), xg.get(), dg.get(), out_partials.get(), count};
        ops.gemv_residual(r, m.W, dx.get(), nullptr);
        std::vector<float> want_res(rows), want_xg(rows);
        double want_ss = 0;
        for (int i = 0; i < rows; ++i) {
            want_res[i] = res[i] + want[i];
            want_xg[i] = want_res[i] * g[i];
            want_ss += double(want_res[i]) * want_res[i];
        }
        EXPECT_LE(rel_err(dres.download(), want_res), kOutTol) << "gemv_residual x";
        EXPECT_LE(rel_err(test::to_float(xg.download()), want_xg), kHalfOutTol) << "gemv_residual xg";
        double got_ss = 0;
        for (float p : out_partials.download()) got_ss += p;
        EXPECT_NEAR(got_ss, want_ss, 1e-3 * want_ss) << "gemv_residual partials";
    }
}

// Realistic (7B o / down projections, a GQA qkv) and odd shapes (stories260K-like, rows not a multiple of anything).
INSTANTIATE_TEST_SUITE_P(Shapes, FormatParity,
                         ::testing::Values(std::make_tuple(4096, 4096), std::make_tuple(4096, 11008),
                                           std::make_tuple(6144, 4096), std::make_tuple(1000, 1024),
                                           std::make_tuple(86, 512), std::make_tuple(97, 160)));

// Every selector the CUDA backend has a definition for, with every metadata format it takes.
struct SelectorCase {
    std::string what;
    QuestSettings q;
};
std::vector<SelectorCase> selector_cases() {
    test::recent_selector_cuda();  // the test-only selector registered at run time (tests/selectors/)
    std::vector<SelectorCase> cases;
    for (PageSelector s : page_selectors()) {
        if (!cuda_selector_ops(s)) continue;
        QuestSettings q;
        q.page_size = 16;
        q.budget = 64;
        q.selector = s;
        if (!q.takes(kUsesMetadataFormat)) {
            for (GqaPolicy p : {GqaPolicy::KvSum, GqaPolicy::PerHead}) {
                q.gqa_policy = p;
                cases.push_back({std::string(page_selector_name(s)) + " " + std::string(gqa_policy_name(p)), q});
            }
            continue;
        }
        for (MetadataFormat f : {MetadataFormat::Fp16, MetadataFormat::Int8, MetadataFormat::Int4})
            for (GqaPolicy p : {GqaPolicy::KvSum, GqaPolicy::KvMax, GqaPolicy::PerHead}) {
                q.metadata = f;
                q.gqa_policy = p;
                cases.push_back({std::string(page_selector_name(s)) + " " + std::string(metadata_format_name(f)) +
                                     " " + std::string(gqa_policy_name(p)), q});
            }
    }
    return cases;
}

// The demo model's 500-token prompt and 20 decode steps through every selector case on both backends (above).
void check_selectors_follow_cpu(const ModelFolder& m) {
    const auto w = test::fp16_rounded_weights(m);
    std::vector<int> prompt(500);
    for (int i = 0; i < 500; ++i) prompt[i] = 3 + (i * 53) % 500;
    QuestSettings full;
    full.full_attention = true;
    CpuLlama cpu_full(w, full, 600);
    cpu_full.prefill(prompt);
    std::vector<std::vector<float>> full_logits;
    for (int t = 0; t < 20; ++t) {
        const auto l = cpu_full.decode(3 + (t * 7) % 500);
        full_logits.emplace_back(l.begin(), l.end());
    }
    const auto cases = selector_cases();
    EXPECT_GE(cases.size(), 5u);
    for (const SelectorCase& k : cases) {
        SCOPED_TRACE(k.what);
        CpuLlama cpu(w, k.q, 600);
        auto gpu = CudaLlama::from_folder(m, k.q, 600);
        cpu.prefill(prompt);
        gpu->prefill(prompt);
        double sum_err = 0, sum_vs_full = 0;
        int far = 0, agree = 0;
        for (int t = 0; t < 20; ++t) {
            const int tok = 3 + (t * 7) % 500;
            const auto la = cpu.decode(tok);
            const std::vector<float> ca(la.begin(), la.end());
            const auto lb = gpu->decode(tok);
            const std::vector<float> cb(lb.begin(), lb.end());
            const double e = rel_err(cb, ca);
            sum_err += e;
            far += !(e <= 5e-2);
            agree += test::argmax(ca) == test::argmax(cb);
            sum_vs_full += rel_err(full_logits[t], ca);
        }
        // Near-tied page rankings may swap a page between the fp32 CPU and the fp16 GPU on a few steps (fp16 vs
        // fp32 keys, and codes quantized from them).
        EXPECT_LE(far, 3) << "steps with logits rel_err > 5e-2";
        EXPECT_GE(agree, 17) << "top-1 agreement of 20";
        // The test can fail: the selection at B = 64 of 500 tokens moves the logits well beyond the tolerance.
        EXPECT_GT(sum_vs_full, 5 * sum_err) << "the selector's logits are as close to full attention as to the CPU's";
        std::printf("[selector parity %s%s] mean logits rel_err %.3g (vs full attention %.3g), top-1 %d/20\n",
                    k.what.c_str(), m.config.sliding_window > 0 ? " window" : "", sum_err / 20, sum_vs_full / 20,
                    agree);
    }
}

TEST(SelectorParity, EverySelectorFollowsCpu) {
    QUEST_REQUIRE_GPU();
    check_selectors_follow_cpu(open_model_folder(test::demo_model_dir()));
}

// The same model as a MistralForCausalLM with a 160-token sliding window (10 pages of the 32: B = 64 selects 4 of
// them): every selector selects inside the window on both backends, and full attention is windowed too.
TEST(SelectorParity, EverySelectorFollowsCpuInASlidingWindow) {
    QUEST_REQUIRE_GPU();
    const auto demo = test::demo_model_dir();
    const auto dir = test::temp_dir("seam_window");
    for (const char* f : {"model.safetensors", "tokenizer.model"})
        std::filesystem::copy_file(demo / f, dir / f, std::filesystem::copy_options::overwrite_existing);
    nlohmann::json cfg = nlohmann::json::parse(test::slurp(demo / "config.json"));
    cfg["architectures"] = {"MistralForCausalLM"};
    cfg["model_type"] = "mistral";
    cfg["sliding_window"] = 160;
    std::ofstream(dir / "config.json") << cfg.dump(2);
    const ModelFolder m = open_model_folder(dir);
    ASSERT_EQ(m.config.attention_window(0), 160);
    check_selectors_follow_cpu(m);
}

}  // namespace
}  // namespace quest
