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

LinearLayout uniform_linear_layout(const ModelConfig& c, const WeightRequest& request) {
    const auto shapes = linear_shapes(c);
    const LinearStorage stored[] = {LinearStorage::f16()};
    LinearLayout g(c.num_layers);
    for (auto& layer : g)
        for (int k = 0; k < 4; ++k) layer[k] = choose_linear_storage(request, stored, static_cast<int64_t>(shapes[k][0]),
                                          static_cast<int64_t>(shapes[k][1]));
    return g;
}

// Every device buffer of the backend, in one list: the plan sums it, allocate() allocates it, so the two agree by
// construction. f(kind, count, DeviceBuffer<T>* target) is called once per buffer with its element count; target is
// null when planning (self == nullptr). The weights are one arena carved in file order (carve_weights). Not listed:
// the all-logits buffer of a prefill that asks for every token's logits (allocated on demand, [prefill_chunk][vocab]
// fp32) and cuBLAS's own workspace (the plan's slack).
template <class F>
void CudaLlama::for_each_buffer(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                                const LinearLayout& g, CudaLlama* self, F&& f) {
    using K = MemoryPlan::Kind;
    auto* b = self;
    const size_t H = c.hidden_size, F_ = c.intermediate_size, V = c.vocab_size, qd = c.q_dim(), kv = c.kv_dim();
    const size_t L = c.num_layers, D = c.head_dim, NKV = c.num_kv_heads;
    const int max_pages = (capacity + q.page_size - 1) / q.page_size;
    const size_t tokens = static_cast<size_t>(max_pages) * q.page_size;
    f(K::Weights, weight_bytes(c, g), b ? &b->weight_arena_ : nullptr);
    f(K::Workspace, gemm_scratch_elements(c, g), b ? &b->gemm_scratch_ : nullptr);  // the prefill's FP16 expansion
    // KV cache and page metadata.
    for (auto* t : {b ? &b->k_cache_ : nullptr, b ? &b->v_cache_ : nullptr}) f(K::KvCache, L * NKV * tokens * D, t);
    for (auto* t : {b ? &b->kmin_ : nullptr, b ? &b->kmax_ : nullptr}) f(K::Metadata, L * NKV * max_pages * D, t);
    if (const size_t ql = quest_layer_count(c, q); uses_page_codes(q) && ql > 0) {
        f(K::Metadata, ql * page_codes_bytes(q.metadata, c.num_kv_heads, c.head_dim, max_pages), b ? &b->codes_ : nullptr);
        f(K::Metadata, ql * page_code_scales_bytes(c.num_kv_heads, max_pages) / sizeof(float),
          b ? &b->code_scales_ : nullptr);
    }
    if (const size_t ql = quest_layer_count(c, q); uses_key_sketch(q) && ql > 0)
        f(K::Metadata, ql * key_sketch_bytes(c.num_kv_heads, c.head_dim, static_cast<int>(tokens)), b ? &b->sketch_ : nullptr);
    // Activations for one prefill chunk (decode uses the first row).
    const size_t C = std::max(1, std::min(o.prefill_chunk, static_cast<int>(tokens)));
    f(K::Workspace, D / 2, b ? &b->inv_freq_ : nullptr);
    f(K::Workspace, 1, b ? &b->d_pos_ : nullptr);
    f(K::Workspace, C, b ? &b->d_tokens_ : nullptr);
    f(K::Workspace, C * H, b ? &b->x_ : nullptr);
    f(K::Workspace, C * (qd + 2 * kv), b ? &b->qkv_ : nullptr);
    f(K::Workspace, C * H, b ? &b->proj_ : nullptr);
    f(K::Workspace, C * 2 * F_, b ? &b->gu_ : nullptr);
    f(K::Workspace, V, b ? &b->logits_ : nullptr);
    f(K::Workspace, C * H, b ? &b->xn_ : nullptr);
    f(K::Workspace, C * qd, b ? &b->q_ : nullptr);
    f(K::Workspace, C * qd, b ? &b->att_ : nullptr);
    f(K::Workspace, C * F_, b ? &b->act_ : nullptr);
    // The fused decode step's partial sums of x^2: at most one per row pair of the widest residual GEMV
    // (choose_decode_path checks the kernels' actual count against it).
    f(K::Workspace, norm_partials_bound(c), b ? &b->norm_partials_ : nullptr);
    // Decode attention: split-K partials of the dense layers, Quest's workspace, the selector's own scratch.
    const int split_tokens = o.split_tokens > 0 ? o.split_tokens : default_split_tokens(static_cast<int>(tokens));
    const int splits = decode_max_splits(static_cast<int>(tokens), split_tokens);
    f(K::Workspace, split_workspace_floats(c.num_heads, c.head_dim, splits), b ? &b->ws_float_ : nullptr);
    f(K::Workspace, NKV, b ? &b->split_counters_ : nullptr);
    if (!q.full_attention) {
        const QuestWorkspaceSizes qs = quest_workspace_sizes(c.num_heads, c.num_kv_heads, c.head_dim, q.page_size,
                                                             max_pages, q.page_budget(), q.gqa_policy, 0,
                                                             settings_match(c, q));
        f(K::Workspace, qs.scores, b ? &b->quest_scores_ : nullptr);
        f(K::Workspace, qs.selected, b ? &b->quest_selected_ : nullptr);
        f(K::Workspace, qs.partial_o + qs.partial_ml, b ? &b->quest_partial_ : nullptr);
        f(K::Workspace, qs.counters, b ? &b->quest_counters_ : nullptr);
        if (o.record_selections) {
            f(K::Workspace, qs.selected * L, b ? &b->selection_log_ : nullptr);
            f(K::Workspace, qs.scores * L, b ? &b->score_log_ : nullptr);
        }
        f(K::Workspace, selector_workspace_floats(c, q, max_pages), b ? &b->selector_ws_ : nullptr);
    }
}

MemoryPlan plan_memory(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                       const LinearLayout* layout) {
    const LinearLayout uniform = layout ? LinearLayout{} : uniform_linear_layout(c, o.weights);
    MemoryPlan p;
    CudaLlama::for_each_buffer(c, q, capacity, o, layout ? *layout : uniform, nullptr,
                               [&](MemoryPlan::Kind k, size_t count, auto* target) {
                                   using T = typename std::remove_pointer_t<decltype(target)>::value_type;
                                   p.add(k, count * sizeof(T));
                               });
    p.workspace += kCublasSlack;
    return p;
}

size_t CudaLlama::buffer_bytes() const {
    size_t total = 0;
    for_each_buffer(c_, quest_, capacity_, opts_, layout_, const_cast<CudaLlama*>(this),
                    [&](MemoryPlan::Kind, size_t, auto* target) { total += target->bytes(); });
    return total + chunk_logits_.bytes();
}

void CudaLlama::allocate() {
    for_each_buffer(c_, quest_, capacity_, opts_, layout_, this, [](MemoryPlan::Kind, size_t count, auto* target) {
        using T = typename std::remove_pointer_t<decltype(target)>::value_type;
        if (count) *target = DeviceBuffer<T>(count);
    });
    carve_weights();
    // Poisoned (0xFF = NaN) so that a read of an unwritten position or an unwritten page-code scale cannot go
    // unnoticed; the counters are zeroed once (every launch leaves them zero).
    for (auto* b : {&k_cache_, &v_cache_, &kmin_, &kmax_}) b->fill_bytes(0xFF);
    codes_.fill_bytes(0xFF);
    sketch_.fill_bytes(0xFF);  // e4m3 NaN
    code_scales_.fill_bytes(0xFF);
    split_counters_.fill_bytes(0);
    quest_counters_.fill_bytes(0);

    // RoPE frequencies, once.
    const RopeFrequencies f = rope_frequencies(c_, 1);
    inv_freq_.upload(f.inv_freq);
    rope_.inv_freq = inv_freq_.get();
    rope_.attention_scaling = f.attention_scaling;
    rope_.dynamic = rope_depends_on_length(c_);
    rope_.theta = c_.rope_theta;
    rope_.factor = c_.rope.factor;
    rope_.max_position_embeddings = c_.max_position_embeddings;

    if (opts_.split_tokens <= 0) opts_.split_tokens = default_split_tokens(capacity_);
    const int splits = decode_max_splits(capacity_, opts_.split_tokens);
    split_ws_.o = ws_float_.get();
    split_ws_.ml = ws_float_.get() + static_cast<size_t>(c_.num_heads) * splits * c_.head_dim;
    split_ws_.counters = split_counters_.get();
    split_ws_.max_splits = splits;
    if (!quest_.full_attention) {
        const QuestWorkspaceSizes qs = quest_workspace_sizes(c_.num_heads, c_.num_kv_heads, c_.head_dim,
                                                             quest_.page_size, max_pages_, quest_.page_budget(),
                                                             quest_.gqa_policy, 0, match_);
        quest_ws_.scores = quest_scores_.get();
        quest_ws_.selected = quest_selected_.get();
        quest_ws_.partial_o = quest_partial_.get();
        quest_ws_.partial_ml = quest_partial_.get() + qs.partial_o;
        quest_ws_.counters = quest_counters_.get();
    }
    choose_decode_path();
    // The fills and uploads above ran on the legacy stream, which stream_ (non-blocking) does not wait for.
    CUDA_CHECK(cudaDeviceSynchronize());
    reset();
}

// The weight arena carved in file order: each linear matrix takes its format's device bytes.
void CudaLlama::carve_weights() {
    const size_t H = c_.hidden_size, V = c_.vocab_size;
    const auto shapes = linear_shapes(c_);
    char* p = weight_arena_.get();
    auto take = [&](size_t bytes) {
        char* r = p;
        p += align_up(bytes);
        return r;
    };
    auto take_linear = [&](LinearWeight& w, int k, const LinearStorage& s) {
        w.storage = s;
        w.rows = static_cast<int>(shapes[k][0]);
        w.cols = static_cast<int>(shapes[k][1]);
        w.data = take(linear_bytes(shapes[k][0], shapes[k][1], s));
    };
    embed_ = reinterpret_cast<__half*>(take(V * H * 2));
    layers_.resize(c_.num_layers);
    for (size_t i = 0; i < layers_.size(); ++i) {
        Layer& l = layers_[i];
        take_linear(l.qkv, 0, layout_[i][0]);
        take_linear(l.o, 1, layout_[i][1]);
        take_linear(l.gu, 2, layout_[i][2]);
        take_linear(l.down, 3, layout_[i][3]);
        l.attn_norm = reinterpret_cast<float*>(take(H * 4));
        l.mlp_norm = reinterpret_cast<float*>(take(H * 4));
        if (c_.qkv_bias) l.bqkv = reinterpret_cast<float*>(take(qkv_bias_floats(c_) * 4));
    }
    final_norm_ = reinterpret_cast<float*>(take(H * 4));
    lm_head_.storage = LinearStorage::f16();
    lm_head_.rows = c_.vocab_size;
    lm_head_.cols = c_.hidden_size;
    lm_head_.data = c_.tie_word_embeddings ? reinterpret_cast<char*>(embed_) : take(V * H * 2);
    QUEST_REQUIRE(p <= weight_arena_.get() + weight_arena_.size(), "carve_weights: the arena is smaller than its layout");
}

}  // namespace quest
