#pragma once
// The GPU Quest decode path (Tang et al., ICML 2024; semantics in docs/quest.md) for one layer and one sequence:
//   1. quest_page_scores: U(p, q) = sum_i max(q_i kmin[p][i], q_i kmax[p][i]) of every complete candidate page, per
//      selection row (a KV head for KvMax/KvSum, the group's scores aggregated; a query head for PerHead);
//   2. quest_top_k: per row the top-(K-1) candidates (ties -> lower page id) plus the last page, ascending (a
//      bytes-matched budget: the top quest_matched_pages, a count the kernels compute from the device position);
//   3. attention_decode_sparse: exact softmax attention of every query head over its row's selected pages.
// CPU references: page_scores_ref, top_k_ref, quest_select_ref (kernels/select/quest.h), attention_pages_ref
// (kernels/attention/attention.h).
//
// Graph capture: every launcher reads the sequence length on the device — the sequence holds len = *d_pos + 1
// tokens, the current one included and already appended to the cache, its page metadata already updated — and its
// launch configuration depends only on shapes and capacity-level maxima (kv.max_pages, the page budget), never on
// len. No launcher synchronises, allocates or copies: capture a step once, replay it at any length by changing
// *d_pos. Work beyond len is skipped on the device. Lengths beyond the cache (len > kv.capacity) write nothing.
//
// Sliding window (kv.window > 0, a layer of MistralForCausalLM / Qwen2ForCausalLM): every step runs as
// select_blocks_ref does with window_start = window_start_of(len, kv.window): the pages from f = window_start / S on
// are renumbered from 0 (P counted from page f, the candidate scores in entries 0 .. P - f - 2 of the rows, the
// dense test P - f <= K, a matched budget's count from len - f * S tokens), the selected ids are pages again, and the
// attention masks the tokens before window_start in page f. quest_top_k takes the window as an argument; the fused
// scoring + top-k refuses one.
//
// Numerics: scores are fp32 sums over the channels in channel order of exact fp16 x fp16 products, i.e. the same
// rounding as page_scores_ref (KvSum adds the group's heads in head order, as quest_select_ref does), so the GPU and
// CPU rankings agree bit for bit. With int8 / int4 page codes (QuestDecodeOptions::codes, kernels/select/page_codes.cuh)
// the scores are page_score_int8_ref's bits instead. Attention uses an exp2-based online softmax with fp32
// accumulation; the output is fp16.
#include <cstddef>

#include "kernels/common/cuda_common.cuh"
#include "kernels/select/page_codes.cuh"
#include "kernels/select/quest.h"
#include "kernels/common/rope.cuh"

namespace quest {

// Selection rows of a policy: num_kv_heads for KvMax/KvSum (one page set per KV head), num_heads for PerHead.
int quest_selection_rows(int num_heads, int num_kv_heads, GqaPolicy policy);

// Bytes-matched budgets (QuestSettings::match_bytes; kernels/select/page_codes.h): with match.on(), a selecting step
// (P > K) selects codes::step_pages(len, S, K, match) pages per row (quest_matched_pages + 1, the last page
// included), computed on the device from the position; without it, K. A setting's budget: matched_budget
// (kernels/select/quest.h).
// Entries per row of `selected` (its row stride) and the most pages the attention kernel is sized for: page_budget,
// or with a matched budget the largest step_pages up to the capacity (max_pages pages), if larger.
int quest_select_capacity(int max_pages, int page_size, int page_budget, const MatchedBudget& match);

// Workspace of one layer's Quest decode, in elements. Depends on shapes and capacity only (not on the length).
struct QuestWorkspaceSizes {
    int rows = 0;             // selection rows (quest_selection_rows)
    int pages_per_split = 0;  // selected pages handled by one attention block
    int max_splits = 0;       // ceil(page_budget / pages_per_split): partial results per query head
    size_t scores = 0;        // floats: [rows][max_pages]            (row stride max_pages)
    size_t selected = 0;      // ints:   [rows][page_budget]          (row stride page_budget)
    size_t topk_scratch = 0;  // bytes:  0 (the top-k keeps its histograms and keys in shared memory)
    size_t partial_o = 0;     // floats: [num_heads][max_splits][head_dim]
    size_t partial_ml = 0;    // floats: [num_heads][max_splits][2]   (running max in log2 units, sum of exp2)
    size_t counters = 0;      // ints:   [num_heads + num_kv_heads]: the attention merge's [num_heads], then the fused
                              //         scoring's per-KV-head tickets; ZEROED ONCE after allocation, every launch
                              //         leaves them zero
    int select_stride = 0;    // entries per row of `selected`: quest_select_capacity (page_budget without a matched
                              // budget)
    size_t bytes() const { return 4 * (scores + selected + partial_o + partial_ml + counters) + topk_scratch; }
};
// page_size S: a power of two in [1, 256]; max_pages: pages per KV head (KvLayerView::max_pages); page_budget K >= 1.
// pages_per_split: 0 picks the default (about 128 tokens per attention block, fewer when the grid would be small);
// a value in [1, 128] forces it (tuning, tests). Pass the same value in QuestWorkspace::pages_per_split.
// match: a bytes-matched budget (selected: [rows][select_stride], the attention splits sized for select_stride pages).
QuestWorkspaceSizes quest_workspace_sizes(int num_heads, int num_kv_heads, int head_dim, int page_size,
                                          int max_pages, int page_budget, GqaPolicy policy, int pages_per_split = 0,
                                          const MatchedBudget& match = {});

// Device buffers sized by quest_workspace_sizes (allocated once, outside the decode loop; cudaMalloc alignment).
// `counters` must be zeroed once (cudaMemset) before the first launch; the kernels leave them zero.
struct QuestWorkspace {
    float* scores = nullptr;
    int* selected = nullptr;
    float* partial_o = nullptr;
    float* partial_ml = nullptr;
    int* counters = nullptr;
    int pages_per_split = 0;  // as passed to quest_workspace_sizes (0: the default)
};

// Step 1. q: [num_heads][head_dim] fp16 (post-RoPE). With P = ceil(len / S) pages: when P > page_budget, writes
// scores[r][p] for every candidate page p < P - 1 (row stride kv.max_pages); a dense step (P <= page_budget) needs no
// scores and writes nothing; nothing is ever written at p >= P - 1. Reads each KV head's metadata once (for groups of
// more than 8 query heads: once per 8 heads), with 16-byte coalesced loads. Launched with programmatic dependent
// launch, it reads the position and the candidates' metadata BEFORE waiting for the kernel before it (only q after):
// no kernel that may still be running may write them. In the decode step the position changes only between steps and
// a layer's candidate bounds only in the steps that completed their pages; the kernel before is rope_append (it
// writes the last page's bounds only and triggers only after its own wait) or, with `rope` below, the qkv GEMV (it
// triggers before its own wait, so earlier kernels of the step may still run; none of them writes these). The same
// holds for quest_page_scores_top_k and quest_decode.
//
// rope (optional): q is not read but rotated by each block from rope->qkv, exactly as rope_append_kv rotates it
// (pass rope->q_out as q), and the launch also does rope_append_kv's work for the token (T = 1, the same bits):
// rope->q_out, its k and v rows and the current page's bounds, spread over the grid's threads (loads right after the
// wait, stores after each block's scoring). quest_decode with QuestDecodeOptions::rope uses this.
struct QuestRopeAppend {
    const float* qkv = nullptr;  // [num_heads*D | num_kv_heads*D | num_kv_heads*D] fp32: the token's projection
    __half* q_out = nullptr;     // [num_heads][D]: the rotated query (written by the scoring launch)
    RopeDeviceParams rope;
};
void quest_page_scores(float* scores, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                       int page_budget, GqaPolicy policy, cudaStream_t stream,
                       const QuestRopeAppend* rope = nullptr);

// Step 2. For each of `rows` rows of `scores` (row stride score_stride >= the largest candidate count, P - 1):
// P = ceil(len / page_size); if P <= page_budget, selected[r][i] = i for i < P (dense step); otherwise
// selected[r][0 .. K-1) = the top-(K-1) candidates among scores[r][0 .. P-1) by score (ties: lower page id) in
// ascending page order, and selected[r][K-1] = P - 1. Only the first min(P, K) entries of a row are written (the
// count is min(P, K), derivable from len). Exact: a radix select on order-preserving keys (-0 counts as +0).
// With a matched budget (match.on()): a selecting step takes the top (n - 1) candidates, n = codes::step_pages (every
// candidate when n - 1 >= P - 1), written as above with selected[r][n - 1] = P - 1; row stride select_stride (0:
// page_budget); a count beyond select_stride writes nothing.
// window: the layer's sliding window (0: none), as described at the top.
void quest_top_k(int* selected, const float* scores, int score_stride, const int* d_pos, int rows, int page_size,
                 int page_budget, cudaStream_t stream, const MatchedBudget& match = {}, int select_stride = 0,
                 int window = 0);

// Steps 1 and 2 in one launch (QuestDecodeOptions::fused; measured slower than the separate launches, the default):
// quest_page_scores, and in the same grid the selection of quest_top_k with score_stride = kv.max_pages, written to
// selected with the same contents (identical pages; the same entries written, dense steps included). The block that
// scores the last tile of a KV head runs the radix select of that head's rows (the other blocks go on scoring), so
// the top-k overlaps the scoring and costs no launch. The select runs on the block's 128 threads: up to 2,048
// candidates (32K tokens at S = 16) with the keys in registers and its histogram in the block's cp.async ring (the
// top-k kernel's register select; head_dim >= 16), otherwise with the keys in the ring (up to ring bytes / 4 - 2048
// candidates: 22,528 at head_dim 64 and 128, 14,336 at 256, 1,024 at 8); longer rows re-read the keys from L2 each
// pass (correct, slower). tickets: [num_kv_heads] ints, zero before the launch and left zero
// (QuestWorkspace::counters + num_heads). scores is scratch here (rows x kv.max_pages floats, written then read by
// the same grid). Each block triggers the dependent launch (pdl_trigger) once its scoring is done, so the attention
// kernel's blocks are resident, waiting in pdl_wait, while the last selections finish.
void quest_page_scores_top_k(int* selected, float* scores, int* tickets, const __half* q, const KvLayerView& kv,
                             const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, cudaStream_t stream);

// Step 3. out: [num_heads][head_dim] fp16 = softmax(q_h . k_t * scale) . v_t over the tokens t < len of the pages
// listed in selected[row(h)][0 .. min(P, K)) (ascending page ids ending with P - 1, as quest_top_k writes them;
// row(h) = h / G for KvMax/KvSum, h for PerHead). For KvMax/KvSum one block reads a page once for up to 8 query
// heads of its group; for PerHead each query head reads its own pages. Uses ws.partial_o, ws.partial_ml,
// ws.counters and ws.pages_per_split (one launch: the split partials are merged by the last block of each head
// group). With a matched budget the rows hold codes::step_pages entries (row stride quest_select_capacity, as
// quest_top_k writes them with the same match); the grid is sized for the capacity, the count read from the device.
void attention_decode_sparse(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos,
                             const int* selected, int num_heads, int page_budget, GqaPolicy policy, float scale,
                             const QuestWorkspace& ws, cudaStream_t stream, const MatchedBudget& match = {});

// How quest_decode launches its steps (benchmarks and tests compare the paths; the results are the same).
struct QuestDecodeOptions {
    // true: quest_page_scores_top_k + attention (2 launches); false (default): the 3 separate launches. The fused
    // path is slower (docs/performance.md): the last block of each KV head runs the select on 128 threads after the
    // scoring, a serial tail.
    bool fused = false;
    // Non-null: score from these int8 / int4 page codes (quest_code_scores, kernels/select/page_codes.cuh; it also writes
    // the codes of the page the current token completes) instead of kv.kmin / kv.kmax. Not with `fused`.
    const PageCodesView* codes = nullptr;
    // A bytes-matched budget (quest_matched_budget; the workspace sized with the same). Not with `fused`.
    MatchedBudget match;
    // Non-null: the decode token's RoPE + KV append (rope_append_kv, T = 1, the same bits) runs inside the Quest
    // launches instead of a launch of its own: the scoring kernel rotates q from rope->qkv for its scores and also
    // writes rope->q_out, the token's k and v and the current page's bounds (its loads issued right after its wait,
    // its stores after each block's scoring items: off the chain's critical path), and the attention reads them two
    // launches later (the top-k needs none of them). The caller does not launch rope_append_kv
    // for this step; quest_decode's q must be rope->q_out. Not with `fused` or `codes`.
    const QuestRopeAppend* rope = nullptr;
};

// Steps 1-3 for one layer (graph-capturable). scale: usually 1/sqrt(head_dim).
void quest_decode(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads,
                  int page_budget, GqaPolicy policy, float scale, const QuestWorkspace& ws, cudaStream_t stream,
                  const QuestDecodeOptions& opts = {});

}  // namespace quest
