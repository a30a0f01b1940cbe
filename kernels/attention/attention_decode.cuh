#pragma once
// Decode attention (one new token) over the paged FP16 KV cache, split across the context (flash-decoding): each
// block handles one KV head and one span of `split_tokens` tokens for ALL the query heads of its group, so every
// K/V byte is read once per KV head; a merge kernel combines the spans' partial softmax results.
// CPU reference: attention_full_ref (kernels/attention/attention.h).
#include "kernels/common/cuda_common.cuh"
#include "kernels/common/rope.cuh"

namespace quest {

struct SplitWorkspace {
    float* o = nullptr;       // [num_heads][max_splits][head_dim] partial outputs (normalised within the span)
    float* ml = nullptr;      // [num_heads][max_splits][2] max (log2 units) and sum of exp2 of each span
    int* counters = nullptr;  // [num_kv_heads] spans finished; zeroed once after allocation, left zero by every launch
    int max_splits = 0;
};
// Floats needed by a workspace's o and ml for `max_splits` spans (counters: num_kv_heads ints more).
size_t split_workspace_floats(int num_heads, int head_dim, int max_splits);
// The longest span for a cache of `capacity` tokens (it sizes the kernel's shared memory): capacity / 64, a power of
// two in [32, 1024].
int default_split_tokens(int capacity);

// Spans the workspace should hold for a cache of `capacity` tokens and spans of at most split_tokens tokens: twice
// the fewest that cover the cache, so that the kernel can raise the span count to whole waves of the GPU (below).
int decode_max_splits(int capacity, int split_tokens);

// q: [num_heads][head_dim] fp16 (rotated). The sequence holds len = *d_pos + 1 tokens (the current one included,
// already appended); the query attends the last kv.window of them when kv.window > 0 (spans cut over those). out: [num_heads][head_dim] fp16. The kernel reads len on the device and cuts it into equal spans
// of at most split_tokens tokens, as many as make whole waves of the resident grid (a length just past a wave
// boundary would otherwise run a nearly empty last wave: measured on the H200 as an 18% step-time jump for 6% more
// bytes at 37K tokens of a 128K cache), at least 64 tokens each, at most ws.max_splits (>= ceil(capacity /
// split_tokens); decode_max_splits gives room to balance). The grid is (num_kv_heads, ws.max_splits) at every length
// and spans beyond len do no work: the launch can be captured in a CUDA graph. One launch: the last span of each KV
// head to finish (an atomic ticket) merges the group's partial results. Launched with programmatic dependent launch,
// it reads the position and the K rows of every token but the newest BEFORE waiting for the kernel before it: those
// must not be written by that kernel (in the decode step it is rope_append, which appends only the newest row and
// triggers its dependents only after its own wait, so every earlier kernel is complete).
void attention_decode(__half* out, const __half* q, const KvLayerView& kv, const int* d_pos, int num_heads, float scale,
                      int split_tokens, const SplitWorkspace& ws, cudaStream_t stream);

}  // namespace quest
