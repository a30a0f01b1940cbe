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
    const int D = a.head_dim, S = a.page_size;
    const float* q = q_head(a, h);
    const float* keys = a.keys + static_cast<int64_t>(kvh) * a.key_capacity * D;
    std::vector<float> u(n);
    for (int p = 0; p < n; ++p) {
        float best = -INFINITY;
        for (int j = 0; j < S; ++j) {
            const float* k = keys + (static_cast<int64_t>(p) * S + j) * D;
            float s = 0.0f;
            for (int c : channels) s = std::fma(q[c], sparq::e4m3_round(k[c]), s);
            best = std::max(best, s);
        }
        u[p] = best;
    }
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

void sparq_select_ref(const QuestSelectArgs& a, Selection& out) {
    const int S = a.page_size, P = pages_of(a.len, S), last = P - 1, G = group_of(a);
    out.block_size = S;
    out.reads.sketch_bytes = static_cast<int64_t>(a.num_kv_heads) * sparq::own_bytes(last, S, a.head_dim);
    const int n = a.match_bytes ? sparq_matched_pages(a) : a.page_budget - 1;
    const bool values = sparq::rows_rank_values(a.policy == GqaPolicy::PerHead, G);
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) {
        const std::vector<int> ch = sparq_channels_ref(a, kvh);
        std::vector<std::vector<float>> u;
        for (int g = 0; g < G; ++g) {
            std::vector<float> score = sparq_page_scores_ref(a, kvh * G + g, kvh, ch, last);
            if (values) {
                for (float& x : score) x *= a.scale;  // v
                u.push_back(std::move(score));
            } else {
                u.push_back(sparq_page_shares_ref(score, a.scale));
            }
        }
        auto take = [&](const std::vector<float>& score, const std::vector<int>& heads) {
            std::vector<int> pages = top_k_ref(score, n);
            std::sort(pages.begin(), pages.end());
            pages.push_back(last);
            for (int h : heads) out.blocks[h] = pages;
            for (int p : pages) out.reads.kv_tokens += std::min(a.len, (p + 1) * S) - p * S;
            ++out.reads.rows;
        };
        if (a.policy == GqaPolicy::PerHead) {
            for (int g = 0; g < G; ++g) take(u[g], {kvh * G + g});
        } else {
            std::vector<float> row = u[0];
            for (int g = 1; g < G; ++g)
                for (int p = 0; p < last; ++p)
                    row[p] = a.policy == GqaPolicy::KvSum ? row[p] + u[g][p] : std::max(row[p], u[g][p]);
            std::vector<int> heads;
            for (int g = 0; g < G; ++g) heads.push_back(kvh * G + g);
            take(row, heads);
        }
    }
}

SelectionReads sparq_step_reads(const StepShape& s) {
    const int S = s.page_size, P = pages_of(s.len, S), last = P - 1;
    const int64_t last_tokens = s.len - static_cast<int64_t>(last) * S;
    const int n = s.kv_pages - 1;  // K - 1, or bytes-matched sparq::matched_pages (codes::step_pages, sparq::budget)
    SelectionReads r;
    r.sketch_bytes = static_cast<int64_t>(s.num_kv_heads) * sparq::own_bytes(last, S, s.head_dim);
    r.kv_tokens = static_cast<int64_t>(s.rows) * (static_cast<int64_t>(n) * S + last_tokens);
    r.rows = s.rows;
    return r;
}

}  // namespace quest
