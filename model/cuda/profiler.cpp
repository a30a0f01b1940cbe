#include "model/cuda/profiler.h"

#include <algorithm>
#include <cstdio>

#include "kernels/common/cuda_common.cuh"

namespace quest {

StepProfiler::~StepProfiler() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void StepProfiler::mark(const char* what, cudaStream_t stream) {
    if (!on_) return;
    if (used_ == events_.size()) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        events_.push_back(e);
        names_.push_back(what);
    }
    names_[used_] = what;
    CUDA_CHECK(cudaEventRecord(events_[used_++], stream));
}

void StepProfiler::end_step(bool count) {
    if (!on_ || !count) return;
    for (size_t i = 1; i < used_; ++i) {
        float seg = 0;
        CUDA_CHECK(cudaEventElapsedTime(&seg, events_[i - 1], events_[i]));
        ms_[names_[i]] += seg;
    }
    ++steps_;
}

std::string StepProfiler::report() const {
    if (!on_ || steps_ == 0) return "";
    double total = 0;
    for (const auto& [name, ms] : ms_) total += ms;
    std::string out = "decode step breakdown (eager launches with events, mean over " + std::to_string(steps_) +
                      " steps; the graph hides some launch gaps):\n";
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, ms] : ms_) rows.push_back({ms / steps_, name});
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [ms, name] : rows) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "  %-20s %9.3f ms  %5.1f%%\n", name.c_str(), ms, 100.0 * ms * steps_ / total);
        out += buf;
    }
    return out;
}

}  // namespace quest
