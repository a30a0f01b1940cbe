#pragma once
// sin and cos of a float angle for RoPE on the GPU (kernels/common/rope_device.cuh), without sincosf's slow path. CUDA's
// sincosf reduces |x| > 105615 by Payne-Hanek with a local-memory array: a kernel that merely contains the call gets a
// stack frame (ptxas then also keeps other small arrays of the kernel in local memory), and a decode position past
// ~105K takes the slow path at the highest RoPE frequency. Here the angle is reduced by pi/2 in double precision
// (x = k pi/2 + r, one fma: r is off by about k * 6e-17, below 1e-9 for |x| < 1e7), then sin r and cos r on
// |r| <= pi/4 in float by their Taylor polynomials to degree 9 / 10 (truncation below 2e-9, under a float ulp of 1),
// the quadrant k mod 4 choosing signs and order. Precondition: |x| < 2^31 (a RoPE angle: a position below 2^31 times
// a frequency of at most 1), so that k fits the integer conversion. Plain C++17 usable from nvcc and host code, so
// that the CPU test suite checks its accuracy against std::sin / std::cos in double (tests/test_ops.cpp,
// Ops.SincosReducedWithinTwoUlpsOfDouble): within 2 float ulps of 1 over positions to 2^24.
#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace quest {

QUEST_HD inline void sincos_reduced(float x, float& s, float& c) {
    const double xd = x;
    const double k = rint(xd * 0.63661977236758134308);      // 2 / pi
    const float r = static_cast<float>(fma(-k, 1.5707963267948966192, xd));  // pi / 2
    const int q = static_cast<int>(static_cast<int64_t>(k) & 3);
    const float r2 = r * r;
    // sin r = r (1 - r^2/3! + r^4/5! - r^6/7! + r^8/9!), cos r = 1 - r^2/2! + ... + r^8/8! - r^10/10!
    const float sr = r + r * r2 * (-1.0f / 6 + r2 * (1.0f / 120 + r2 * (-1.0f / 5040 + r2 * (1.0f / 362880))));
    const float cr = 1.0f + r2 * (-0.5f + r2 * (1.0f / 24 + r2 * (-1.0f / 720 + r2 * (1.0f / 40320 +
                                                                                        r2 * (-1.0f / 3628800)))));
    // x = k pi/2 + r: sin x = (sin r, cos r, -sin r, -cos r)[q], cos x = (cos r, -sin r, -cos r, sin r)[q].
    const float a = (q & 1) ? cr : sr, b = (q & 1) ? sr : cr;
    s = (q & 2) ? -a : a;
    c = ((q + 1) & 2) ? -b : b;
}

}  // namespace quest
