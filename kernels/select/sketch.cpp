#include "kernels/select/sketch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "kernels/select/page_codes.h"
#include "kernels/select/registry.h"

namespace quest {

int SketchConfig::channels(int head_dim) const {
    return std::max(1, std::min(head_dim, head_dim * channel_num / channel_den - channel_less));
}
int SketchConfig::bytes_per_token(int head_dim) const { return (channels(head_dim) * bits + 7) / 8; }

SketchCalibration sketch_calibrate_ref(const float* keys, int tokens, int head_dim) {
    SketchCalibration c;
    c.mu.assign(head_dim, 0.0f);
    c.sd.assign(head_dim, 0.0f);
    std::vector<double> e(head_dim, 0.0);
    for (int i = 0; i < head_dim; ++i) {
        double s = 0, s2 = 0;
        for (int t = 0; t < tokens; ++t) {
            const double x = keys[static_cast<int64_t>(t) * head_dim + i];
            s += x, s2 += x * x;
        }
        const double m = tokens ? s / tokens : 0.0;
        const double v = tokens ? std::max(0.0, s2 / tokens - m * m) : 0.0;
        c.mu[i] = static_cast<float>(m);
        c.sd[i] = static_cast<float>(std::sqrt(v));
        e[i] = m * m + v;
    }
    c.order.resize(head_dim);
    std::iota(c.order.begin(), c.order.end(), 0);
    std::stable_sort(c.order.begin(), c.order.end(), [&](int x, int y) { return e[x] > e[y]; });
    return c;
}

// Lloyd-Max quantizers of a unit Gaussian (thresholds between the levels): 1 bit: +-0.7979; 2 bits: +-0.4528,
// +-1.5104 (thresholds 0, +-0.9816); 4 bits: the uniform 16-level quantizer of step 0.3352 (levels +-0.1676 ...
// +-2.5140), clamped at the ends.
float sketch_decode_ref(float x, float mu, float sd, int bits) {
    if (bits == 16) return x;
    if (sd <= 0.0f) return mu;
    const float z = (x - mu) / sd;
    float level;
    if (bits == 1) {
        level = z >= 0.0f ? 0.7979f : -0.7979f;
    } else if (bits == 2) {
        const float m = std::fabs(z) < 0.9816f ? 0.4528f : 1.5104f;
        level = z >= 0.0f ? m : -m;
    } else if (bits == 4) {
        const float step = 0.3352f;
        const int c = std::clamp(static_cast<int>(std::floor(z / step)) + 8, 0, 15);
        level = (static_cast<float>(c) - 7.5f) * step;
    } else {
        throw std::invalid_argument("sketch: bits must be 1, 2, 4 or 16");
    }
    return mu + sd * level;
}

void sketch_logits_ref(float* out, const float* q, const float* keys, int tokens, int head_dim,
                       const SketchCalibration& cal, const SketchConfig& cfg) {
    const int c = cfg.channels(head_dim);
    float base = 0.0f;  // the channels without a sketch decode to their mean
    for (int j = c; j < head_dim; ++j) base += q[cal.order[j]] * cal.mu[cal.order[j]];
    for (int t = 0; t < tokens; ++t) {
        const float* k = keys + static_cast<int64_t>(t) * head_dim;
        float s = base;
        for (int j = 0; j < c; ++j) {
            const int i = cal.order[j];
            s += q[i] * sketch_decode_ref(k[i], cal.mu[i], cal.sd[i], cfg.bits);
        }
        out[t] = s;
    }
}

int sketch_matched_pages(const QuestSelectArgs& a, int64_t ours) {
    const int P = (a.len + a.page_size - 1) / a.page_size, last = P - 1;
    const int64_t rows = a.policy == GqaPolicy::PerHead ? a.num_heads / a.num_kv_heads : 1;
    const int64_t last_tokens = a.len - static_cast<int64_t>(last) * a.page_size;
    return static_cast<int>(
        codes::matched_pages(last, last_tokens, a.page_size, a.page_budget, a.head_dim, ours, 1, rows));
}

namespace {

struct Shape {
    int P, last, c, tok_bytes;
    int64_t tables, write, bounds;  // per KV head
};
Shape shape_of(const SketchConfig& cfg, int len, int S, int D) {
    Shape s;
    s.P = (len + S - 1) / S;
    s.last = s.P - 1;
    s.c = cfg.channels(D);
    s.tok_bytes = cfg.bytes_per_token(D);
    s.tables = 5ll * s.c;
    s.write = s.tok_bytes;
    s.bounds = cfg.shortlist ? static_cast<int64_t>(s.last) * page_metadata_bytes(MetadataFormat::Int4, D) : 0;
    return s;
}

// Per KV head: (pages read besides the last, pages sketched, own bytes). The shortlist's size depends on n, so
// n is the largest count whose shortlist still leaves room for it.
struct Plan {
    int n = 0, sketched = 0;
    int64_t ours = 0;
};
Plan plan_of(const SketchConfig& cfg, const QuestSelectArgs& a) {
    const Shape s = shape_of(cfg, a.len, a.page_size, a.head_dim);
    const int64_t page_sketch = (static_cast<int64_t>(a.page_size) * s.c * cfg.bits + 7) / 8;  // packed per page
    Plan p;
    if (!cfg.shortlist) {
        p.sketched = s.last;
        p.ours = s.last * page_sketch + s.tables + s.write;
        p.n = sketch_matched_pages(a, p.ours);
        return p;
    }
    for (int n = s.last; n >= 0; --n) {
        const int sk = std::min(s.last, cfg.shortlist * n);
        const int64_t ours = s.bounds + sk * page_sketch + s.tables + s.write;
        if (sketch_matched_pages(a, ours) >= n || n == 0) {
            p.n = n, p.sketched = sk, p.ours = ours;
            return p;
        }
    }
    return p;
}

std::vector<float> aggregate(GqaPolicy policy, const std::vector<std::vector<float>>& per_head) {
    std::vector<float> out = per_head[0];
    for (size_t g = 1; g < per_head.size(); ++g)
        for (size_t i = 0; i < out.size(); ++i)
            out[i] = policy == GqaPolicy::KvSum ? out[i] + per_head[g][i] : std::max(out[i], per_head[g][i]);
    return out;
}

int tokens_in(int page, int S, int len) { return std::max(0, std::min(len, (page + 1) * S) - page * S); }

// Per-head page scores of the candidate pages `cand` (ascending) from the token logits s[t] of the head.
std::vector<float> page_scores(const std::vector<float>& s, const std::vector<int>& cand, int S, float scale, bool lse) {
    std::vector<float> out(cand.size());
    if (!lse) {
        for (size_t j = 0; j < cand.size(); ++j) {
            float m = -INFINITY;
            for (int t = cand[j] * S; t < (cand[j] + 1) * S; ++t) m = std::max(m, s[t]);
            out[j] = m;
        }
        return out;
    }
    float mx = -INFINITY;
    for (int p : cand)
        for (int t = p * S; t < (p + 1) * S; ++t) mx = std::max(mx, s[t]);
    double z = 0;
    std::vector<double> e(cand.size(), 0.0);
    for (size_t j = 0; j < cand.size(); ++j) {
        for (int t = cand[j] * S; t < (cand[j] + 1) * S; ++t) e[j] += std::exp(static_cast<double>(scale) * (s[t] - mx));
        z += e[j];
    }
    for (size_t j = 0; j < cand.size(); ++j) out[j] = static_cast<float>(e[j] / z);
    return out;
}

}  // namespace

void sketch_select_ref(const QuestSelectArgs& a, const SketchConfig& cfg, Selection& out) {
    if (!a.keys || a.key_capacity < a.len || (cfg.lse && a.scale <= 0.0f))
        throw std::invalid_argument("sketch: needs the keys (and the softmax scale for the lse score)");
    const int S = a.page_size, D = a.head_dim, P = (a.len + S - 1) / S, last = P - 1;
    const int group = a.num_heads / a.num_kv_heads;
    const Plan plan = plan_of(cfg, a);
    out.block_size = S;
    out.reads.sketch_bytes += static_cast<int64_t>(a.num_kv_heads) * plan.ours;
    std::vector<float> s(static_cast<size_t>(last) * S);
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) {
        const float* keys = a.keys + static_cast<int64_t>(kvh) * a.key_capacity * D;
        const SketchCalibration cal = sketch_calibrate_ref(keys, last * S, D);
        std::vector<std::vector<int>> row_heads;
        if (a.policy == GqaPolicy::PerHead)
            for (int g = 0; g < group; ++g) row_heads.push_back({kvh * group + g});
        else {
            row_heads.emplace_back();
            for (int g = 0; g < group; ++g) row_heads.back().push_back(kvh * group + g);
        }
        for (const auto& heads : row_heads) {
            std::vector<int> cand(last);
            std::iota(cand.begin(), cand.end(), 0);
            if (cfg.shortlist) {  // the int4 bound of every complete page, GQA-aggregated, top x * n
                std::vector<std::vector<float>> u;
                for (int h : heads) {
                    std::vector<float> uh(last);
                    for (int p = 0; p < last; ++p) {
                        const int64_t off = (static_cast<int64_t>(kvh) * a.page_capacity + p) * D;
                        uh[p] = page_score_int8_ref(a.q + static_cast<int64_t>(h) * D,
                                                    quantize_page_codes_ref(a.kmin + off, a.kmax + off, D, MetadataFormat::Int4));
                    }
                    u.push_back(std::move(uh));
                }
                cand = top_k_ref(aggregate(a.policy, u), plan.sketched);
            }
            std::vector<std::vector<float>> sc;
            for (int h : heads) {
                sketch_logits_ref(s.data(), a.q + static_cast<int64_t>(h) * D, keys, last * S, D, cal, cfg);
                sc.push_back(page_scores(s, cand, S, a.scale, cfg.lse));
            }
            std::vector<int> pick = top_k_ref(aggregate(a.policy, sc), plan.n);
            std::vector<int> pages;
            for (int j : pick) pages.push_back(cand[j]);
            std::sort(pages.begin(), pages.end());
            pages.push_back(last);
            for (int h : heads) out.blocks[h] = pages;
            for (int p : pages) out.reads.kv_tokens += tokens_in(p, S, a.len);
            ++out.reads.rows;
        }
    }
}

SelectionReads sketch_step_reads(const SketchConfig& cfg, int len, int page_size, int page_budget, int head_dim,
                                 int num_heads, int num_kv_heads, GqaPolicy policy) {
    QuestSelectArgs a;
    a.len = len, a.page_size = page_size, a.page_budget = page_budget, a.head_dim = head_dim;
    a.num_heads = num_heads, a.num_kv_heads = num_kv_heads, a.policy = policy;
    const Plan plan = plan_of(cfg, a);
    const int P = (len + page_size - 1) / page_size;
    SelectionReads r;
    r.rows = policy == GqaPolicy::PerHead ? num_heads : num_kv_heads;
    r.sketch_bytes = static_cast<int64_t>(num_kv_heads) * plan.ours;
    r.kv_tokens = static_cast<int64_t>(r.rows) *
                  (static_cast<int64_t>(plan.n) * page_size + (len - static_cast<int64_t>(P - 1) * page_size));
    return r;
}

// ---------------------------------------------------------------- the registered variants

namespace {

// name, config. c = D * num / den - less: one channel fewer than the share named, so that the tables and the
// append write fit in the bytes the dropped channel frees (the step never reads more than fp16 Quest).
struct Variant {
    const char* name;
    const char* help;
    SketchConfig cfg;
};
const Variant kVariants[] = {
    {"sketch2", "2-bit key sketch of D-1 channels per token, page = max token (CPU)", {2, 1, 1, 1, false, 0}},
    {"sketch2-lse", "2-bit key sketch of D-1 channels, page = estimated softmax share (CPU)", {2, 1, 1, 1, true, 0}},
    {"sketch1-lse", "1-bit key sketch of D channels (half Quest's metadata), softmax share (CPU)", {1, 1, 1, 0, true, 0}},
    {"sketch4h-lse", "4-bit key sketch of D/2-1 channels by energy, softmax share (CPU)", {4, 1, 2, 1, true, 0}},
    {"sketch16c-lse", "fp16 values of D/8-1 channels by energy, softmax share (CPU)", {16, 1, 8, 1, true, 0}},
    {"rerank4", "int4 bounds shortlist 4x, 4-bit sketch of D channels re-ranks, softmax share (CPU)", {4, 1, 1, 0, true, 4}},
    {"rerank2", "int4 bounds shortlist 4x, 2-bit sketch of D channels re-ranks, softmax share (CPU)", {2, 1, 1, 0, true, 4}},
    {"rerank-exact", "int4 bounds shortlist 2x, the shortlist's fp16 keys re-rank by true share (CPU)", {16, 1, 1, 0, true, 2}},
};

template <int I>
void select_variant(const QuestSelectArgs& a, Selection& out) {
    sketch_select_ref(a, kVariants[I].cfg, out);
}
template <int I>
SelectionReads reads_variant(const StepShape& s) {
    return sketch_step_reads(kVariants[I].cfg, s.len, s.page_size, s.page_budget, s.head_dim, s.num_heads,
                             s.num_kv_heads, s.policy);
}
template <int... I>
void append_all(std::vector<PageSelectorDef>& defs, std::integer_sequence<int, I...>) {
    (defs.push_back(PageSelectorDef{kVariants[I].name, kVariants[I].help, 0, select_variant<I>, reads_variant<I>}), ...);
}

}  // namespace

const SketchConfig* sketch_config_of(std::string_view name) {
    for (const auto& v : kVariants)
        if (name == v.name) return &v.cfg;
    return nullptr;
}

void append_sketch_selectors(std::vector<PageSelectorDef>& defs) {
    append_all(defs, std::make_integer_sequence<int, static_cast<int>(std::size(kVariants))>{});
}

}  // namespace quest
