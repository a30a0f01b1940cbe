// Sampler: greedy, determinism per seed, top-k / top-p restrict the support, frequencies follow the softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"
#include "engine/timing.h"
#include "kernels/common/error.h"

using namespace quest;

TEST(Sampler, GreedyIsArgmaxLowestIndexOnTies) {
    Sampler s({0.0f, 0, 1.0f, 0});
    const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
    EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, SameSeedSameTokens) {
    std::vector<float> logits(50);
    for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.3f) * 2;
    Sampler a({1.0f, 0, 1.0f, 42}), b({1.0f, 0, 1.0f, 42}), c({1.0f, 0, 1.0f, 43});
    std::vector<int> ta, tb, tc;
    for (int i = 0; i < 100; ++i) {
        ta.push_back(a.sample(logits));
        tb.push_back(b.sample(logits));
        tc.push_back(c.sample(logits));
    }
    EXPECT_EQ(ta, tb);
    EXPECT_NE(ta, tc);
}

TEST(Sampler, TopKAndTopPRestrictSupport) {
    const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -5.0f};
    Sampler k2({1.0f, 2, 1.0f, 7});
    for (int i = 0; i < 500; ++i) EXPECT_LT(k2.sample(logits), 2);
    // softmax: p0 = 0.553, p1 = 0.203, p2 = 0.123 ... top-p 0.7 keeps {0, 1}.
    Sampler p7({1.0f, 0, 0.7f, 7});
    for (int i = 0; i < 500; ++i) EXPECT_LT(p7.sample(logits), 2);
}

TEST(Sampler, FrequenciesFollowSoftmaxWithTemperature) {
    const std::vector<float> logits = {1.0f, 0.0f, -1.0f};
    const float T = 0.5f;
    Sampler s({T, 0, 1.0f, 123});
    std::map<int, int> counts;
    const int n = 40000;
    for (int i = 0; i < n; ++i) counts[s.sample(logits)]++;
    double z = 0;
    for (float l : logits) z += std::exp(l / T);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(counts[i] / double(n), std::exp(logits[i] / T) / z, 0.01) << i;
}

TEST(Sampler, InvalidSettings) {
    EXPECT_THROW(Sampler({-1.0f, 0, 1.0f, 0}), InputError);
    EXPECT_THROW(Sampler({1.0f, -3, 1.0f, 0}), InputError);
    EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 0}), InputError);
    EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 0}), InputError);
}

TEST(Timing, Percentiles) {
    const std::vector<double> v = {5, 1, 4, 2, 3};
    const LatencyStats s = summarize_latency(v);
    EXPECT_EQ(s.count, 5);
    EXPECT_DOUBLE_EQ(s.p50, 3);
    EXPECT_DOUBLE_EQ(s.p90, 4.6);
    EXPECT_DOUBLE_EQ(s.mean, 3);
    EXPECT_DOUBLE_EQ(s.min, 1);
    EXPECT_DOUBLE_EQ(s.max, 5);
}
