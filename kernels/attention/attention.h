#pragma once
// CPU reference of decode/prefill attention over a paged KV cache, for one query head.
//
// KV layout (per layer and KV head): k[token][head_dim], v[token][head_dim] for tokens [0, capacity); page p holds
// tokens [p*S, (p+1)*S). `len` tokens are valid; the last page may be partial.
#include <span>

namespace quest {

// out[head_dim] = softmax(q . k_t * scale) . v_t over the tokens t < len of the listed pages (ascending page ids;
// only tokens < len of the last listed page count; tokens < first are masked: a sliding window starting inside a
// listed page). Exact fp32 softmax: max-subtracted, two passes. Visiting all pages in order gives bit-for-bit the
// same result as attention_full_ref.
void attention_pages_ref(float* out, const float* q, const float* k, const float* v, int head_dim, int len,
                         int page_size, std::span<const int> pages, float scale, int first = 0);

// All tokens first <= t < len (first > 0: a sliding window).
void attention_full_ref(float* out, const float* q, const float* k, const float* v, int head_dim, int len,
                        float scale, int first = 0);

// Softmax mass of each page for this query (probabilities summed per page; pages [0, ceil(len/S))). Used by the
// selection diagnostics and the oracle policy.
void attention_page_mass_ref(float* mass, const float* q, const float* k, int head_dim, int len, int page_size,
                             float scale);

}  // namespace quest
