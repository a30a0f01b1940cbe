#pragma once
// The sparq page selector (PageSelector::Sparq): Quest's pages, ranked by approximate token logits instead of a page
// bound. After SparQ attention's first step (Ribar et al., 2024: score every key on the query's largest channels),
// within Quest's bytes:
//   - every key is kept a second time as an fp8 e4m3, channel-major sketch, so that reading channel c of a page is
//     one contiguous run of S bytes;
//   - a step picks per KV head the r = D / 8 channels (fewer for pages above 16 tokens: sparq_rule.h) where the
//     group's queries are largest (sum of |q|), scores every token of every complete page on those channels, gives
//     each head's page its best token's value, normalises each head's pages to shares (as the oracle does with true
//     masses) and sums them over the group (a row of one head ranks the values themselves), and reads the top K
//     pages as Quest does: its own bytes (r * S per
//     page plus the D-byte append of the token's sketch) are half of Quest's metadata at S = 16. With match_bytes
//     (`sparq+m`) the other half buys pages: as many as fit in the bytes fp16 Quest reads at the same step
//     (sparq::matched_pages), which costs the attention kernel time in proportion (docs/quest.md, "sparq").
// The rules (channel choice, rounding, sums, page count) are in kernels/select/sparq_rule.h, shared with the CUDA
// kernels (kernels/select/sparq.cuh). Quest's bound ranks a page by the sum of per-channel extremes that usually
// come from different keys; a token's approximate logit keeps which key has which values, which is what separates
// a needle's page from pages of similar distractors (docs/quest.md, "sparq").
#include <vector>

#include "kernels/select/quest.h"

namespace quest {

// The r channels of KV head kvh's selection at this step: sparq_rule.h's choice from q (a.q, [num_heads][D]),
// ascending.
std::vector<int> sparq_channels_ref(const QuestSelectArgs& a, int kvh);

// Per head of the group of kvh: the page scores (max over the page's tokens of the approximate logit) of the
// complete pages [0, n), from a.keys rounded to e4m3.
std::vector<float> sparq_page_scores_ref(const QuestSelectArgs& a, int h, int kvh, const std::vector<int>& channels,
                                         int n);
// A head's shares of the pages from its page scores (sparq_rule.h): v = scale * score (fp32), w = exp(v - M) / Z in
// fp32 (Z summed in page order).
std::vector<float> sparq_page_shares_ref(const std::vector<float>& scores, float scale);

// The pages besides the last that a bytes-matched selecting step of this layer reads (sparq::matched_pages).
int sparq_matched_pages(const QuestSelectArgs& a);

// The selector's CPU reference (select_blocks_ref's contract). Needs a.keys ([num_kv_heads][key_capacity][D]).
void sparq_select_ref(const QuestSelectArgs& a, Selection& out);

// The bytes model without running it (StepShape: kernels/select/registry.h).
struct StepShape;
SelectionReads sparq_step_reads(const StepShape& s);

}  // namespace quest
