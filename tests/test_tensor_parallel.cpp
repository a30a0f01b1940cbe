// Tensor parallelism without GPUs: the plan's layout and validation (model/core/tensor_parallel.h), the per-rank
// memory plan and its refusal, and a CPU emulation of the sharded forward pass (each rank's slice of every weight,
// its heads' attention and Quest selection over its own KV cache, the row-parallel partial sums added in rank order
// as the all-reduce does, the vocabulary-split logits gathered) against the unsharded CPU backend. The emulation is
// a test oracle for the NCCL backend, built from the CPU reference ops, not a product feature.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/attention/attention.h"
#include "kernels/common/basic_ops.h"
#include "kernels/common/error.h"
#include "kernels/select/quest.h"
#include "model/core/memory.h"
#include "model/core/rope.h"
#include "model/core/tensor_parallel.h"
#include "model/cpu/kv_cache.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/model_folder.h"
#include "model/io/quantize.h"
#include "model/io/shard_source.h"
#include "model/io/weight_source.h"
#include "model/io/weights.h"
#include "kernels/linear/quant.h"
#include "kernels/common/dtype.h"
#include "test_util.h"

using namespace quest;

namespace {

// Rows [b, e) of a row-major [rows][cols] matrix.
std::vector<float> rows_of(const std::vector<float>& w, int cols, int b, int e) {
    return {w.begin() + size_t(b) * cols, w.begin() + size_t(e) * cols};
}
// Columns [b, e) of a row-major [rows][cols] matrix.
std::vector<float> cols_of(const std::vector<float>& w, int rows, int cols, int b, int e) {
    std::vector<float> out;
    out.reserve(size_t(rows) * (e - b));
    for (int r = 0; r < rows; ++r) out.insert(out.end(), w.begin() + size_t(r) * cols + b, w.begin() + size_t(r) * cols + e);
    return out;
}

// Rank r's shard of the fp32 weights: a Llama of config shard(model), every matrix cut as the plan says.
LlamaWeightsF32 cut_shard(const LlamaWeightsF32& w, const TpRank& r) {
    const ModelConfig& c = w.config;
    const int H = c.hidden_size, D = c.head_dim;
    LlamaWeightsF32 s;
    s.config = r.shard(c);
    s.embed = rows_of(w.embed, H, r.vocab.begin, r.vocab.end());
    s.final_norm = w.final_norm;
    if (!w.lm_head.empty()) s.lm_head = rows_of(w.lm_head, H, r.vocab.begin, r.vocab.end());
    const int q0 = r.heads.begin * D, q1 = r.heads.end() * D, k0 = r.kv_heads.begin * D, k1 = r.kv_heads.end() * D;
    for (const LayerWeightsF32& L : w.layers) {
        LayerWeightsF32& S = s.layers.emplace_back();
        S.attn_norm = L.attn_norm;
        S.mlp_norm = L.mlp_norm;
        S.wq = rows_of(L.wq, H, q0, q1);
        S.wk = rows_of(L.wk, H, k0, k1);
        S.wv = rows_of(L.wv, H, k0, k1);
        if (c.qkv_bias) {
            S.bq.assign(L.bq.begin() + q0, L.bq.begin() + q1);
            S.bk.assign(L.bk.begin() + k0, L.bk.begin() + k1);
            S.bv.assign(L.bv.begin() + k0, L.bv.begin() + k1);
        }
        S.wo = cols_of(L.wo, H, c.q_dim(), q0, q1);
        S.w_gate = rows_of(L.w_gate, H, r.ffn.begin, r.ffn.end());
        S.w_up = rows_of(L.w_up, H, r.ffn.begin, r.ffn.end());
        S.w_down = cols_of(L.w_down, H, c.intermediate_size, r.ffn.begin, r.ffn.end());
    }
    return s;
}

// The sharded model, ranks run one after another. Mirrors CpuLlama::forward (without reuse_cos and diagnostics).
class TpEmulator {
public:
    TpEmulator(const LlamaWeightsF32& w, int ranks, const QuestSettings& q, int capacity)
        : c_(w.config), plan_(make_tp_plan(w.config, ranks)), q_(q) {
        for (const TpRank& r : plan_.rank) {
            shards_.push_back(cut_shard(w, r));
            caches_.emplace_back(KvCacheShape{c_.num_layers, r.kv_heads.count, c_.head_dim, q.page_size, capacity,
                                              q.cache_sub_page()});
        }
    }
    std::vector<float> prefill(const std::vector<int>& t) { return forward(t, false); }
    std::vector<float> decode(int t) { return forward({t}, true); }
    // [layer][global query head] pages of the last step, empty for dense layers (CpuLlama::last_selection).
    const std::vector<std::vector<std::vector<int>>>& last_selection() const { return sel_; }

private:
    std::vector<float> forward(const std::vector<int>& tokens, bool quest_step) {
        const int n = int(tokens.size()), H = c_.hidden_size, D = c_.head_dim;
        const float eps = float(c_.rms_norm_eps), scale = 1.0f / std::sqrt(float(D));
        const RopeFrequencies rope = rope_frequencies(c_, pos_ + n);
        // The embedding: each rank looks up the tokens in its vocabulary rows (zeros elsewhere); all-reduce.
        std::vector<float> x(size_t(n) * H, 0.0f), xn(x.size()), sum(x.size()), row(H);
        for (size_t r = 0; r < shards_.size(); ++r) {
            const TpRange& v = plan_.rank[r].vocab;
            for (int t = 0; t < n; ++t) {
                std::fill(row.begin(), row.end(), 0.0f);
                if (tokens[t] >= v.begin && tokens[t] < v.end())
                    embedding_ref(row.data(), shards_[r].embed.data(), tokens[t] - v.begin, H);
                add_inplace_ref(&x[size_t(t) * H], row.data(), H);
            }
        }
        sel_.assign(c_.num_layers, {});
        for (int l = 0; l < c_.num_layers; ++l) {
            const bool select = quest_step && q_.quest_layer(l);
            if (select) sel_[l].resize(c_.num_heads);
            const int window = c_.attention_window(l);
            // Attention: column-parallel q/k/v, the rank's heads over its cache, row-parallel o; all-reduce.
            for (int t = 0; t < n; ++t)
                rms_norm_ref(&xn[size_t(t) * H], &x[size_t(t) * H], shards_[0].layers[l].attn_norm.data(), H, eps);
            std::fill(sum.begin(), sum.end(), 0.0f);
            for (size_t r = 0; r < shards_.size(); ++r) {
                const ModelConfig& s = shards_[r].config;
                const LayerWeightsF32& L = shards_[r].layers[l];
                KvCache& cache = caches_[r];
                const int qd = s.q_dim(), kv = s.kv_dim();
                std::vector<float> q(size_t(n) * qd), k(size_t(n) * kv), v(k.size()), att(q.size()), part(x.size());
                matmul_ref(q.data(), L.wq.data(), xn.data(), n, qd, H);
                matmul_ref(k.data(), L.wk.data(), xn.data(), n, kv, H);
                matmul_ref(v.data(), L.wv.data(), xn.data(), n, kv, H);
                for (int t = 0; t < n; ++t) {
                    if (s.qkv_bias) {
                        add_inplace_ref(&q[size_t(t) * qd], L.bq.data(), qd);
                        add_inplace_ref(&k[size_t(t) * kv], L.bk.data(), kv);
                        add_inplace_ref(&v[size_t(t) * kv], L.bv.data(), kv);
                    }
                    rope_ref(&q[size_t(t) * qd], s.num_heads, D, pos_ + t, rope.inv_freq.data(), rope.attention_scaling);
                    rope_ref(&k[size_t(t) * kv], s.num_kv_heads, D, pos_ + t, rope.inv_freq.data(), rope.attention_scaling);
                    cache.write(l, pos_ + t, &k[size_t(t) * kv], &v[size_t(t) * kv]);
                }
                for (int t = 0; t < n; ++t) {
                    const int len = pos_ + t + 1, first = window > 0 ? std::max(0, len - window) : 0;
                    const float* qt = &q[size_t(t) * qd];
                    Selection sel;
                    if (select) {  // Quest on the rank's heads and metadata alone
                        const QuestSelectArgs a = quest_select_args(q_, cache, l, qt, s.num_heads, s.num_kv_heads, D, len,
                                                                    first, scale);
                        select_blocks_ref(a, sel);
                        for (int h = 0; h < s.num_heads; ++h) sel_[l][plan_.rank[r].heads.begin + h] = sel.blocks[h];
                    }
                    for (int h = 0; h < s.num_heads; ++h) {
                        const int kvh = h / s.group_size();
                        float* out = &att[size_t(t) * qd + size_t(h) * D];
                        if (select)
                            attention_pages_ref(out, qt + size_t(h) * D, cache.keys(l, kvh), cache.values(l, kvh), D,
                                                len, sel.block_size, sel.blocks[h], scale, first);
                        else
                            attention_full_ref(out, qt + size_t(h) * D, cache.keys(l, kvh), cache.values(l, kvh), D,
                                               len, scale, first);
                    }
                }
                matmul_ref(part.data(), L.wo.data(), att.data(), n, H, qd);
                add_inplace_ref(sum.data(), part.data(), n * H);  // the all-reduce, in rank order
            }
            add_inplace_ref(x.data(), sum.data(), n * H);
            // MLP: column-parallel gate/up, row-parallel down; all-reduce.
            for (int t = 0; t < n; ++t)
                rms_norm_ref(&xn[size_t(t) * H], &x[size_t(t) * H], shards_[0].layers[l].mlp_norm.data(), H, eps);
            std::fill(sum.begin(), sum.end(), 0.0f);
            for (size_t r = 0; r < shards_.size(); ++r) {
                const LayerWeightsF32& L = shards_[r].layers[l];
                const int F = shards_[r].config.intermediate_size;
                std::vector<float> gate(size_t(n) * F), up(gate.size()), part(x.size());
                matmul_ref(gate.data(), L.w_gate.data(), xn.data(), n, F, H);
                matmul_ref(up.data(), L.w_up.data(), xn.data(), n, F, H);
                swiglu_ref(gate.data(), gate.data(), up.data(), n * F);
                matmul_ref(part.data(), L.w_down.data(), gate.data(), n, H, F);
                add_inplace_ref(sum.data(), part.data(), n * H);
            }
            add_inplace_ref(x.data(), sum.data(), n * H);
        }
        pos_ += n;
        // The last token's logits: each rank its vocabulary rows, gathered in rank order.
        rms_norm_ref(xn.data(), &x[size_t(n - 1) * H], shards_[0].final_norm.data(), H, eps);
        std::vector<float> logits;
        for (size_t r = 0; r < shards_.size(); ++r) {
            std::vector<float> part(shards_[r].config.vocab_size);
            matvec_ref(part.data(), shards_[r].output_matrix().data(), xn.data(), int(part.size()), H);
            logits.insert(logits.end(), part.begin(), part.end());
        }
        return logits;
    }

    ModelConfig c_;
    TpPlan plan_;
    QuestSettings q_;
    std::vector<LlamaWeightsF32> shards_;
    std::vector<KvCache> caches_;
    int pos_ = 0;
    std::vector<std::vector<std::vector<int>>> sel_;
};

// fp32 tolerance: |tp - ref| <= kTol * max(1, max |ref|) per step. The sharded sums differ from the unsharded ones
// only in the order of fp32 additions (partial sums over ranks).
constexpr float kTol = 1e-5f;

float max_abs(const std::vector<float>& a) {
    float m = 0;
    for (float x : a) m = std::max(m, std::abs(x));
    return m;
}

// Quest settings that select on these small models: pages of 4 tokens, a budget of 2 pages, layers from 1 on.
QuestSettings small_quest(GqaPolicy policy = GqaPolicy::KvSum) {
    QuestSettings q;
    q.page_size = 4;
    q.budget = 8;
    q.dense_layers = 1;
    q.gqa_policy = policy;
    return q;
}
QuestSettings full() {
    QuestSettings q;
    q.full_attention = true;
    return q;
}

// Prefill `prompt` tokens and decode `steps` more through the unsharded CPU backend and the emulation at `ranks`;
// the logits of every step compared, and under Quest the selected pages of every layer and head. Returns the
// number of decode steps at which some layer selected (so a Quest test can check that it selected at all).
int compare(const std::shared_ptr<const LlamaWeightsF32>& w, int ranks, const QuestSettings& q, int prompt, int steps,
            uint32_t seed) {
    const int V = w->config.vocab_size;
    std::mt19937 rng(seed);
    std::vector<int> ids(prompt + steps);
    for (int& t : ids) t = int(rng() % uint32_t(V));
    CpuLlama ref(w, q, prompt + steps);
    TpEmulator tp(*w, ranks, q, prompt + steps);
    auto check = [&](std::span<const float> r, const std::vector<float>& t, const std::string& where) {
        const std::vector<float> rv(r.begin(), r.end());
        ASSERT_EQ(t.size(), rv.size()) << where;
        const float bound = kTol * std::max(1.0f, max_abs(rv));
        float worst = 0;
        for (size_t i = 0; i < rv.size(); ++i) worst = std::max(worst, std::abs(rv[i] - t[i]));
        EXPECT_LE(worst, bound) << where << " ranks " << ranks;
    };
    check(ref.prefill(std::vector<int>(ids.begin(), ids.begin() + prompt)),
          tp.prefill(std::vector<int>(ids.begin(), ids.begin() + prompt)), "prefill");
    int selecting = 0;
    for (int s = 0; s < steps; ++s) {
        const auto r = ref.decode(ids[prompt + s]);
        const auto t = tp.decode(ids[prompt + s]);
        check(r, t, "decode step " + std::to_string(s));
        const auto& rs = ref.last_selection();
        const auto& ts = tp.last_selection();
        EXPECT_EQ(rs, ts) << "selected pages, decode step " << s << ", ranks " << ranks;
        bool any = false;
        for (size_t l = 0; l < rs.size(); ++l)
            for (const auto& h : rs[l]) any |= !h.empty() && int(h.size()) < (prompt + s + q.page_size) / q.page_size;
        selecting += any;
    }
    return selecting;
}

std::shared_ptr<const LlamaWeightsF32> fixture_weights(const std::string& name) {
    return std::make_shared<LlamaWeightsF32>(
        load_model_weights_f32(open_model_folder(test::source_dir() / "tests/fixtures/hf" / name)));
}

// A Llama shape: hidden, MLP width, layers, query heads, KV heads, head_dim, vocabulary, positions.
ModelConfig llama_shape(int hidden, int intermediate, int layers, int heads, int kv_heads, int head_dim, int vocab,
                        int positions) {
    ModelConfig c;
    c.hidden_size = hidden;
    c.intermediate_size = intermediate;
    c.num_layers = layers;
    c.num_heads = heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.vocab_size = vocab;
    c.max_position_embeddings = positions;
    return c;
}

// A seeded random Llama with 8 KV heads (so 1, 2, 4 and 8 ranks), an intermediate size and a vocabulary that 8
// does not divide (the uneven splits), GQA groups of 2, three layers.
std::shared_ptr<const LlamaWeightsF32> random_weights(bool tied) {
    ModelConfig c = llama_shape(64, 100, 3, 16, 8, 8, 203, 256);
    c.tie_word_embeddings = tied;
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    auto mat = [&](size_t n, float sd) {
        std::vector<float> v(n);
        for (float& x : v) x = g(rng) * sd;
        return v;
    };
    const size_t H = c.hidden_size, F = c.intermediate_size;
    auto w = std::make_shared<LlamaWeightsF32>();
    w->config = c;
    w->embed = mat(c.vocab_size * H, 1.0f);
    for (int l = 0; l < c.num_layers; ++l) {
        LayerWeightsF32& L = w->layers.emplace_back();
        L.attn_norm = mat(H, 0.1f);
        L.mlp_norm = mat(H, 0.1f);
        for (float& x : L.attn_norm) x += 1.0f;
        for (float& x : L.mlp_norm) x += 1.0f;
        L.wq = mat(c.q_dim() * H, 0.5f);  // large enough that the attention is peaked and the pages differ
        L.wk = mat(c.kv_dim() * H, 0.5f);
        L.wv = mat(c.kv_dim() * H, 0.125f);
        L.wo = mat(H * c.q_dim(), 0.1f);
        L.w_gate = mat(F * H, 0.125f);
        L.w_up = mat(F * H, 0.125f);
        L.w_down = mat(H * F, 0.1f);
    }
    w->final_norm = mat(H, 0.1f);
    for (float& x : w->final_norm) x += 1.0f;
    if (!tied) w->lm_head = mat(c.vocab_size * H, 0.125f);
    return w;
}

}  // namespace

TEST(TpPlan, LayoutCoversEveryRowOnce) {
    ModelConfig c = random_weights(false)->config;
    for (int n : {1, 2, 4, 8}) {
        const TpPlan p = make_tp_plan(c, n);
        ASSERT_EQ(int(p.rank.size()), n);
        int heads = 0, kv = 0, ffn = 0, vocab = 0;
        for (const TpRank& r : p.rank) {
            EXPECT_EQ(r.heads.begin, heads);
            EXPECT_EQ(r.kv_heads.begin, kv);
            EXPECT_EQ(r.ffn.begin, ffn);
            EXPECT_EQ(r.vocab.begin, vocab);
            EXPECT_EQ(r.heads.count, r.kv_heads.count * c.group_size());  // whole KV-head groups
            EXPECT_LE(std::abs(r.ffn.count - p.rank[0].ffn.count), 1);
            heads = r.heads.end(), kv = r.kv_heads.end(), ffn = r.ffn.end(), vocab = r.vocab.end();
        }
        EXPECT_EQ(heads, c.num_heads);
        EXPECT_EQ(kv, c.num_kv_heads);
        EXPECT_EQ(ffn, c.intermediate_size);
        EXPECT_EQ(vocab, c.vocab_size);
    }
    const TpPlan p8 = make_tp_plan(c, 8);  // 100 = 4 x 13 + 4 x 12; 203 = 3 x 26 + 5 x 25
    EXPECT_EQ(p8.rank[3].ffn.count, 13);
    EXPECT_EQ(p8.rank[4].ffn.count, 12);
    EXPECT_EQ(p8.rank[2].vocab.count, 26);
    EXPECT_EQ(p8.rank[3].vocab.count, 25);
    c.intermediate_size = 1024;  // int4 g128: every rank's down_proj columns are whole groups
    const TpPlan g = make_tp_plan(c, 4, 128);
    for (const TpRank& r : g.rank) EXPECT_EQ(r.ffn.begin % 128, 0);
}

TEST(TpPlan, RefusesLayoutsThatSplitKvHeads) {
    const ModelConfig c = random_weights(false)->config;  // 8 KV heads, intermediate 100, vocab 203
    auto message = [&](int n, int unit = 1) -> std::string {
        try {
            make_tp_plan(c, n, unit);
        } catch (const InputError& e) {
            return e.what();
        }
        return "accepted";
    };
    EXPECT_EQ(message(3), "--tp 3: the GPUs must divide the model's 8 KV heads (num_key_value_heads), so that each GPU "
                          "owns whole KV-head groups; 3 does not");
    EXPECT_NE(message(16).find("--tp 16: the GPUs must divide the model's 8 KV heads"), std::string::npos);
    EXPECT_NE(message(0).find("--tp 0: expected a number of GPUs in [1, 64]"), std::string::npos);
    EXPECT_NE(message(2, 128).find("--tp 2: the intermediate size 100 is not a multiple of the split unit 128"),
              std::string::npos);
    EXPECT_NE(message(8, 25).find("--tp 8: the intermediate size 100 holds 4 units of 25 rows, fewer than the 8 GPUs"),
              std::string::npos);
    ModelConfig tiny = c;
    tiny.vocab_size = 5;
    EXPECT_THROW(make_tp_plan(tiny, 8), InputError);
}

// Llama-2-70B in FP16 (8 KV heads, 80 layers, 138 GB = 128.4 GiB of weights) with a 32K context (10 GiB of KV) does
// not fit one GPU of 139 GiB (an H200 as lent); it fits two, each rank holding half the matrices and half the KV cache.
TEST(TpMemory, SeventyBillionNeedsTwoGpus) {
    ModelConfig c = llama_shape(8192, 28672, 80, 64, 8, 128, 32000, 32768);
    QuestSettings q;
    const size_t gpu = size_t(139) << 30;
    const TpFit one = fit_tp_memory(make_tp_plan(c, 1), q, 32768, gpu);
    EXPECT_FALSE(one.fits());
    EXPECT_NE(one.refusal.find("--tp 1: rank 0 needs weights 128."), std::string::npos) << one.refusal;
    EXPECT_NE(one.refusal.find("but a GPU holds 139.00 GiB"), std::string::npos) << one.refusal;
    const TpFit two = fit_tp_memory(make_tp_plan(c, 2), q, 32768, gpu);
    EXPECT_TRUE(two.fits()) << two.refusal;
    // Each rank: half of the per-layer matrices and of the vocabulary; the KV cache split by KV heads exactly
    // (80 layers x 2 x 4 heads x 128 x 32768 tokens x 2 bytes = 5 GiB).
    EXPECT_EQ(two.ranks[0].kv_cache, size_t(5) << 30);
    EXPECT_EQ(one.ranks[0].kv_cache, 2 * two.ranks[0].kv_cache);
    EXPECT_LT(two.ranks[0].weights, one.ranks[0].weights / 2 + (size_t(8) << 20));  // + the replicated norms
    EXPECT_EQ(choose_tp_layout(c, q, 32768, gpu, 8).ranks, 2);
    try {
        choose_tp_layout(c, q, 32768, size_t(16) << 30, 4);
        ADD_FAILURE() << "16 GiB GPUs x 4 accepted";
    } catch (const ResourceError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("fits on no layout of at most 4 GPUs of 16.00 GiB"), std::string::npos) << m;
        EXPECT_NE(m.find("--tp 1 "), std::string::npos) << m;
        EXPECT_NE(m.find("--tp 4 "), std::string::npos) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
    TpMemoryOptions int4;
    int4.weights = TpWeights::Int4;  // about a quarter of the bytes: 70B int4 at 32K fits one GPU
    EXPECT_EQ(choose_tp_layout(c, q, 32768, gpu, 8, int4).ranks, 1);
}

// The sharded forward equals the unsharded CPU backend (fp32, kTol), full attention and Quest, with the same pages.
TEST(TpEmulation, RandomModelEveryLayout) {
    for (bool tied : {false, true}) {
        const auto w = random_weights(tied);
        for (int n : {1, 2, 4, 8}) {
            SCOPED_TRACE("tied " + std::to_string(tied) + " ranks " + std::to_string(n));
            compare(w, n, full(), 30, 4, 11);
            EXPECT_GT(compare(w, n, small_quest(), 30, 4, 12), 0);
            EXPECT_GT(compare(w, n, small_quest(GqaPolicy::PerHead), 30, 4, 13), 0);
        }
    }
}

TEST(TpEmulation, Fixtures) {
    // name, the layouts its KV heads allow
    const std::vector<std::pair<std::string, std::vector<int>>> cases = {
        {"gqa4_hd128", {1}}, {"gqa8_hd64_tied", {1}}, {"mha_hd64", {1, 2}}, {"f16_gqa4", {1, 2}},
        {"bf16_gqa2", {1, 2}}, {"qwen2_gqa2", {1, 2}}, {"mistral_swa24", {1, 2}}};
    for (const auto& [name, layouts] : cases) {
        const auto w = fixture_weights(name);
        for (int n : layouts) {
            SCOPED_TRACE(name + " ranks " + std::to_string(n));
            compare(w, n, full(), 20, 6, 21);
            EXPECT_GT(compare(w, n, small_quest(), name == "mistral_swa24" ? 40 : 20, 6, 22), 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The shard source (model/io/shard_source.h): what a device loader reads for rank r is cut_shard's slice.
// ---------------------------------------------------------------------------------------------------------------

namespace {

std::vector<float> host_f32(const HostLinear& h) {
    if (!h.storage.is_f16()) return dequantize_int4(h.int4);
    std::vector<float> v(static_cast<size_t>(h.rows * h.cols));
    convert_to_f32(h.dtype, h.data(), v.data(), v.size());
    return v;
}

}  // namespace

// Every tensor of every rank's view of a fixture checkpoint (F32, F16, BF16, Qwen2 biases, tied and untied) equals
// the emulation's slice of the fp32 weights, exactly; whole-row slices keep the file's dtype.
TEST(TpShardSource, SlicesEqualTheEmulationsCut) {
    for (const std::string name : {"mha_hd64", "f16_gqa4", "bf16_gqa2", "qwen2_gqa2", "gqa8_hd64_tied"}) {
        const ModelFolder m = open_model_folder(test::source_dir() / "tests/fixtures/hf" / name);
        const auto w = load_model_weights_f32(m);
        const auto full = open_weight_source(m);
        const int ranks = m.config.num_kv_heads >= 2 ? 2 : 1;
        const TpPlan plan = make_tp_plan(m.config, ranks);
        for (const TpRank& r : plan.rank) {
            SCOPED_TRACE(name + " rank " + std::to_string(r.rank));
            const LlamaWeightsF32 want = cut_shard(w, r);
            const ModelConfig& s = want.config;
            const auto src = shard_weight_source(*full, m.config, r);
            const int64_t H = s.hidden_size;
            const int64_t emb[] = {s.vocab_size, H};
            const HostLinear e = src->tensor(LlamaTensorNames::embed(), emb);
            EXPECT_EQ(host_f32(e), want.embed);
            if (!s.tie_word_embeddings) {
                EXPECT_EQ(host_f32(src->tensor(LlamaTensorNames::lm_head(), emb)), want.lm_head);
            }
            const int64_t norm[] = {H};
            EXPECT_EQ(host_f32(src->tensor(LlamaTensorNames::final_norm(), norm)), want.final_norm);
            for (int l = 0; l < s.num_layers; ++l) {
                const auto specs = llama_linear_specs(s, l);
                const LayerWeightsF32& L = want.layers[l];
                const std::vector<const std::vector<float>*> mats = {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
                for (size_t i = 0; i < specs.size(); ++i) {
                    const HostLinear h = src->linear(specs[i]);
                    EXPECT_EQ(h.rows, specs[i].rows);
                    EXPECT_EQ(h.cols, specs[i].cols);
                    EXPECT_EQ(host_f32(h), *mats[i]) << specs[i].prefix;
                    if (i != 3 && i != 6) {  // row slices of a float file: its dtype, mapped
                        EXPECT_NE(h.mapped_bytes, nullptr) << specs[i].prefix;
                    }
                }
                EXPECT_EQ(host_f32(src->tensor(LlamaTensorNames::layer(l, "input_layernorm.weight"), norm)), L.attn_norm);
                if (s.qkv_bias) {
                    const int64_t bq[] = {s.q_dim()}, bkv[] = {s.kv_dim()};
                    EXPECT_EQ(host_f32(src->tensor(LlamaTensorNames::layer(l, "self_attn.q_proj.bias"), bq)), L.bq);
                    EXPECT_EQ(host_f32(src->tensor(LlamaTensorNames::layer(l, "self_attn.k_proj.bias"), bkv)), L.bk);
                    EXPECT_EQ(host_f32(src->tensor(LlamaTensorNames::layer(l, "self_attn.v_proj.bias"), bkv)), L.bv);
                }
            }
        }
    }
}

namespace {

// A checkpoint of int4 linear layers (group 32), seeded per layer name; float tensors zero.
class Int4Source final : public WeightSource {
public:
    explicit Int4Source(ModelConfig c) : c_(std::move(c)) {}
    HostLinear tensor(const std::string&, std::span<const int64_t> shape) const override {
        const int64_t rows = shape.size() == 2 ? shape[0] : 1;
        return HostLinear::floats(std::vector<float>(rows * shape.back(), 0.0f), rows, shape.back());
    }
    LinearStorage stored(const LinearSpec&) const override { return LinearStorage::int4(32); }
    HostLinear linear(const LinearSpec& s) const override {
        std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>{}(s.prefix)));
        std::normal_distribution<float> g(0.0f, 0.1f);
        std::vector<float> w(s.rows * s.cols);
        for (float& x : w) x = g(rng);
        return HostLinear::quantized(quantize_int4(w.data(), int(s.rows), int(s.cols), 32, nullptr, 1));
    }
    std::string describe() const override { return "int4 test source"; }

private:
    ModelConfig c_;
};

}  // namespace

// Int4 layers: row slices and column slices that keep whole groups stay int4 (the same codes, scales and zeros);
// a column slice that splits a group is given dequantized (stored() says int4 without a group), never re-quantized.
TEST(TpShardSource, Int4SlicesKeepWholeGroups) {
    for (const int unit : {32, 1}) {
        // 96 intermediate rows: in units of 32, 64 + 32 (whole groups); in rows, 48 + 48 (rank 1's start splits one).
        const ModelConfig c = llama_shape(64, 96, 1, 4, 2, 32, 10, 64);
        const TpPlan plan = make_tp_plan(c, 2, unit);
        const Int4Source full(c);
        for (const TpRank& r : plan.rank) {
            SCOPED_TRACE("unit " + std::to_string(unit) + " rank " + std::to_string(r.rank));
            const auto src = shard_weight_source(full, c, r);
            const auto specs = llama_linear_specs(r.shard(c), 0), whole = llama_linear_specs(c, 0);
            for (size_t i = 0; i < specs.size(); ++i) {
                const bool columns = i == 3 || i == 6;
                const std::vector<float> all = host_f32(full.linear(whole[i]));
                const int64_t D = c.head_dim;
                const int64_t b = i == 3 ? r.heads.begin * D : i == 6 ? r.ffn.begin : i == 0 ? r.heads.begin * D
                                  : i < 3 ? r.kv_heads.begin * D : r.ffn.begin;
                const int64_t n = columns ? specs[i].cols : specs[i].rows;
                std::vector<float> want;
                for (int64_t row = 0; row < specs[i].rows; ++row)
                    for (int64_t col = 0; col < specs[i].cols; ++col)
                        want.push_back(columns ? all[row * whole[i].cols + b + col] : all[(b + row) * whole[i].cols + col]);
                const HostLinear h = src->linear(specs[i]);
                EXPECT_EQ(host_f32(h), want) << specs[i].prefix;
                const bool split = columns && (b % 32 != 0 || (b + n) % 32 != 0);
                EXPECT_EQ(src->stored(specs[i]).group, split ? 0 : 32) << specs[i].prefix;
                EXPECT_EQ(h.storage.is_f16(), split) << specs[i].prefix;
            }
        }
    }
}
