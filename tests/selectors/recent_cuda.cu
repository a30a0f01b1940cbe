// The CUDA definition of the test-only "recent" selector (tests/selectors/recent.h): a kernel writes each row's K
// most recent pages, then the shared sparse attention reads them.
#include "kernels/select/quest.cuh"
#include "tests/selectors/recent_cuda.h"

namespace quest::test {
namespace {

// A sliding window (kv.window): the pages from f, the one holding the window's first token, are the candidates
// (kernels/select/quest.cuh); a dense step lists them all.
__global__ void recent_select_kernel(int* selected, const int* d_pos, int page_size, int page_budget, int window) {
    const int len = *d_pos + 1;
    const int f = window_start_of(len, window) / page_size;
    const int pages = (len + page_size - 1) / page_size;
    const bool dense = pages - f <= page_budget;
    int* row = selected + static_cast<int64_t>(blockIdx.x) * page_budget;
    for (int i = threadIdx.x; i < (dense ? pages - f : page_budget); i += blockDim.x)
        row[i] = dense ? f + i : pages - page_budget + i;
}

void recent_decode_layer(const CudaSelectArgs& a) {
    const int rows = quest_selection_rows(a.num_heads, a.kv.num_kv_heads, a.policy);
    recent_select_kernel<<<rows, 128, 0, a.stream>>>(a.ws.selected, a.d_pos, a.kv.page_size, a.page_budget,
                                                     a.kv.window);
    attention_decode_sparse(a.out, a.q, a.kv, a.d_pos, a.ws.selected, a.num_heads, a.page_budget, a.policy, a.scale,
                            a.ws, a.stream);
}

}  // namespace

PageSelector recent_selector_cuda() {
    const PageSelector id = recent_selector();
    if (!cuda_selector_ops(id)) {
        CudaSelectorOps ops;
        ops.decode_layer = recent_decode_layer;
        register_cuda_selector(id, ops);
    }
    return id;
}

}  // namespace quest::test
