// Causal flash-attention prefill (kernels/attention/attention_prefill.cu) against the CPU reference attention_full_ref, one
// query row at a time. Inputs are seeded random values rounded to fp16 (to_half), so the reference sees exactly the
// GPU's inputs; the output is poisoned with 0xFF (NaN) before each launch, so an unwritten element fails.
//
// Tolerance: 2e-3 relative (L2 over the whole output, and over every single (t, h) row): fp16 inputs and outputs,
// fp32 accumulation. The expected error is ~3e-4 (fp16 rounding of the output and of the softmax weights P fed to
// the tensor cores); a leaked masked key, a missed tile or a wrong KV head gives errors of 1e-2 or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_prefill.cuh"

namespace quest {
namespace {

using test::rel_err;
using test::to_float;
using test::to_half;

constexpr double kTol = 2e-3;  // fp16 inputs and outputs, fp32 accumulation

struct PrefillCase {
    int head_dim;
    int num_kv_heads;
    int group;  // query heads per KV head
    int T;
    int pos0;
    int slack;          // capacity - (pos0 + T): garbage that must not leak
    float amp = 1.0f;   // q and k standard deviation (larger: peakier softmax, bigger running-max jumps)
    uint32_t seed = 1;
    int window = 0;     // sliding window (KvLayerView::window), 0: none
};

// fp16 bit pattern as __half.
__half half_bits(uint16_t bits) {
    __half_raw raw;
    raw.x = bits;
    return __half(raw);
}

struct PrefillResult {
    double err = 0;       // relative L2 error over the whole output
    double worst_row = 0; // largest relative L2 error of one (t, h) row
    bool finite = false;
};

PrefillResult run_case(const PrefillCase& c) {
    const int D = c.head_dim;
    const int H = c.num_kv_heads * c.group;
    const int len = c.pos0 + c.T;  // valid cache tokens after the chunk's append
    const int capacity = len + c.slack;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::mt19937 rng(c.seed);

    // q [T][H][D]; k, v [num_kv_heads][capacity][D]: tokens < len random (earlier chunks and this chunk), the
    // slack past len garbage: the largest finite fp16 in K, NaN in V.
    std::vector<float> qf = test::random_floats(rng, size_t(c.T) * H * D, c.amp);
    std::vector<__half> qh = to_half(qf);
    const size_t cache_n = size_t(c.num_kv_heads) * capacity * D;
    std::vector<float> kf(cache_n), vf(cache_n);
    std::normal_distribution<float> kd(0.0f, c.amp), vd(0.0f, 1.0f);
    for (int kvh = 0; kvh < c.num_kv_heads; ++kvh)
        for (int t = 0; t < len; ++t)
            for (int i = 0; i < D; ++i) {
                const size_t idx = (size_t(kvh) * capacity + t) * D + i;
                kf[idx] = kd(rng);
                vf[idx] = vd(rng);
            }
    std::vector<__half> kh = to_half(kf), vh = to_half(vf);
    for (int kvh = 0; kvh < c.num_kv_heads; ++kvh)
        for (int t = len; t < capacity; ++t)
            for (int i = 0; i < D; ++i) {
                const size_t idx = (size_t(kvh) * capacity + t) * D + i;
                kh[idx] = half_bits(0x7BFF);  // 65504
                vh[idx] = half_bits(0x7E00);  // NaN
            }

    DeviceBuffer<__half> dq(qh.size()), dk(cache_n), dv(cache_n), dout(qh.size());
    dq.upload(qh);
    dk.upload(kh);
    dv.upload(vh);
    dout.fill_bytes(0xFF);
    KvLayerView kv;
    kv.k = dk.get();
    kv.v = dv.get();
    kv.num_kv_heads = c.num_kv_heads;
    kv.head_dim = D;
    kv.capacity = capacity;
    kv.page_size = 16;
    kv.max_pages = capacity / 16;
    kv.window = c.window;
    attention_prefill(dout.get(), dq.get(), kv, c.T, c.pos0, H, scale, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = to_float(dout.download());

    std::vector<float> ref(got.size());
    PrefillResult res;
    for (int t = 0; t < c.T; ++t)
        for (int h = 0; h < H; ++h) {
            const int kvh = h / c.group;
            const size_t row = (size_t(t) * H + h) * D;
            attention_full_ref(ref.data() + row, qf.data() + row, kf.data() + size_t(kvh) * capacity * D,
                               vf.data() + size_t(kvh) * capacity * D, D, c.pos0 + t + 1, scale,
                               c.window > 0 ? std::max(0, c.pos0 + t + 1 - c.window) : 0);
            const std::vector<float> g(got.begin() + row, got.begin() + row + D);
            const std::vector<float> r(ref.begin() + row, ref.begin() + row + D);
            const double e = rel_err(g, r);
            res.worst_row = std::isnan(e) || std::isnan(res.worst_row) ? NAN : std::max(res.worst_row, e);
        }
    res.err = rel_err(got, ref);
    res.finite = test::all_finite(got);
    return res;
}

void expect_case(const PrefillCase& c) {
    SCOPED_TRACE(::testing::Message() << "D=" << c.head_dim << " kv_heads=" << c.num_kv_heads << " group=" << c.group
                                      << " T=" << c.T << " pos0=" << c.pos0 << " slack=" << c.slack
                                      << " amp=" << c.amp << " window=" << c.window);
    const PrefillResult r = run_case(c);
    EXPECT_TRUE(r.finite);
    EXPECT_LE(r.err, kTol);
    EXPECT_LE(r.worst_row, kTol);
}

TEST(CudaAttentionPrefill, HeadDims) {
    QUEST_REQUIRE_GPU();
    for (int D : {8, 16, 32, 64, 128}) expect_case({D, 2, 2, 100, 5, 37, 1.0f, uint32_t(D)});
}

TEST(CudaAttentionPrefill, HeadDim256) {
    QUEST_REQUIRE_GPU();
    expect_case({256, 2, 2, 100, 300, 19, 1.0f, 7});
    expect_case({256, 1, 1, 7, 0, 3, 1.0f, 8});
}

TEST(CudaAttentionPrefill, GqaGroups) {
    QUEST_REQUIRE_GPU();
    // (num_kv_heads, group): MHA, Llama-style GQA groups of 4 and 8, odd group size 3.
    const int configs[][2] = {{3, 1}, {2, 4}, {1, 8}, {4, 8}, {4, 3}};
    uint32_t seed = 100;
    for (const auto& kg : configs) {
        expect_case({64, kg[0], kg[1], 64, 300, 64, 1.0f, seed++});
        expect_case({32, kg[0], kg[1], 33, 5, 1, 1.0f, seed++});
    }
}

TEST(CudaAttentionPrefill, ChunkShapes) {
    QUEST_REQUIRE_GPU();
    // Every T (one token, sub-tile, exactly one tile, odd, several tiles + 1) at every chunk start (first chunk,
    // unaligned later chunk, long earlier context), for a small and the Llama head_dim.
    uint32_t seed = 200;
    for (int D : {32, 128})
        for (int T : {1, 7, 64, 100, 257})
            for (int pos0 : {0, 5, 300}) expect_case({D, 1, 2, T, pos0, 50, 1.0f, seed++});
}

TEST(CudaAttentionPrefill, PeakySoftmax) {
    QUEST_REQUIRE_GPU();
    // q, k with std 3: logits of std ~9, so the running max jumps between tiles and most weights underflow.
    expect_case({64, 2, 4, 257, 300, 11, 3.0f, 300});
    expect_case({128, 1, 2, 100, 1000, 0, 3.0f, 301});
    expect_case({16, 1, 1, 257, 0, 0, 3.0f, 302});
}

TEST(CudaAttentionPrefill, SlidingWindow) {
    QUEST_REQUIRE_GPU();
    // Windows shorter than a key tile, between tiles, longer than the chunk; chunks at the start and deep into the
    // cache (whole tiles below every row's window skipped); one window longer than the sequence (no effect).
    uint32_t seed = 500;
    for (int D : {32, 64, 128})
        for (int window : {1, 24, 100, 4096})
            for (int pos0 : {0, 37, 700}) expect_case({D, 2, 2, 150, pos0, 20, 1.0f, seed++, window});
    expect_case({256, 1, 3, 90, 333, 5, 3.0f, seed++, 50});
    expect_case({8, 1, 1, 64, 64, 0, 1.0f, seed++, 64});
}

TEST(CudaAttentionPrefill, NoSlack) {
    QUEST_REQUIRE_GPU();
    // capacity == pos0 + T: the last key tile is partial and must not read past the allocation.
    expect_case({128, 2, 1, 100, 27, 0, 1.0f, 400});
    expect_case({8, 1, 4, 1, 0, 0, 1.0f, 401});
}

TEST(CudaAttentionPrefill, Llama7BShape) {
    QUEST_REQUIRE_GPU();
    // Llama-2-7B attention (MHA, D = 128), 4 of its 32 heads to keep the CPU reference fast: a 512-token chunk
    // after 1536 tokens of context.
    expect_case({128, 4, 1, 512, 1536, 100, 1.0f, 500});
}

// Chunked prefill is exact: key tiles are aligned to absolute positions and each row visits them in the same
// order with the same values, so any split of a prompt into chunks gives bit-identical outputs.
TEST(CudaAttentionPrefill, ChunkingIsBitExact) {
    QUEST_REQUIRE_GPU();
    const int D = 64, kvh = 2, group = 2, H = kvh * group, len = 300, capacity = 320;
    const float scale = 0.125f;
    std::mt19937 rng(600);
    std::vector<float> qf = test::random_floats(rng, size_t(len) * H * D);
    std::vector<float> kf = test::random_floats(rng, size_t(kvh) * capacity * D);
    std::vector<float> vf = test::random_floats(rng, size_t(kvh) * capacity * D);
    DeviceBuffer<__half> dq(qf.size()), dk(kf.size()), dv(vf.size()), whole(qf.size()), chunked(qf.size());
    dq.upload(to_half(qf));
    dk.upload(to_half(kf));
    dv.upload(to_half(vf));
    whole.fill_bytes(0xFF);
    chunked.fill_bytes(0xFF);
    KvLayerView kv;
    kv.k = dk.get();
    kv.v = dv.get();
    kv.num_kv_heads = kvh;
    kv.head_dim = D;
    kv.capacity = capacity;
    attention_prefill(whole.get(), dq.get(), kv, len, 0, H, scale, nullptr);
    const int cuts[] = {0, 1, 70, 133, 200, len};
    for (int i = 0; i + 1 < 6; ++i) {
        const size_t off = size_t(cuts[i]) * H * D;
        attention_prefill(chunked.get() + off, dq.get() + off, kv, cuts[i + 1] - cuts[i], cuts[i], H, scale, nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<__half> a = whole.download(), b = chunked.download();
    size_t mismatches = 0;
    for (size_t i = 0; i < a.size(); ++i) mismatches += __half_raw(a[i]).x != __half_raw(b[i]).x;
    EXPECT_EQ(mismatches, 0u);
    EXPECT_TRUE(test::all_finite(to_float(a)));
}

TEST(CudaAttentionPrefill, RejectsBadArguments) {
    QUEST_REQUIRE_GPU();
    DeviceBuffer<__half> buf(4096);
    KvLayerView kv;
    kv.k = buf.get();
    kv.v = buf.get();
    kv.num_kv_heads = 2;
    kv.head_dim = 64;
    kv.capacity = 16;
    __half* p = buf.get();  // q [4][4][64] at p, out at o; kv reads the whole buffer
    __half* o = p + 3072;
    EXPECT_NO_THROW(attention_prefill(o, p, kv, 4, 12, 4, 0.125f, nullptr));
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_THROW(attention_prefill(o, p, kv, 4, 13, 4, 0.125f, nullptr), std::invalid_argument);  // past capacity
    EXPECT_THROW(attention_prefill(o, p, kv, 0, 0, 4, 0.125f, nullptr), std::invalid_argument);   // T = 0
    EXPECT_THROW(attention_prefill(o, p, kv, 4, -1, 4, 0.125f, nullptr), std::invalid_argument);  // pos0 < 0
    EXPECT_THROW(attention_prefill(o, p, kv, 4, 0, 3, 0.125f, nullptr), std::invalid_argument);   // 3 % 2 != 0
    EXPECT_THROW(attention_prefill(nullptr, p, kv, 4, 0, 4, 0.125f, nullptr), std::invalid_argument);
    EXPECT_THROW(attention_prefill(o + 1, p, kv, 4, 0, 4, 0.125f, nullptr), std::invalid_argument);  // misaligned
    kv.head_dim = 96;  // not a supported head_dim
    EXPECT_THROW(attention_prefill(o, p, kv, 4, 0, 4, 0.125f, nullptr), std::invalid_argument);
}

// Throughput of the realistic case: Llama-2-7B (32 heads, D = 128) prefilling a 2048-token chunk at the end of a
// 32K context. Spot-checks a few rows against the reference. Run with --gtest_also_run_disabled_tests.
TEST(CudaAttentionPrefill, DISABLED_BenchLlama7B32K) {
    QUEST_REQUIRE_GPU();
    const int D = 128, H = 32, T = 2048, pos0 = 32768 - T, capacity = 32768;
    const float scale = 1.0f / std::sqrt(float(D));
    const size_t cache_n = size_t(H) * capacity * D;
    // Cheap deterministic fill (a full normal draw of 134M values would dominate the test).
    auto fill = [](std::vector<float>& v, uint32_t seed) {
        uint32_t x = seed;
        for (float& f : v) {
            x = x * 1664525u + 1013904223u;
            f = (float((x >> 8) & 0xFFFF) / 65536.0f - 0.5f) * 3.4f;  // uniform, std ~1
        }
    };
    std::vector<float> qf(size_t(T) * H * D), kf(cache_n), vf(cache_n);
    fill(qf, 1);
    fill(kf, 2);
    fill(vf, 3);
    DeviceBuffer<__half> dq(qf.size()), dk(cache_n), dv(cache_n), dout(qf.size());
    dq.upload(to_half(qf));
    dk.upload(to_half(kf));
    dv.upload(to_half(vf));
    dout.fill_bytes(0xFF);
    KvLayerView kv;
    kv.k = dk.get();
    kv.v = dv.get();
    kv.num_kv_heads = H;
    kv.head_dim = D;
    kv.capacity = capacity;
    attention_prefill(dout.get(), dq.get(), kv, T, pos0, H, scale, nullptr);  // warm-up
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    const int iters = 10;
    CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) attention_prefill(dout.get(), dq.get(), kv, T, pos0, H, scale, nullptr);
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= iters;
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    // 2 matmuls (QK^T, PV) x 2 flops per multiply-add x D x visited keys, summed over queries and heads.
    const double flops = 4.0 * D * H * (double(T) * pos0 + double(T) * (T + 1) / 2);
    std::printf("prefill D=%d H=%d T=%d pos0=%d: %.3f ms, %.1f TFLOP/s\n", D, H, T, pos0, ms, flops / ms * 1e-9);

    const std::vector<float> got = to_float(dout.download());
    std::vector<float> g, r;
    for (int t : {0, 1, 777, T - 1})
        for (int h : {0, 13, 31}) {
            std::vector<float> ref(D);
            const size_t row = (size_t(t) * H + h) * D;
            attention_full_ref(ref.data(), qf.data() + row, kf.data() + size_t(h) * capacity * D,
                               vf.data() + size_t(h) * capacity * D, D, pos0 + t + 1, scale);
            g.insert(g.end(), got.begin() + row, got.begin() + row + D);
            r.insert(r.end(), ref.begin(), ref.end());
        }
    EXPECT_LE(rel_err(g, r), kTol);
}

}  // namespace
}  // namespace quest
