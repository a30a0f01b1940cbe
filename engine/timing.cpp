#include "engine/timing.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace quest {

namespace {
double percentile(const std::vector<double>& sorted, double p) {
    const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
    const size_t lo = static_cast<size_t>(rank);
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}
}  // namespace

LatencyStats summarize_latency(std::span<const double> ms) {
    LatencyStats s;
    if (ms.empty()) return s;
    std::vector<double> v(ms.begin(), ms.end());
    std::sort(v.begin(), v.end());
    s.count = static_cast<int>(v.size());
    s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    s.p50 = percentile(v, 50);
    s.p90 = percentile(v, 90);
    s.p99 = percentile(v, 99);
    s.min = v.front();
    s.max = v.back();
    return s;
}

}  // namespace quest
