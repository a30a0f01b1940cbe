#pragma once
// `quest soak`: a long greedy decode that checks every step's logits are finite and logs the per-token latency in
// buckets of positions, next to what the bytes model predicts (the bytes one step must read, over the bandwidth the
// first bucket achieved): latency should grow only as the bytes do. Stops after --tokens steps, when the context is
// full (with a clear message), at --time-limit, on Ctrl-C, or at the first non-finite logit (a failure).
#include <functional>
#include <string>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/timing.h"

namespace quest {

struct SoakRequest {
    std::string model;            // model folder, or a config.json with random_weights
    bool random_weights = false;
    BackendOptions backend;       // capacity 0: prompt_tokens + tokens
    int prompt_tokens = 16;       // random ids (BOS first), prefilled before the decode
    long tokens = 100000;         // decode steps
    int bucket = 4096;            // positions per latency bucket
    double time_limit_s = 0;      // stop after this many seconds (0: no limit)
    uint64_t seed = 1;
};

struct SoakBucket {
    int first_position = 0, last_position = 0;  // positions decoded in this bucket, inclusive
    LatencyStats ms;
    size_t bytes = 0;          // bytes one step reads at the bucket's last position (bytes model)
    double gbps = 0;           // bytes / mean
    double predicted_ms = 0;   // bytes / the first bucket's GB/s
    float max_abs_logit = 0;   // largest |logit| seen in the bucket (drift shows here before inf does)
};

struct SoakResult {
    std::string backend, attention;
    int capacity = 0, start_position = 0, end_position = 0;
    long steps = 0;
    double prefill_s = 0, wall_s = 0;
    std::vector<SoakBucket> buckets;
    std::string stop_reason;  // tokens, context_full, time_limit, interrupted, non_finite
    std::string failure;      // the first non-finite logit: step, position, index, value
    bool ok() const { return stop_reason != "non_finite"; }
};

SoakResult run_soak(const SoakRequest& r, const std::function<void(const std::string&)>& progress,
                    const std::function<bool()>& interrupted = {});
std::string soak_bucket_line(const SoakBucket& b);
std::string soak_summary(const SoakResult& r);
std::string soak_csv(const SoakResult& r);

}  // namespace quest
