#pragma once
// RoPE on the fresh q and k of T tokens, fused with the append of k and v to the paged KV cache and (one token)
// the O(1) update of the last page's metadata. CPU references: rope_ref (kernels/common/basic_ops.h),
// page_metadata_update_ref (kernels/select/quest.h).
#include "kernels/common/cuda_common.cuh"

namespace quest {

// Rotary parameters for the device. inv_freq is precomputed once on the host (model/core/rope.h) except for the dynamic
// type, whose frequencies depend on the sequence length and are computed in the kernel from (theta, factor,
// max_position_embeddings) exactly as model/core/rope.cpp does.
struct RopeDeviceParams {
    const float* inv_freq = nullptr;  // [head_dim / 2] (unused when dynamic)
    float attention_scaling = 1.0f;   // multiplies cos and sin (yarn)
    bool dynamic = false;
    double theta = 10000.0;
    double factor = 1.0;
    int max_position_embeddings = 0;
    // Dynamic only: the length the frequencies are computed for. 0 means "*d_pos + T" (this launch's last position
    // + 1); a chunked prefill passes the whole prompt's end so that every chunk rotates like one forward pass.
    int dynamic_len = 0;
};

// One layer's KV cache and page metadata on the device. Layout (also CPU, model/cpu/kv_cache.h):
//   k, v:        [num_kv_heads][capacity][head_dim]  fp16; page p = tokens [p*S, (p+1)*S)
//   kmin, kmax:  [num_kv_heads][max_pages][head_dim] fp16; per-channel min and max of the page's post-RoPE keys
// fp16 metadata is exact: the keys themselves are stored in fp16, so their min and max are fp16 values.
struct KvLayerView {
    __half* k = nullptr;
    __half* v = nullptr;
    __half* kmin = nullptr;
    __half* kmax = nullptr;
    int num_kv_heads = 0;
    int head_dim = 0;
    int capacity = 0;   // tokens
    int page_size = 0;  // S
    int max_pages = 0;  // capacity / S
    // Sliding window of the layer (ModelConfig::attention_window), 0 for full attention: the token at position p
    // attends keys (p - window, p]. Honoured by attention_prefill, attention_decode and the page selectors'
    // launches (kernels/select/quest.cuh); the fused Quest scoring + top-k refuses it.
    int window = 0;
};

// qkv: [T][num_heads*D | num_kv_heads*D | num_kv_heads*D] fp32 (the fused projection's output).
// Token t has position *d_pos + t: q_out[t] (fp16, [num_heads][D]) gets its rotated query; its rotated key and its
// value go to the cache at that position. When T == 1 the key is folded into its page's metadata; for T > 1 call
// page_metadata_rebuild afterwards. Reads the position from the device so the launch can live in a CUDA graph.
// Triggers its dependent launch (pdl_trigger) right after its own pdl_wait: the next kernel may start early and must
// pdl_wait before reading q, the appended K/V or the current page's metadata.
// Its argument checks on the host (throws std::invalid_argument naming `who`), shared with the Quest launches that
// fold the same work in (kernels/select/quest.cuh, QuestRopeAppend).
void require_rope_append(const char* who, const __half* q_out, const KvLayerView& kv, const float* qkv, int T,
                         int num_heads, const RopeDeviceParams& rope);
void rope_append_kv(__half* q_out, const KvLayerView& kv, const float* qkv, const int* d_pos, int T, int num_heads,
                    const RopeDeviceParams& rope, cudaStream_t stream);

// Recomputes kmin/kmax of pages [first_page, last_page] from the keys of tokens < len (after a prefill chunk).
void page_metadata_rebuild(const KvLayerView& kv, int first_page, int last_page, int len, cudaStream_t stream);

}  // namespace quest
