#include "model/cpu/llama_cpu.h"

#include <chrono>
#include <cmath>
#include <numeric>

#include "kernels/attention/attention.h"
#include "kernels/common/basic_ops.h"
#include "kernels/common/parallel.h"
#include "kernels/select/quest.h"
#include "kernels/select/registry.h"
#include "kernels/select/sparq_rule.h"
#include "model/core/step_bytes.h"
#include "kernels/common/error.h"
#include "model/core/memory.h"
#include "model/io/safetensors.h"
#include "model/core/rope.h"

namespace quest {

CpuLlama::CpuLlama(std::shared_ptr<const LlamaWeightsF32> weights, const QuestSettings& quest, int capacity)
    : w_(std::move(weights)),
      quest_(quest),
      cache_(KvCacheShape{w_->config.num_layers, w_->config.num_kv_heads, w_->config.head_dim, quest.page_size,
                          capacity, quest.cache_sub_page()}) {
    quest_.validate();
    if (!quest_.full_attention && quest_.selector == PageSelector::Sparq &&
        !sparq::supported(w_->config.head_dim, quest_.page_size))
        throw InputError("selector 'sparq': needs head_dim a multiple of 8 and at least half the page size (head_dim " +
                         std::to_string(w_->config.head_dim) + ", page size " + std::to_string(quest_.page_size) +
                         "): a smaller --page-size, or --selector quest");
    logits_.resize(w_->config.vocab_size);
}

std::span<const float> CpuLlama::prefill(std::span<const int> tokens, std::vector<float>* all_logits) {
    if (tokens.empty()) throw InputError("prefill: no tokens (an empty prompt still holds BOS)");
    forward(tokens, /*quest_step=*/false, all_logits);
    return logits_;
}

bool CpuLlama::set_selection_diagnostics(bool on) {
    diagnostics_ = on;
    const ModelConfig& c = w_->config;
    diag_ = SelectionDiagnostics{};
    diag_.selected_mass.assign(c.num_layers, std::vector<double>(c.num_heads, 0.0));
    diag_.oracle_mass = diag_.selected_mass;
    diag_.steps.assign(c.num_layers, 0);
    return true;
}

bool CpuLlama::copy_cache_from(const Backend& b) {
    const auto* o = dynamic_cast<const CpuLlama*>(&b);  // the same kind of backend, or nothing to copy
    if (!o) return false;
    const CpuLlama& other = *o;
    if (other.pos_ > capacity()) throw ResourceError("copy_cache_from: the other cache holds more tokens than this one");
    cache_.copy_tokens_from(other.cache_, other.pos_);
    pos_ = other.pos_;
    reuse_.clear();
    return true;
}

size_t CpuLlama::decode_bytes() const {
    const ModelConfig& c = w_->config;
    const size_t params = static_cast<size_t>(c.vocab_size) * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) +
                          static_cast<size_t>(c.num_layers) *
                              (static_cast<size_t>(c.hidden_size) * (2 * c.q_dim() + 2 * c.kv_dim()) +
                               3ull * c.hidden_size * c.intermediate_size);
    double attention = reads_.bytes_per_step();
    if (reads_.steps == 0 && (quest_.full_attention || page_selector_def(quest_.selector).step_reads))
        attention = quest_step_bytes_model(c, quest_, pos_).first;
    return params * 4 + static_cast<size_t>(attention);
}

size_t CpuLlama::host_memory_bytes() const { return plan_cpu_memory(w_->config, quest_, capacity()).total(); }

bool CpuLlama::may_reuse(int l, const float* q, int pages) const {
    if (quest_.reuse_cos == 0 || l >= static_cast<int>(reuse_.size())) return false;
    const ReuseAnchor& a = reuse_[l];
    if (a.pages != pages || a.q.empty()) return false;
    const int D = w_->config.head_dim;
    for (int h = 0; h < w_->config.num_heads; ++h) {
        const float* x = q + size_t(h) * D;
        const float* y = a.q.data() + size_t(h) * D;
        double xy = 0, xx = 0, yy = 0;
        for (int i = 0; i < D; ++i) {
            xy += double(x[i]) * y[i];
            xx += double(x[i]) * x[i];
            yy += double(y[i]) * y[i];
        }
        if (!(xx > 0 && yy > 0) || xy < quest_.reuse_cos * std::sqrt(xx * yy)) return false;
    }
    return true;
}

void CpuLlama::record_selection_mass(int layer, const float* q, int len, const std::vector<std::vector<int>>& blocks,
                                     int block_size, float scale) {
    const ModelConfig& c = w_->config;
    const int S = quest_.page_size, P = (len + S - 1) / S, K = quest_.page_budget();
    if (P <= K) return;  // dense step: every page is read, nothing to compare
    std::vector<float> mass(P), block_mass((len + block_size - 1) / block_size);
    for (int h = 0; h < c.num_heads; ++h) {
        const int kvh = h / c.group_size();
        attention_page_mass_ref(mass.data(), q + size_t(h) * c.head_dim, cache_.keys(layer, kvh), c.head_dim, len, S,
                                scale);
        attention_page_mass_ref(block_mass.data(), q + size_t(h) * c.head_dim, cache_.keys(layer, kvh), c.head_dim, len,
                                block_size, scale);
        double selected = 0.0;
        for (int b : blocks[h]) selected += block_mass[b];
        // The oracle at the same budget: the last page plus the K-1 complete pages that hold the most mass.
        const std::vector<float> complete(mass.begin(), mass.end() - 1);
        double oracle = mass[P - 1];
        for (int p : top_k_ref(complete, K - 1)) oracle += mass[p];
        diag_.selected_mass[layer][h] += selected;
        diag_.oracle_mass[layer][h] += oracle;
    }
    ++diag_.steps[layer];
}

std::span<const float> CpuLlama::decode(int token) {
    const auto t0 = std::chrono::steady_clock::now();
    const int one[] = {token};
    forward(one, /*quest_step=*/true, nullptr);
    ++reads_.steps;
    last_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return logits_;
}

void CpuLlama::forward(std::span<const int> tokens, bool quest_step, std::vector<float>* all_logits) {
    const ModelConfig& c = w_->config;
    const int n = static_cast<int>(tokens.size());
    if (pos_ + n > capacity())
        throw ResourceError("context full: " + std::to_string(pos_) + " + " + std::to_string(n) +
                            " tokens exceed the KV cache capacity of " + std::to_string(capacity()) + " tokens");
    for (int t : tokens)
        if (t < 0 || t >= c.vocab_size)
            throw InputError("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                             std::to_string(c.vocab_size) + ")");

    const int H = c.hidden_size, D = c.head_dim, NH = c.num_heads, NKV = c.num_kv_heads, F = c.intermediate_size;
    const int group = c.group_size();
    const float eps = static_cast<float>(c.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    // Rotary frequencies for this forward pass (dynamic NTK depends on its last position).
    const RopeFrequencies rope = rope_frequencies(c, pos_ + n);

    std::vector<float> x(static_cast<size_t>(n) * H), xn(x.size()), att_out(static_cast<size_t>(n) * c.q_dim());
    std::vector<float> q(static_cast<size_t>(n) * c.q_dim()), k(static_cast<size_t>(n) * c.kv_dim()), v(k.size());
    std::vector<float> proj(x.size()), gate(static_cast<size_t>(n) * F), up(gate.size());
    for (int t = 0; t < n; ++t) embedding_ref(&x[static_cast<size_t>(t) * H], w_->embed.data(), tokens[t], H);

    selection_.assign(c.num_layers, {});
    selection_block_.assign(c.num_layers, 0);
    if (!quest_step || n > 1) reuse_.clear();  // a prefill: the next decode step selects afresh
    if (quest_.reuse_cos != 0) reuse_.resize(c.num_layers);
    Selection sel;
    for (int l = 0; l < c.num_layers; ++l) {
        if (n > 1 && interrupt_requested()) {  // Ctrl-C during a prefill: undo this call's cache writes and stop
            cache_.truncate(pos_);
            throw Interrupted("prefill interrupted (layer " + std::to_string(l) + " of " + std::to_string(c.num_layers) +
                              "); the cache holds the " + std::to_string(pos_) + " tokens it held before");
        }
        const LayerWeightsF32& L = w_->layers[l];
        // Attention block.
        for (int t = 0; t < n; ++t) rms_norm_ref(&xn[size_t(t) * H], &x[size_t(t) * H], L.attn_norm.data(), H, eps);
        if (observer_) observer_(l, LinearSite::Qkv, xn.data(), n, H);
        matmul_ref(q.data(), L.wq.data(), xn.data(), n, c.q_dim(), H);
        matmul_ref(k.data(), L.wk.data(), xn.data(), n, c.kv_dim(), H);
        matmul_ref(v.data(), L.wv.data(), xn.data(), n, c.kv_dim(), H);
        if (c.qkv_bias)  // Qwen2
            for (int t = 0; t < n; ++t) {
                add_inplace_ref(&q[size_t(t) * c.q_dim()], L.bq.data(), c.q_dim());
                add_inplace_ref(&k[size_t(t) * c.kv_dim()], L.bk.data(), c.kv_dim());
                add_inplace_ref(&v[size_t(t) * c.kv_dim()], L.bv.data(), c.kv_dim());
            }
        for (int t = 0; t < n; ++t) {
            const int pos = pos_ + t;
            rope_ref(&q[size_t(t) * c.q_dim()], NH, D, pos, rope.inv_freq.data(), rope.attention_scaling);
            rope_ref(&k[size_t(t) * c.kv_dim()], NKV, D, pos, rope.inv_freq.data(), rope.attention_scaling);
            cache_.write(l, pos, &k[size_t(t) * c.kv_dim()], &v[size_t(t) * c.kv_dim()]);
        }
        const bool select = quest_step && quest_.quest_layer(l);
        const int window = c.attention_window(l);  // 0: full attention
        if (!quest_step) {
            // A prefill: full (or windowed) attention for every token and head, each independent of the others. The
            // threads take pairs of tokens t and n - 1 - t, so that every range of pairs attends over about as many
            // keys as any other.
            auto attend = [&](int t) {
                const int len = pos_ + t + 1, first = window_start_of(len, window);
                for (int h = 0; h < NH; ++h)
                    attention_full_ref(&att_out[size_t(t) * c.q_dim() + size_t(h) * D],
                                       &q[size_t(t) * c.q_dim() + size_t(h) * D], cache_.keys(l, h / group),
                                       cache_.values(l, h / group), D, len, scale, first);
            };
            parallel_rows((n + 1) / 2, int64_t(n) * (pos_ + n) * NH * D, 0, [&](int j0, int j1) {
                for (int j = j0; j < j1; ++j) {
                    attend(j);
                    if (n - 1 - j != j) attend(n - 1 - j);
                }
            });
        }
        for (int t = 0; t < n && quest_step; ++t) {
            const int len = pos_ + t + 1;  // the token attends to itself and everything before it
            const int first = window_start_of(len, window);  // ... within its layer's window
            const float* qt = &q[size_t(t) * c.q_dim()];
            if (select) {
                const QuestSelectArgs a = quest_select_args(quest_, cache_, l, qt, NH, NKV, D, len, first, scale);
                const int pages = (len + quest_.page_size - 1) / quest_.page_size;
                // A windowed layer selects afresh each step (a reused page may have left the window).
                if (window == 0 && may_reuse(l, qt, pages)) {
                    // The anchor's pages (the last one has grown by the tokens since): KV only, no metadata.
                    sel = reuse_[l].sel;
                    sel.reads = SelectionReads{};
                    sel.reads.rows = reuse_[l].sel.reads.rows;
                    const int last_tokens = len - (pages - 1) * quest_.page_size;
                    const int stride = quest_.gqa_policy == GqaPolicy::PerHead ? 1 : group;
                    for (int h = 0; h < NH; h += stride)
                        sel.reads.kv_tokens +=
                            int64_t(sel.blocks[h].size() - 1) * quest_.page_size + last_tokens;
                    ++reads_.reused_steps;
                } else {
                    select_blocks_ref(a, sel);
                    if (quest_.reuse_cos != 0 && !sel.reads.dense && window == 0) reuse_[l] = {sel, std::vector<float>(qt, qt + c.q_dim()), pages};
                }
                const int64_t bytes = selection_bytes(sel.reads, D, quest_.metadata);
                reads_.quest_layer_bytes += bytes;
                reads_.metadata_bytes += bytes - sel.reads.kv_tokens * 4ll * D;
                if (!sel.reads.dense) {
                    ++reads_.selecting_steps;
                    reads_.selecting_rows += sel.reads.rows;
                    reads_.selected_tokens += sel.reads.kv_tokens;
                }
            } else if (quest_step) {  // a decode step's dense layer (or full attention): every token, no metadata
                // Layers from dense_layers on count as Quest layers also under full attention (the comparison).
                const int64_t bytes = selection_bytes(dense_reads(len - first, NKV), D, quest_.metadata);
                (l >= quest_.dense_layers ? reads_.quest_layer_bytes : reads_.dense_layer_bytes) += bytes;
            }
            for (int h = 0; h < NH; ++h) {
                const int kvh = h / group;
                float* out = &att_out[size_t(t) * c.q_dim() + size_t(h) * D];
                if (select)
                    attention_pages_ref(out, qt + size_t(h) * D, cache_.keys(l, kvh), cache_.values(l, kvh), D, len,
                                        sel.block_size, sel.blocks[h], scale, first);
                else
                    attention_full_ref(out, qt + size_t(h) * D, cache_.keys(l, kvh), cache_.values(l, kvh), D, len,
                                       scale, first);
            }
            if (select) {
                selection_[l] = sel.blocks;
                selection_block_[l] = sel.block_size;
            }
            // The diagnostics' oracle ranks the whole sequence: not comparable once a window cuts it.
            if (select && diagnostics_ && first == 0) record_selection_mass(l, qt, len, sel.blocks, sel.block_size, scale);
        }
        if (observer_) observer_(l, LinearSite::O, att_out.data(), n, c.q_dim());
        matmul_ref(proj.data(), L.wo.data(), att_out.data(), n, H, c.q_dim());
        add_inplace_ref(x.data(), proj.data(), n * H);
        // MLP block.
        for (int t = 0; t < n; ++t) rms_norm_ref(&xn[size_t(t) * H], &x[size_t(t) * H], L.mlp_norm.data(), H, eps);
        if (observer_) observer_(l, LinearSite::GateUp, xn.data(), n, H);
        matmul_ref(gate.data(), L.w_gate.data(), xn.data(), n, F, H);
        matmul_ref(up.data(), L.w_up.data(), xn.data(), n, F, H);
        swiglu_ref(gate.data(), gate.data(), up.data(), n * F);
        if (observer_) observer_(l, LinearSite::Down, gate.data(), n, F);
        matmul_ref(proj.data(), L.w_down.data(), gate.data(), n, H, F);
        add_inplace_ref(x.data(), proj.data(), n * H);
    }
    pos_ += n;

    // Final norm and logits (all tokens only when asked).
    const int first = all_logits ? 0 : n - 1;
    const int count = n - first;
    for (int t = first; t < n; ++t)
        rms_norm_ref(&xn[size_t(t) * H], &x[size_t(t) * H], w_->final_norm.data(), H, eps);
    std::vector<float> out(static_cast<size_t>(count) * c.vocab_size);
    matmul_ref(out.data(), w_->output_matrix().data(), &xn[size_t(first) * H], count, c.vocab_size, H);
    std::copy(out.end() - c.vocab_size, out.end(), logits_.begin());
    if (all_logits) *all_logits = std::move(out);
}

QuestSelectArgs quest_select_args(const QuestSettings& q, const KvCache& cache, int layer, const float* qt,
                                  int num_heads, int num_kv_heads, int head_dim, int len, int window_start, float scale) {
    QuestSelectArgs a;
    a.q = qt;
    a.kmin = cache.kmin(layer);
    a.kmax = cache.kmax(layer);
    a.num_heads = num_heads;
    a.num_kv_heads = num_kv_heads;
    a.head_dim = head_dim;
    a.page_capacity = cache.shape().pages();
    a.len = len;
    a.page_size = q.page_size;
    a.page_budget = q.page_budget();
    a.policy = q.gqa_policy;
    a.selector = q.selector;
    a.keys = cache.keys(layer, 0);  // the oracle reads every key (KV heads are contiguous in a layer)
    a.key_capacity = cache.shape().capacity;
    a.scale = scale;
    a.metadata = q.metadata;
    a.sub_kmin = cache.sub_kmin(layer);
    a.sub_kmax = cache.sub_kmax(layer);
    a.sub_capacity = cache.shape().sub_pages();
    a.sub_page = q.sub_page;
    a.shortlist = q.shortlist;
    a.mass_target = static_cast<float>(q.mass_target);
    a.match_bytes = q.match_bytes;
    a.window_start = window_start;
    return a;
}

std::unique_ptr<Backend> make_cpu_backend(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                          size_t memory_limit) {
    check_model_tensors(model);  // before the memory plan
    check_cpu_memory(model.config, quest, capacity, memory_limit);
    // A folder's safetensors, or a GGUF file's tensors dequantized to fp32.
    auto weights = std::make_shared<LlamaWeightsF32>(load_model_weights_f32(model));
    return std::make_unique<CpuLlama>(std::move(weights), quest, capacity);
}

}  // namespace quest
