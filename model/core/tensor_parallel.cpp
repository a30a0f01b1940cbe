#include "model/core/tensor_parallel.h"

#include <algorithm>

#include "kernels/common/error.h"
#include "model/core/memory.h"

namespace quest {

namespace {

// Part r of `total` units split over n parts as evenly as possible: the first total % n parts get one more.
TpRange balanced(int total, int n, int r, int unit = 1) {
    const int units = total / unit, base = units / n, extra = units % n;
    const int begin = r * base + std::min(r, extra);
    return {begin * unit, (base + (r < extra ? 1 : 0)) * unit};
}

std::string tp_flag(int ranks) { return "--tp " + std::to_string(ranks); }

size_t z(int v) { return v > 0 ? static_cast<size_t>(v) : 0; }

}  // namespace

ModelConfig TpRank::shard(const ModelConfig& model) const {
    ModelConfig s = model;
    s.num_heads = heads.count;
    s.num_kv_heads = kv_heads.count;
    s.intermediate_size = ffn.count;
    s.vocab_size = vocab.count;
    return s;
}

TpPlan make_tp_plan(const ModelConfig& c, int ranks, int ffn_unit) {
    const std::string flag = tp_flag(ranks);
    if (ranks < 1 || ranks > kMaxTpRanks)
        throw InputError(flag + ": expected a number of GPUs in [1, " + std::to_string(kMaxTpRanks) + "]");
    if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0)
        throw InputError(flag + ": the model's " + std::to_string(c.num_heads) + " attention heads are not a multiple of its " +
                         std::to_string(c.num_kv_heads) + " KV heads");
    if (c.num_kv_heads % ranks != 0)
        throw InputError(flag + ": the GPUs must divide the model's " + std::to_string(c.num_kv_heads) +
                         " KV heads (num_key_value_heads), so that each GPU owns whole KV-head groups; " +
                         std::to_string(ranks) + " does not");
    if (ffn_unit < 1 || c.intermediate_size % ffn_unit != 0)
        throw InputError(flag + ": the intermediate size " + std::to_string(c.intermediate_size) +
                         " is not a multiple of the split unit " + std::to_string(ffn_unit) + " (the int4 group size)");
    if (c.intermediate_size / ffn_unit < ranks)
        throw InputError(flag + ": the intermediate size " + std::to_string(c.intermediate_size) + " holds " +
                         std::to_string(c.intermediate_size / ffn_unit) + " units of " + std::to_string(ffn_unit) +
                         " rows, fewer than the " + std::to_string(ranks) + " GPUs");
    if (c.vocab_size < ranks)
        throw InputError(flag + ": the vocabulary of " + std::to_string(c.vocab_size) + " tokens is smaller than the " +
                         std::to_string(ranks) + " GPUs");
    TpPlan p;
    p.model = c;
    p.ranks = ranks;
    p.ffn_unit = ffn_unit;
    const int kv = c.num_kv_heads / ranks, group = c.group_size();
    for (int r = 0; r < ranks; ++r) {
        TpRank& k = p.rank.emplace_back();
        k.rank = r;
        k.kv_heads = {r * kv, kv};
        k.heads = {r * kv * group, kv * group};
        k.ffn = balanced(c.intermediate_size, ranks, r, ffn_unit);
        k.vocab = balanced(c.vocab_size, ranks, r);
    }
    return p;
}

size_t TpRankMemory::total() const { return weights + kv_cache + metadata + workspace; }

std::string TpRankMemory::describe() const {
    return "weights " + format_bytes(weights) + " + KV cache " + format_bytes(kv_cache) + " + page metadata " +
           format_bytes(metadata) + " + workspace " + format_bytes(workspace) + " = " + format_bytes(total());
}

std::vector<TpRankMemory> plan_tp_memory(const TpPlan& p, const QuestSettings& q, int capacity,
                                         const TpMemoryOptions& o) {
    const ModelConfig& c = p.model;
    const size_t H = z(c.hidden_size), D = z(c.head_dim), L = z(c.num_layers), V = z(c.vocab_size);
    const size_t S = z(q.page_size) ? z(q.page_size) : 1;
    const size_t pages = (z(capacity) + S - 1) / S, tokens = pages * S;
    size_t quest_layers = 0;
    for (int l = 0; l < c.num_layers; ++l) quest_layers += q.quest_layer(l) ? 1 : 0;
    // Bytes of a linear matrix [rows][cols] in the chosen storage (int4: cols in groups when the group divides them).
    auto linear = [&](size_t rows, size_t cols) -> size_t {
        const size_t g = z(o.group);
        if (o.weights == TpWeights::Int4 && g && cols % g == 0) return rows * cols / 2 + rows * (cols / g) * 4;
        return rows * cols * 2;
    };
    std::vector<TpRankMemory> out;
    for (const TpRank& r : p.rank) {
        const size_t qd = z(r.heads.count) * D, kv = z(r.kv_heads.count) * D, F = z(r.ffn.count), Vr = z(r.vocab.count);
        TpRankMemory m;
        const size_t per_layer = linear(qd + 2 * kv, H) + linear(H, qd) + linear(2 * F, H) + linear(H, F) +
                                 2 * H * 2 + (c.qkv_bias ? (qd + 2 * kv) * 2 : 0);
        m.weights = Vr * H * 2 * (c.tie_word_embeddings ? 1 : 2) + L * per_layer + H * 2;
        m.kv_cache = L * 2 * kv * tokens * 2;
        m.metadata = quest_layers * 2 * kv * pages * 2;
        // A prefill chunk's activations in fp16 (x, xn, the partial sum [n][H]; q, attention [n][qd]; k, v [n][kv];
        // gate, up [n][F]), the logits slice and the gathered logits in fp32, the all-reduce's [n][H] fp32 buffer.
        const size_t n = std::min(z(capacity), z(o.prefill_chunk));
        m.workspace = n * (3 * H + 2 * qd + 2 * kv + 2 * F) * 2 + (Vr + V) * 4 + n * H * 4 + kTpSlackBytes;
        out.push_back(m);
    }
    return out;
}

TpFit fit_tp_memory(const TpPlan& p, const QuestSettings& q, int capacity, size_t per_gpu, const TpMemoryOptions& o) {
    TpFit f;
    f.ranks = plan_tp_memory(p, q, capacity, o);
    const auto worst = std::max_element(f.ranks.begin(), f.ranks.end(),
                                        [](const TpRankMemory& a, const TpRankMemory& b) { return a.total() < b.total(); });
    if (worst->total() > per_gpu)
        f.refusal = tp_flag(p.ranks) + ": rank " + std::to_string(worst - f.ranks.begin()) + " needs " +
                    worst->describe() + " for a " + std::to_string(capacity) + "-token context, but a GPU holds " +
                    format_bytes(per_gpu);
    return f;
}

TpPlan choose_tp_layout(const ModelConfig& c, const QuestSettings& q, int capacity, size_t per_gpu, int max_gpus,
                        const TpMemoryOptions& o) {
    const int unit = o.weights == TpWeights::Int4 && o.group > 0 && c.intermediate_size % o.group == 0 ? o.group : 1;
    std::string tried;
    for (int n = 1; n <= std::min(max_gpus, kMaxTpRanks); ++n) {
        if (c.num_kv_heads % n != 0) continue;
        const TpPlan p = make_tp_plan(c, n, unit);
        const TpFit f = fit_tp_memory(p, q, capacity, per_gpu, o);
        if (f.fits()) return p;
        size_t need = 0;
        for (const TpRankMemory& m : f.ranks) need = std::max(need, m.total());
        tried += (tried.empty() ? "" : ", ") + tp_flag(n) + " " + format_bytes(need);
    }
    if (tried.empty())
        throw InputError("--tp: no number of GPUs up to " + std::to_string(max_gpus) + " divides the model's " +
                         std::to_string(c.num_kv_heads) + " KV heads");
    throw ResourceError("the model fits on no layout of at most " + std::to_string(max_gpus) + " GPUs of " +
                        format_bytes(per_gpu) + " with a " + std::to_string(capacity) +
                        "-token context: the largest rank needs " + tried + ". Lower the context with -c, or use 4-bit weights.");
}

}  // namespace quest
