#pragma once
// The scalar rules of the sparq selector (kernels/select/sparq.h), shared by the CPU reference and the CUDA kernels
// so that both make the same choices from the same inputs. C++17, no CUDA header (QUEST_HD: page_codes.h).
//
//   channels   r = channels(D, S): the query channels a step scores with, min(D / 8, 2 D / S): the sketch of a
//              page (r * S bytes) is at most half of fp16 Quest's metadata of it (4 D bytes), so that at least half
//              of Quest's metadata bytes buy pages. Needs D a multiple of 8 and D >= S / 2 (supported()).
//   choice     per KV head, a_i = sum over the group's query heads (in head order) of |q_h,i| in fp32; the r
//              channels with the largest a_i, ties to the lower channel; used in ascending channel order.
//   sketch     every key is kept a second time, channel-major, as fp8 e4m3 (round to nearest even, saturating at
//              +-448): e4m3_round below is that rounding on a float.
//   token      s_h(t) = sum over the chosen channels c, ascending, of q_h,c * e4m3(k_t,c), fp32 (each product of an
//              fp16 q and an e4m3 key is exact in fp32, so an FMA chain has the bits of multiply-then-add).
//   page       head h's page value v_h(p) = scale * max over the page's tokens of s_h(t) (scale = 1 / sqrt(D): the
//              log of the page's mass if its best token were all of it), and its estimated share of the head's
//              attention w_h(p) = exp(v_h(p) - M_h) / Z_h over the complete pages (M_h their largest v, Z_h the sum
//              of exp(v - M_h)): the oracle's normalisation (page_oracle.cuh), so that every head of a group
//              weighs the same whatever the scale of its logits. A selection row of several heads aggregates
//              their shares like every selector (kv-sum: sum in head order, kv-max: max). Summing raw logits
//              instead let the heads with the largest logits rank the pages (measured: docs/quest.md). A row of
//              one head (per-head, or a group of one: rows_rank_values) ranks by v itself: its shares are
//              monotone in v, and v needs no normalisation pass (on the GPU, no launch).
//   budget     K pages (the last one included), as Quest. Bytes-matched (match_bytes) to fp16 Quest: the
//              selector's own bytes are r * S per complete page (the r channels' bytes of its S tokens) plus D for
//              the current token's sketch (written once per step; with at least one complete page it fits in the
//              half of Quest's metadata the sketch leaves); the pages besides the last are as many as fit in fp16
//              Quest's bytes at the same step after those (sparq_matched_pages, codes::matched_pages with the
//              append write as fixed bytes).
#include <cmath>
#include <cstdint>

#include "kernels/select/page_codes.h"

namespace quest::sparq {

QUEST_HD inline bool supported(int head_dim, int page_size) {
    return head_dim >= 8 && head_dim % 8 == 0 && page_size >= 1 && 2 * head_dim >= page_size;
}
QUEST_HD inline int channels(int head_dim, int page_size) {
    const int a = head_dim / 8, b = 2 * head_dim / page_size;
    return a < b ? a : b;
}

// True when every selection row is one head (per-head, or a group of one): the rows rank the page values v
// themselves, not the shares.
QUEST_HD inline bool rows_rank_values(bool per_head, int group) { return per_head || group == 1; }

// fp8 e4m3 (OCP, as cvt.rn.satfinite.e4m3 rounds): 3 mantissa bits, normal exponents down to 2^-6, subnormal
// quantum 2^-9, largest finite 448 (larger magnitudes saturate to it). Exact for any float input (the quotient by a
// power of two and the round to an integer are exact in fp32).
QUEST_HD inline float e4m3_round(float x) {
    const float ax = fabsf(x);
    if (!(ax < 448.0f)) return x != x ? x : copysignf(448.0f, x);
    const float quantum = ax < 0.015625f ? 0.001953125f : ldexpf(1.0f, ilogbf(ax) - 3);
    return rintf(x / quantum) * quantum;
}

// The own bytes of one selecting step of one KV head: the chosen channels of every complete page, and the
// current token's sketch (D bytes).
QUEST_HD inline int64_t own_bytes(int64_t complete_pages, int page_size, int head_dim) {
    return complete_pages * page_size * channels(head_dim, page_size) + head_dim;
}

// The device's matched budget of the selector: r * S bytes per complete page, the append write as fixed bytes.
QUEST_HD inline codes::MatchedBudget budget(int page_size, int head_dim, int rows) {
    codes::MatchedBudget m;
    m.meta_bytes = page_size * channels(head_dim, page_size);
    m.head_dim = head_dim;
    m.rows = rows;
    m.fixed_bytes = head_dim;
    return m;
}

// Pages besides the last one a selecting step reads (at most the complete pages): fp16 Quest's bytes at this step
// minus our own, in pages of KV per row (codes::matched_pages with the budget above).
QUEST_HD inline int matched_pages(int64_t last, int64_t last_tokens, int page_size, int page_budget, int head_dim,
                                  int64_t rows) {
    const codes::MatchedBudget m = budget(page_size, head_dim, static_cast<int>(rows));
    return static_cast<int>(codes::matched_pages(last, last_tokens, page_size, page_budget, head_dim, m.meta_bytes,
                                                 last, rows, m.fixed_bytes));
}

}  // namespace quest::sparq
