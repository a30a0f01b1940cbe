#pragma once
// CPU reference of Quest's query-aware page selection (Tang et al., ICML 2024; see docs/quest.md).
//
// Page metadata, per layer, KV head, page and channel i: kmin[p][i] and kmax[p][i], the min and max of the
// post-RoPE keys in page p. For a post-RoPE query q the page's score is
//     U(p, q) = sum_i max(q_i * kmin[p][i], q_i * kmax[p][i])
// an upper bound of q . k for every key k of the page (not a probability).
//
// With a page budget K = B / S: the last page (the one holding the newest token, possibly partial) is always
// attended; the other K-1 are the top-(K-1) complete pages by U; when the sequence has P <= K pages, all pages are
// attended (dense step).
// C++17 only: the CUDA units (nvcc, C++17) include this header too.
#include <cstdint>
#include <string_view>
#if __cplusplus >= 202002L
#include <span>
#endif
#include <vector>

#include "kernels/select/page_codes.h"
#include "kernels/select/selection.h"

namespace quest {

// A sliding window of `window` tokens (0: none) at sequence length len: the first token attended, len - window when
// the window is shorter than the sequence, else 0 (QuestSelectArgs::window_start). Its page, window_start_of / S, is
// the first page a step may select; the CUDA launches compute both from the device position.
QUEST_HD inline int window_start_of(int len, int window) { return window > 0 && len > window ? len - window : 0; }


// scores[p] = U(p, q) for p < num_pages. kmin/kmax: [num_pages][head_dim] (one KV head).
void page_scores_ref(float* scores, const float* q, const float* kmin, const float* kmax, int num_pages,
                     int head_dim);

// Indices of the k largest scores among scores[0, n), ties broken towards the lower index, returned in ascending
// index order. k >= n returns every index.
std::vector<int> top_k_ref(const float* scores, int n, int k);
inline std::vector<int> top_k_ref(const std::vector<float>& scores, int k) {
    return top_k_ref(scores.data(), static_cast<int>(scores.size()), k);
}
#if __cplusplus >= 202002L
inline std::vector<int> top_k_ref(std::span<const float> scores, int k) {
    return top_k_ref(scores.data(), static_cast<int>(scores.size()), k);
}
#endif

// Folds key[head_dim] into page metadata: when `first` (the page's first token) it initialises min = max = key.
void page_metadata_update_ref(float* kmin, float* kmax, const float* key, int head_dim, bool first);

struct QuestSelectArgs {
    const float* q = nullptr;     // [num_heads][head_dim], post-RoPE
    const float* kmin = nullptr;  // [num_kv_heads][page_capacity][head_dim]
    const float* kmax = nullptr;  // [num_kv_heads][page_capacity][head_dim]
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    int page_capacity = 0;  // pages allocated per KV head (stride of kmin/kmax)
    int len = 0;            // tokens in the cache, the current one included (>= 1)
    int page_size = 0;      // S
    int page_budget = 0;    // K = B / S (>= 1)
    GqaPolicy policy = GqaPolicy::KvMax;
    PageSelector selector = PageSelector::Quest;
    const float* keys = nullptr;  // Oracle only: [num_kv_heads][key_capacity][head_dim], post-RoPE
    int key_capacity = 0;         // Oracle only: tokens per KV head (stride of keys)
    float scale = 0.0f;           // Oracle, and the mass estimate of mass_target: softmax scale, 1/sqrt(head_dim)
    MetadataFormat metadata = MetadataFormat::Fp16;  // Quest and TwoLevel (coarse level): format of kmin/kmax
    // TwoLevel only: sub-page bounds, the exact per-channel min/max of the keys of each sub-page of sub_page tokens
    // (sub-page j holds tokens [j*sub_page, (j+1)*sub_page)); quantized to uint8 inside their page's range when read.
    const float* sub_kmin = nullptr;  // [num_kv_heads][sub_capacity][head_dim]
    const float* sub_kmax = nullptr;  // [num_kv_heads][sub_capacity][head_dim]
    int sub_capacity = 0;             // sub-pages allocated per KV head (stride of sub_kmin/sub_kmax)
    int sub_page = 0;                 // tokens per sub-page (a power of two dividing page_size, < page_size)
    int shortlist = 4;                // TwoLevel: pages shortlisted by the coarse bound = shortlist * (K - 1)
    // Adaptive budget (Quest, TwoLevel): 0 = off (always K pages). In (0, 1]: per selection row, the shortest
    // prefix of the row's ranking whose ESTIMATED share of the softmax mass reaches mass_target for every query
    // head of the row, capped at the budget (adaptive_prefix_ref). Needs scale.
    float mass_target = 0.0f;
    // Quest with int8 metadata: true = as many pages as fit in fp16 Quest's bytes (quest_matched_pages).
    // TwoLevel: false = read (K-1) * S tokens besides the last page (the same tokens as Quest). true = bytes-matched:
    // as many sub-pages as fit in the bytes Quest (fp16 metadata, K pages) would read at this step after our own
    // metadata (two_level_matched_sub_pages): the metadata saved by int8 bounds buys KV tokens, and the fine
    // metadata is paid for with KV tokens, so the step never reads more bytes than Quest's.
    bool match_bytes = false;
    // Sliding window (a layer of MistralForCausalLM / Qwen2ForCausalLM): the first token attended, len - window
    // when the window is shorter than the sequence, else 0. select_blocks_ref hands the selector the pages from the
    // one holding window_start on, renumbered from 0 (pointers advanced, strides unchanged: every selector honours
    // the window without knowing of it) and shifts its blocks back; the tokens before window_start in that first
    // page are masked by the attention (attention_pages_ref's `first`), and not counted in out.reads.
    int window_start = 0;
};


// Pages each query head attends at this step: selected[h] is ascending and always ends with the last page. The
// GQA policy aggregates the per-head page scores (U for Quest, softmax mass for Oracle) the same way for every
// selector. Page-granular selectors only (throws for TwoLevel: use select_blocks_ref).
void quest_select_ref(const QuestSelectArgs& a, std::vector<std::vector<int>>& selected);

// Every selector: fills out.blocks (in units of out.block_size tokens) and out.reads. Dispatches to the policies
// below; the dense step (P <= K, P counted from the page holding window_start) is shared: every page of the
// window, block_size = page_size.
void select_blocks_ref(const QuestSelectArgs& a, Selection& out);

// --- Bounds with quantized metadata ---

// Int8 page bounds: scale = the smallest float with 127 * scale >= max_i max(|kmin_i|, |kmax_i|) (0 for an all-zero
// page); cmin_i = the largest code in [-128, 127] with cmin_i * scale <= kmin_i, cmax_i = the smallest with
// cmax_i * scale >= kmax_i. Dequantized (code * scale) they enclose [kmin_i, kmax_i].
struct Int8Page {
    float scale = 0.0f;                    // per page
    std::vector<int8_t> cmin, cmax;        // [head_dim]
};
Int8Page quantize_page_int8_ref(const float* kmin, const float* kmax, int head_dim);
// The same rule for a metadata format's code range: int8 [-128, 127] with 127 * scale >= max, int4 [-8, 7] with
// 7 * scale >= max (the codes are held in int8 either way). Fp16 is not a code format (use the exact values).
Int8Page quantize_page_codes_ref(const float* kmin, const float* kmax, int head_dim, MetadataFormat f);
// U8(p, q) = scale * sum_i max(q_i * cmin_i, q_i * cmax_i) >= U(p, q) (up to fp32 rounding): the sum in fp32 in
// channel order, then one multiplication by the scale (kernels/select/page_codes.h, code_term; the GPU's scores are these
// bits for its fp16 q). The codes and scale rule (quantize_page_codes_ref) is shared with the GPU the same way.
float page_score_int8_ref(const float* q, const Int8Page& p);

// Uint8 sub-page bounds inside the page's range [lo_i, hi_i] per channel: step_i = (hi_i - lo_i) / 255; code c
// decodes to lo_i + c * step_i for c < 255 and to hi_i for c = 255. cmin_i is the largest code decoding <= kmin_i,
// cmax_i the smallest decoding >= kmax_i (so the decoded range encloses [kmin_i, kmax_i] when it lies in [lo, hi]).
void quantize_sub_page_u8_ref(uint8_t* cmin, uint8_t* cmax, const float* kmin, const float* kmax, const float* lo,
                              const float* hi, int head_dim);
float sub_page_decode_u8(uint8_t code, float lo, float hi);
// The sub-page bound: sum_i max(q_i * dec(cmin_i), q_i * dec(cmax_i)).
float sub_page_score_u8_ref(const float* q, const uint8_t* cmin, const uint8_t* cmax, const float* lo,
                            const float* hi, int head_dim);

// --- The adaptive budget ---

// Given candidates in ranking order (order[j], best first) and, per query head g of a selection row, the estimated
// unnormalised mass of each candidate est[g][c], of the always-attended part fixed[g], and of the whole sequence
// total[g] (fixed + every candidate + what cannot be selected), returns the length n of the shortest prefix
// order[0..n) with fixed[g] + sum_{j<n} est[g][order[j]] >= target * total[g] for every g, capped at max_n.
// Monotone in target; never above max_n.
int adaptive_prefix_ref(const std::vector<int>& order, const std::vector<std::vector<double>>& est,
                        const std::vector<double>& fixed, const std::vector<double>& total, double target, int max_n);
// The estimated unnormalised softmax mass of a block of n tokens whose logits are bounded by u (q . k units):
// n * exp(scale * u - shift), shift a common offset (the row's largest scale * u) against overflow.
double estimated_mass(int n, float u, float scale, float shift);
// Indices 0..n-1 ordered by score, highest first, ties towards the lower index (top_k_ref's order).
std::vector<int> ranking_ref(const float* scores, int n);

// --- The policies (select_blocks_ref dispatches; each fills out.blocks, out.block_size, out.reads) ---
// Contract common to all: called only for a selecting step (P > K); every query head's blocks are ascending and
// cover every token of the last page; KV tokens read never exceed the budget's (K - 1) * S plus the last page's.

// Quest: per selection row, the top-(K-1) complete pages by the GQA-aggregated bound U (a.metadata: exact or int8),
// or with mass_target the adaptive prefix of that ranking; with match_bytes the top quest_matched_pages(a). block_size = S.
void quest_policy_ref(const QuestSelectArgs& a, Selection& out);
// Bytes-matched Quest (match_bytes, meant with int8 metadata): the pages besides the last that fit in the bytes
// fp16 Quest reads at this step, min(P-1, floor((quest - meta - rows * last * kv) / rows / (S * kv))) with quest,
// rows and kv as in two_level_budget and meta = the scored pages' metadata in a.metadata.
int quest_matched_pages(const QuestSelectArgs& a);
// The same count as a device-side description (kernels/select/page_codes.h: codes::step_pages(len, S, K, m) - 1 equals
// quest_matched_pages for these settings without mass_target; the GPU computes it from the position): the metadata
// format's page bytes, head_dim, and the selection rows sharing a KV head's metadata (the group for PerHead, else 1).
codes::MatchedBudget matched_budget(MetadataFormat f, int head_dim, int num_heads, int num_kv_heads, GqaPolicy policy);
// Streaming: the first page and the K-2 most recent complete pages (query-independent). block_size = S.
void streaming_policy_ref(const QuestSelectArgs& a, Selection& out);
// Oracle: the top-(K-1) complete pages by the GQA-aggregated true softmax mass. block_size = S.
void oracle_policy_ref(const QuestSelectArgs& a, Selection& out);
// Two-level: per selection row, the top shortlist * (K-1) complete pages by the coarse bound (a.metadata), then the
// top (K-1) * S / sub_page sub-pages of those pages by the sub-page bound (uint8 codes inside the page's coarse
// range, quantize_sub_page_u8_ref), GQA-aggregated the same way; with mass_target the adaptive prefix of the
// sub-page ranking. The last page's sub-pages are always attended. block_size = sub_page.
void two_level_select_ref(const QuestSelectArgs& a, Selection& out);
// How much two-level reads per selection row at a selecting step.
struct TwoLevelBudget {
    int shortlist_pages = 0;  // pages shortlisted by the coarse bound
    int sub_pages = 0;        // sub-pages selected from them (at most; fewer when the shortlist holds fewer)
};
// Without match_bytes: min(P-1, shortlist * (K-1)) pages, (K-1) * S / sub_page sub-pages (Quest's tokens).
// With match_bytes (rows = selection rows sharing a KV head: 1, or the group under per-head; kv = 4 * head_dim):
//   quest = (P-1) * 4 * head_dim + rows * ((K-1) * S + last) * kv        (Quest's bytes for the KV head)
//   left(n) = quest - coarse - rows * (n * (page_meta + (S / sub_page) * 2 * head_dim) + last * kv)
//   shortlist_pages = the largest n <= min(P-1, shortlist * (K-1)) with left(n) >= 0 (0 if none)
//   sub_pages = min(floor(left / rows / (sub_page * kv)), shortlist_pages * S / sub_page)
// so the step's selection_bytes never exceed Quest's (unless even the coarse pass and the last page do).
TwoLevelBudget two_level_budget(const QuestSelectArgs& a);

}  // namespace quest
