#include "engine/soak.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "engine/sampler.h"
#include "kernels/common/error.h"
#include "model/io/model_folder.h"

namespace quest {

namespace {

SoakBucket close_bucket(const Backend& b, int first, const std::vector<double>& ms, float max_abs, double ref_gbps) {
    SoakBucket k;
    k.first_position = first;
    k.last_position = b.position() - 1;
    k.ms = summarize_latency(ms);
    k.bytes = b.decode_bytes();
    k.gbps = k.ms.mean > 0 ? static_cast<double>(k.bytes) / (k.ms.mean * 1e-3) / 1e9 : 0;
    const double gbps = ref_gbps > 0 ? ref_gbps : k.gbps;
    k.predicted_ms = gbps > 0 ? static_cast<double>(k.bytes) / (gbps * 1e9) * 1e3 : 0;
    k.max_abs_logit = max_abs;
    return k;
}

}  // namespace

SoakResult run_soak(const SoakRequest& r, const std::function<void(const std::string&)>& progress,
                    const std::function<bool()>& interrupted) {
    if (r.prompt_tokens < 1) throw InputError("soak: --prompt-tokens must be >= 1 (BOS at least)");
    if (r.tokens < 1) throw InputError("soak: --tokens must be >= 1");
    if (r.bucket < 1) throw InputError("soak: --bucket must be >= 1");
    if (r.time_limit_s < 0) throw InputError("soak: --time-limit must be >= 0");
    const ModelFolder folder = open_model_or_config(r.model, r.random_weights);
    const ModelConfig& config = folder.config;
    BackendOptions o = r.backend;
    if (o.capacity <= 0) {
        const long want = r.prompt_tokens + r.tokens;
        o.capacity = static_cast<int>(std::min<long>(want, 1L << 30));
    }
    if (r.prompt_tokens > o.capacity)
        throw InputError("soak: --prompt-tokens " + std::to_string(r.prompt_tokens) + " exceeds the context (-c " +
                         std::to_string(o.capacity) + ")");
    if (o.capacity > config.max_context())
        progress("note: the context (" + std::to_string(o.capacity) + " tokens) exceeds the model's " +
                 std::to_string(config.max_context()) + " positions: RoPE extrapolates (fine for a soak)");

    Stopwatch wall;
    auto b = r.random_weights ? create_random_backend(config, r.seed, o) : create_backend(folder, o);
    SoakResult res;
    res.backend = b->name();
    res.attention = b->quest().describe();
    res.capacity = b->capacity();
    progress("soak: " + res.backend + ", " + res.attention + ", context " + std::to_string(res.capacity) +
             " tokens, prompt " + std::to_string(r.prompt_tokens) + " tokens, " + std::to_string(r.tokens) +
             " greedy decode steps, buckets of " + std::to_string(r.bucket) + " positions");

    std::mt19937 rng(static_cast<uint32_t>(r.seed));
    std::uniform_int_distribution<int> tok(3, std::max(3, config.vocab_size - 1));
    std::vector<int> prompt(static_cast<size_t>(r.prompt_tokens));
    for (int& t : prompt) t = tok(rng) % config.vocab_size;
    prompt[0] = config.bos_token_id;
    Stopwatch sw;
    std::span<const float> logits = b->prefill(prompt);
    res.prefill_s = sw.ms() / 1000.0;
    res.start_position = b->position();
    progress("prefill: " + std::to_string(r.prompt_tokens) + " tokens in " + std::to_string(res.prefill_s) + " s");

    std::vector<double> ms;
    int bucket_first = b->position();
    float max_abs = 0;
    double ref_gbps = 0;
    auto flush_bucket = [&]() {
        if (ms.empty()) return;
        res.buckets.push_back(close_bucket(*b, bucket_first, ms, max_abs, ref_gbps));
        if (ref_gbps == 0) ref_gbps = res.buckets.back().gbps;
        progress(soak_bucket_line(res.buckets.back()));
        ms.clear();
        max_abs = 0;
        bucket_first = b->position();
    };
    // Checks the logits of the token at position b->position() - 1 (the last one fed).
    auto check = [&](long step) {
        for (size_t i = 0; i < logits.size(); ++i) {
            const float v = logits[i];
            if (!std::isfinite(v)) {
                char buf[256];
                std::snprintf(buf, sizeof buf, "non-finite logit after decode step %ld (position %d): logits[%zu] = %g",
                              step, b->position() - 1, i, static_cast<double>(v));
                res.failure = buf;
                return false;
            }
            max_abs = std::max(max_abs, std::fabs(v));
        }
        return true;
    };
    res.stop_reason = "tokens";
    if (!check(0)) res.stop_reason = "non_finite";
    for (long step = 1; res.stop_reason == "tokens" && step <= r.tokens; ++step) {
        if (b->position() >= b->capacity()) {
            res.stop_reason = "context_full";
            break;
        }
        if (interrupted && interrupted()) {
            res.stop_reason = "interrupted";
            break;
        }
        if (r.time_limit_s > 0 && wall.ms() / 1000.0 >= r.time_limit_s) {
            res.stop_reason = "time_limit";
            break;
        }
        logits = b->decode(argmax(logits));
        ms.push_back(b->last_decode_ms());
        ++res.steps;
        if (!check(step)) res.stop_reason = "non_finite";
        if (b->position() - bucket_first >= r.bucket) flush_bucket();
    }
    flush_bucket();
    res.end_position = b->position();
    res.wall_s = wall.ms() / 1000.0;
    return res;
}

std::string soak_bucket_line(const SoakBucket& k) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "positions %7d-%7d: p50 %.3f ms, p90 %.3f, p99 %.3f, max %.3f, mean %.3f; %.4g GB/step, %.4g GB/s; "
                  "bytes model %.3f ms (x%.2f); max |logit| %.2f",
                  k.first_position, k.last_position, k.ms.p50, k.ms.p90, k.ms.p99, k.ms.max, k.ms.mean, k.bytes / 1e9,
                  k.gbps, k.predicted_ms, k.predicted_ms > 0 ? k.ms.mean / k.predicted_ms : 0.0,
                  static_cast<double>(k.max_abs_logit));
    return buf;
}

std::string soak_summary(const SoakResult& r) {
    std::ostringstream o;
    o << "soak: " << r.steps << " decode steps, positions " << r.start_position << " to " << r.end_position
      << " (context " << r.capacity << "), " << r.backend << ", " << r.attention << ", " << r.wall_s << " s\n";
    if (!r.buckets.empty()) {
        const SoakBucket &a = r.buckets.front(), &z = r.buckets.back();
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "latency: mean %.3f ms/token in the first bucket, %.3f in the last (x%.2f); the bytes model says "
                      "x%.2f\n",
                      a.ms.mean, z.ms.mean, a.ms.mean > 0 ? z.ms.mean / a.ms.mean : 0.0,
                      a.bytes ? static_cast<double>(z.bytes) / static_cast<double>(a.bytes) : 0.0);
        o << buf;
    }
    if (r.stop_reason == "non_finite") o << "FAILED: " << r.failure << "\n";
    else o << "every logit finite\n";
    if (r.stop_reason == "context_full")
        o << "stopped: the context is full (" << r.capacity << " tokens) after " << r.steps
          << " decode steps; raise it with -c\n";
    else if (r.stop_reason == "time_limit") o << "stopped: --time-limit reached after " << r.steps << " decode steps\n";
    else if (r.stop_reason == "interrupted") o << "stopped: interrupted (Ctrl-C) after " << r.steps << " decode steps\n";
    return o.str();
}

std::string soak_csv(const SoakResult& r) {
    std::ostringstream o;
    o << "first_position,last_position,steps,p50_ms,p90_ms,p99_ms,max_ms,mean_ms,bytes,gbps,predicted_ms,"
         "max_abs_logit\n";
    for (const SoakBucket& k : r.buckets)
        o << k.first_position << ',' << k.last_position << ',' << k.ms.count << ',' << k.ms.p50 << ',' << k.ms.p90
          << ',' << k.ms.p99 << ',' << k.ms.max << ',' << k.ms.mean << ',' << k.bytes << ',' << k.gbps << ','
          << k.predicted_ms << ',' << k.max_abs_logit << '\n';
    return o.str();
}

}  // namespace quest
