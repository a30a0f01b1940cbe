#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace quest {

namespace {
float dot(const float* a, const float* b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) acc += a[i] * b[i];
    return acc;
}
}  // namespace

void attention_pages_ref(float* out, const float* q, const float* k, const float* v, int head_dim, int len,
                         int page_size, std::span<const int> pages, float scale, int first) {
    // Pass 1: logits of every visited token, and their maximum.
    std::vector<int> tokens;
    std::vector<float> logits;
    float max_logit = -std::numeric_limits<float>::infinity();
    for (int p : pages) {
        const int t1 = std::min(len, (p + 1) * page_size);
        for (int t = std::max(p * page_size, first); t < t1; ++t) {
            const float s = dot(q, k + static_cast<int64_t>(t) * head_dim, head_dim) * scale;
            tokens.push_back(t);
            logits.push_back(s);
            max_logit = std::max(max_logit, s);
        }
    }
    // Pass 2: normalised weights and the weighted sum of values.
    float denom = 0.0f;
    for (float& s : logits) {
        s = std::exp(s - max_logit);
        denom += s;
    }
    std::fill(out, out + head_dim, 0.0f);
    for (size_t j = 0; j < tokens.size(); ++j) {
        const float w = logits[j] / denom;
        const float* vt = v + static_cast<int64_t>(tokens[j]) * head_dim;
        for (int i = 0; i < head_dim; ++i) out[i] += w * vt[i];
    }
}

void attention_full_ref(float* out, const float* q, const float* k, const float* v, int head_dim, int len,
                        float scale, int first) {
    // A page size of len makes every token part of page 0.
    const int pages[] = {0};
    attention_pages_ref(out, q, k, v, head_dim, len, std::max(len, 1), pages, scale, first);
}

void attention_page_mass_ref(float* mass, const float* q, const float* k, int head_dim, int len, int page_size,
                             float scale) {
    const int num_pages = (len + page_size - 1) / page_size;
    std::vector<float> logits(len);
    float max_logit = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < len; ++t) {
        logits[t] = dot(q, k + static_cast<int64_t>(t) * head_dim, head_dim) * scale;
        max_logit = std::max(max_logit, logits[t]);
    }
    double denom = 0.0;
    for (float& s : logits) {
        s = std::exp(s - max_logit);
        denom += s;
    }
    std::fill(mass, mass + num_pages, 0.0f);
    for (int t = 0; t < len; ++t) mass[t / page_size] += static_cast<float>(logits[t] / denom);
}

}  // namespace quest
