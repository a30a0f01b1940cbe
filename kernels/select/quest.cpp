#include "kernels/select/quest.h"

#include "kernels/attention/attention.h"
#include "kernels/select/page_codes.h"
#include "kernels/select/registry.h"
#include "kernels/select/sparq_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>

namespace quest {

void page_scores_ref(float* scores, const float* q, const float* kmin, const float* kmax, int num_pages,
                     int head_dim) {
    for (int p = 0; p < num_pages; ++p) {
        const float* mn = kmin + static_cast<int64_t>(p) * head_dim;
        const float* mx = kmax + static_cast<int64_t>(p) * head_dim;
        float u = 0.0f;
        for (int i = 0; i < head_dim; ++i) u += std::max(q[i] * mn[i], q[i] * mx[i]);
        scores[p] = u;
    }
}

std::vector<int> ranking_ref(const float* scores, int n) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a < b; });
    return idx;
}

std::vector<int> top_k_ref(const float* scores, int n, int k) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    if (k >= n) return idx;
    if (k <= 0) return {};
    // Higher score first; equal scores: lower index first. A strict weak order, so the result is unique.
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
    });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
}

void page_metadata_update_ref(float* kmin, float* kmax, const float* key, int head_dim, bool first) {
    for (int i = 0; i < head_dim; ++i) {
        kmin[i] = first ? key[i] : std::min(kmin[i], key[i]);
        kmax[i] = first ? key[i] : std::max(kmax[i], key[i]);
    }
}


// ---------------------------------------------------------------- quantized bounds

Int8Page quantize_page_int8_ref(const float* kmin, const float* kmax, int head_dim) {
    return quantize_page_codes_ref(kmin, kmax, head_dim, MetadataFormat::Int8);
}

Int8Page quantize_page_codes_ref(const float* kmin, const float* kmax, int head_dim, MetadataFormat f) {
    // The rule lives in kernels/select/page_codes.h, shared with the GPU quantizer (bit-identical codes and scales).
    const int qmax = codes::code_max(f == MetadataFormat::Int4);
    Int8Page p;
    p.cmin.assign(head_dim, 0);
    p.cmax.assign(head_dim, 0);
    float amax = 0.0f;
    for (int i = 0; i < head_dim; ++i) amax = std::max({amax, std::abs(kmin[i]), std::abs(kmax[i])});
    p.scale = codes::code_scale(amax, qmax);  // 0 for an all-zero page: codes 0 decode exactly
    for (int i = 0; i < head_dim; ++i) {
        p.cmin[i] = static_cast<int8_t>(codes::code_floor(kmin[i], p.scale, qmax));
        p.cmax[i] = static_cast<int8_t>(codes::code_ceil(kmax[i], p.scale, qmax));
    }
    return p;
}

float page_score_int8_ref(const float* q, const Int8Page& p) {
    // Channel order from +0, then the scale (codes::code_term; the GPU kernel reproduces these bits for fp16 q).
    float u = 0.0f;
    for (size_t i = 0; i < p.cmin.size(); ++i) u += codes::code_term(q[i], p.cmin[i], p.cmax[i]);
    return u * p.scale;
}

float sub_page_decode_u8(uint8_t code, float lo, float hi) {
    if (code == 255) return hi;
    return lo + static_cast<float>(code) * ((hi - lo) / 255.0f);
}

void quantize_sub_page_u8_ref(uint8_t* cmin, uint8_t* cmax, const float* kmin, const float* kmax, const float* lo,
                              const float* hi, int head_dim) {
    for (int i = 0; i < head_dim; ++i) {
        const float step = (hi[i] - lo[i]) / 255.0f;
        int a = 0, b = 255;
        if (step > 0.0f) {
            a = std::clamp(static_cast<int>(std::floor((kmin[i] - lo[i]) / step)), 0, 255);
            b = std::clamp(static_cast<int>(std::ceil((kmax[i] - lo[i]) / step)), 0, 255);
        }
        while (a > 0 && sub_page_decode_u8(static_cast<uint8_t>(a), lo[i], hi[i]) > kmin[i]) --a;
        while (b < 255 && sub_page_decode_u8(static_cast<uint8_t>(b), lo[i], hi[i]) < kmax[i]) ++b;
        cmin[i] = static_cast<uint8_t>(a);
        cmax[i] = static_cast<uint8_t>(b);
    }
}

float sub_page_score_u8_ref(const float* q, const uint8_t* cmin, const uint8_t* cmax, const float* lo,
                            const float* hi, int head_dim) {
    float u = 0.0f;
    for (int i = 0; i < head_dim; ++i)
        u += std::max(q[i] * sub_page_decode_u8(cmin[i], lo[i], hi[i]), q[i] * sub_page_decode_u8(cmax[i], lo[i], hi[i]));
    return u;
}

// ---------------------------------------------------------------- the adaptive budget

double estimated_mass(int n, float u, float scale, float shift) {
    return static_cast<double>(n) * std::exp(static_cast<double>(scale) * u - shift);
}

int adaptive_prefix_ref(const std::vector<int>& order, const std::vector<std::vector<double>>& est,
                        const std::vector<double>& fixed, const std::vector<double>& total, double target, int max_n) {
    const int n_max = std::min<int>(max_n, static_cast<int>(order.size()));
    std::vector<double> acc = fixed;
    auto reached = [&]() {
        for (size_t g = 0; g < acc.size(); ++g)
            if (acc[g] < target * total[g]) return false;
        return true;
    };
    int n = 0;
    while (n < n_max && !reached()) {
        for (size_t g = 0; g < acc.size(); ++g) acc[g] += est[g][order[n]];
        ++n;
    }
    return n;
}

// ---------------------------------------------------------------- the policies

namespace {

void check_args(const QuestSelectArgs& a) {
    if (a.len < 1 || a.page_size < 1 || a.page_budget < 1 || a.num_kv_heads < 1 || a.head_dim < 1 ||
        a.num_heads % a.num_kv_heads)
        throw std::invalid_argument("select: invalid arguments");
    if (a.selector == PageSelector::Oracle && (!a.keys || a.key_capacity < a.len || a.scale <= 0.0f))
        throw std::invalid_argument("select: the oracle needs the keys and the softmax scale");
    if (a.selector == PageSelector::Sparq && (!a.keys || a.key_capacity < a.len || a.scale <= 0.0f))
        throw std::invalid_argument("select: sparq needs the keys (its sketch is made from them) and the softmax scale");
    if (a.selector == PageSelector::Sparq && !sparq::supported(a.head_dim, a.page_size))
        throw std::invalid_argument("select: sparq needs head_dim a multiple of 8 and at least half the page size");
    if (a.mass_target < 0.0f || a.mass_target > 1.0f || (a.mass_target > 0.0f && a.scale <= 0.0f))
        throw std::invalid_argument("select: mass_target must be in [0, 1] and needs the softmax scale");
    if (a.selector == PageSelector::TwoLevel &&
        (!a.sub_kmin || !a.sub_kmax || a.sub_page < 1 || a.sub_page >= a.page_size || a.page_size % a.sub_page ||
         a.shortlist < 1 || a.sub_capacity * a.sub_page < a.len))
        throw std::invalid_argument("select: two-level needs sub-page metadata, a sub-page size dividing the page "
                                    "size, and a shortlist factor >= 1");
}

// A selection row: the KV head whose pages it reads and the query heads that share its page set.
struct Row {
    int kvh;
    std::vector<int> heads;
};
std::vector<Row> selection_rows(const QuestSelectArgs& a) {
    const int group = a.num_heads / a.num_kv_heads;
    std::vector<Row> rows;
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) {
        if (a.policy == GqaPolicy::PerHead) {
            for (int g = 0; g < group; ++g) rows.push_back({kvh, {kvh * group + g}});
        } else {
            Row r{kvh, {}};
            for (int g = 0; g < group; ++g) r.heads.push_back(kvh * group + g);
            rows.push_back(std::move(r));
        }
    }
    return rows;
}

// The row score of each item from the per-head scores [heads][n] (kv-max: max, kv-sum: sum in head order,
// per-head: the one head's).
std::vector<float> aggregate(const QuestSelectArgs& a, const std::vector<std::vector<float>>& per_head) {
    std::vector<float> out = per_head[0];
    for (size_t g = 1; g < per_head.size(); ++g)
        for (size_t i = 0; i < out.size(); ++i)
            out[i] = a.policy == GqaPolicy::KvSum ? out[i] + per_head[g][i] : std::max(out[i], per_head[g][i]);
    return out;
}

const float* q_of(const QuestSelectArgs& a, int h) { return a.q + static_cast<int64_t>(h) * a.head_dim; }
const float* page_min(const QuestSelectArgs& a, int kvh, int p) {
    return a.kmin + (static_cast<int64_t>(kvh) * a.page_capacity + p) * a.head_dim;
}
const float* page_max(const QuestSelectArgs& a, int kvh, int p) {
    return a.kmax + (static_cast<int64_t>(kvh) * a.page_capacity + p) * a.head_dim;
}

// The page's coarse range as the selector reads it: exact (fp16 metadata: the keys' own values), or the int8 codes
// decoded (enclosing the exact range).
void page_range(const QuestSelectArgs& a, int kvh, int p, std::vector<float>& lo, std::vector<float>& hi) {
    const float* mn = page_min(a, kvh, p);
    const float* mx = page_max(a, kvh, p);
    lo.assign(mn, mn + a.head_dim);
    hi.assign(mx, mx + a.head_dim);
    if (a.metadata != MetadataFormat::Fp16) {
        const Int8Page c = quantize_page_codes_ref(mn, mx, a.head_dim, a.metadata);
        for (int i = 0; i < a.head_dim; ++i) {
            lo[i] = static_cast<float>(c.cmin[i]) * c.scale;
            hi[i] = static_cast<float>(c.cmax[i]) * c.scale;
        }
    }
}

// Bounds of pages [0, n) for query head h, in the metadata format.
std::vector<float> page_bounds(const QuestSelectArgs& a, int h, int kvh, int n) {
    std::vector<float> u(n);
    if (a.metadata == MetadataFormat::Fp16) {
        const int64_t off = static_cast<int64_t>(kvh) * a.page_capacity * a.head_dim;
        page_scores_ref(u.data(), q_of(a, h), a.kmin + off, a.kmax + off, n, a.head_dim);
    } else {
        for (int p = 0; p < n; ++p)
            u[p] = page_score_int8_ref(q_of(a, h),
                                       quantize_page_codes_ref(page_min(a, kvh, p), page_max(a, kvh, p), a.head_dim, a.metadata));
    }
    return u;
}

int num_pages_of(const QuestSelectArgs& a) { return (a.len + a.page_size - 1) / a.page_size; }
int tokens_in(int block, int block_size, int len) { return std::max(0, std::min(len, (block + 1) * block_size) - block * block_size); }

void assign_row(const Row& r, const std::vector<int>& blocks, int block_size, int len, Selection& out) {
    for (int h : r.heads) out.blocks[h] = blocks;
    for (int b : blocks) out.reads.kv_tokens += tokens_in(b, block_size, len);
    ++out.reads.rows;
}

// Top-n of the row's ranking (adaptive prefix with mass_target) for n_max items.
// est_per_head[g][c]: estimated masses; fixed/total per head; returns the chosen item ids (unsorted).
std::vector<int> choose(const QuestSelectArgs& a, const std::vector<float>& row_score, int n_max,
                        const std::vector<std::vector<double>>* est, const std::vector<double>* fixed,
                        const std::vector<double>* total) {
    std::vector<int> order = ranking_ref(row_score.data(), static_cast<int>(row_score.size()));
    int n = std::min<int>(n_max, static_cast<int>(order.size()));
    if (a.mass_target > 0.0f) n = adaptive_prefix_ref(order, *est, *fixed, *total, a.mass_target, n);
    order.resize(n);
    return order;
}

}  // namespace

int quest_matched_pages(const QuestSelectArgs& a) {
    // The formula lives in kernels/select/page_codes.h, shared with the GPU's device-side page count.
    const int P = num_pages_of(a), last = P - 1, S = a.page_size;
    const int group = a.num_heads / a.num_kv_heads;
    const int64_t rows = a.policy == GqaPolicy::PerHead ? group : 1;
    const int64_t last_tokens = a.len - static_cast<int64_t>(last) * S;
    return static_cast<int>(codes::matched_pages(last, last_tokens, S, a.page_budget, a.head_dim,
                                                 page_metadata_bytes(a.metadata, a.head_dim),
                                                 a.mass_target > 0.0f ? P : last, rows));
}

codes::MatchedBudget matched_budget(MetadataFormat f, int head_dim, int num_heads, int num_kv_heads, GqaPolicy policy) {
    codes::MatchedBudget m;
    m.meta_bytes = static_cast<int>(page_metadata_bytes(f, head_dim));
    m.head_dim = head_dim;
    m.rows = policy == GqaPolicy::PerHead && num_kv_heads > 0 ? num_heads / num_kv_heads : 1;
    return m;
}

void quest_policy_ref(const QuestSelectArgs& a, Selection& out) {
    const int P = num_pages_of(a), last = P - 1, S = a.page_size;
    const bool adaptive = a.mass_target > 0.0f;
    out.block_size = S;
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) out.reads.pages_scored += adaptive ? P : last;  // metadata once per KV head
    for (const Row& r : selection_rows(a)) {
        // Per head: bounds of the complete pages (and the last page, for the adaptive estimate).
        std::vector<std::vector<float>> u;
        for (int h : r.heads) u.push_back(page_bounds(a, h, r.kvh, adaptive ? P : last));
        std::vector<std::vector<double>> est;
        std::vector<double> fixed, total;
        if (adaptive) {
            for (auto& uh : u) {
                const float shift = a.scale * *std::max_element(uh.begin(), uh.end());
                std::vector<double> e(last);
                double t = 0;
                for (int p = 0; p < last; ++p) t += e[p] = estimated_mass(S, uh[p], a.scale, shift);
                const double f = estimated_mass(tokens_in(last, S, a.len), uh[last], a.scale, shift);
                est.push_back(std::move(e));
                fixed.push_back(f);
                total.push_back(t + f);
                uh.resize(last);
            }
        }
        const int n_pages = a.match_bytes ? quest_matched_pages(a) : a.page_budget - 1;
        std::vector<int> pages = choose(a, aggregate(a, u), n_pages, &est, &fixed, &total);
        std::sort(pages.begin(), pages.end());
        pages.push_back(last);
        assign_row(r, pages, S, a.len, out);
    }
}

void streaming_policy_ref(const QuestSelectArgs& a, Selection& out) {
    const int P = num_pages_of(a);
    out.block_size = a.page_size;
    std::vector<int> pages;
    if (a.page_budget >= 2) pages.push_back(0);
    for (int p = std::max(1, P - (a.page_budget - static_cast<int>(pages.size()))); p < P; ++p) pages.push_back(p);
    for (const Row& r : selection_rows(a)) assign_row(r, pages, a.page_size, a.len, out);
}

void oracle_policy_ref(const QuestSelectArgs& a, Selection& out) {
    const int P = num_pages_of(a), last = P - 1;
    out.block_size = a.page_size;
    out.reads.keys_scanned = static_cast<int64_t>(a.len) * a.num_kv_heads;
    std::vector<float> mass(P);
    for (const Row& r : selection_rows(a)) {
        std::vector<std::vector<float>> m;
        for (int h : r.heads) {
            attention_page_mass_ref(mass.data(), q_of(a, h), a.keys + static_cast<int64_t>(r.kvh) * a.key_capacity * a.head_dim,
                                    a.head_dim, a.len, a.page_size, a.scale);
            m.emplace_back(mass.begin(), mass.begin() + last);
        }
        std::vector<int> pages = top_k_ref(aggregate(a, m), a.page_budget - 1);
        pages.push_back(last);
        assign_row(r, pages, a.page_size, a.len, out);
    }
}

TwoLevelBudget two_level_budget(const QuestSelectArgs& a) {
    const int P = num_pages_of(a), last = P - 1, S = a.page_size, s = a.sub_page, per_page = S / s;
    TwoLevelBudget b;
    b.shortlist_pages = std::max(0, std::min(last, a.shortlist * (a.page_budget - 1)));
    b.sub_pages = (a.page_budget - 1) * per_page;
    if (!a.match_bytes) return b;
    const int group = a.num_heads / a.num_kv_heads;
    const int64_t rows = a.policy == GqaPolicy::PerHead ? group : 1;  // rows sharing one KV head's metadata
    const int64_t kv_token = 4ll * a.head_dim, last_tokens = a.len - static_cast<int64_t>(last) * S;
    const int64_t meta = page_metadata_bytes(a.metadata, a.head_dim);
    // Quest's bytes for this KV head at this step (fp16 metadata of the complete pages, K pages per row).
    const int64_t quest = static_cast<int64_t>(last) * page_metadata_bytes(MetadataFormat::Fp16, a.head_dim) +
                          rows * (static_cast<int64_t>(a.page_budget - 1) * S + last_tokens) * kv_token;
    const int64_t coarse = static_cast<int64_t>(a.mass_target > 0.0f ? P : last) * meta;
    // The bytes left for the selected sub-pages with n pages shortlisted (each re-read with its sub-page codes).
    auto left = [&](int64_t n) { return quest - coarse - rows * (n * (meta + per_page * 2ll * a.head_dim) + last_tokens * kv_token); };
    while (b.shortlist_pages > 0 && left(b.shortlist_pages) < 0) --b.shortlist_pages;
    const int64_t l = left(b.shortlist_pages);
    const int64_t n = l <= 0 ? 0 : l / rows / (static_cast<int64_t>(s) * kv_token);
    b.sub_pages = static_cast<int>(std::min<int64_t>(n, static_cast<int64_t>(b.shortlist_pages) * per_page));
    return b;
}

void two_level_select_ref(const QuestSelectArgs& a, Selection& out) {
    const int P = num_pages_of(a), last = P - 1, S = a.page_size, s = a.sub_page, per_page = S / s;
    const bool adaptive = a.mass_target > 0.0f;
    out.block_size = s;
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) out.reads.pages_scored += adaptive ? P : last;
    const TwoLevelBudget budget = two_level_budget(a);
    const int shortlist_n = budget.shortlist_pages;
    std::vector<float> lo, hi;
    std::vector<uint8_t> cmin(a.head_dim), cmax(a.head_dim);
    for (const Row& r : selection_rows(a)) {
        std::vector<std::vector<float>> u;
        for (int h : r.heads) u.push_back(page_bounds(a, h, r.kvh, adaptive ? P : last));
        std::vector<std::vector<float>> u_complete = u;
        for (auto& uh : u_complete) uh.resize(last);
        std::vector<int> shortlist = top_k_ref(aggregate(a, u_complete), shortlist_n);
        out.reads.shortlist_pages += static_cast<int64_t>(shortlist.size());
        out.reads.sub_pages_scored += static_cast<int64_t>(shortlist.size()) * per_page;
        // Sub-page bounds of the shortlisted pages, per head: item c is sub-page c % per_page of page shortlist[c / per_page].
        const int items = static_cast<int>(shortlist.size()) * per_page;
        std::vector<std::vector<float>> f(r.heads.size(), std::vector<float>(items));
        for (size_t j = 0; j < shortlist.size(); ++j) {
            const int p = shortlist[j];
            page_range(a, r.kvh, p, lo, hi);
            for (int k = 0; k < per_page; ++k) {
                const int64_t sp = static_cast<int64_t>(r.kvh) * a.sub_capacity + static_cast<int64_t>(p) * per_page + k;
                quantize_sub_page_u8_ref(cmin.data(), cmax.data(), a.sub_kmin + sp * a.head_dim, a.sub_kmax + sp * a.head_dim,
                                         lo.data(), hi.data(), a.head_dim);
                for (size_t g = 0; g < r.heads.size(); ++g)
                    f[g][j * per_page + k] = sub_page_score_u8_ref(q_of(a, r.heads[g]), cmin.data(), cmax.data(), lo.data(),
                                                                   hi.data(), a.head_dim);
            }
        }
        std::vector<std::vector<double>> est;
        std::vector<double> fixed, total;
        if (adaptive) {
            std::vector<bool> listed(last, false);
            for (int p : shortlist) listed[p] = true;
            for (size_t g = 0; g < r.heads.size(); ++g) {
                float m = u[g][last];
                for (int p = 0; p < last; ++p) if (!listed[p]) m = std::max(m, u[g][p]);
                for (float x : f[g]) m = std::max(m, x);
                const float shift = a.scale * m;
                std::vector<double> e(items);
                double t = 0;
                for (int c = 0; c < items; ++c) t += e[c] = estimated_mass(s, f[g][c], a.scale, shift);
                for (int p = 0; p < last; ++p) if (!listed[p]) t += estimated_mass(S, u[g][p], a.scale, shift);
                const double fx = estimated_mass(tokens_in(last, S, a.len), u[g][last], a.scale, shift);
                est.push_back(std::move(e));
                fixed.push_back(fx);
                total.push_back(t + fx);
            }
        }
        const std::vector<int> chosen = choose(a, aggregate(a, f), budget.sub_pages, &est, &fixed, &total);
        std::vector<int> blocks;
        for (int c : chosen) blocks.push_back(shortlist[c / per_page] * per_page + c % per_page);
        std::sort(blocks.begin(), blocks.end());
        for (int b = last * per_page; b * s < a.len; ++b) blocks.push_back(b);  // the last page's sub-pages
        assign_row(r, blocks, s, a.len, out);
    }
}

void select_blocks_ref(const QuestSelectArgs& args, Selection& out) {
    check_args(args);
    if (args.window_start < 0 || args.window_start >= args.len)
        throw std::invalid_argument("select: window_start must be in [0, len)");
    // The window's pages renumbered from 0: page f (holding window_start) becomes page 0.
    const int f = args.window_start / args.page_size;
    const int64_t skip = static_cast<int64_t>(f) * args.page_size;
    QuestSelectArgs a = args;
    if (f > 0) {
        a.len -= static_cast<int>(skip);
        a.window_start -= static_cast<int>(skip);
        a.kmin += static_cast<int64_t>(f) * a.head_dim;
        a.kmax += static_cast<int64_t>(f) * a.head_dim;
        if (a.keys) a.keys += skip * a.head_dim;
        if (a.sub_page > 0 && a.sub_kmin) {
            a.sub_kmin += skip / a.sub_page * a.head_dim;
            a.sub_kmax += skip / a.sub_page * a.head_dim;
        }
    }
    const int P = num_pages_of(a);
    out = Selection{};
    out.blocks.assign(a.num_heads, {});
    if (P <= a.page_budget) {  // dense step: every page
        out.block_size = a.page_size;
        for (auto& s : out.blocks) {
            s.resize(P);
            std::iota(s.begin(), s.end(), 0);
        }
        out.reads = dense_reads(a.len, a.num_kv_heads);
    } else {
        page_selector_def(a.selector).select_cpu(a, out);
    }
    // The masked head of the window's first page is not read: per selection row that lists its blocks.
    const int off = a.window_start, bs = out.block_size;
    if (off > 0) {
        const int group = a.num_heads / a.num_kv_heads;
        const int stride = out.reads.dense || a.policy != GqaPolicy::PerHead ? group : 1;
        for (int h = 0; h < a.num_heads; h += stride)
            for (int b : out.blocks[h])
                if (b * bs < off) out.reads.kv_tokens -= std::min(off, (b + 1) * bs) - b * bs;
    }
    if (f > 0) {
        const int shift = static_cast<int>(skip / bs);
        for (auto& blocks : out.blocks)
            for (int& b : blocks) b += shift;
    }
}

void quest_select_ref(const QuestSelectArgs& a, std::vector<std::vector<int>>& selected) {
    if (a.selector == PageSelector::TwoLevel)
        throw std::invalid_argument("quest_select_ref: two-level selects sub-pages; use select_blocks_ref");
    Selection s;
    select_blocks_ref(a, s);
    selected = std::move(s.blocks);
}

}  // namespace quest

