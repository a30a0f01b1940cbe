// GPU top-k page selection (quest_top_k, kernels/select/quest.cuh): one block per selection row.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/select/quest.cuh"
#include "kernels/select/topk_select.cuh"

namespace quest {

namespace {

// One block per selection row. KPT > 0: the row's score_stride <= kTopkThreads * KPT, every candidate in registers
// (topk_select_row_reg); KPT = 0: any stride (topk_select_row, keys cached in dynamic shared memory when `cache`,
// else re-read from L2).
template <int KPT>
__global__ void __launch_bounds__(kTopkThreads) top_k_kernel(int* __restrict__ selected,
                                                             const float* __restrict__ scores, int score_stride,
                                                             const int* __restrict__ d_pos, int page_size_log2,
                                                             int page_budget, int cache, int select_stride,
                                                             MatchedBudget match, int window) {
    constexpr int PRE = KPT > 0 ? KPT : kTopkUnroll;
    pdl_wait();
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int tid = threadIdx.x;
    int* out = selected + static_cast<size_t>(blockIdx.x) * select_stride;
    const float* in = scores + static_cast<size_t>(blockIdx.x) * score_stride;
    // The first round of scores is loaded together with the position (one dependent round trip less): entries
    // u * kTopkThreads + tid < score_stride of the row (those past this step's candidates are never used).
    float pre[PRE];
#pragma unroll
    for (int u = 0; u < PRE; ++u) {
        const int i = u * kTopkThreads + tid;
        pre[u] = i < score_stride ? ld_score(in + i) : 0.0f;
    }
    const int len = *d_pos + 1;
    top_k_row<KPT>(out, in, pre, len, window_start_of(len, window) >> page_size_log2, score_stride, page_size_log2,
                   page_budget, cache, select_stride, match);
}

}  // namespace

void quest_top_k(int* selected, const float* scores, int score_stride, const int* d_pos, int rows, int page_size,
                 int page_budget, cudaStream_t stream, const MatchedBudget& match, int select_stride, int window) {
    QUEST_REQUIRE(selected && scores && d_pos, "null pointer");
    QUEST_REQUIRE(rows >= 1 && score_stride >= 1 && page_budget >= 1, "rows, score_stride, page_budget >= 1");
    if (select_stride == 0) select_stride = page_budget;
    QUEST_REQUIRE(select_stride >= page_budget, "select_stride must be >= page_budget");
    QUEST_REQUIRE(!match.on() || (match.head_dim >= 1 && match.rows >= 1 && match.meta_bytes <= 4 * match.head_dim),
                  "matched budget: head_dim and rows >= 1, metadata no larger than fp16's");
    QUEST_REQUIRE(page_size >= 1 && page_size <= 256 && (page_size & (page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(window >= 0, "window must be >= 0");
    auto go = [&](auto kernel, int smem, bool cache) {
        launch_pdl(kernel, dim3(rows), dim3(kTopkThreads), static_cast<size_t>(smem), stream, selected, scores,
                   score_stride, d_pos, log2_exact(page_size), page_budget, static_cast<int>(cache), select_stride,
                   match, window);
    };
    if (score_stride <= kTopkThreads * 4) return go(top_k_kernel<4>, 0, false);
    if (score_stride <= kTopkThreads * 8) return go(top_k_kernel<8>, 0, false);
    if (score_stride <= kTopkThreads * kTopkRegMaxKpt) return go(top_k_kernel<kTopkRegMaxKpt>, 0, false);
    const bool cache = score_stride <= kTopkCacheMax;
    const int smem = cache ? score_stride * static_cast<int>(sizeof(uint32_t)) : 0;
    if (smem > 32 * 1024)  // opt in beyond the default 48 KB (static + dynamic); not a stream operation
        CUDA_CHECK(cudaFuncSetAttribute(top_k_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    go(top_k_kernel<0>, smem, cache);
}

}  // namespace quest
