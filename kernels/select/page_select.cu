#include "kernels/select/page_select.cuh"

#include "kernels/select/quest.h"

namespace quest {
namespace {

__global__ void streaming_select_kernel(int* __restrict__ selected, const int* __restrict__ d_pos, int page_size,
                                        int page_budget, int window) {
    pdl_wait();  // *d_pos is written by the host-side step setup or an earlier kernel
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int len = *d_pos + 1;
    // A sliding window: the pages from f (holding the window's first token) on, renumbered from 0.
    const int f = window_start_of(len, window) / page_size;
    const int pages = (len + page_size - 1) / page_size - f;
    int* row = selected + static_cast<int64_t>(blockIdx.x) * page_budget;
    const bool dense = pages <= page_budget;
    const int count = dense ? pages : page_budget;
    // Entry i: dense -> i; else (K >= 2) page 0 at i = 0, then pages P-K+1 .. P-1 at i = 1 .. K-1; K = 1: P-1.
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        int page;
        if (dense) page = i;
        else if (page_budget >= 2) page = i == 0 ? 0 : pages - page_budget + i;
        else page = pages - 1;
        row[i] = f + page;
    }
}

}  // namespace

void streaming_select(int* selected, const int* d_pos, int rows, int page_size, int page_budget, cudaStream_t stream,
                      int window) {
    QUEST_REQUIRE(selected && d_pos, "null pointer");
    QUEST_REQUIRE(rows >= 1 && page_size >= 1 && page_budget >= 1, "rows, page_size and page_budget must be >= 1");
    QUEST_REQUIRE(window >= 0, "window must be >= 0");
    launch_pdl(streaming_select_kernel, dim3(rows), dim3(128), 0, stream, selected, d_pos, page_size, page_budget,
               window);
}

}  // namespace quest
