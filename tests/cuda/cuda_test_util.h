#pragma once
// Helpers for the CUDA tests (ctest label `cuda`): skip visibly without a GPU, seeded random inputs, fp16
// round-tripping so the CPU reference sees exactly what the GPU sees, and relative errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda_common.cuh"
#include "kernels/device_buffer.h"
#include "model/dtype.h"

#define QUEST_REQUIRE_GPU()                                                                              \
    do {                                                                                                 \
        if (::quest::cuda_device_count() == 0) GTEST_SKIP() << "SKIPPED: no CUDA device on this machine"; \
    } while (0)

namespace quest::test {

inline std::vector<float> random_floats(std::mt19937& rng, size_t n, float scale = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// Rounds every value to fp16 precision (so CPU and GPU start from identical inputs) and returns the fp16 bits.
inline std::vector<__half> to_half(std::vector<float>& v) {
    std::vector<__half> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t bits = float_to_half(v[i]);
        v[i] = half_to_float(bits);
        __half_raw raw;
        raw.x = bits;
        h[i] = __half(raw);
    }
    return h;
}

inline std::vector<float> to_float(const std::vector<__half>& h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) v[i] = half_to_float(__half_raw(h[i]).x);
    return v;
}

// ||a - b|| / ||b||; NaN (an unwritten poisoned element) gives NaN, which fails every `<=` check.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    if (std::isnan(num)) return NAN;
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool all_finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

}  // namespace quest::test
