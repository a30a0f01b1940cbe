// 4-bit weights on the GPU: the fused dequantize + GEMV (gemv_int4 and every kernel it chooses from) against the CPU reference at Llama-2-7B and
// odd shapes, the dequantize-to-FP16 kernel bit for bit, the GEMV inside a captured graph behind a programmatic
// dependent launch, and the CUDA backend on int4 weights against the CPU backend on the same quantized weights.
//
// Tolerances: the GEMV multiplies (q - z) by x in fp16 and sums 8 products in fp16 before the fp32 accumulation
// (kernels/linear/gemv_int4.cuh), so against the fp32 reference on the same codes it is within 3e-3 relative L2 (fp16
// rounding ~5e-4 per product); the i16 kernels (x in per-chunk block floating point, integer dot) are held to the
// same bound and, where x is exactly representable, to 1e-5 of a double reference. The whole model: 2e-2 relative
// L2 on the logits, as the FP16 backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "model/core/backend.h"
#include "model/cpu/llama_cpu.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "kernels/common/basic_ops.h"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv_int4.cuh"
#include "kernels/linear/gemv_int4_kernels.cuh"
#include "kernels/linear/quant.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/quantize.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "tokenizer/tokenizer.h"

using namespace quest;
using namespace quest::test;

namespace {

constexpr double kGemvTol = 3e-3;
constexpr double kLogitTol = 2e-2;

int top1(std::span<const float> l) { return int(std::max_element(l.begin(), l.end()) - l.begin()); }

std::vector<float> slice(const std::vector<float>& v, size_t i, size_t n) {
    return {v.begin() + i * n, v.begin() + (i + 1) * n};
}

QuestSettings full() {
    QuestSettings s;
    s.full_attention = true;
    return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------------------------------

namespace {

struct GemvShape {
    int rows, cols, group;
};

// gemv_int4 and every kernel it chooses from against matvec_int4_ref on the same codes and fp16-rounded x, outputs poisoned.
void check_gemv(const std::vector<GemvShape>& shapes, uint32_t seed) {
    std::mt19937 g(seed);
    for (const GemvShape& s : shapes) {
        SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " g" << s.group);
        const auto W = random_floats(g, size_t(s.rows) * s.cols, 0.02f);
        auto x = random_floats(g, s.cols);
        const Int4Matrix m = quantize_int4(W.data(), s.rows, s.cols, s.group);
        const DeviceInt4 dW(m);
        auto dx = upload(to_half(x));  // x rounded to fp16: the reference sees what the GPU sees
        std::vector<float> want(s.rows);
        matvec_int4_ref(want.data(), m, x.data());
        DeviceBuffer<float> y(s.rows);
        y.fill_bytes(0xFF);
        gemv_int4(y.get(), dW.view, dx.get(), nullptr);
        auto got = y.download();
        EXPECT_TRUE(all_finite(got));
        EXPECT_LE(rel_err(got, want), kGemvTol);
        for (Int4Kernel k : kInt4Kernels) {  // every kernel, not just the one the shape picks
            y.fill_bytes(0xFF);
            gemv_int4_run(k, y.get(), dW.view, dx.get(), nullptr);
            got = y.download();
            EXPECT_TRUE(all_finite(got)) << gemv_int4_kernel_name(k);
            EXPECT_LE(rel_err(got, want), kGemvTol) << gemv_int4_kernel_name(k);
        }
    }
}

}  // namespace

TEST(CudaInt4, GemvAtLlama7BShapes) {
    QUEST_REQUIRE_GPU();
    check_gemv({{4096, 4096, 128}, {12288, 4096, 128}, {4096, 11008, 128}, {22016, 4096, 128}, {4096, 4096, 32},
                {1000, 4096, 64}},
               21);
}

// Odd sizes: one row, rows that do not fill a block or a tile (rows % 4 != 0 for the 2 / 4 rows-per-tile
// kernels), one chunk per row, one group per row, rows whose chunks do not fill the 32 lanes (384 and 640 columns: 12 and 20 chunks; 11008: 344 chunks,
// a last batch with idle lanes and, for U = 4, an empty slot). Small enough for compute-sanitizer.
TEST(CudaInt4, GemvAtOddSizes) {
    QUEST_REQUIRE_GPU();
    check_gemv({{1, 32, 32}, {37, 96, 32}, {5, 160, 32}, {3, 11008, 64}, {64, 512, 512}, {333, 1024, 256},
                {17, 64, 64}, {129, 11008, 128}, {2, 64, 32}, {7, 384, 128}, {45, 640, 64}, {1, 11008, 128},
                {6, 2048, 1024}, {3, 4096, 4096}},
               25);
}

// Segment boundaries of the device layout (kernels/linear/int4_layout.h, int4_chunk_slot): one group of 128 columns
// per row (one segment), three groups of 64, 33 segments (a second batch of one segment), 65 segments of group 64
// (S = 2), group 32 with several batches and a partial one (S = 1), rows that are not a multiple of 16.
TEST(CudaInt4, GemvAtSegmentBoundaries) {
    QUEST_REQUIRE_GPU();
    check_gemv({{13, 128, 128}, {11, 192, 64}, {19, 4224, 128}, {21, 4160, 64}, {35, 4096, 32}, {40, 4096, 128},
                {9, 11008, 32}, {50, 384, 128}, {300, 640, 32}},
               27);
}

// The stream kernels run a grid of at most 16 warps per SM that each take several tiles (R rows) in turn, with the
// next tile's loads issued while the current one is multiplied; on a 132-SM H200 these shapes give the warps two or
// more tiles each (rows / R > 132 * 16: R = 2 from 4225 rows, R = 4 with 9001), with a partial last tile and idle
// lanes in the last batch.
TEST(CudaInt4, GemvWithManyTilesPerWarp) {
    QUEST_REQUIRE_GPU();
    check_gemv({{9001, 384, 128}, {5003, 640, 32}, {4403, 4096, 128}, {4501, 11008, 128}}, 26);
}

// The integer dot (the "i16" kernels; gemv_int4 runs them on tall matrices): with every x within 4 binades of its chunk's
// largest |x| (here |x| in [1/4, 1)) x is held exactly and sum (q - z) x is exact in int32, so the result is the
// exact dot up to the fp32 rounding of one product per chunk and the sums over chunks and lanes: within 1e-5
// relative L2 of a double-precision reference (the fp16-dot kernels are at ~3e-4 on these inputs, so this tells
// the two arithmetics apart).
TEST(CudaInt4, GemvI16IsExactOnBlockFloatingPointInputs) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(29);
    std::uniform_real_distribution<float> mag(0.25f, 1.0f);
    int tested = 0;
    for (const GemvShape& s : std::vector<GemvShape>{{4096, 4096, 128}, {37, 11008, 128}, {9001, 384, 128},
                                                     {5, 160, 32}, {45, 640, 64}}) {
        SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " g" << s.group);
        const auto W = random_floats(g, size_t(s.rows) * s.cols, 0.02f);
        std::vector<float> x(s.cols);
        for (float& v : x) v = half_to_float(float_to_half((g() & 1 ? -1.0f : 1.0f) * mag(g)));
        const Int4Matrix m = quantize_int4(W.data(), s.rows, s.cols, s.group);
        const std::vector<float> Wd = dequantize_int4(m);  // (q - z) s: exact in fp32
        std::vector<float> want(s.rows);
        for (int r = 0; r < s.rows; ++r) {
            double acc = 0.0;
            for (int c = 0; c < s.cols; ++c) acc += double(Wd[size_t(r) * s.cols + c]) * x[c];
            want[r] = float(acc);
        }
        const DeviceInt4 dW(m);
        auto dx = upload(to_half(x));
        DeviceBuffer<float> y(s.rows);
        for (Int4Kernel k : {Int4Kernel::I16R2, Int4Kernel::I16R4}) {
            y.fill_bytes(0xFF);
            gemv_int4_run(k, y.get(), dW.view, dx.get(), nullptr);
            const auto got = y.download();
            EXPECT_TRUE(all_finite(got)) << gemv_int4_kernel_name(k);
            EXPECT_LE(rel_err(got, want), 1e-5) << gemv_int4_kernel_name(k);
            ++tested;
        }
    }
    EXPECT_EQ(tested, 10);
}

// A NaN or an infinity in x reaches every output as a non-finite value, in every kernel (the i16 conversion must
// not turn it into an integer; the fp16 dot multiplies it into every row).
TEST(CudaInt4, GemvPropagatesNonFiniteInputs) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(30);
    for (const GemvShape& s : std::vector<GemvShape>{{64, 4096, 128}, {9001, 384, 128}}) {
        const auto W = random_floats(g, size_t(s.rows) * s.cols, 0.02f);
        const Int4Matrix m = quantize_int4(W.data(), s.rows, s.cols, s.group);
        const DeviceInt4 dW(m);
        DeviceBuffer<float> y(s.rows);
        for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
            auto x = random_floats(g, s.cols);
            x[100] = bad;
            auto dx = upload(to_half(x));
            for (int v = -1; v < int(std::size(kInt4Kernels)); ++v) {
                SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " x[100] = " << bad << " "
                                                  << (v < 0 ? "gemv_int4" : gemv_int4_kernel_name(kInt4Kernels[v])));
                y.fill_bytes(0);
                if (v < 0) gemv_int4(y.get(), dW.view, dx.get(), nullptr);
                else gemv_int4_run(kInt4Kernels[v], y.get(), dW.view, dx.get(), nullptr);
                const auto got = y.download();
                int finite = 0;
                for (float o : got) finite += std::isfinite(o);
                EXPECT_EQ(finite, 0);
            }
        }
    }
}

// Llama-2's "massive activations": a few input channels in the thousands (the down projection's input). The fp16
// partial sums (8 products of |q - z| <= 15) must not overflow.
TEST(CudaInt4, GemvWithMassiveActivations) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(22);
    const int rows = 4096, cols = 11008;
    const auto W = random_floats(g, size_t(rows) * cols, 0.02f);
    auto x = random_floats(g, cols, 0.5f);
    for (int c : {7, 1415, 2533, 7890}) x[c] = (c % 2 ? -1.0f : 1.0f) * 2500.0f;
    const Int4Matrix m = quantize_int4(W.data(), rows, cols, 128);
    const DeviceInt4 dW(m);
    auto dx = upload(to_half(x));
    std::vector<float> want(rows);
    matvec_int4_ref(want.data(), m, x.data());
    DeviceBuffer<float> y(rows);
    y.fill_bytes(0xFF);
    gemv_int4(y.get(), dW.view, dx.get(), nullptr);
    auto got = y.download();
    EXPECT_TRUE(all_finite(got));
    EXPECT_LE(rel_err(got, want), kGemvTol);
    for (Int4Kernel k : kInt4Kernels) {
        y.fill_bytes(0xFF);
        gemv_int4_run(k, y.get(), dW.view, dx.get(), nullptr);
        got = y.download();
        EXPECT_TRUE(all_finite(got)) << gemv_int4_kernel_name(k);
        EXPECT_LE(rel_err(got, want), kGemvTol) << gemv_int4_kernel_name(k);
    }
}

// The prefill's dequantization gives float_to_half of the exact (q - z) * s, bit for bit.
TEST(CudaInt4, DequantizeToHalfIsBitExact) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(23);
    struct Shape { int rows, cols, group; };
    for (Shape s : {Shape{4096, 4096, 128}, Shape{4096, 11008, 128}, Shape{37, 96, 32}, Shape{1, 32, 32},
                    Shape{300, 512, 256}, Shape{37, 4160, 64}, Shape{5, 11008, 32}, Shape{3, 4224, 128}}) {
        const auto W = random_floats(g, size_t(s.rows) * s.cols, 0.05f);
        const Int4Matrix m = quantize_int4(W.data(), s.rows, s.cols, s.group);
        const DeviceInt4 dW(m);
        DeviceBuffer<__half> out(size_t(s.rows) * s.cols);
        out.fill_bytes(0xFF);
        dequantize_int4_to_half(out.get(), dW.view, nullptr);
        const auto got = out.download();
        const auto want = dequantize_int4(m);
        size_t bad = 0;
        for (size_t i = 0; i < want.size(); ++i) bad += __half_raw(got[i]).x != float_to_half(want[i]);
        EXPECT_EQ(bad, 0u) << s.rows << "x" << s.cols << " g" << s.group;
    }
}

// Captured in a graph after a kernel that writes its input (rms_norm, programmatic dependent launch): the GEMV issues
// its weight loads early but reads x only after the wait, at every replay with new inputs.
TEST(CudaInt4, GemvInsideAGraphAfterAProducerKernel) {
    QUEST_REQUIRE_GPU();
    std::mt19937 g(24);
    const int rows = 12288, cols = 4096;
    const auto W = random_floats(g, size_t(rows) * cols, 0.02f);
    const Int4Matrix m = quantize_int4(W.data(), rows, cols, 128);
    const DeviceInt4 dW(m);
    const auto norm_w = random_floats(g, cols, 0.1f, 1.0f);
    auto dnorm = upload(norm_w);
    DeviceBuffer<float> x32(cols);
    DeviceBuffer<__half> xn(cols);
    DeviceBuffer<float> y(rows);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));  // a blocking stream: ordered after the uploads and fills below
    // gemv_int4 (v = -1), then every kernel it chooses from: each issues its first weight loads before the wait.
    for (int v = -1; v < int(std::size(kInt4Kernels)); ++v) {
        SCOPED_TRACE(v < 0 ? std::string("gemv_int4") : std::string(gemv_int4_kernel_name(kInt4Kernels[v])));
        auto gemv = [&] {
            if (v < 0)
                gemv_int4(y.get(), dW.view, xn.get(), s);
            else
                gemv_int4_run(kInt4Kernels[v], y.get(), dW.view, xn.get(), s);
        };
        rms_norm(xn.get(), x32.get(), nullptr, dnorm.get(), 1, cols, 1e-5f, s);  // warm-up outside the capture
        gemv();
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        rms_norm(xn.get(), x32.get(), nullptr, dnorm.get(), 1, cols, 1e-5f, s);
        gemv();
        CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int replay = 0; replay < 4; ++replay) {
            const auto x = random_floats(g, cols, 1.0f + replay);
            x32.upload(x);
            y.fill_bytes(0xFF);
            CUDA_CHECK(cudaGraphLaunch(exec, s));
            CUDA_CHECK(cudaStreamSynchronize(s));
            std::vector<float> xr(cols), want(rows);
            rms_norm_ref(xr.data(), x.data(), norm_w.data(), cols, 1e-5f);
            to_half(xr);
            matvec_int4_ref(want.data(), m, xr.data());
            EXPECT_LE(rel_err(y.download(), want), kGemvTol) << "replay " << replay;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(s);
}

// The auto rule: the i16 dot on 4-row tiles where every warp of the persistent grid (16 per SM) takes at least two of
// them, else on 2-row tiles where every warp takes at least two of those, else the fp16 dot; x beyond shared memory
// (48 KB) the wide kernel. On a 132-SM H200: gate+up I16R4, qkv I16R2, o and down Fp16R2.
TEST(CudaInt4, AutoRuleChoosesByShape) {
    QUEST_REQUIRE_GPU();
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int64_t two_rounds = int64_t{2} * sms * 16;
    auto expect = [&](int rows, int cols) {
        if ((rows + 3) / 4 >= two_rounds) return cols * 2 + cols / 4 > 48 * 1024 ? Int4Kernel::Wide : Int4Kernel::I16R4;
        if ((rows + 1) / 2 >= two_rounds) return cols * 2 + cols / 4 > 48 * 1024 ? Int4Kernel::Wide : Int4Kernel::I16R2;
        return cols * 2 > 48 * 1024 ? Int4Kernel::Wide : Int4Kernel::Fp16R2;
    };
    for (auto [rows, cols] : {std::pair{22016, 4096}, {12288, 4096}, {4096, 4096}, {4096, 11008}, {8, 32768},
                              {22016, 24576}, {4096, 24576}, {1, 32}}) {
        const Int4View v{reinterpret_cast<const uint32_t*>(16), nullptr, nullptr, rows, cols, 32};
        EXPECT_EQ(int(gemv_int4_kernel_for(v)), int(expect(rows, cols))) << rows << "x" << cols;
    }
}

TEST(CudaInt4, RejectsBadArguments) {
    QUEST_REQUIRE_GPU();
    DeviceBuffer<uint32_t> q(4096);
    DeviceBuffer<__half> sc(1024), x(1024);
    DeviceBuffer<uint8_t> z(1024);
    DeviceBuffer<float> y(64);
    Int4View v{q.get(), sc.get(), z.get(), 8, 128, 32};
    EXPECT_NO_THROW(gemv_int4(y.get(), v, x.get(), nullptr));
    Int4View bad = v;
    bad.group = 48;
    EXPECT_THROW(gemv_int4(y.get(), bad, x.get(), nullptr), std::invalid_argument);
    bad = v;
    bad.cols = 96;  // 96 % 64
    bad.group = 64;
    EXPECT_THROW(gemv_int4(y.get(), bad, x.get(), nullptr), std::invalid_argument);
    bad = v;
    bad.qweight = q.get() + 1;  // not 16-byte aligned
    EXPECT_THROW(gemv_int4(y.get(), bad, x.get(), nullptr), std::invalid_argument);
    EXPECT_THROW(gemv_int4(y.get(), v, x.get() + 1, nullptr), std::invalid_argument);
    EXPECT_THROW(dequantize_int4_to_half(nullptr, v, nullptr), std::invalid_argument);
    CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(CudaInt4, RandomWeightsStayInRange) {
    QUEST_REQUIRE_GPU();
    const int rows = 256, cols = 4096, group = 128;
    DeviceBuffer<uint32_t> q(size_t(rows) * cols / 8);
    DeviceBuffer<__half> sc(size_t(rows) * cols / group);
    DeviceBuffer<uint8_t> z(sc.size());
    fill_random_int4(q.get(), sc.get(), z.get(), rows, cols, group, 5, 0.015f, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    Int4Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.group = group;
    m.qweight = q.download();
    int4_from_device_layout(m.qweight, rows, cols, group);  // (uniform codes: any layout; read it as the kernels do)
    m.zeros = z.download();
    const auto s = sc.download();
    for (const __half& h : s) m.scales.push_back(__half_raw(h).x);
    for (uint8_t v : m.zeros) ASSERT_TRUE(v == 7 || v == 8);
    double sum = 0, sq = 0;
    for (float w : dequantize_int4(m)) {
        ASSERT_LE(std::abs(w), 0.015f * 1.25f / 7.5f * 8.0f * 1.001f);  // + the fp16 rounding of the scale
        sum += w;
        sq += double(w) * w;
    }
    const double n = double(rows) * cols;
    EXPECT_LT(std::abs(sum / n), 0.001);
    EXPECT_GT(std::sqrt(sq / n), 0.005);
}

// ---------------------------------------------------------------------------------------------------------------------
// The CUDA backend on int4 weights
// ---------------------------------------------------------------------------------------------------------------------

class CudaInt4Parity : public ::testing::TestWithParam<std::string> {};

// The fixture quantized by `quest quantize` (group 32): the CPU backend computes in fp32 on the exact dequantized
// weights, the CUDA backend keeps int4 (fused GEMV at decode, dequantize + FP16 GEMM at prefill, several prefill
// chunks). Same top-1 at every position but one (near ties of the random fixtures).
TEST_P(CudaInt4Parity, CudaInt4MatchesCpuOnTheSameQuantizedWeights) {
    QUEST_REQUIRE_GPU();
    const auto src = source_dir() / "tests/fixtures/hf" / GetParam();
    const auto dir = temp_dir("cuda_int4_" + GetParam());
    QuantizeOptions qo;
    qo.group = 32;
    ASSERT_EQ(quantize_model(src, dir, qo).quantized, 14);
    const ModelFolder m = open_model_folder(dir);
    const auto prompt = test::reference_ids(src / "reference.safetensors", "prompt_ids");
    const auto steps = test::reference_ids(src / "reference.safetensors", "decode_ids");
    const int cap = int(prompt.size() + steps.size()), V = m.config.vocab_size;
    auto cpu = make_cpu_backend(m, full(), cap);
    CudaOptions opts;
    opts.prefill_chunk = 7;
    auto gpu = CudaLlama::from_folder(m, full(), cap, opts);
    EXPECT_LT(gpu->memory_plan().weights, CudaLlama::from_folder(open_model_folder(src), full(), cap)->memory_plan().weights);
    std::vector<float> a, b;
    cpu->prefill(prompt, &a);
    gpu->prefill(prompt, &b);
    int top1_diff = 0;
    for (size_t t = 0; t < prompt.size(); ++t) {
        EXPECT_LE(rel_err(slice(b, t, V), slice(a, t, V)), kLogitTol) << "prefill " << t;
        top1_diff += top1(slice(b, t, V)) != top1(slice(a, t, V));
    }
    for (size_t i = 0; i < steps.size(); ++i) {
        const auto la = cpu->decode(steps[i]);
        const std::vector<float> ca(la.begin(), la.end());
        const auto lb = gpu->decode(steps[i]);
        const std::vector<float> cb(lb.begin(), lb.end());
        EXPECT_LE(rel_err(cb, ca), kLogitTol) << "decode " << i;
        top1_diff += top1(cb) != top1(ca);
    }
    EXPECT_LE(top1_diff, 1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaInt4Parity,
                         ::testing::Values("mha_hd64", "gqa4_hd128", "gqa8_hd64_tied", "linear_x4_legacy",
                                           "dynamic_x2", "yarn_x4_legacy", "llama3_x8", "bf16_gqa2", "f16_gqa4"));

// The AutoAWQ checkpoint on the GPU (converted to the quest-int4 layout at load) against transformers' fp32 logits.
TEST(CudaInt4Model, AwqFixtureMatchesTransformers) {
    QUEST_REQUIRE_GPU();
    const auto dir = source_dir() / "tests/fixtures/awq/llama_g32";
    const ModelFolder m = open_model_folder(dir);
    const auto ref = SafeTensorsFile::open(dir / "reference.safetensors");
    auto floats = [&](const char* name) {
        const TensorInfo* t = ref->find(name);
        std::vector<float> v(t->numel());
        std::memcpy(v.data(), ref->data(*t), t->nbytes());
        return v;
    };
    const auto prompt = test::reference_ids(dir / "reference.safetensors", "prompt_ids");
    const auto steps = test::reference_ids(dir / "reference.safetensors", "decode_ids");
    const auto pre = floats("prefill_logits"), dec = floats("decode_logits");
    const int V = m.config.vocab_size;
    auto gpu = CudaLlama::from_folder(m, full(), int(prompt.size() + steps.size()));
    std::vector<float> b;
    gpu->prefill(prompt, &b);
    for (size_t t = 0; t < prompt.size(); ++t)
        EXPECT_LE(rel_err(slice(b, t, V), slice(pre, t, V)), kLogitTol) << "prefill " << t;
    for (size_t i = 0; i < steps.size(); ++i) {
        const auto l = gpu->decode(steps[i]);
        EXPECT_LE(rel_err(std::vector<float>(l.begin(), l.end()), slice(dec, i, V)), kLogitTol) << "decode " << i;
    }
}

// Quantizing on load (CudaOptions::weights int4) gives exactly the weights of the quantized folder: the same logits
// (to 1e-6), eager or replayed from the graph. Forcing FP16 on the quantized folder runs the FP16 path on the
// dequantized weights (FP16 tolerance).
TEST(CudaInt4Model, QuantizeOnLoadEqualsTheQuantizedFolder) {
    QUEST_REQUIRE_GPU();
    const auto src = source_dir() / "tests/fixtures/hf/gqa4_hd128";
    const auto dir = temp_dir("cuda_int4_onload");
    QuantizeOptions qo;
    qo.group = 64;
    quantize_model(src, dir, qo);
    const auto prompt = test::reference_ids(src / "reference.safetensors", "prompt_ids");
    auto run = [&](const std::filesystem::path& folder, WeightRequest weights, bool graph) {
        CudaOptions o;
        o.weights = weights;
        o.graph = graph;
        auto b = CudaLlama::from_folder(open_model_folder(folder), full(), 64, o);
        b->prefill(prompt);
        std::vector<std::vector<float>> out;
        for (int t = 0; t < 8; ++t) {
            const auto l = b->decode(3 + 17 * t);
            out.emplace_back(l.begin(), l.end());
        }
        return out;
    };
    const WeightRequest as_stored = WeightRequest::as_stored();
    const auto stored = run(dir, as_stored, true), on_load = run(src, WeightRequest::int4(64), true),
               eager = run(dir, as_stored, false);
    const auto fp16 = run(dir, WeightRequest::f16(), true);
    for (size_t t = 0; t < stored.size(); ++t) {
        EXPECT_LE(rel_err(on_load[t], stored[t]), 1e-6) << t;
        EXPECT_LE(rel_err(eager[t], stored[t]), 1e-6) << "graph replay and eager launches run the same kernels " << t;
        EXPECT_LE(rel_err(fp16[t], stored[t]), kLogitTol) << t;
    }
}

// stories260K quantized at group 32 (its 172-wide down projection stays FP16): teacher-forced along the CPU
// backend's greedy text, full attention and Quest with a budget covering the context.
TEST(CudaInt4Model, Stories260KFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const auto src = shared_dir() / "models/stories260K";
    QUEST_REQUIRE_PATH(src);
    const auto dir = temp_dir("cuda_int4_stories");
    QuantizeOptions qo;
    qo.group = 32;
    EXPECT_EQ(quantize_model(src, dir, qo).kept_fp16.size(), 5u);
    const ModelFolder m = open_model_folder(dir);
    const auto tok_owner = load_tokenizer(m.dir);
    const Tokenizer& tok = *tok_owner;
    for (bool quest : {false, true}) {
        QuestSettings q = quest ? QuestSettings{} : full();
        q.budget = 512;
        auto cpu = make_cpu_backend(m, q, 512);
        Sampler greedy({0.0f, 0, 1.0f, 0});
        const auto r = generate(*cpu, greedy, tok.encode(""), 150, [](int) { return true; });
        EXPECT_THAT(tok.decode(r.tokens), ::testing::StartsWith("Once upon a time"));
        auto cpu2 = make_cpu_backend(m, q, 512);
        auto gpu = CudaLlama::from_folder(m, q, 512);
        auto la = cpu2->prefill(tok.encode(""));
        auto lb = gpu->prefill(tok.encode(""));
        int agree = 0;
        for (size_t i = 0; i < r.tokens.size(); ++i) {
            const std::vector<float> a(la.begin(), la.end()), b(lb.begin(), lb.end());
            EXPECT_LE(rel_err(b, a), kLogitTol) << (quest ? "quest " : "full ") << i;
            agree += top1(a) == top1(b);
            la = cpu2->decode(r.tokens[i]);
            lb = gpu->decode(r.tokens[i]);
        }
        EXPECT_GE(agree, int(r.tokens.size()) - 2) << (quest ? "quest" : "full");
    }
}

// Random int4 weights at Llama-2-7B layer shapes (2 layers): the device draws them, prefill and decode give finite
// logits, and the weights take about a quarter of the FP16 bytes.
TEST(CudaInt4Model, RandomInt4WeightsAtLlama7BShapes) {
    QUEST_REQUIRE_GPU();
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 2, "num_attention_heads": 32,
            "vocab_size": 32000, "max_position_embeddings": 4096})",
        "inline");
    CudaOptions o;
    o.weights = WeightRequest::int4(128);
    QuestSettings q;
    q.budget = 256;
    q.dense_layers = 1;
    auto b = CudaLlama::random(c, q, 1024, 3, o);
    CudaOptions o16;
    const size_t fp16_weights = plan_memory(c, q, 1024, o16).weights;
    const size_t embed_lm = 2ull * 32000 * 4096 * 2;
    EXPECT_LT(double(b->memory_plan().weights - embed_lm), 0.3 * double(fp16_weights - embed_lm));
    std::vector<int> prompt(700);
    for (int i = 0; i < 700; ++i) prompt[i] = 3 + (i * 131) % 31000;
    const auto l = b->prefill(prompt);
    EXPECT_TRUE(all_finite(std::vector<float>(l.begin(), l.end())));
    for (int t = 0; t < 5; ++t) {
        const auto d = b->decode(3 + t);
        EXPECT_TRUE(all_finite(std::vector<float>(d.begin(), d.end()))) << t;
    }
}
