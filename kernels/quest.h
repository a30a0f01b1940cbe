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
#include <string_view>
#if __cplusplus >= 202002L
#include <span>
#endif
#include <vector>

namespace quest {

// How one page set is chosen for the query heads that share a KV head (grouped-query attention).
enum class GqaPolicy {
    KvMax,    // one page set per KV head, pages ranked by the max of the group's scores (default)
    KvSum,    // one page set per KV head, ranked by the sum of the group's scores
    PerHead,  // every query head ranks and selects its own pages (the paper's MHA rule, applied per query head)
};
std::string_view gqa_policy_name(GqaPolicy p);
bool gqa_policy_from_name(std::string_view s, GqaPolicy& out);

// How the K-1 pages besides the last one are chosen at a selecting step.
enum class PageSelector {
    Quest,      // top-(K-1) complete pages by the upper bound U(p, q) (the paper; the default)
    Streaming,  // the first page and the K-2 most recent complete pages: StreamingLLM-like, query-independent
    Oracle,     // top-(K-1) complete pages by the true softmax mass (reads every key: an evaluation yardstick)
};
std::string_view page_selector_name(PageSelector s);
bool page_selector_from_name(std::string_view name, PageSelector& out);

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
    float scale = 0.0f;           // Oracle only: softmax scale, 1/sqrt(head_dim)
};

// Pages each query head attends at this step: selected[h] is ascending and always ends with the last page. The
// GQA policy aggregates the per-head page scores (U for Quest, softmax mass for Oracle) the same way for every
// selector.
void quest_select_ref(const QuestSelectArgs& a, std::vector<std::vector<int>>& selected);

}  // namespace quest
