#pragma once
// Query-independent page selection on the GPU: the `streaming` selector (PageSelector::Streaming; StreamingLLM-like
// baseline: the first page, then the most recent pages). It writes the same `selected` rows as quest_top_k, so
// attention_decode_sparse (kernels/select/quest.cuh) runs on them unchanged. CPU reference: quest_select_ref with
// selector = Streaming (kernels/select/quest.h).
#include "kernels/common/cuda_common.cuh"

namespace quest {

// For each of `rows` selection rows (row stride page_budget), with len = *d_pos + 1 tokens and P = ceil(len / S)
// pages: if P <= K (= page_budget), selected[r][i] = i for i < P (dense step); otherwise, for K >= 2,
// selected[r] = {0, P-K+1, ..., P-1} (the first page, the K-2 most recent complete pages, the last page) and for K = 1,
// {P-1}. Ascending, ending with P - 1: the contract of quest_top_k. Only the first min(P, K) entries of a row are
// written. Graph-capturable: the launch depends on rows and K only. Programmatic launch: nothing read before the
// wait except the arguments. window: the layer's sliding window (0: none): the rule above over the pages from
// f = window_start_of(len, window) / S on (page f in the role of page 0), as select_blocks_ref renumbers them.
void streaming_select(int* selected, const int* d_pos, int rows, int page_size, int page_budget, cudaStream_t stream,
                      int window = 0);

}  // namespace quest
