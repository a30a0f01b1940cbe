#pragma once
// The sparq selector on the GPU (kernels/select/sparq.h; rules in kernels/select/sparq_rule.h). Per Quest layer the
// keys are kept a second time as an fp8 e4m3 sketch, channel-major, so that one channel of 16 tokens is one 16-byte
// load and a warp reads 512 contiguous bytes of a channel's row. A decode step of one layer:
//   1. sparq_page_lse: per KV head the r = channels(D, S) channels of the group's largest sum |q|, every token of
//      every complete page scored on them, each head's page value scale * (its best token's score); for a group
//      above one head also each scoring block's per-head (max, sum of exp) of its values; the same launch writes
//      the current token's sketch (and, folded in, does its RoPE + KV append);
//   2. rows of several heads (kv-sum, kv-max with a group above 1): sparq_row_shares, per head the pages' shares
//      exp(v - M) / Z (M, Z from the scoring blocks' partials), aggregated per row; rows of one head rank v itself
//      (no launch);
//   3. quest_top_k (K pages, or bytes-matched with sparq::budget), then attention_decode_sparse: Quest's own.
// The page values are sparq_page_scores_ref's bits times scale (tests/cuda/test_sparq.cpp); the shares are fp32 on
// both sides with sums in different orders, so the selections are the CPU's up to swaps at near-ties.
// Shapes: head_dim a power of two in [8, 256], page size a power of two of at most min(2 x head_dim, 256)
// (require_sparq_supported).
// Graph capture: as every Quest launcher (kernels/select/quest.cuh): the length is read on the device, the launch
// depends on shapes and capacity only, nothing synchronises or allocates.
#include <cstddef>
#include <cstdint>

#include "kernels/common/cuda_common.cuh"
#include "kernels/common/rope.cuh"
#include "kernels/select/quest.cuh"

namespace quest {

// One layer's key sketch, allocated once for the capacity (key_sketch_bytes), 16-byte aligned.
struct KeySketchView {
    uint8_t* k8 = nullptr;  // [num_kv_heads][head_dim][capacity] fp8 e4m3: channel c of token t at (kvh * D + c) *
                            // capacity + t
    int num_kv_heads = 0;
    int head_dim = 0;
    int capacity = 0;  // tokens per channel row: sparq_sketch_capacity(KvLayerView::capacity), a multiple of 16
};

// The sketch's row length for a KV cache of kv_capacity tokens: rounded up to a multiple of 16 (a thread's load).
int sparq_sketch_capacity(int kv_capacity);
// Bytes of one layer's sketch for a KV cache of kv_capacity tokens.
size_t key_sketch_bytes(int num_kv_heads, int head_dim, int kv_capacity);

// Throws std::invalid_argument naming what sparq needs and the value it got (head_dim a power of two in [8, 256],
// page size a power of two of at most min(2 x head_dim, 256)). A sliding window (kv.window) is honoured as Quest's
// kernels do: the candidates are the complete pages from the window's first one on.
void require_sparq_supported(int head_dim, int page_size);

// The sketch of tokens [t0, t1) of every KV head from kv.k (after a prefill chunk's rope_append_kv). Host-side range:
// not for graph capture (the decode step writes its token inside sparq_page_scores).
void sparq_sketch_write(const KeySketchView& sk, const KvLayerView& kv, int t0, int t1, cudaStream_t stream);

// Step 1. With len = *d_pos + 1 and P = ceil(len / S): writes the sketch of token len - 1 (every step, dense ones
// too); when P > page_budget, lse[h][p] (row stride kv.max_pages) = scale * the best approximate logit of complete
// page p < P - 1 for every query head h, and lse[h][P - 1] = -inf (the last page takes no share); for a group above
// one head also the scoring blocks' partials after them (sparq_workspace_floats counts them); nothing beyond. q:
// [num_heads][head_dim] fp16 post-RoPE; the launch waits (pdl_wait) before it reads q, the token's key or writes
// anything. lse: 8-byte aligned.
// rope (optional): the token's RoPE + KV append folded into this launch, as quest_page_scores folds it
// (kernels/select/quest.cuh, QuestRopeAppend): q is rotated by each block from rope->qkv (pass rope->q_out as q), the
// grid writes q_out, the token's k and v and the current page's bounds with rope_append_kv's bits, and the token's
// sketch is made from the same rotation.
void sparq_page_lse(float* lse, const KeySketchView& sk, const __half* q, const KvLayerView& kv, const int* d_pos,
                    int num_heads, int page_budget, float scale, cudaStream_t stream,
                    const QuestRopeAppend* rope = nullptr);

// Step 2, for a group of 2-64 heads and kv-sum or kv-max: from step 1's workspace lse (values and partials), when
// P > page_budget, scores[r][p] (row stride max_pages) for KV head r and complete page p < P - 1 of the window:
// each head's share exp(v - M_h) / Z_h (M_h the largest value of the head's complete pages, Z_h the sum of exp(v -
// M_h) over them, combined from the scoring blocks' partials in a fixed order), aggregated over the group in head
// order; nothing else.
void sparq_row_shares(float* scores, const float* lse, const int* d_pos, int num_heads, int num_kv_heads,
                      int max_pages, int page_size, int page_budget, GqaPolicy policy, cudaStream_t stream,
                      int window = 0);

// Steps 1-3 and the attention: one Quest layer of a decode step with the sparq selector, reading K = page_budget
// pages, or with a matched budget (match.on(): sparq::budget of this shape, the settings' match_bytes) as many as fit
// in fp16 Quest's bytes (codes::step_pages). ws sized by quest_workspace_sizes with the same match; lse:
// sparq_workspace_floats(num_heads, kv.max_pages) floats (the page values [num_heads][kv.max_pages], then the
// partials).
size_t sparq_workspace_floats(int num_heads, int max_pages);
// The scores sparq_decode's top-k ranks, [rows][kv.max_pages]: lse itself when every row is one head (per-head, or a
// group of one), else the aggregated shares in ws.scores.
const float* sparq_row_scores(const float* lse, const QuestWorkspace& ws, int num_heads, int num_kv_heads,
                              GqaPolicy policy);
void sparq_decode(__half* out, const KeySketchView& sk, float* lse, const __half* q, const KvLayerView& kv,
                  const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, float scale,
                  const MatchedBudget& match, const QuestWorkspace& ws, cudaStream_t stream,
                  const QuestRopeAppend* rope = nullptr);

}  // namespace quest
