#pragma once
// The CUDA half of the page-selector seam (kernels/select/registry.h): how the CUDA backend runs a selector in one
// decode layer. A selector without CudaSelectorOps is not run by the CUDA backend (cuda_selector_ops returns null
// and the backend refuses the settings); it is never replaced by another selector.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/select/page_codes.cuh"
#include "kernels/select/quest.cuh"
#include "kernels/select/sparq.cuh"

namespace quest {

// One Quest layer of one decode step, as the CUDA backend hands it to a selector. Device pointers; the position
// lives on the device (d_pos) so that the launches can be captured in a CUDA graph.
struct CudaSelectArgs {
    __half* out = nullptr;          // [num_heads][head_dim] attention output
    const __half* q = nullptr;      // [num_heads][head_dim] post-RoPE query (written by rope, or by the selector
                                    // itself when it folds the RoPE append: rope below)
    KvLayerView kv;                 // the layer's KV cache and fp16 page bounds
    const int* d_pos = nullptr;     // [1] position of the current token
    int num_heads = 0;
    int page_budget = 0;            // K
    GqaPolicy policy = GqaPolicy::KvSum;
    float scale = 0.0f;             // softmax scale, 1/sqrt(head_dim)
    QuestWorkspace ws;              // selected pages, scores and the top-k's scratch
    const PageCodesView* codes = nullptr;  // int8 / int4 page bounds (metadata format), else null
    const KeySketchView* sketch = nullptr;  // sparq: the layer's fp8 key sketch, else null
    MatchedBudget match;            // bytes-matched budget (match_bytes), else off
    bool fused = false;             // score and select in one launch (--quest-fused)
    float* workspace = nullptr;     // [workspace_floats(num_heads, max_pages)]: the selector's own scratch
    const QuestRopeAppend* rope = nullptr;  // when folds_rope_append: the RoPE + KV append to run in the launches
    cudaStream_t stream = nullptr;
};

struct CudaSelectorOps {
    // Selection and sparse attention of one layer (graph-capturable: no host synchronisation, no allocation). A
    // sliding window (a.kv.window > 0) is honoured as select_blocks_ref honours it on the CPU: candidates from the
    // page holding window_start_of(len, window) on (kernels/select/quest.cuh); attention_decode_sparse masks the rest.
    void (*decode_layer)(const CudaSelectArgs& a) = nullptr;
    // True when decode_layer runs the token's RoPE + KV append itself (given a.rope); else the backend launches
    // rope_append_kv first. Null: never.
    bool (*folds_rope_append)(const CudaSelectArgs& a) = nullptr;
    // Floats of the selector's own scratch (CudaSelectArgs::workspace), planned with the backend's memory. Null: none.
    size_t (*workspace_floats)(int num_heads, int max_pages) = nullptr;
    // Where decode_layer leaves the page scores its top-k ranked, [rows][kv.max_pages] (a.ws.scores, or a buffer of
    // its own; CudaOptions::record_selections copies them). Null: it ranks no scores.
    const float* (*row_scores)(const CudaSelectArgs& a) = nullptr;
};

// The CUDA definition of a registered selector; null when the CUDA backend does not run it.
const CudaSelectorOps* cuda_selector_ops(PageSelector id);
// Adds the CUDA definition of a selector registered with register_page_selector (tests). std::invalid_argument
// for an unregistered id or one that has CUDA ops already.
void register_cuda_selector(PageSelector id, const CudaSelectorOps& ops);

}  // namespace quest
