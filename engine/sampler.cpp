#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/error.h"

namespace quest {

int argmax(std::span<const float> logits) {
    int best = 0;
    for (int i = 1; i < static_cast<int>(logits.size()); ++i)
        if (logits[i] > logits[best]) best = i;
    return best;
}

Sampler::Sampler(const SamplerSettings& s) : settings_(s), rng_(s.seed) {
    if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
        throw InputError("--temp must be >= 0, got " + std::to_string(s.temperature));
    if (s.top_k < 0) throw InputError("--top-k must be >= 0 (0 disables it), got " + std::to_string(s.top_k));
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
        throw InputError("--top-p must be in (0, 1] (1 disables it), got " + std::to_string(s.top_p));
}

double Sampler::uniform01() {
    // 53 random bits -> [0, 1). std::uniform_real_distribution is implementation-defined; this is not.
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int Sampler::sample(std::span<const float> logits) {
    const int n = static_cast<int>(logits.size());
    if (n == 0) throw InputError("sample: empty logits");
    if (settings_.temperature == 0.0f) return argmax(logits);

    // Candidates sorted by logit (descending, lower id first on ties), cut to top-k.
    scratch_.resize(n);
    for (int i = 0; i < n; ++i) scratch_[i] = {logits[i] / settings_.temperature, i};
    auto by_logit = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    int keep = n;
    if (settings_.top_k > 0 && settings_.top_k < n) {
        keep = settings_.top_k;
        std::partial_sort(scratch_.begin(), scratch_.begin() + keep, scratch_.end(), by_logit);
    } else {
        std::sort(scratch_.begin(), scratch_.end(), by_logit);
    }
    // Softmax over the kept candidates, in double.
    const double max_logit = scratch_[0].first;
    std::vector<double>& prob = probs_;
    prob.resize(keep);
    double total = 0.0;
    for (int i = 0; i < keep; ++i) {
        prob[i] = std::exp(static_cast<double>(scratch_[i].first) - max_logit);
        total += prob[i];
    }
    // Nucleus: the smallest prefix whose mass reaches top_p (at least one token).
    if (settings_.top_p < 1.0f) {
        double cum = 0.0;
        int cut = keep;
        for (int i = 0; i < keep; ++i) {
            cum += prob[i] / total;
            if (cum >= settings_.top_p) {
                cut = i + 1;
                break;
            }
        }
        keep = cut;
        total = 0.0;
        for (int i = 0; i < keep; ++i) total += prob[i];
    }
    const double r = uniform01() * total;
    double cum = 0.0;
    for (int i = 0; i < keep; ++i) {
        cum += prob[i];
        if (r < cum) return scratch_[i].second;
    }
    return scratch_[keep - 1].second;
}

}  // namespace quest
