#pragma once
// Causal flash-attention for a prefill chunk, GQA-aware, over the paged FP16 KV cache (the chunk's keys and values
// are already appended). Scores are never materialised, so memory does not grow with the context: a 128K-token
// prompt is prefilled chunk by chunk. CPU reference: attention_full_ref per query (kernels/attention/attention.h).
#include "kernels/common/cuda_common.cuh"
#include "kernels/common/rope.cuh"

namespace quest {

// q: [T][num_heads][head_dim] fp16, query t at absolute position pos0 + t attends keys [0, pos0 + t], or with a
// sliding window (kv.window > 0) keys [max(0, pos0 + t - window + 1), pos0 + t].
// out: [T][num_heads][head_dim] fp16. head_dim in {8, 16, 32, 64, 128, 256}.
void attention_prefill(__half* out, const __half* q, const KvLayerView& kv, int T, int pos0, int num_heads, float scale,
                       cudaStream_t stream);

}  // namespace quest
