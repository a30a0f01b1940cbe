#include "model/cuda/llama_cuda.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "kernels/attention/attention_prefill.cuh"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/quant.h"
#include "kernels/select/page_codes.cuh"
#include "kernels/select/quest.cuh"
#include "kernels/select/registry.h"
#include "kernels/select/registry_cuda.h"
#include "model/core/step_bytes.h"
#include "kernels/common/error.h"
#include "model/io/quantize.h"
#include "model/core/rope.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"

#include "model/cuda/layout.h"

namespace quest {

using namespace cuda_layout;

std::string MemoryPlan::describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "weights %.2f GiB + KV cache %.2f GiB + page metadata %.2f GiB + workspace %.2f GiB = %.2f GiB",
                  gib(weights), gib(kv_cache), gib(metadata), gib(workspace), gib(total()));
    return buf;
}

LinearGroups uniform_linear_groups(const ModelConfig& c, int int4_group) {
    LinearGroups g(c.num_layers, {0, 0, 0, 0});
    if (int4_group <= 0) return g;
    const auto shapes = linear_shapes(c);
    for (auto& layer : g)
        for (int k = 0; k < 4; ++k)
            if (int4_quantizable(static_cast<int>(shapes[k][1]), int4_group)) layer[k] = int4_group;
    return g;
}

MemoryPlan plan_memory(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                       const LinearGroups* groups) {
    MemoryPlan p;
    const size_t L = c.num_layers, kv = c.kv_dim(), D = c.head_dim;
    const size_t pages = (capacity + q.page_size - 1) / q.page_size;
    const size_t tokens = pages * q.page_size;
    const LinearGroups uniform = groups ? LinearGroups{} : uniform_linear_groups(c, o.int4_group);
    const LinearGroups& g = groups ? *groups : uniform;
    p.weights = weight_bytes(c, g);
    p.kv_cache = L * 2 * kv * 2 * tokens;
    p.metadata = L * 2 * c.num_kv_heads * pages * D * 2;
    if (uses_page_codes(q))
        p.metadata += static_cast<size_t>(quest_layer_count(c, q)) *
                      (page_codes_bytes(q.metadata, c.num_kv_heads, c.head_dim, static_cast<int>(pages)) +
                       page_code_scales_bytes(c.num_kv_heads, static_cast<int>(pages)));
    const size_t C = std::max(1, std::min(o.prefill_chunk, capacity));
    const size_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, qd = c.q_dim();
    const size_t act = C * (H * 4 /*x*/ + (qd + 2 * kv) * 4 /*qkv*/ + H * 4 /*proj*/ + 2 * F * 4 /*gu*/ +
                            H * 2 /*xn*/ + qd * 2 /*q*/ + qd * 2 /*att*/ + F * 2 /*act*/ + 4 /*tokens*/);
    const int split_tokens = o.split_tokens > 0 ? o.split_tokens : default_split_tokens(static_cast<int>(tokens));
    const size_t splits = decode_max_splits(static_cast<int>(tokens), split_tokens);
    const size_t split_ws = split_workspace_floats(c.num_heads, c.head_dim, static_cast<int>(splits)) * 4;
    const size_t quest_ws = q.full_attention ? 0
                                             : quest_workspace_sizes(c.num_heads, c.num_kv_heads, c.head_dim,
                                                                     q.page_size, static_cast<int>(pages),
                                                                     q.page_budget(), q.gqa_policy, 0,
                                                                     settings_match(c, q))
                                                   .bytes();
    const size_t oracle_ws = selector_workspace_floats(c, q, static_cast<int>(pages)) * 4;
    p.workspace = act + split_ws + quest_ws + oracle_ws + V * 4 + largest_int4(c, g) * 2 /* prefill dequantization */ +
                  (64 << 20) /* cuBLAS and slack */;
    return p;
}

void CudaLlama::allocate() {
    const size_t H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size, qd = c_.q_dim(), kv = c_.kv_dim();
    const size_t L = c_.num_layers, D = c_.head_dim;
    // Weights: one arena, carved in file order.
    weight_arena_ = DeviceBuffer<char>(weight_bytes(c_, groups_));
    char* p = weight_arena_.get();
    auto take = [&](size_t bytes) {
        char* r = p;
        p += align_up(bytes);
        return r;
    };
    // A linear matrix: FP16, or (group > 0) int4 codes, scales and zero points (the FP16 pointer stays null).
    auto take_linear = [&](__half*& w16, Int4View& w4, size_t rows, size_t cols, int group) {
        if (group <= 0) {
            w16 = reinterpret_cast<__half*>(take(rows * cols * 2));
            return;
        }
        const size_t groups = rows * (cols / group);
        w4.qweight = reinterpret_cast<const uint32_t*>(take(rows * cols / 2));
        w4.scales = reinterpret_cast<const __half*>(take(groups * 2));
        w4.zeros = reinterpret_cast<const uint8_t*>(take(groups));
        w4.rows = static_cast<int>(rows);
        w4.cols = static_cast<int>(cols);
        w4.group = group;
    };
    embed_ = reinterpret_cast<__half*>(take(V * H * 2));
    layers_.resize(L);
    for (size_t i = 0; i < L; ++i) {
        Layer& l = layers_[i];
        take_linear(l.wqkv, l.qkv4, qd + 2 * kv, H, groups_[i][0]);
        take_linear(l.wo, l.o4, H, qd, groups_[i][1]);
        take_linear(l.wgu, l.gu4, 2 * F, H, groups_[i][2]);
        take_linear(l.wdown, l.down4, H, F, groups_[i][3]);
        l.attn_norm = reinterpret_cast<float*>(take(H * 4));
        l.mlp_norm = reinterpret_cast<float*>(take(H * 4));
    }
    if (const size_t n = largest_int4(c_, groups_)) dequant_scratch_ = DeviceBuffer<__half>(n);
    final_norm_ = reinterpret_cast<float*>(take(H * 4));
    lm_head_ = c_.tie_word_embeddings ? embed_ : reinterpret_cast<__half*>(take(V * H * 2));

    // KV cache and metadata. Poisoned (0xFF = NaN) so that a read of an unwritten position cannot go unnoticed.
    const size_t kv_elems = L * c_.num_kv_heads * static_cast<size_t>(capacity_) * D;
    const size_t meta_elems = L * c_.num_kv_heads * static_cast<size_t>(max_pages_) * D;
    k_cache_ = DeviceBuffer<__half>(kv_elems);
    v_cache_ = DeviceBuffer<__half>(kv_elems);
    kmin_ = DeviceBuffer<__half>(meta_elems);
    kmax_ = DeviceBuffer<__half>(meta_elems);
    for (auto* b : {&k_cache_, &v_cache_, &kmin_, &kmax_}) b->fill_bytes(0xFF);
    // Page codes of the Quest layers, written when a page completes (poisoned too: an unwritten scale is NaN).
    if (const int ql = quest_layer_count(c_, quest_); uses_page_codes(quest_) && ql > 0) {
        codes_ = DeviceBuffer<uint8_t>(static_cast<size_t>(ql) *
                                       page_codes_bytes(quest_.metadata, c_.num_kv_heads, c_.head_dim, max_pages_));
        code_scales_ = DeviceBuffer<float>(static_cast<size_t>(ql) * page_code_scales_bytes(c_.num_kv_heads, max_pages_) /
                                           sizeof(float));
        codes_.fill_bytes(0xFF);
        code_scales_.fill_bytes(0xFF);
    }

    // RoPE frequencies, once.
    const RopeFrequencies f = rope_frequencies(c_, 1);
    inv_freq_ = DeviceBuffer<float>(f.inv_freq.size());
    inv_freq_.upload(f.inv_freq);
    rope_.inv_freq = inv_freq_.get();
    rope_.attention_scaling = f.attention_scaling;
    rope_.dynamic = rope_depends_on_length(c_);
    rope_.theta = c_.rope_theta;
    rope_.factor = c_.rope.factor;
    rope_.max_position_embeddings = c_.max_position_embeddings;

    // Activations for one prefill chunk (decode uses the first row).
    const size_t C = std::max(1, std::min(opts_.prefill_chunk, capacity_));
    d_pos_ = DeviceBuffer<int>(1);
    d_tokens_ = DeviceBuffer<int>(C);
    x_ = DeviceBuffer<float>(C * H);
    qkv_ = DeviceBuffer<float>(C * (qd + 2 * kv));
    proj_ = DeviceBuffer<float>(C * H);
    gu_ = DeviceBuffer<float>(C * 2 * F);
    logits_ = DeviceBuffer<float>(V);
    xn_ = DeviceBuffer<__half>(C * H);
    q_ = DeviceBuffer<__half>(C * qd);
    att_ = DeviceBuffer<__half>(C * qd);
    act_ = DeviceBuffer<__half>(C * F);
    if (opts_.split_tokens <= 0) opts_.split_tokens = default_split_tokens(capacity_);
    const int splits = decode_max_splits(capacity_, opts_.split_tokens);
    ws_float_ = DeviceBuffer<float>(split_workspace_floats(c_.num_heads, c_.head_dim, splits));
    split_counters_ = DeviceBuffer<int>(c_.num_kv_heads);
    split_counters_.fill_bytes(0);
    split_ws_.o = ws_float_.get();
    split_ws_.ml = ws_float_.get() + static_cast<size_t>(c_.num_heads) * splits * c_.head_dim;
    split_ws_.counters = split_counters_.get();
    split_ws_.max_splits = splits;
    if (!quest_.full_attention) {
        const QuestWorkspaceSizes qs = quest_workspace_sizes(c_.num_heads, c_.num_kv_heads, c_.head_dim,
                                                             quest_.page_size, max_pages_, quest_.page_budget(),
                                                             quest_.gqa_policy, 0, match_);
        quest_scores_ = DeviceBuffer<float>(qs.scores);
        quest_selected_ = DeviceBuffer<int>(qs.selected);
        quest_partial_ = DeviceBuffer<float>(qs.partial_o + qs.partial_ml);
        quest_counters_ = DeviceBuffer<int>(qs.counters);
        quest_counters_.fill_bytes(0);  // the kernels leave them zero after every launch
        quest_ws_.scores = quest_scores_.get();
        quest_ws_.selected = quest_selected_.get();
        quest_ws_.partial_o = quest_partial_.get();
        quest_ws_.partial_ml = quest_partial_.get() + qs.partial_o;
        quest_ws_.counters = quest_counters_.get();
        if (opts_.record_selections) {
            selection_log_ = DeviceBuffer<int>(qs.selected * c_.num_layers);
            score_log_ = DeviceBuffer<float>(qs.scores * c_.num_layers);
        }
    }
    choose_decode_path();
    if (const size_t n = selector_workspace_floats(c_, quest_, max_pages_)) selector_ws_ = DeviceBuffer<float>(n);
    // The fills and uploads above ran on the legacy stream, which stream_ (non-blocking) does not wait for.
    CUDA_CHECK(cudaDeviceSynchronize());
    reset();
}

}  // namespace quest
