#pragma once
// The oracle selector on the GPU (PageSelector::Oracle): an evaluation yardstick, not a policy. It reads every key
// of the sequence to rank the complete pages by their TRUE softmax mass, then selects like Quest. CPU reference:
// oracle_policy_ref (kernels/select/quest.h) with attention_page_mass_ref (kernels/attention/attention.h).
//
// At a selecting step (P = ceil(len / S) > K = page_budget), for one layer:
//   1. oracle_page_lse: per query head h and page p < P,
//          lse[h][p] = log sum_{t in page p, t < len} exp(scale * q_h . k_t)
//      (fp32; the page's logits max-subtracted: lse = m + log sum exp(l - m)). One block per (KV head, chunk of
//      pages); the group's query heads share every key load (for groups above 8: once per 8 heads).
//   2. oracle_row_scores: per selection row (a KV head for kv-max / kv-sum, a query head for per-head), each head's
//      page mass mass[h][p] = exp(lse[h][p] - M_h) / Z_h, M_h = max_p lse[h][p], Z_h = sum_{p < P} exp(lse[h][p] - M_h)
//      (the true softmax mass of the page over all len tokens: attention_page_mass_ref), aggregated over the row's
//      heads (kv-max: max; kv-sum: sum in head order; per-head: the head's own) into scores[row][p] for the complete
//      pages p < P - 1. Z_h is summed in a fixed order (per thread, then a fixed tree): deterministic.
//   3. quest_top_k (kernels/select/quest.cuh) on those scores: the top-(K-1) complete pages (ties -> lower page id) and the
//      last page, ascending; a dense step (P <= K) selects every page. The rows feed attention_decode_sparse.
// oracle_select runs 1-3.
// A sliding window (kv.window; kernels/select/quest.cuh): the steps run on the pages from f = window_start / S on,
// renumbered from 0 (page f + p in entry p of lse, mass and scores; P counted from f), as oracle_policy_ref does
// through select_blocks_ref: page f's mass counts its tokens before window_start too.
//
// Graph capture: as every Quest launcher, the length is read on the device (len = *d_pos + 1, the current token
// already appended), the launch configuration depends on shapes and capacity only (kv.max_pages), nothing
// synchronises, allocates or copies. Dense steps (P <= K) and lengths beyond the cache (P > kv.max_pages) skip steps
// 1 and 2 on the device (nothing written). Programmatic launch: every kernel waits (pdl_wait) before it reads q, the
// keys or the previous step's output, and before it writes.
//
// Cost: every key of every KV head is read once per step (len * num_kv_heads keys of 2 * head_dim bytes: the bytes
// model's keys_scanned), like full attention's K half. Meant for evaluation, not for speed.
#include <cstddef>

#include "kernels/common/cuda_common.cuh"
#include "kernels/select/quest.h"
#include "kernels/common/rope.cuh"

namespace quest {

// Workspace of the oracle selection of one layer (reused by every layer), in floats: the page log-sum-exps
// lse[num_heads][max_pages] (row stride max_pages). Depends on shapes and capacity only. The row scores and the
// selected pages use the Quest workspace (QuestWorkspace::scores [rows][max_pages], ::selected [rows][page_budget]).
size_t oracle_workspace_floats(int num_heads, int max_pages);

// Step 1. lse: [num_heads][kv.max_pages] fp32; q: [num_heads][head_dim] fp16 (post-RoPE, 16-byte aligned); kv.k:
// [num_kv_heads][capacity][head_dim] fp16 (16-byte aligned). When P > page_budget, writes lse[h][p] for every head
// and every page p < P (the last, partial page included); otherwise nothing. scale: the softmax scale (1/sqrt(d)).
// head_dim: a power of two in [8, 256]; page size a power of two in [1, 256]; num_heads a multiple of num_kv_heads.
void oracle_page_lse(float* lse, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                     int page_budget, float scale, cudaStream_t stream);

// Step 2. From lse ([num_heads][max_pages], step 1), when P > page_budget: scores[r][p] (row stride max_pages) for
// r < quest_selection_rows(num_heads, num_kv_heads, policy) and p < P - 1, the row's GQA-aggregated mass (above);
// nothing at p >= P - 1. mass (optional, nullptr: not written; tests and diagnostics): mass[h][p] (row stride
// max_pages) for every head and every page p < P, the head's own page mass (they sum to 1 over p up to rounding).
void oracle_row_scores(float* scores, float* mass, const float* lse, const int* d_pos, int num_heads,
                       int num_kv_heads, int max_pages, int page_size, int page_budget, GqaPolicy policy,
                       cudaStream_t stream, int window = 0);

// Steps 1-3: selected[r][0 .. min(P, K)) (row stride page_budget) as quest_top_k writes them, from the oracle's
// scores. scores: [rows][kv.max_pages] (QuestWorkspace::scores), lse: oracle_workspace_floats(num_heads,
// kv.max_pages) floats; both scratch. Then attention_decode_sparse(..., selected, ...) as for Quest.
void oracle_select(int* selected, float* scores, float* lse, const __half* q, const KvLayerView& kv, const int* d_pos,
                   int num_heads, int page_budget, GqaPolicy policy, float scale, cudaStream_t stream);

}  // namespace quest
