#pragma once
// Latency statistics over per-token timings.
#include <chrono>
#include <span>

namespace quest {

struct LatencyStats {
    int count = 0;
    double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;  // milliseconds
};

// Percentiles by linear interpolation between closest ranks (numpy's default). Empty input: all zeros.
LatencyStats summarize_latency(std::span<const double> ms);

// Wall-clock stopwatch (host). Device timings use CUDA events instead.
class Stopwatch {
public:
    Stopwatch() : t0_(std::chrono::steady_clock::now()) {}
    double ms() const { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count(); }
    void restart() { t0_ = std::chrono::steady_clock::now(); }

private:
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace quest
