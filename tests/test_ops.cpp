// CPU reference ops against independent double-precision formulas, and the fp16/bf16 conversions.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>

#include "kernels/attention/attention.h"
#include "kernels/common/basic_ops.h"
#include "kernels/common/sincos.h"
#include "kernels/common/dtype.h"

using namespace quest;

namespace {
std::vector<float> rnd(std::mt19937& g, size_t n) {
    std::normal_distribution<float> d;
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return std::sqrt(num / den);
}
}  // namespace

TEST(Ops, RmsNorm) {
    std::mt19937 g(1);
    for (int n : {1, 7, 64, 4096}) {
        auto x = rnd(g, n), w = rnd(g, n);
        std::vector<float> out(n);
        rms_norm_ref(out.data(), x.data(), w.data(), n, 1e-5f);
        double ss = 0;
        for (float v : x) ss += double(v) * v;
        std::vector<double> want(n);
        for (int i = 0; i < n; ++i) want[i] = x[i] / std::sqrt(ss / n + 1e-5) * w[i];
        EXPECT_LT(rel_err(out, want), 1e-6) << n;
    }
}

TEST(Ops, MatmulMatchesMatvecAndDouble) {
    std::mt19937 g(2);
    // Token counts on both paths (a decode step's below 8, the tiles of 8 and 64 with remainders), rows off the
    // 4- and 8-row blocks, and thread counts that split the rows unevenly (the last case is above
    // the one-thread cut-off).
    for (const auto [tokens, rows, cols, threads] :
         {std::array{5, 37, 129, 3}, std::array{1, 8, 64, 1}, std::array{9, 37, 129, 2}, std::array{70, 41, 96, 3},
          std::array{130, 13, 200, 0}, std::array{70, 301, 257, 3}}) {
        auto W = rnd(g, rows * cols), X = rnd(g, tokens * cols);
        std::vector<float> Y(tokens * rows);
        matmul_ref(Y.data(), W.data(), X.data(), tokens, rows, cols, threads);
        std::vector<double> want(tokens * rows);
        for (int t = 0; t < tokens; ++t)
            for (int r = 0; r < rows; ++r) {
                double acc = 0;
                for (int c = 0; c < cols; ++c) acc += double(W[r * cols + c]) * X[t * cols + c];
                want[t * rows + r] = acc;
            }
        EXPECT_LT(rel_err(Y, want), 1e-6) << tokens;
        // Every output is matvec_ref's, bit for bit: the CPU backend's prefill and decode agree.
        std::vector<float> y1(rows);
        for (int t = 0; t < tokens; ++t) {
            matvec_ref(y1.data(), W.data(), X.data() + t * cols, rows, cols);
            for (int r = 0; r < rows; ++r) ASSERT_EQ(y1[r], Y[t * rows + r]) << tokens << " " << t << " " << r;
        }
    }
}

TEST(Ops, RopeRotatesPairsHalfApart) {
    std::mt19937 g(3);
    const int heads = 3, d = 16, pos = 1234;
    auto x = rnd(g, heads * d);
    std::vector<float> inv(d / 2);
    for (int i = 0; i < d / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / d);
    auto y = x;
    rope_ref(y.data(), heads, d, pos, inv.data(), 1.5f);
    std::vector<double> want(heads * d);
    for (int h = 0; h < heads; ++h)
        for (int i = 0; i < d / 2; ++i) {
            const double a = double(float(pos) * inv[i]);
            const double c = std::cos(a) * 1.5, s = std::sin(a) * 1.5;
            const double x1 = x[h * d + i], x2 = x[h * d + i + d / 2];
            want[h * d + i] = x1 * c - x2 * s;
            want[h * d + i + d / 2] = x2 * c + x1 * s;
        }
    EXPECT_LT(rel_err(y, want), 1e-6);
}

// The GPU RoPE's sin / cos (kernels/common/sincos.h: reduction by pi/2 in double, Taylor polynomials in float) against
// std::sin / std::cos in double of the same float angle: RoPE angles pos * inv_freq of a Llama-2 head (theta 1e4,
// D = 128) at positions to 2^24 (the highest frequency, 1, crosses sincosf's slow-path bound 105615 at 105K), and
// random angles of either sign up to 1e7 and below 1e-3. Within 2^-22 (two float ulps of 1) everywhere.
TEST(Ops, SincosReducedWithinTwoUlpsOfDouble) {
    std::vector<float> angles;
    std::vector<float> inv_freq(64);
    for (int i = 0; i < 64; ++i) inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / 128));
    for (int pos : {0, 1, 2, 3, 15, 16, 1000, 4095, 32767, 32768, 105614, 105616, 131071, 1000003, 16777215})
        for (float f : inv_freq) angles.push_back(static_cast<float>(pos) * f);
    std::mt19937 g(5);
    std::uniform_int_distribution<int> pos(0, 1 << 24);
    for (int i = 0; i < 20000; ++i) angles.push_back(static_cast<float>(pos(g)) * inv_freq[i % 64]);
    std::uniform_real_distribution<float> big(-1e7f, 1e7f), tiny(-1e-3f, 1e-3f);
    for (int i = 0; i < 20000; ++i) angles.push_back(i % 2 ? big(g) : tiny(g));
    for (float q = 0; q < 8; q += 0.5f) angles.push_back(q * 0.78539816f);  // around the quadrant boundaries
    double worst = 0;
    float at = 0;
    for (const float x : angles) {
        float s = 0, c = 0;
        sincos_reduced(x, s, c);
        const double e = std::max(std::abs(s - std::sin(double(x))), std::abs(c - std::cos(double(x))));
        if (e > worst) worst = e, at = x;
    }
    std::printf("[sincos] %zu angles, worst |error| %.3g at x = %.9g\n", angles.size(), worst, double(at));
    EXPECT_LE(worst, std::ldexp(1.0, -22)) << "at x = " << at;
}

TEST(Ops, Swiglu) {
    std::mt19937 g(4);
    auto a = rnd(g, 100), b = rnd(g, 100);
    std::vector<float> out(100);
    swiglu_ref(out.data(), a.data(), b.data(), 100);
    std::vector<double> want(100);
    for (int i = 0; i < 100; ++i) want[i] = a[i] / (1.0 + std::exp(-double(a[i]))) * b[i];
    EXPECT_LT(rel_err(out, want), 1e-6);
}

TEST(Ops, AttentionAgainstDoubleSoftmax) {
    std::mt19937 g(5);
    for (int len : {1, 2, 17, 300}) {
        const int d = 64;
        auto q = rnd(g, d), k = rnd(g, len * d), v = rnd(g, len * d);
        std::vector<float> out(d);
        attention_full_ref(out.data(), q.data(), k.data(), v.data(), d, len, 0.125f);
        std::vector<double> s(len), want(d, 0.0);
        double mx = -1e30, den = 0;
        for (int t = 0; t < len; ++t) {
            double dot = 0;
            for (int i = 0; i < d; ++i) dot += double(q[i]) * k[t * d + i];
            s[t] = dot * 0.125;
            mx = std::max(mx, s[t]);
        }
        for (double& x : s) den += (x = std::exp(x - mx));
        for (int t = 0; t < len; ++t)
            for (int i = 0; i < d; ++i) want[i] += s[t] / den * v[t * d + i];
        EXPECT_LT(rel_err(out, want), 1e-5) << len;
        // Page mass sums to one and matches the weights.
        std::vector<float> mass((len + 15) / 16);
        attention_page_mass_ref(mass.data(), q.data(), k.data(), d, len, 16, 0.125f);
        double total = 0;
        for (float m : mass) total += m;
        EXPECT_NEAR(total, 1.0, 1e-5);
        EXPECT_NEAR(mass[0], [&] { double m = 0; for (int t = 0; t < std::min(16, len); ++t) m += s[t] / den; return m; }(), 1e-5);
    }
}

TEST(DType, HalfConversionsRoundTripEveryHalf) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = half_to_float(uint16_t(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
            continue;
        }
        EXPECT_EQ(float_to_half(f), h) << std::hex << h;
    }
    EXPECT_EQ(half_to_float(0x3c00), 1.0f);
    EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
    EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
    EXPECT_EQ(float_to_half(65520.0f), 0x7c00);               // rounds to inf
    EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
    EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
    EXPECT_EQ(float_to_bf16(bf16_to_float(0x4049)), 0x4049);
}
