#include "kernels/select/sparq.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/select/registry.h"
#include "kernels/select/sparq_rule.h"

namespace quest {

namespace {

int pages_of(int len, int page_size) { return (len + page_size - 1) / page_size; }
int group_of(const QuestSelectArgs& a) { return a.num_heads / a.num_kv_heads; }
const float* q_head(const QuestSelectArgs& a, int h) { return a.q + static_cast<int64_t>(h) * a.head_dim; }

// Page p's best token for head h of KV head kvh: max over its S tokens of the fp32 sum over `channels`
// (ascending) of q * e4m3(k).
float page_best(const QuestSelectArgs& a, int h, int kvh, const std::vector<int>& channels, int p) {
    const int D = a.head_dim, S = a.page_size;
    const float* q = q_head(a, h);
    const float* keys = a.keys + static_cast<int64_t>(kvh) * a.key_capacity * D;
    float best = -INFINITY;
    for (int j = 0; j < S; ++j) {
        const float* k = keys + (static_cast<int64_t>(p) * S + j) * D;
        float s = 0.0f;
        for (int c : channels) s = std::fma(q[c], sparq::e4m3_round(k[c]), s);
        best = std::max(best, s);
    }
    return best;
}

int rows_per_kv(const QuestSelectArgs& a) { return a.policy == GqaPolicy::PerHead ? group_of(a) : 1; }

}  // namespace

std::vector<int> sparq_channels_ref(const QuestSelectArgs& a, int kvh) {
    const int D = a.head_dim, G = group_of(a), r = sparq::channels(D, a.page_size);
    std::vector<float> w(D, 0.0f);
    for (int g = 0; g < G; ++g) {
        const float* q = q_head(a, kvh * G + g);
        for (int i = 0; i < D; ++i) w[i] += std::fabs(q[i]);
    }
    std::vector<int> order(D);
    for (int i = 0; i < D; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return w[x] > w[y]; });
    order.resize(r);
    std::sort(order.begin(), order.end());
    return order;
}

std::vector<float> sparq_page_scores_ref(const QuestSelectArgs& a, int h, int kvh, const std::vector<int>& channels,
                                         int n) {
    std::vector<float> u(n);
    for (int p = 0; p < n; ++p) u[p] = page_best(a, h, kvh, channels, p);
    return u;
}

std::vector<float> sparq_page_shares_ref(const std::vector<float>& scores, float scale) {
    std::vector<float> v(scores.size()), w(scores.size());
    float m = -INFINITY;
    for (size_t p = 0; p < scores.size(); ++p) m = std::max(m, v[p] = scale * scores[p]);
    float z = 0.0f;
    for (float x : v) z += std::exp(x - m);
    for (size_t p = 0; p < v.size(); ++p) w[p] = std::exp(v[p] - m) / z;
    return w;
}

int sparq_matched_pages(const QuestSelectArgs& a) {
    const int P = pages_of(a.len, a.page_size), last = P - 1;
    const int64_t rows = a.policy == GqaPolicy::PerHead ? group_of(a) : 1;
    return sparq::matched_pages(last, a.len - static_cast<int64_t>(last) * a.page_size, a.page_size, a.page_budget,
                                a.head_dim, rows);
}

namespace {

// sparq and sparq-rerank: rank every complete page on the chosen channels; with rerank, each row's top L of them
// again on all channels (sparq_rule.h).
void select(const QuestSelectArgs& a, Selection& out, bool rerank) {
    const int S = a.page_size, D = a.head_dim, P = pages_of(a.len, S), last = P - 1, G = group_of(a);
    out.block_size = S;
    const int n = !rerank && a.match_bytes ? sparq_matched_pages(a) : a.page_budget - 1;
    const int L = rerank ? sparq::rerank_pages(last, S, D, rows_per_kv(a), n) : 0;
    const int r = sparq::channels(D, S);
    out.reads.sketch_bytes = static_cast<int64_t>(a.num_kv_heads) *
                             (sparq::own_bytes(last, S, D) + static_cast<int64_t>(rows_per_kv(a)) * L * (D - r) * S);
    const bool values = sparq::rows_rank_values(a.policy == GqaPolicy::PerHead, G);
    std::vector<int> all(D);
    for (int c = 0; c < D; ++c) all[c] = c;
    // A head's row entries from its page values (best-token logits before the scale): v, or its shares.
    auto entries = [&](std::vector<float> best) {
        if (!values) return sparq_page_shares_ref(best, a.scale);
        for (float& x : best) x *= a.scale;
        return best;
    };
    auto aggregate = [&](const std::vector<std::vector<float>>& u) {  // the group's entries -> one row (kv-sum/max)
        std::vector<float> row = u[0];
        for (size_t g = 1; g < u.size(); ++g)
            for (size_t p = 0; p < row.size(); ++p)
                row[p] = a.policy == GqaPolicy::KvSum ? row[p] + u[g][p] : std::max(row[p], u[g][p]);
        return row;
    };
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) {
        const std::vector<int> ch = sparq_channels_ref(a, kvh);
        std::vector<std::vector<float>> u;
        for (int g = 0; g < G; ++g) u.push_back(entries(sparq_page_scores_ref(a, kvh * G + g, kvh, ch, last)));
        auto take = [&](const std::vector<float>& score, const std::vector<int>& heads) {
            std::vector<int> pages;
            if (L > 0) {
                const std::vector<int> shortlist = top_k_ref(score, L);
                std::vector<std::vector<float>> w;
                for (int h : heads) {
                    std::vector<float> best(L);
                    for (int i = 0; i < L; ++i) best[i] = page_best(a, h, kvh, all, shortlist[i]);
                    w.push_back(entries(std::move(best)));
                }
                for (int i : top_k_ref(aggregate(w), n)) pages.push_back(shortlist[i]);
            } else {
                pages = top_k_ref(score, n);
            }
            std::sort(pages.begin(), pages.end());
            pages.push_back(last);
            for (int h : heads) out.blocks[h] = pages;
            for (int p : pages) out.reads.kv_tokens += std::min(a.len, (p + 1) * S) - p * S;
            ++out.reads.rows;
        };
        std::vector<int> heads;
        for (int g = 0; g < G; ++g) heads.push_back(kvh * G + g);
        if (a.policy == GqaPolicy::PerHead) {
            for (int g = 0; g < G; ++g) take(u[g], {kvh * G + g});
        } else {
            take(aggregate(u), heads);
        }
    }
}

SelectionReads step_reads(const StepShape& s, bool rerank) {
    const int S = s.page_size, D = s.head_dim, P = pages_of(s.len, S), last = P - 1;
    const int64_t last_tokens = s.len - static_cast<int64_t>(last) * S;
    const int n = s.kv_pages - 1;  // K - 1, or bytes-matched sparq::matched_pages (codes::step_pages, sparq::budget)
    const int per_kv = s.rows / s.num_kv_heads;
    const int L = rerank ? sparq::rerank_pages(last, S, D, per_kv, n) : 0;
    SelectionReads r;
    r.sketch_bytes = static_cast<int64_t>(s.num_kv_heads) *
                     (sparq::own_bytes(last, S, D) + static_cast<int64_t>(per_kv) * L * (D - sparq::channels(D, S)) * S);
    r.kv_tokens = static_cast<int64_t>(s.rows) * (static_cast<int64_t>(n) * S + last_tokens);
    r.rows = s.rows;
    return r;
}

}  // namespace

void sparq_select_ref(const QuestSelectArgs& a, Selection& out) { select(a, out, false); }
void sparq_rerank_select_ref(const QuestSelectArgs& a, Selection& out) { select(a, out, true); }
SelectionReads sparq_step_reads(const StepShape& s) { return step_reads(s, false); }
SelectionReads sparq_rerank_step_reads(const StepShape& s) { return step_reads(s, true); }

}  // namespace quest
