#pragma once
// Shapes and sizes shared by the CUDA backend's parts (model/cuda/*.cpp): the device layout of the weights, which
// Quest buffers the settings need, and the byte arithmetic of the memory plan. Internal to model/cuda.
#include <algorithm>
#include <array>
#include <vector>

#include "kernels/linear/gemv.cuh"
#include "kernels/linear/linear.h"
#include "kernels/select/quest.cuh"
#include "kernels/select/registry.h"
#include "kernels/select/registry_cuda.h"
#include "model/core/step_bytes.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/weights.h"

namespace quest::cuda_layout {

constexpr size_t kAlign = 256;
inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
inline double gib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

// Rows and columns of the fused linear matrices of a decoder layer: qkv, o, gate|up, down (LinearLayout order).
inline std::array<std::array<size_t, 2>, 4> linear_shapes(const ModelConfig& c) {
    const size_t H = c.hidden_size, F = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
    return {{{q + 2 * kv, H}, {H, q}, {2 * F, H}, {H, F}}};
}

// The q|k|v biases of a layer (Qwen2), fp32 in the fused qkv rows' order: q_dim + 2 kv_dim.
inline size_t qkv_bias_floats(const ModelConfig& c) { return static_cast<size_t>(c.q_dim()) + 2 * c.kv_dim(); }

// Uploads layer l's q, k and v biases to dst (qkv_bias_floats of them); get(name, n) returns a bias as fp32.
template <class Get>
void upload_qkv_bias(float* dst, const ModelConfig& c, int l, Get&& get) {
    std::vector<float> all;
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
        const std::vector<float> b =
            get(LlamaTensorNames::layer(l, "self_attn.") + p + ".bias", p[0] == 'q' ? c.q_dim() : c.kv_dim());
        all.insert(all.end(), b.begin(), b.end());
    }
    CUDA_CHECK(cudaMemcpy(dst, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
}

inline size_t linear_bytes(size_t rows, size_t cols, const LinearStorage& s) {
    return linear_format(s.format).device_bytes(static_cast<int64_t>(rows), static_cast<int64_t>(cols), s);
}

// Bytes of the weight arena (carve_weights' order): the embedding, per layer the four linear matrices and two
// norms, the final norm, the lm_head when untied.
inline size_t weight_bytes(const ModelConfig& c, const LinearLayout& g) {
    const size_t H = c.hidden_size, V = c.vocab_size;
    const auto shapes = linear_shapes(c);
    size_t total = 0;
    for (int l = 0; l < c.num_layers; ++l) {
        for (int k = 0; k < 4; ++k) total += linear_bytes(shapes[k][0], shapes[k][1], g[l][k]);
        total += 2 * align_up(H * 4);
        if (c.qkv_bias) total += align_up(qkv_bias_floats(c) * 4);
    }
    return total + align_up(V * H * 2) * (c.tie_word_embeddings ? 1 : 2) + align_up(H * 4);
}

// True when the Quest layers score int8 / int4 page codes (kernels/select/page_codes.cuh) instead of the fp16 metadata.
inline bool uses_page_codes(const QuestSettings& q) {
    return !q.full_attention && q.takes(kUsesMetadataFormat) && q.metadata != MetadataFormat::Fp16;
}

// Floats of the selector's own workspace (CudaSelectorOps::workspace_floats), one layer's, reused by every layer.
inline size_t selector_workspace_floats(const ModelConfig& c, const QuestSettings& q, int max_pages) {
    if (q.full_attention) return 0;
    const CudaSelectorOps* ops = cuda_selector_ops(q.selector);
    return ops && ops->workspace_floats ? ops->workspace_floats(c.num_heads, max_pages) : 0;
}

// True when the Quest layers keep an fp8 key sketch (the sparq selector; kernels/select/sparq.cuh).
inline bool uses_key_sketch(const QuestSettings& q) { return !q.full_attention && q.selector == PageSelector::Sparq; }

// Layers that run Quest selection (and keep page codes when uses_page_codes).
inline int quest_layer_count(const ModelConfig& c, const QuestSettings& q) {
    return q.full_attention ? 0 : std::max(0, c.num_layers - q.dense_layers);
}

// FP16 elements of the prefill GEMMs' scratch: the largest LinearFormatOps::gemm_scratch of the layout (0 when
// every matrix is FP16).
inline size_t gemm_scratch_elements(const ModelConfig& c, const LinearLayout& g) {
    const auto shapes = linear_shapes(c);
    size_t n = 0;
    for (const auto& layer : g)
        for (int k = 0; k < 4; ++k)
            n = std::max(n, linear_format(layer[k].format)
                                .gemm_scratch(static_cast<int64_t>(shapes[k][0]), static_cast<int64_t>(shapes[k][1]),
                                              layer[k]));
    return n;
}

// Device memory cuBLAS and the allocator's rounding may take beyond the listed buffers (the plan's slack).
constexpr size_t kCublasSlack = 64ull << 20;

// Partial sums of x^2 the fused decode step's residual GEMVs may write: the FP16 kernel's row blocks, or at most one
// per two-row tile of an int4 kernel (its persistent grid never exceeds its tiles).
inline size_t norm_partials_bound(const ModelConfig& c) {
    return static_cast<size_t>(std::max(gemv_residual_partials(c.hidden_size), (c.hidden_size + 1) / 2));
}

}  // namespace quest::cuda_layout
