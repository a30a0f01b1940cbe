#pragma once
// Decode attention (one new token) over the paged FP16 KV cache, split across the context (flash-decoding): each
// block handles one KV head and one span of `split_tokens` tokens for ALL the query heads of its group, so every
// K/V byte is read once per KV head; a merge kernel combines the spans' partial softmax results.
// CPU reference: attention_full_ref (kernels/attention.h).
#include "kernels/cuda_common.cuh"
#include "kernels/rope.cuh"

namespace quest {

struct SplitWorkspace {
    float* o = nullptr;       // [num_heads][max_splits][head_dim] partial outputs (normalised within the span)
    float* ml = nullptr;      // [num_heads][max_splits][2] max (log2 units) and sum of exp2 of each span
    int* counters = nullptr;  // [num_kv_heads] spans finished; zeroed once after allocation, left zero by every launch
    int max_splits = 0;
};
// Floats needed by a workspace's o and ml for `max_splits` spans (counters: num_kv_heads ints more).
size_t split_workspace_floats(int num_heads, int head_dim, int max_splits);
// Tokens per span for a cache of `capacity` tokens: about 64 spans per KV head (enough blocks to fill the GPU at
// every length), a power of two in [32, 1024].
int default_split_tokens(int capacity);

// q: [num_heads][head_dim] fp16 (rotated). The sequence holds len = *d_pos + 1 tokens (the current one included,
// already appended). out: [num_heads][head_dim] fp16. Spans beyond len do no work, so one launch configuration
// (max_splits = ceil(capacity / split_tokens)) serves every length: the launch can be captured in a CUDA graph.
// One launch: the last span of each KV head to finish (an atomic ticket) merges the group's partial results.
void attention_decode(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads, float scale,
                      int split_tokens, const SplitWorkspace& ws, cudaStream_t stream);

}  // namespace quest
