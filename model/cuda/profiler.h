#pragma once
// Per-kernel-group timing of the CUDA decode step (CudaOptions::profile): events recorded between groups of
// launches, milliseconds summed per group name over the profiled steps. The step then runs eagerly (no graph).
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace quest {

class StepProfiler {
public:
    explicit StepProfiler(bool on) : on_(on) {}
    ~StepProfiler();
    StepProfiler(const StepProfiler&) = delete;
    StepProfiler& operator=(const StepProfiler&) = delete;

    bool on() const { return on_; }
    void begin_step() { used_ = 0; }
    // An event after the launches of `what` (nothing when profiling is off). Events are created during the first
    // step only; later steps reuse them.
    void mark(const char* what, cudaStream_t stream);
    // After the step's last event completed: adds each group's time (a step of one-time set-up is skipped).
    void end_step(bool count);
    std::string report() const;  // "" when off or nothing was counted

private:
    bool on_;
    std::vector<cudaEvent_t> events_;
    std::vector<std::string> names_;
    size_t used_ = 0;
    std::map<std::string, double> ms_;
    int steps_ = 0;
};

}  // namespace quest
