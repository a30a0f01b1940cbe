// 4-bit weights on the CPU: the quest-int4 layout, round-to-nearest quantization and its error bound, the AutoAWQ
// reader (against AutoAWQ's documented packing and a committed AWQ checkpoint with reference logits), `quest
// quantize` folders, and the quality of 4-bit models against FP32/FP16 (KL divergence, top-1 agreement,
// perplexity) on the HF fixtures and stories260K.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sys/wait.h>

#include "model/core/backend.h"
#include "kernels/common/basic_ops.h"
#include "kernels/linear/format.h"
#include "kernels/linear/int4_layout.h"
#include "kernels/linear/quant.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/quantize.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "test_util.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/tokenizer.h"

using namespace quest;
using ::testing::HasSubstr;

namespace {

std::vector<float> normal(std::mt19937& rng, size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// |w - dequant| <= scale / 2 for every element (up to fp32 rounding of w / scale).
void expect_within_bound(const std::vector<float>& W, const Int4Matrix& m) {
    const std::vector<float> dq = dequantize_int4(m);
    int bad = 0;
    for (int r = 0; r < m.rows; ++r)
        for (int c = 0; c < m.cols; ++c) {
            const float w = W[size_t(r) * m.cols + c], s = m.scale(r, c / m.group);
            const float err = std::abs(w - dq[size_t(r) * m.cols + c]);
            if (err > 0.5f * s * (1.0f + 1e-5f) + 1e-6f * std::abs(w)) {
                if (++bad < 5) ADD_FAILURE() << "[" << r << "][" << c << "] w " << w << " dq " << dq[size_t(r) * m.cols + c] << " scale " << s;
            }
        }
    EXPECT_EQ(bad, 0);
}

// AutoAWQ WQLinear_GEMM.from_linear packing (awq/modules/linear/gemm.py), from codes q [N][K], zeros [N][K/G]:
// qweight [K][N/8] with qweight[:, col] |= intweight[:, col*8 + order_map[i]] << 4i, the same for qzeros.
void pack_awq(const Int4Matrix& m, std::vector<int32_t>& qweight, std::vector<int32_t>& qzeros,
              std::vector<uint16_t>& scales) {
    const int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    const int K = m.cols, N = m.rows, G = m.groups();
    qweight.assign(size_t(K) * N / 8, 0);
    qzeros.assign(size_t(G) * N / 8, 0);
    scales.assign(size_t(G) * N, 0);
    for (int k = 0; k < K; ++k)
        for (int col = 0; col < N / 8; ++col)
            for (int i = 0; i < 8; ++i)
                qweight[size_t(k) * (N / 8) + col] |= int32_t(uint32_t(m.code(col * 8 + order_map[i], k)) << (4 * i));
    for (int g = 0; g < G; ++g) {
        for (int col = 0; col < N / 8; ++col)
            for (int i = 0; i < 8; ++i)
                qzeros[size_t(g) * (N / 8) + col] |=
                    int32_t(uint32_t(m.zeros[size_t(col * 8 + order_map[i]) * G + g]) << (4 * i));
        for (int n = 0; n < N; ++n) scales[size_t(g) * N + n] = m.scales[size_t(n) * G + g];
    }
}

template <typename T>
std::vector<T> read_tensor(const SafeTensorsFile& f, const std::string& name) {
    const TensorInfo* t = f.find(name);
    if (!t) throw std::runtime_error("fixture tensor missing: " + name);
    std::vector<T> out(t->numel());
    std::memcpy(out.data(), f.data(*t), t->nbytes());
    return out;
}

std::filesystem::path awq_fixture() { return test::source_dir() / "tests/fixtures/awq/llama_g32"; }

// Quality of a 4-bit model against a reference on the same tokens (teacher forcing, every prefill position).
struct Agreement {
    double kl = 0;       // mean KL(reference || quantized), nats
    double top1 = 0;     // fraction of positions with the same argmax
    double ppl_ref = 0;  // perplexity of the token sequence (next-token prediction) under each model
    double ppl_q = 0;
};

std::vector<double> log_softmax(const float* l, int V) {
    double mx = -1e300;
    for (int i = 0; i < V; ++i) mx = std::max(mx, double(l[i]));
    double s = 0;
    for (int i = 0; i < V; ++i) s += std::exp(l[i] - mx);
    std::vector<double> out(V);
    for (int i = 0; i < V; ++i) out[i] = l[i] - mx - std::log(s);
    return out;
}

Agreement compare_logits(const std::vector<float>& ref, const std::vector<float>& q, const std::vector<int>& tokens,
                         int V) {
    const int T = static_cast<int>(tokens.size());
    Agreement a;
    double nll_ref = 0, nll_q = 0;
    for (int t = 0; t < T; ++t) {
        const auto lp = log_softmax(&ref[size_t(t) * V], V), lq = log_softmax(&q[size_t(t) * V], V);
        double kl = 0;
        int ar = 0, aq = 0;
        for (int i = 0; i < V; ++i) {
            kl += std::exp(lp[i]) * (lp[i] - lq[i]);
            if (lp[i] > lp[ar]) ar = i;
            if (lq[i] > lq[aq]) aq = i;
        }
        a.kl += kl / T;
        a.top1 += double(ar == aq) / T;
        if (t + 1 < T) {
            nll_ref -= lp[tokens[t + 1]];
            nll_q -= lq[tokens[t + 1]];
        }
    }
    a.ppl_ref = std::exp(nll_ref / (T - 1));
    a.ppl_q = std::exp(nll_q / (T - 1));
    return a;
}

std::vector<float> prefill_logits(std::shared_ptr<const LlamaWeightsF32> w, const std::vector<int>& tokens) {
    QuestSettings q;
    q.full_attention = true;
    CpuLlama model(std::move(w), q, static_cast<int>(tokens.size()));
    std::vector<float> all;
    model.prefill(tokens, &all);
    return all;
}

std::shared_ptr<LlamaWeightsF32> load_weights(const std::filesystem::path& dir) {
    const ModelFolder m = open_model_folder(dir);
    return std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(dir), m.config));
}

const char* kStoryText =
    "Once upon a time, there was a little boy named Tom. Tom liked to play with his red ball in the garden. One day, "
    "the ball rolled under a big tree. Tom was sad because he could not reach it. His friend Sue came to help.";

const char* kCalibText =
    "Lily and her mom went to the park. The sun was warm and the birds sang. Lily saw a small dog near the pond. The "
    "dog was wet and cold. Lily gave the dog her blanket. The dog wagged its tail and licked her hand. Mom smiled and "
    "said, \"You are very kind, Lily.\" They walked home together, and the dog followed them. Lily asked if they could "
    "keep the dog. Mom said yes, and Lily hugged her new friend. The next day they went to the shop to buy food.";

std::filesystem::path small_model(const std::string& name, int intermediate, DType dtype = DType::F32) {
    const auto dir = test::temp_dir(name);
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 64, "intermediate_size": )" + std::to_string(intermediate) +
            R"(, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256})",
        "inline");
    write_random_llama(dir, c, {11, dtype});
    std::filesystem::copy_file(test::source_dir() / "tests/fixtures/tokenizer/demo-512.model", dir / "tokenizer.model");
    return dir;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------------------------------

TEST(Int4Layout, WordHoldsEvenColumnsLowOddColumnsHigh) {
    const uint8_t q[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    // slots 0..7 hold columns 0, 2, 4, 6, 1, 3, 5, 7 (the nibbles read from the lowest)
    EXPECT_EQ(int4_pack_word(q), 0x75316420u);
    std::mt19937 rng(1);
    for (int trial = 0; trial < 1000; ++trial) {
        uint8_t c[8];
        for (uint8_t& v : c) v = rng() & 15;
        const uint32_t w = int4_pack_word(c);
        for (int j = 0; j < 8; ++j) EXPECT_EQ(int4_word_code(w, j), c[j]);
        // What the GPU kernel relies on: (w >> 4i) & 0x000F000F is the column pair (2i, 2i + 1), low half first.
        for (int i = 0; i < 4; ++i) EXPECT_EQ((w >> (4 * i)) & 0x000F000Fu, uint32_t(c[2 * i]) | uint32_t(c[2 * i + 1]) << 16);
    }
}

// The GPU kernel's dequantization (kernels/linear/gemv_int4.cu, word_to_pairs), emulated with IEEE fp16 on the host: the
// magic-number constants give (q - z) exactly for every code and zero point.
TEST(Int4Layout, MagicNumberDequantizationIsExact) {
    auto lo = [](uint32_t h) { return half_to_float(uint16_t(h & 0xFFFFu)); };
    auto hi = [](uint32_t h) { return half_to_float(uint16_t(h >> 16)); };
    EXPECT_EQ(half_to_float(0x2C00u), 0.0625f);
    for (uint32_t z = 0; z < 16; ++z) {
        const float zlo = half_to_float(uint16_t(0x6400u | z)), zhi = half_to_float(uint16_t(0xD400u | (z << 4)));
        ASSERT_EQ(zlo, 1024.0f + z);
        ASSERT_EQ(zhi, -(64.0f + z));
        std::mt19937 rng(z);
        for (int trial = 0; trial < 200; ++trial) {
            uint8_t q[8];
            for (uint8_t& v : q) v = rng() & 15;
            uint32_t w = int4_pack_word(q);
            const uint32_t lo0 = (w & 0x000F000Fu) | 0x64006400u, hi0 = (w & 0x00F000F0u) | 0x64006400u;
            w >>= 8;
            const uint32_t lo1 = (w & 0x000F000Fu) | 0x64006400u, hi1 = (w & 0x00F000F0u) | 0x64006400u;
            // __hsub2(lo, zlo) and __hfma2(hi, 1/16, zhi): every intermediate is exact in fp16 and fp32.
            const float got[8] = {lo(lo0) - zlo, hi(lo0) - zlo, lo(hi0) * 0.0625f + zhi, hi(hi0) * 0.0625f + zhi,
                                  lo(lo1) - zlo, hi(lo1) - zlo, lo(hi1) * 0.0625f + zhi, hi(hi1) * 0.0625f + zhi};
            for (int j = 0; j < 8; ++j) ASSERT_EQ(got[j], float(int(q[j]) - int(z))) << "column " << j;
        }
    }
}

// The GPU kernel's integer dot (kernels/linear/gemv_int4.cu: x_to_i16, chunk_dot_i16, the "i16" variants), emulated on the
// host: x in block floating point per chunk of 32 columns (xi = rint(x 2^k), k = 29 - E for the fp16 exponent field
// E of the chunk's largest |x|), split into byte planes packed by the kernel's PRMT selectors (byte_perm's host
// emulation, kernels/common/host_device.h), dotted with the code bytes of words packed by int4_pack_word by dp4a. Checks
// what the kernel's comments claim: |xi| < 2^15, xi 2^-k == x exactly for normal x within 4 binades of the chunk's
// largest, |xi 2^-k - x| <= 2^-k / 2 always, and 256 sum(q hi) + sum(q lo) - z sum(xi) == sum (q - z) xi (the byte
// order of the planes matches the codes').
TEST(Int4Layout, IntegerDotOfBlockFloatingPointXIsExact) {
    auto dp4a_us = [](uint32_t a, uint32_t b, int64_t c) {  // unsigned bytes of a, signed bytes of b
        for (int i = 0; i < 4; ++i) c += int64_t((a >> (8 * i)) & 0xFFu) * int64_t(int8_t((b >> (8 * i)) & 0xFFu));
        return c;
    };
    auto dp4a_uu = [](uint32_t a, uint32_t b, int64_t c) {
        for (int i = 0; i < 4; ++i) c += int64_t((a >> (8 * i)) & 0xFFu) * int64_t((b >> (8 * i)) & 0xFFu);
        return c;
    };
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> binade(-26, 15), code(0, 15), kind(0, 5);
    int exact_checked = 0, rounded_checked = 0;
    for (int trial = 0; trial < 2000; ++trial) {
        uint16_t h[32];
        const int spread = 1 + trial % 20;  // binades spanned by the chunk
        const int top = binade(rng) % 12;
        for (uint16_t& v : h) {
            float x = (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(mant(rng), top - int(rng() % spread));
            if (kind(rng) == 0) x = 0.0f;
            v = float_to_half(x);
        }
        if (trial % 97 == 0) std::fill(h, h + 32, uint16_t(0));  // an all-zero chunk
        uint32_t mb = 0;
        for (uint16_t v : h) mb = std::max(mb, uint32_t(v & 0x7FFFu));
        const int E = int(mb >> 10);
        const float up = std::ldexp(1.0f, 29 - E), sx = std::ldexp(1.0f, E - 29);
        int xi[32];
        int64_t xsum = 0;
        for (int i = 0; i < 32; ++i) {
            const float x = half_to_float(h[i]);
            xi[i] = int(std::nearbyint(x * up));  // the kernel's __float2int_rn of the exact fp32 product
            ASSERT_LT(std::abs(xi[i]), 32768) << "E " << E;
            xsum += xi[i];
            const double err = std::fabs(double(xi[i]) * sx - double(x));
            ASSERT_LE(err, 0.5 * sx);
            const int e = (h[i] >> 10) & 31;
            if (e >= 1 && e >= E - 4) {
                ASSERT_EQ(err, 0.0) << "x " << x << " E " << E;
                ++exact_checked;
            } else if (h[i] & 0x7FFFu) {
                ++rounded_checked;
            }
        }
        uint8_t q[32];
        for (uint8_t& c : q) c = uint8_t(code(rng));
        const int z = code(rng);
        int64_t hs = 0, ls = 0, want = 0;
        for (int j = 0; j < 4; ++j) {  // piece j: columns 8j .. 8j + 7, one code word
            const int* v = xi + 8 * j;
            const uint32_t a04 = byte_perm(uint32_t(v[0]), uint32_t(v[4]), 0x4051u),
                           a15 = byte_perm(uint32_t(v[1]), uint32_t(v[5]), 0x4051u);
            const uint32_t a26 = byte_perm(uint32_t(v[2]), uint32_t(v[6]), 0x4051u),
                           a37 = byte_perm(uint32_t(v[3]), uint32_t(v[7]), 0x4051u);
            const uint32_t px = byte_perm(a04, a15, 0x5410u), py = byte_perm(a26, a37, 0x5410u);
            const uint32_t pz = byte_perm(a04, a15, 0x7632u), pw = byte_perm(a26, a37, 0x7632u);
            const uint32_t w = int4_pack_word(q + 8 * j);
            const uint32_t c0 = w & 0x0F0F0F0Fu, c1 = (w >> 4) & 0x0F0F0F0Fu;
            hs = dp4a_us(c1, py, dp4a_us(c0, px, hs));
            ls = dp4a_uu(c1, pw, dp4a_uu(c0, pz, ls));
            for (int i = 0; i < 8; ++i) want += int64_t(int(q[8 * j + i]) - z) * v[i];
        }
        ASSERT_EQ(256 * hs + ls - z * xsum, want) << "trial " << trial;
        ASSERT_LT(std::llabs(want), int64_t(1) << 24);  // exact in the kernel's int32 and in its fp32 conversion
    }
    EXPECT_GT(exact_checked, 10000);
    EXPECT_GT(rounded_checked, 1000);
}

// What the integer dot costs and buys in accuracy, on a host emulation of both GPU arithmetics (the fp16 dot:
// (q - z) x in fp16 with fp16 sums of 8 products, kernels/linear/gemv_int4.cu chunk_dot; the integer dot: x in block
// floating point per 32 columns, exact sums) against a double reference: 256 int4 rows x 4096 columns, group 128,
// x ~ N(0, 0.03) in fp16 with one outlier channel (a normalised "massive activation"). The integer dot is 3-40x more
// accurate when the outlier's weights are ordinary, about as accurate when they are the smallest nonzero (codes
// z +- 1), and worse when they are exactly zero in every row (codes equal to the zero point): then the outlier's 31
// neighbours in its chunk, 2^11 .. 2^13 below it, carry the output with 4 .. 2 bits. Printed, and bounded here as
// kernels/linear/gemv_int4.cuh states.
TEST(Int4Layout, IntegerDotErrorAgainstTheFp16DotWithAnOutlier) {
    auto h = [](float x) { return half_to_float(float_to_half(x)); };
    const int rows = 256, cols = 4096, outc = 1415;
    std::mt19937 g(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct Case { float outlier; int weights; double max_fp16, max_i16; };  // weights: 0 random, 1 zero, 2 +-1
    const Case cases[] = {{0.0f, 0, 1e-3, 5e-5},  {64.0f, 0, 1e-3, 3e-4}, {300.0f, 0, 1e-3, 3e-4},
                          {64.0f, 2, 1e-3, 1e-3}, {300.0f, 2, 1e-3, 1e-3}, {64.0f, 1, 1e-3, 6e-3},
                          {300.0f, 1, 1e-3, 2.5e-2}};
    for (const Case& cs : cases) {
        std::vector<float> x(cols);
        for (float& v : x) v = h(0.03f * nd(g));
        x[outc] = h(cs.outlier);
        std::vector<int> q(size_t(rows) * cols), z(size_t(rows) * cols / 128);
        std::vector<float> s(z.size());
        for (int& c : q) c = int(g() % 16);
        for (int& v : z) v = 7 + int(g() % 2);
        for (float& v : s) v = h(0.01f * (0.75f + 0.5f * float(g() % 1000) / 1000.0f));
        if (cs.weights)
            for (int r = 0; r < rows; ++r)
                q[size_t(r) * cols + outc] = z[size_t(r) * 32 + outc / 128] + (cs.weights == 2 ? (r % 2 ? 1 : -1) : 0);
        std::vector<double> xb(cols);  // x as the integer dot holds it (xi 2^-k)
        for (int c0 = 0; c0 < cols; c0 += 32) {
            uint32_t mb = 0;
            for (int i = 0; i < 32; ++i) mb = std::max<uint32_t>(mb, float_to_half(x[c0 + i]) & 0x7FFFu);
            const int E = int(mb >> 10);
            for (int i = 0; i < 32; ++i)
                xb[c0 + i] = std::nearbyint(double(x[c0 + i]) * std::ldexp(1.0, 29 - E)) * std::ldexp(1.0, E - 29);
        }
        double e16 = 0.0, ei = 0.0, norm = 0.0;
        for (int r = 0; r < rows; ++r) {
            double exact = 0.0, yi = 0.0;
            float yf = 0.0f;
            for (int c0 = 0; c0 < cols; c0 += 32) {
                const size_t grp = size_t(r) * 32 + c0 / 128;
                float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // even / odd words x the two fp16 halves
                for (int j = 0; j < 4; ++j)
                    for (int p = 0; p < 8; ++p) {
                        const int c = c0 + 8 * j + p, d = q[size_t(r) * cols + c] - z[grp];
                        exact += double(d) * s[grp] * x[c];
                        yi += double(d) * s[grp] * xb[c];
                        float& a = acc[j & 1][p & 1];
                        a = h(std::fma(float(d), x[c], a));  // HFMA2: one fp16 rounding
                    }
                yf = std::fma(s[grp], (acc[0][0] + acc[0][1]) + (acc[1][0] + acc[1][1]), yf);
            }
            e16 += (yf - exact) * (yf - exact);
            ei += (yi - exact) * (yi - exact);
            norm += exact * exact;
        }
        const double r16 = std::sqrt(e16 / norm), ri = std::sqrt(ei / norm);
        std::printf("outlier %5.0f, its weights %-6s: relative L2 error fp16 dot %.2e, integer dot %.2e\n",
                    cs.outlier, cs.weights == 0 ? "random" : (cs.weights == 1 ? "zero" : "+-1"), r16, ri);
        EXPECT_LE(r16, cs.max_fp16);
        EXPECT_LE(ri, cs.max_i16);
        if (cs.weights == 0) { EXPECT_LT(ri, 0.5 * r16); }
        if (cs.weights == 2) { EXPECT_LT(ri, 1.5 * r16); }
    }
}

// The CUDA device layout (kernels/linear/int4_layout.h): per row, a permutation of the 16-byte chunks that puts chunk j of
// segments 32 b .. 32 b + n_b - 1 (S chunks of one group each) at n_b consecutive slots; the identity for group 32.
TEST(Int4DeviceLayout, ChunkSlotsArePerRowPermutationsWithCoalescedRuns) {
    for (int group : {32, 64, 128, 256, 4096}) {
        for (int cols : {32, 64, 96, 128, 192, 384, 640, 4096, 4160, 4224, 11008, 12288, 24576}) {
            if (!int4_quantizable(cols, group)) continue;
            SCOPED_TRACE(::testing::Message() << cols << " g" << group);
            const int chunks = cols / 32, sshift = int4_segment_shift(group), S = 1 << sshift;
            EXPECT_EQ(S, std::min(group / 32, 4));
            EXPECT_EQ(chunks % S, 0);
            std::vector<int> hits(chunks, 0);
            for (int c = 0; c < chunks; ++c) {
                const int slot = int4_chunk_slot(c, chunks, sshift);
                ASSERT_GE(slot, 0);
                ASSERT_LT(slot, chunks);
                ++hits[slot];
                if (S == 1) {
                    EXPECT_EQ(slot, c);
                }
                // A segment's chunks are inside one group.
                EXPECT_EQ((c / S) * S * 32 / group, (c / S * S + S - 1) * 32 / group);
            }
            for (int h : hits) ASSERT_EQ(h, 1);
            const int nseg = chunks / S;
            for (int b = 0; b * 32 < nseg; ++b) {
                const int n = std::min(32, nseg - 32 * b);
                for (int j = 0; j < S; ++j)
                    for (int l = 0; l < n; ++l)
                        ASSERT_EQ(int4_chunk_slot((32 * b + l) * S + j, chunks, sshift), 32 * S * b + j * n + l);
            }
        }
    }
}

TEST(Int4DeviceLayout, RepackThenUnpackIsTheIdentity) {
    std::mt19937 rng(11);
    struct Case { int rows, cols, group; };
    for (Case cs : {Case{1, 32, 32}, Case{3, 96, 32}, Case{5, 128, 64}, Case{7, 384, 128}, Case{2, 11008, 128},
                    Case{4, 4096, 4096}, Case{3, 4160, 64}, Case{6, 2048, 256}}) {
        SCOPED_TRACE(::testing::Message() << cs.rows << "x" << cs.cols << " g" << cs.group);
        std::vector<uint32_t> q(size_t(cs.rows) * cs.cols / 8);
        for (uint32_t& w : q) w = rng();
        std::vector<uint32_t> d = q;
        int4_to_device_layout(d, cs.rows, cs.cols, cs.group);
        const int chunks = cs.cols / 32, sshift = int4_segment_shift(cs.group);
        for (int r = 0; r < cs.rows; ++r)  // chunk c of row r is at its slot, word for word
            for (int c = 0; c < chunks; ++c)
                for (int w = 0; w < 4; ++w)
                    ASSERT_EQ(d[(size_t(r) * chunks + int4_chunk_slot(c, chunks, sshift)) * 4 + w],
                              q[(size_t(r) * chunks + c) * 4 + w]);
        const bool identity = sshift == 0 || chunks == (1 << sshift);  // group 32, or one segment per row
        EXPECT_EQ(d == q, identity);
        int4_from_device_layout(d, cs.rows, cs.cols, cs.group);
        EXPECT_EQ(d, q);
    }
    std::vector<uint32_t> q(4 * 96 / 8);
    EXPECT_THROW(int4_to_device_layout(q, 4, 96, 64), std::invalid_argument);   // 96 % 64
    EXPECT_THROW(int4_to_device_layout(q, 5, 96, 32), std::invalid_argument);   // size
    EXPECT_THROW(int4_from_device_layout(q, 4, 96, 48), std::invalid_argument); // group
}

TEST(Int4Layout, GroupRules) {
    for (int g : {32, 64, 128, 256, 4096}) EXPECT_TRUE(int4_group_valid(g)) << g;
    for (int g : {0, 8, 16, 48, 96, 100, -32}) EXPECT_FALSE(int4_group_valid(g)) << g;
    EXPECT_TRUE(int4_quantizable(4096, 128));
    EXPECT_TRUE(int4_quantizable(11008, 128));  // 86 groups
    EXPECT_FALSE(int4_quantizable(172, 64));    // stories260K's MLP width
    EXPECT_FALSE(int4_quantizable(96, 64));
    EXPECT_TRUE(int4_quantizable(96, 32));
    EXPECT_EQ(int4_bytes(4096, 4096, 128), size_t(4096) * 2048 + size_t(4096) * 32 * 3);
    std::vector<float> w(3 * 172, 1.0f);
    EXPECT_THROW(quantize_int4(w.data(), 3, 172, 64), InputError);
    EXPECT_THROW(quantize_int4(w.data(), 3, 172, 48), InputError);
}

// ---------------------------------------------------------------------------------------------------------------------
// Round-to-nearest
// ---------------------------------------------------------------------------------------------------------------------

TEST(Int4Quantize, ErrorWithinHalfAScaleAtEveryShapeAndGroup) {
    std::mt19937 rng(7);
    struct Case { int rows, cols, group; };
    for (Case cs : {Case{1, 32, 32}, Case{3, 96, 32}, Case{37, 160, 32}, Case{5, 128, 64}, Case{64, 256, 128},
                    Case{17, 4096, 128}, Case{2, 512, 512}, Case{9, 11008, 64}}) {
        SCOPED_TRACE(::testing::Message() << cs.rows << "x" << cs.cols << " g" << cs.group);
        std::vector<float> W = normal(rng, size_t(cs.rows) * cs.cols, 0.05f);
        for (int i = 0; i < 20; ++i) W[rng() % W.size()] *= 40.0f;  // outliers
        const Int4Matrix m = quantize_int4(W.data(), cs.rows, cs.cols, cs.group);
        ASSERT_EQ(m.qweight.size(), size_t(cs.rows) * cs.cols / 8);
        ASSERT_EQ(m.scales.size(), size_t(cs.rows) * cs.cols / cs.group);
        for (uint8_t z : m.zeros) ASSERT_LE(z, 15);
        expect_within_bound(W, m);
        EXPECT_LT(int4_relative_error(W.data(), m), 0.25);
    }
}

TEST(Int4Quantize, OneSidedConstantAndZeroGroups) {
    const int cols = 128, group = 32;
    std::vector<float> W(4 * cols);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (int c = 0; c < cols; ++c) {
        W[c] = u(rng);                 // row 0: all positive (zero point 0)
        W[cols + c] = -u(rng);         // row 1: all negative (zero point 15)
        W[2 * cols + c] = 0.37f;       // row 2: constant
        W[3 * cols + c] = 0.0f;        // row 3: all zero
    }
    const Int4Matrix m = quantize_int4(W.data(), 4, cols, group);
    expect_within_bound(W, m);
    for (int g = 0; g < cols / group; ++g) {
        EXPECT_EQ(m.zeros[g], 0);
        EXPECT_EQ(m.zeros[m.groups() + g], 15);
        EXPECT_EQ(m.scale(3, g), 0.0f);
    }
    for (int c = 0; c < cols; ++c) {
        EXPECT_EQ(m.value(3, c), 0.0f);
        EXPECT_NEAR(m.value(2, c), 0.37f, 0.37f / 30.0f);
    }
    // 0 is always on the grid: zeros next to a spike stay exactly zero.
    W.assign(W.size(), 0.0f);
    W[5] = 1.0f;
    const Int4Matrix m2 = quantize_int4(W.data(), 4, cols, group);
    for (int c = 0; c < cols; ++c)
        if (c != 5) {
            EXPECT_EQ(m2.value(0, c), 0.0f) << c;
        }
    EXPECT_NEAR(m2.value(0, 5), 1.0f, m2.scale(0, 0) / 2);
}

TEST(Int4Quantize, RejectsNonFiniteAndHugeWeights) {
    std::vector<float> W(64, 0.1f);
    W[7] = NAN;
    EXPECT_THROW(quantize_int4(W.data(), 2, 32, 32), InputError);
    W[7] = 1e9f;
    EXPECT_THROW(quantize_int4(W.data(), 2, 32, 32), InputError);
}

TEST(Int4Quantize, ColumnScalesQuantizeTheScaledMatrix) {
    std::mt19937 rng(5);
    const int rows = 8, cols = 64;
    std::vector<float> W = normal(rng, rows * cols), s(cols), Ws(W.size());
    for (int c = 0; c < cols; ++c) s[c] = 0.5f + 0.03f * c;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) Ws[r * cols + c] = W[r * cols + c] * s[c];
    const Int4Matrix a = quantize_int4(W.data(), rows, cols, 32, s.data()), b = quantize_int4(Ws.data(), rows, cols, 32);
    EXPECT_EQ(a.qweight, b.qweight);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.zeros, b.zeros);
}

TEST(Int4Quantize, ThreadsGiveTheSameBits) {
    std::mt19937 rng(9);
    const int rows = 300, cols = 4096;
    const std::vector<float> W = normal(rng, size_t(rows) * cols);
    const Int4Matrix a = quantize_int4(W.data(), rows, cols, 128, nullptr, 1);
    const Int4Matrix b = quantize_int4(W.data(), rows, cols, 128, nullptr, 4);
    EXPECT_EQ(a.qweight, b.qweight);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.zeros, b.zeros);
}

TEST(Int4Quantize, MatvecReferenceEqualsDequantizedProduct) {
    std::mt19937 rng(11);
    for (auto [rows, cols, group] : {std::tuple{1, 32, 32}, {13, 96, 32}, {64, 512, 128}, {7, 1024, 256}}) {
        const std::vector<float> W = normal(rng, size_t(rows) * cols), x = normal(rng, cols);
        const Int4Matrix m = quantize_int4(W.data(), rows, cols, group);
        const std::vector<float> dq = dequantize_int4(m);
        std::vector<float> a(rows), b(rows);
        matvec_int4_ref(a.data(), m, x.data());
        matvec_ref(b.data(), dq.data(), x.data(), rows, cols);
        for (int r = 0; r < rows; ++r) EXPECT_FLOAT_EQ(a[r], b[r]);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// AutoAWQ
// ---------------------------------------------------------------------------------------------------------------------

TEST(Awq, PackedLikeAutoAwqConvertsBackExactly) {
    std::mt19937 rng(13);
    for (auto [N, K, G] : {std::tuple{8, 32, 32}, {64, 128, 32}, {40, 256, 64}, {128, 512, 128}, {512, 4096, 128}}) {
        const std::vector<float> W = normal(rng, size_t(N) * K);
        const Int4Matrix m = quantize_int4(W.data(), N, K, G);
        std::vector<int32_t> qw, qz;
        std::vector<uint16_t> sc;
        pack_awq(m, qw, qz, sc);
        const Int4Matrix back = int4_from_awq(qw.data(), qz.data(), sc.data(), K, N, G);
        EXPECT_EQ(back.qweight, m.qweight);
        EXPECT_EQ(back.zeros, m.zeros);
        EXPECT_EQ(back.scales, m.scales);
    }
    std::vector<int32_t> q(32), z(1);
    std::vector<uint16_t> s(12);
    EXPECT_THROW(int4_from_awq(q.data(), z.data(), s.data(), 32, 12, 32), std::invalid_argument);  // 12 % 8
}

TEST(Awq, FixtureDequantizesToItsSourceExactly) {
    const auto dir = awq_fixture();
    const QuantizationInfo info = read_quantization_info(dir);
    ASSERT_EQ(info.method, QuantizationInfo::Method::Awq);
    EXPECT_EQ(info.group, 32);
    const ModelFolder model = open_model_folder(dir);
    const ModelFiles files(dir);
    const LinearReader reader(files, info);
    const auto src = SafeTensorsFile::open(dir / "source.safetensors");
    int checked = 0;
    for (int l = 0; l < model.config.num_layers; ++l)
        for (const LinearSpec& s : llama_linear_specs(model.config, l)) {
            SCOPED_TRACE(s.prefix);
            const LinearInfo li = reader.inspect(s.prefix, s.rows, s.cols);
            EXPECT_EQ(li.storage, LinearInfo::Storage::Awq);
            EXPECT_EQ(li.group, 32);
            const Int4Matrix m = reader.load_int4(s.prefix, s.rows, s.cols);
            const auto codes = read_tensor<uint8_t>(*src, s.prefix + ".codes");
            const auto zeros = read_tensor<uint8_t>(*src, s.prefix + ".zeros");
            const auto scales = read_tensor<uint16_t>(*src, s.prefix + ".scales");
            ASSERT_EQ(codes.size(), size_t(s.rows * s.cols));
            EXPECT_EQ(m.zeros, zeros);
            EXPECT_EQ(m.scales, scales);
            const std::vector<float> dq = reader.load_f32(s.prefix, s.rows, s.cols);
            int mismatches = 0;
            for (int64_t r = 0; r < s.rows; ++r)
                for (int64_t c = 0; c < s.cols; ++c) {
                    mismatches += m.code(int(r), int(c)) != codes[r * s.cols + c];
                    const float want = float(int(codes[r * s.cols + c]) - int(zeros[r * (s.cols / 32) + c / 32])) *
                                       half_to_float(scales[r * (s.cols / 32) + c / 32]);
                    mismatches += dq[r * s.cols + c] != want;
                }
            EXPECT_EQ(mismatches, 0);
            ++checked;
        }
    EXPECT_EQ(checked, 14);
}

TEST(Awq, FixtureLogitsMatchTransformers) {
    const auto dir = awq_fixture();
    const ModelFolder model = open_model_folder(dir);
    const auto ref = SafeTensorsFile::open(dir / "reference.safetensors");
    const auto prompt = read_tensor<int32_t>(*ref, "prompt_ids");
    const auto steps = read_tensor<int32_t>(*ref, "decode_ids");
    const auto prefill_ref = read_tensor<float>(*ref, "prefill_logits");
    const auto decode_ref = read_tensor<float>(*ref, "decode_logits");
    const int V = model.config.vocab_size;
    QuestSettings q;
    q.full_attention = true;
    auto b = make_cpu_backend(model, q, int(prompt.size() + steps.size()));
    std::vector<float> all;
    b->prefill(std::vector<int>(prompt.begin(), prompt.end()), &all);
    auto rel = [](const float* a, const float* r, int n) {
        double num = 0, den = 0;
        for (int i = 0; i < n; ++i) {
            num += double(a[i] - r[i]) * (a[i] - r[i]);
            den += double(r[i]) * r[i];
        }
        return std::sqrt(num / den);
    };
    for (size_t t = 0; t < prompt.size(); ++t)
        EXPECT_LE(rel(&all[t * V], &prefill_ref[t * V], V), 1e-4) << "prefill " << t;
    for (size_t i = 0; i < steps.size(); ++i) {
        const auto l = b->decode(steps[i]);
        EXPECT_LE(rel(l.data(), &decode_ref[i * V], V), 1e-4) << "decode " << i;
    }
}

TEST(Awq, QuantizationConfigsThisEngineCannotReadAreRejected) {
    const auto dir = test::temp_dir("awq_configs");
    auto with = [&](const std::string& qc) {
        std::ofstream(dir / "config.json") << R"({"hidden_size": 64, "quantization_config": )" << qc << "}";
    };
    auto message = [&]() -> std::string {
        try {
            read_quantization_info(dir);
        } catch (const InputError& e) {
            return e.what();
        }
        return "";
    };
    with(R"({"quant_method": "gptq", "bits": 4, "group_size": 128})");
    EXPECT_THAT(message(), HasSubstr("unsupported quantization 'gptq'"));
    with(R"({"quant_method": "awq", "bits": 8, "group_size": 128, "zero_point": true, "version": "gemm"})");
    EXPECT_THAT(message(), HasSubstr("only 4-bit"));
    with(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemv"})");
    EXPECT_THAT(message(), HasSubstr("unsupported AWQ version 'gemv'"));
    with(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false, "version": "gemm"})");
    EXPECT_THAT(message(), HasSubstr("zero_point"));
    with(R"({"quant_method": "quest-int4", "bits": 4, "group_size": 128, "layout": "other"})");
    EXPECT_THAT(message(), HasSubstr("unknown layout"));
    with(R"({"quant_method": "quest-int4", "bits": 4, "group_size": 48})");
    EXPECT_THAT(message(), HasSubstr("power of two"));
    with(R"({"quant_method": "AWQ", "bits": 4, "group_size": 64, "zero_point": true, "version": "GEMM"})");
    EXPECT_EQ(message(), "");
    EXPECT_EQ(read_quantization_info(dir).group, 64);
    // AutoAWQ's older quant_config.json next to a config without quantization_config.
    std::ofstream(dir / "config.json") << R"({"hidden_size": 64})";
    std::ofstream(dir / "quant_config.json") << R"({"zero_point": true, "q_group_size": 128, "w_bit": 4, "version": "GEMM"})";
    const QuantizationInfo legacy = read_quantization_info(dir);
    EXPECT_EQ(legacy.method, QuantizationInfo::Method::Awq);
    EXPECT_EQ(legacy.group, 128);
}

// ---------------------------------------------------------------------------------------------------------------------
// quest quantize folders
// ---------------------------------------------------------------------------------------------------------------------

TEST(QuantizeModel, WritesInt4FolderThatLoadsAsTheQuantizedWeights) {
    const auto in = small_model("qm_in", 80);  // down_proj: 80 % 32 != 0 stays FP16
    const auto out = test::temp_dir("qm_out");
    QuantizeOptions o;
    o.group = 32;
    const QuantizeSummary s = quantize_model(in, out, o);
    EXPECT_EQ(s.quantized, 12);
    ASSERT_EQ(s.kept_fp16.size(), 2u);
    EXPECT_THAT(s.kept_fp16[0], HasSubstr("model.layers.0.mlp.down_proj: input dimension 80 is not a multiple of the group size 32"));
    EXPECT_GT(s.weight_rel_err, 0.01);
    EXPECT_LT(s.weight_rel_err, 0.15);
    EXPECT_LT(s.bytes_out, s.bytes_in);
    EXPECT_THAT(s.text(), HasSubstr("kept in FP16: model.layers.1.mlp.down_proj"));
    EXPECT_TRUE(std::filesystem::exists(out / "tokenizer.model"));

    const QuantizationInfo info = read_quantization_info(out);
    EXPECT_EQ(info.method, QuantizationInfo::Method::QuestInt4);
    EXPECT_EQ(info.group, 32);
    std::ifstream cj(out / "config.json");
    const std::string config((std::istreambuf_iterator<char>(cj)), {});
    EXPECT_THAT(config, HasSubstr("\"layout_version\": 1"));
    EXPECT_THAT(config, HasSubstr("\"modules_not_quantized\""));

    // The folder's weights are exactly the in-memory round-to-nearest of the source (embeddings rounded to fp16).
    auto src = load_weights(in);
    auto q = load_weights(out);
    LlamaWeightsF32 fake = *src;
    EXPECT_EQ(fake_quantize_llama_weights(fake, 32), 12);
    for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(q->layers[l].wq, fake.layers[l].wq);
        EXPECT_EQ(q->layers[l].wv, fake.layers[l].wv);
        EXPECT_EQ(q->layers[l].wo, fake.layers[l].wo);
        EXPECT_EQ(q->layers[l].w_up, fake.layers[l].w_up);
        EXPECT_EQ(q->layers[l].attn_norm, src->layers[l].attn_norm);
        for (size_t i = 0; i < src->layers[l].w_down.size(); ++i)
            ASSERT_EQ(q->layers[l].w_down[i], half_to_float(float_to_half(src->layers[l].w_down[i])));
    }
    for (size_t i = 0; i < src->embed.size(); ++i) ASSERT_EQ(q->embed[i], half_to_float(float_to_half(src->embed[i])));

    // Quantizing a quest-int4 folder again at its group copies the codes bit for bit.
    const auto again = test::temp_dir("qm_again");
    const QuantizeSummary s2 = quantize_model(out, again, {});
    EXPECT_EQ(s2.group, 32);
    auto q2 = load_weights(again);
    for (int l = 0; l < 2; ++l) EXPECT_EQ(q2->layers[l].wk, q->layers[l].wk);
    EXPECT_THROW(quantize_model(out, out, {}), InputError);
}

TEST(QuantizeModel, AwqFolderConvertsWithoutRequantizing) {
    const auto out = test::temp_dir("qm_awq");
    const QuantizeSummary s = quantize_model(awq_fixture(), out, {});
    EXPECT_EQ(s.group, 32);
    EXPECT_EQ(s.quantized, 14);
    EXPECT_TRUE(s.kept_fp16.empty());
    auto a = load_weights(awq_fixture()), b = load_weights(out);
    for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(a->layers[l].wq, b->layers[l].wq);
        EXPECT_EQ(a->layers[l].w_down, b->layers[l].w_down);
    }
    EXPECT_EQ(a->lm_head, b->lm_head);
}

// ---------------------------------------------------------------------------------------------------------------------
// Quality: 4-bit against the full-precision model
// ---------------------------------------------------------------------------------------------------------------------

class Int4Quality : public ::testing::TestWithParam<std::string> {};

// The quantized weights with the 8 columns of every word permuted by the slot order: what a reader or kernel that
// got the nibble order wrong would compute. The negative control of the quality thresholds below.
void scramble_like_a_layout_bug(LlamaWeightsF32& w) {
    for (auto& L : w.layers)
        for (auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            for (size_t i = 0; i + 8 <= m->size(); i += 8) {
                float tmp[8];
                for (int j = 0; j < 8; ++j) tmp[j] = (*m)[i + kInt4Order[j]];
                std::copy(tmp, tmp + 8, m->begin() + i);
            }
}

// Random HF fixtures (weights ~ N(0, 1/fan_in), so their next-token distributions are flat and top-1 often a near
// tie), group 32, the fixture's 20 prompt positions. Measured: KL 0.019 .. 0.121 nats, top-1 agreement 0.55 .. 0.85.
// Thresholds: KL <= 0.2 and top-1 >= 0.45; the same weights with the nibble order scrambled must give a KL at least
// 4x higher (the thresholds separate a working layout from a broken one).
TEST_P(Int4Quality, HfFixtureFourBitVsFullPrecision) {
    const auto dir = test::source_dir() / "tests/fixtures/hf" / GetParam();
    auto ref = SafeTensorsFile::open(dir / "reference.safetensors");
    const auto p = read_tensor<int32_t>(*ref, "prompt_ids");
    const std::vector<int> tokens(p.begin(), p.end());
    auto w = load_weights(dir);
    const int V = w->config.vocab_size;
    const auto full = prefill_logits(w, tokens);
    auto wq = std::make_shared<LlamaWeightsF32>(*w);
    EXPECT_EQ(fake_quantize_llama_weights(*wq, 32), 14);
    const Agreement a = compare_logits(full, prefill_logits(wq, tokens), tokens, V);
    auto wbad = std::make_shared<LlamaWeightsF32>(*wq);
    scramble_like_a_layout_bug(*wbad);
    const Agreement bad = compare_logits(full, prefill_logits(wbad, tokens), tokens, V);
    std::printf("[ int4 g32 ] %-18s KL %.5f  top-1 %.2f   (scrambled nibbles: KL %.3f, top-1 %.2f)\n",
                GetParam().c_str(), a.kl, a.top1, bad.kl, bad.top1);
    EXPECT_LE(a.kl, 0.2);
    EXPECT_GE(a.top1, 0.45);
    EXPECT_GE(bad.kl, 4 * a.kl);

    // The same model written by `quest quantize` (config.json rewritten: RoPE scaling and all) computes the same
    // logits, up to its FP16 embeddings and lm_head.
    const auto out = test::temp_dir("int4_quality_" + GetParam());
    QuantizeOptions qo;
    qo.group = 32;
    quantize_model(dir, out, qo);
    const auto folder = prefill_logits(load_weights(out), tokens), mem = prefill_logits(wq, tokens);
    double num = 0, den = 0;
    for (size_t i = 0; i < mem.size(); ++i) {
        num += double(folder[i] - mem[i]) * (folder[i] - mem[i]);
        den += double(mem[i]) * mem[i];
    }
    EXPECT_LE(std::sqrt(num / den), 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Int4Quality,
                         ::testing::Values("mha_hd64", "gqa4_hd128", "gqa8_hd64_tied", "linear_x4_legacy",
                                           "dynamic_x2", "yarn_x4_legacy", "llama3_x8", "bf16_gqa2", "f16_gqa4"));

// stories260K (a trained model): its 64-wide matrices at group 64 and 32 (down_proj, 172 wide, stays FP16).
// Evaluated on 2 x 511 tokens of the second half of tools/data/demo_corpus.txt (TinyStories-style text), against
// the fp32 model: mean KL, top-1 agreement and perplexity; and activation-aware scaling calibrated on the first 511
// tokens of the same corpus (held out from the evaluation). Measured (2026-11-29): perplexity 8.77 (fp32) ->
// 9.44 (+7.6%, RTN, both groups); g64: KL 0.148 (RTN) / 0.120 (AWQ, -19%), top-1 0.79 / 0.83, AWQ perplexity 9.62;
// g32: KL 0.096 / 0.091 (-5%), top-1 0.81 / 0.83, AWQ perplexity 8.94. Thresholds with margin: KL <= 0.2, top-1
// >= 0.75, perplexity within +10% (RTN) and +15% (AWQ), and AWQ's KL below round-to-nearest's.
TEST(Int4Quality, Stories260KKlTop1AndPerplexity) {
    const auto dir = test::shared_dir() / "models/stories260K";
    QUEST_REQUIRE_PATH(dir);
    const SentencePieceTokenizer tok(dir / "tokenizer.model");
    std::ifstream in(test::source_dir() / "tools/data/demo_corpus.txt");
    const std::string corpus((std::istreambuf_iterator<char>(in)), {});
    const std::vector<int> ids = tok.encode(corpus, false);
    ASSERT_GT(ids.size(), 4000u);
    auto window = [&](size_t start) {
        std::vector<int> t = {1};
        t.insert(t.end(), ids.begin() + start, ids.begin() + start + 511);
        return t;
    };
    const std::vector<int> calib = window(0);
    const std::vector<std::vector<int>> evals = {window(ids.size() / 2), window(ids.size() / 2 + 600)};
    auto w = load_weights(dir);
    const int V = w->config.vocab_size;
    auto evaluate = [&](std::shared_ptr<const LlamaWeightsF32> wq) {
        std::vector<float> ref_all, q_all;
        std::vector<int> tok_all;
        Agreement sum;
        double nll_ref = 0, nll_q = 0;
        for (const auto& e : evals) {
            const Agreement a = compare_logits(prefill_logits(w, e), prefill_logits(wq, e), e, V);
            sum.kl += a.kl / evals.size();
            sum.top1 += a.top1 / evals.size();
            nll_ref += std::log(a.ppl_ref) / evals.size();
            nll_q += std::log(a.ppl_q) / evals.size();
        }
        sum.ppl_ref = std::exp(nll_ref);
        sum.ppl_q = std::exp(nll_q);
        return sum;
    };
    for (int group : {64, 32}) {
        auto wq = std::make_shared<LlamaWeightsF32>(*w);
        EXPECT_EQ(fake_quantize_llama_weights(*wq, group), 5 * 6);  // q k v o gate up per layer; down stays FP16
        const Agreement a = evaluate(wq);
        auto wa = std::make_shared<LlamaWeightsF32>(*w);
        const AwqStats st = apply_awq_scaling(*wa, calib, group);
        fake_quantize_llama_weights(*wa, group);
        const Agreement b = evaluate(wa);
        std::printf("[ stories260K int4 g%d ] perplexity %.4f (fp32) -> %.4f (RTN), %.4f (AWQ); KL %.4f (RTN) %.4f "
                    "(AWQ); top-1 %.3f (RTN) %.3f (AWQ); AWQ scaled %d sites, calibration output error x%.3f\n",
                    group, a.ppl_ref, a.ppl_q, b.ppl_q, a.kl, b.kl, a.top1, b.top1, st.sites_scaled,
                    st.loss_awq / st.loss_rtn);
        EXPECT_LE(a.kl, 0.2) << "group " << group;
        EXPECT_GE(a.top1, 0.75) << "group " << group;
        EXPECT_LE(a.ppl_q, a.ppl_ref * 1.10) << "group " << group;
        EXPECT_LE(st.loss_awq, st.loss_rtn);  // the search includes alpha = 0 (round-to-nearest)
        EXPECT_LT(b.kl, a.kl) << "group " << group << ": activation-aware scaling must lower the held-out KL";
        EXPECT_LE(b.ppl_q, a.ppl_ref * 1.15) << "group " << group;
    }
}

// With B >= the context, AWQ scaling changes nothing in full precision: the folded scales are exact up to fp32
// rounding.
TEST(Int4Quality, AwqScalingPreservesTheFullPrecisionFunction) {
    const auto dir = small_model("awq_identity", 128);
    const SentencePieceTokenizer tok(dir / "tokenizer.model");
    const std::vector<int> tokens = tok.encode(kStoryText, true), calib = tok.encode(kCalibText, true);
    auto w = load_weights(dir);
    auto ws = std::make_shared<LlamaWeightsF32>(*w);
    const AwqStats st = apply_awq_scaling(*ws, calib, 32);
    EXPECT_GT(st.calib_tokens, 20);
    const auto a = prefill_logits(w, tokens), b = prefill_logits(ws, tokens);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += double(a[i] - b[i]) * (a[i] - b[i]);
        den += double(a[i]) * a[i];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-5);
}

// ---------------------------------------------------------------------------------------------------------------------
// The quest binary
// ---------------------------------------------------------------------------------------------------------------------

namespace {

using test::run_quest;
using test::RunResult;

}  // namespace

TEST(QuantizeCli, QuantizeThenGenerateChatAndBench) {
    const auto in = small_model("qcli_in", 80, DType::F16);
    const auto out = test::temp_dir("qcli_out");
    RunResult r = run_quest("quantize -m '" + in.string() + "' -o '" + out.string() + "' --group 32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("quantized 12 of 14 linear layers to int4 (group 32, round-to-nearest)"));
    EXPECT_THAT(r.err, HasSubstr("kept in FP16: model.layers.0.mlp.down_proj: input dimension 80"));
    EXPECT_THAT(r.err, HasSubstr("weight error"));

    r = run_quest("generate -m '" + out.string() + "' -p 'Once upon a time' -n 12 --temp 0");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("decode: 12 tokens generated"));
    EXPECT_FALSE(r.out.empty());

    const auto chat_in = test::temp_dir("qcli_chat") / "in.txt";
    std::ofstream(chat_in) << "hello there\n/stats\n";
    r = run_quest("chat -m '" + out.string() + "' -n 5 --temp 0 < '" + chat_in.string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("last answer: prefill"));

    // The 4-bit folder as stored (int4-g32) and dequantized (the CPU holds it in fp32), side by side; the FP16 source
    // quantized on load.
    r = run_quest("bench -m '" + out.string() + "' --backend cpu --contexts 24 --budgets full,16 --page-size 8 "
                  "--steps 2 --warmup 1 --weights fp16,int4");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("int4-g32"));
    EXPECT_THAT(r.out, HasSubstr("fp32"));
    r = run_quest("bench -m '" + in.string() + "' --backend cpu --contexts 24 --budgets full --steps 2 --warmup 1 "
                  "--weights fp16,int4-g32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("int4-g32"));
    r = run_quest("bench -m '" + in.string() + "' --backend cpu --contexts 24 --budgets full --weights int3");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("--weights"));

    // Generation on the 4-bit folder equals the fp32 CPU backend on the fake-quantized source weights.
    auto src = load_weights(in);
    auto fake = std::make_shared<LlamaWeightsF32>(*src);
    fake_quantize_llama_weights(*fake, 32);
    for (auto* v : {&fake->embed, &fake->lm_head})
        for (float& x : *v) x = half_to_float(float_to_half(x));
    for (auto& L : fake->layers)
        for (float& x : L.w_down) x = half_to_float(float_to_half(x));
    const std::vector<int> prompt = {1, 50, 60, 70};
    QuestSettings q;
    q.full_attention = true;
    CpuLlama a(fake, q, 8), b(load_weights(out), q, 8);
    const auto la = a.prefill(prompt);
    const std::vector<float> va(la.begin(), la.end());
    const auto lb = b.prefill(prompt);
    EXPECT_EQ(va, std::vector<float>(lb.begin(), lb.end()));
}

TEST(QuantizeCli, BadGroupAndCalibration) {
    const auto in = small_model("qcli_bad", 96);
    const auto out = test::temp_dir("qcli_bad_out");
    RunResult r = run_quest("quantize -m '" + in.string() + "' -o '" + out.string() + "' --group 48");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("power of two"));
    r = run_quest("quantize -m /nonexistent -o '" + out.string() + "'");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("/nonexistent"));
    const auto calib = test::temp_dir("qcli_calib") / "calib.txt";
    std::ofstream(calib) << kCalibText;
    r = run_quest("quantize -m '" + in.string() + "' -o '" + out.string() + "' --group 32 --awq-calib '" +
                  calib.string() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("activation-aware scaling"));
    EXPECT_THAT(r.err, HasSubstr("calibration tokens"));
    r = run_quest("generate -m '" + out.string() + "' -p hi -n 4 --temp 0");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

// The weight-format seam's storage rule (kernels/linear/format.h): what each request gives a fused matrix from how its
// parts are stored.
TEST(LinearStorage, ChooseFollowsTheRequestAndTheStoredParts) {
    using S = LinearStorage;
    const S f16 = S::f16(), g64 = S::int4(64), g32 = S::int4(32), unusable = S::int4(0);
    auto choose = [](const WeightRequest& r, std::vector<S> parts, int64_t cols) {
        return choose_linear_storage(r, parts, 128, cols);
    };
    const WeightRequest stored = WeightRequest::as_stored(), fp16 = WeightRequest::f16(), int4 = WeightRequest::int4(128);
    EXPECT_EQ(choose(stored, {f16, f16, f16}, 4096), f16);
    EXPECT_EQ(choose(stored, {g64, g64}, 4096), g64);              // 4-bit layers stay as stored
    EXPECT_EQ(choose(int4, {g64, g64}, 4096), g64);                // with their own group under an int4 request
    EXPECT_EQ(choose(fp16, {g64, g64}, 4096), f16);                // FP16 asked: dequantized
    EXPECT_EQ(choose(stored, {g64, g32}, 4096), f16);              // parts stored differently
    EXPECT_EQ(choose(int4, {g64, f16}, 4096), f16);
    EXPECT_EQ(choose(int4, {unusable, unusable}, 4096), f16);      // 4-bit values the int4 format cannot take
    EXPECT_EQ(choose(int4, {f16, f16}, 4096), S::int4(128));       // float layers quantized on load
    EXPECT_EQ(choose(int4, {f16}, 576), f16);                      // the group must divide the input dimension
    EXPECT_EQ(choose(WeightRequest::int4(64), {f16}, 576), S::int4(64));
    EXPECT_EQ(S::int4(128).describe(), "int4 g128");
    EXPECT_EQ(f16.describe(), "fp16");
}
