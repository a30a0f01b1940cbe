#include "kernels/quest.h"

#include "kernels/attention.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>

namespace quest {

std::string_view gqa_policy_name(GqaPolicy p) {
    switch (p) {
        case GqaPolicy::KvMax: return "kv-max";
        case GqaPolicy::KvSum: return "kv-sum";
        case GqaPolicy::PerHead: return "per-head";
    }
    return "?";
}

bool gqa_policy_from_name(std::string_view s, GqaPolicy& out) {
    for (GqaPolicy p : {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead})
        if (s == gqa_policy_name(p)) {
            out = p;
            return true;
        }
    return false;
}

std::string_view page_selector_name(PageSelector s) {
    switch (s) {
        case PageSelector::Quest: return "quest";
        case PageSelector::Streaming: return "streaming";
        case PageSelector::Oracle: return "oracle";
    }
    return "?";
}

bool page_selector_from_name(std::string_view name, PageSelector& out) {
    for (PageSelector s : {PageSelector::Quest, PageSelector::Streaming, PageSelector::Oracle})
        if (name == page_selector_name(s)) {
            out = s;
            return true;
        }
    return false;
}

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

void quest_select_ref(const QuestSelectArgs& a, std::vector<std::vector<int>>& selected) {
    if (a.len < 1 || a.page_size < 1 || a.page_budget < 1 || a.num_kv_heads < 1 || a.num_heads % a.num_kv_heads)
        throw std::invalid_argument("quest_select_ref: invalid arguments");
    if (a.selector == PageSelector::Oracle && (!a.keys || a.key_capacity < a.len || a.scale <= 0.0f))
        throw std::invalid_argument("quest_select_ref: the oracle needs the keys and the softmax scale");
    const int num_pages = (a.len + a.page_size - 1) / a.page_size;
    const int last = num_pages - 1;
    selected.assign(a.num_heads, {});
    if (num_pages <= a.page_budget) {  // dense step: every page
        for (auto& s : selected) {
            s.resize(num_pages);
            std::iota(s.begin(), s.end(), 0);
        }
        return;
    }
    if (a.selector == PageSelector::Streaming) {  // the first page, then the most recent ones
        std::vector<int> pages;
        if (a.page_budget >= 2) pages.push_back(0);
        for (int p = std::max(1, num_pages - (a.page_budget - static_cast<int>(pages.size()))); p < num_pages; ++p)
            pages.push_back(p);
        for (auto& s : selected) s = pages;
        return;
    }
    // Candidates are the complete pages before the last one.
    const int candidates = last;
    const int group = a.num_heads / a.num_kv_heads;
    std::vector<float> scores(candidates), head_scores(candidates), mass;
    // Score of each candidate page for query head h: Quest's bound, or the true softmax mass (oracle).
    auto score_head = [&](int h, int kvh) {
        const float* q = a.q + static_cast<int64_t>(h) * a.head_dim;
        if (a.selector == PageSelector::Quest) {
            const int64_t meta_off = static_cast<int64_t>(kvh) * a.page_capacity * a.head_dim;
            page_scores_ref(head_scores.data(), q, a.kmin + meta_off, a.kmax + meta_off, candidates, a.head_dim);
        } else {
            mass.resize(num_pages);
            attention_page_mass_ref(mass.data(), q, a.keys + static_cast<int64_t>(kvh) * a.key_capacity * a.head_dim,
                                    a.head_dim, a.len, a.page_size, a.scale);
            std::copy(mass.begin(), mass.begin() + candidates, head_scores.begin());
        }
    };
    auto finish = [&](std::vector<int> pages) {
        pages.push_back(last);
        return pages;
    };
    for (int kvh = 0; kvh < a.num_kv_heads; ++kvh) {
        if (a.policy == GqaPolicy::PerHead) {
            for (int g = 0; g < group; ++g) {
                const int h = kvh * group + g;
                score_head(h, kvh);
                selected[h] = finish(top_k_ref(head_scores, a.page_budget - 1));
            }
            continue;
        }
        for (int g = 0; g < group; ++g) {
            score_head(kvh * group + g, kvh);
            for (int p = 0; p < candidates; ++p) {
                if (g == 0) scores[p] = head_scores[p];
                else if (a.policy == GqaPolicy::KvMax) scores[p] = std::max(scores[p], head_scores[p]);
                else scores[p] += head_scores[p];
            }
        }
        const std::vector<int> pages = finish(top_k_ref(scores, a.page_budget - 1));
        for (int g = 0; g < group; ++g) selected[kvh * group + g] = pages;
    }
}

}  // namespace quest
