#include "model/core/step_bytes.h"

#include "kernels/select/page_codes.h"
#include "kernels/select/quest.h"
#include "kernels/select/registry.h"
#include "kernels/select/sparq_rule.h"

#include <stdexcept>
#include <string>

namespace quest {

codes::MatchedBudget settings_match(const ModelConfig& c, const QuestSettings& q) {
    if (q.full_attention || !q.takes(kUsesMatchBytes) || !q.match_bytes) return {};
    if (q.selector == PageSelector::Sparq)
        return sparq::budget(q.page_size, c.head_dim,
                             q.gqa_policy == GqaPolicy::PerHead ? c.num_heads / c.num_kv_heads : 1);
    return matched_budget(q.metadata, c.head_dim, c.num_heads, c.num_kv_heads, q.gqa_policy);
}

std::pair<double, double> quest_step_bytes_model(const ModelConfig& c, const QuestSettings& q, int len) {
    const int S = q.page_size, P = (len + S - 1) / S, K = q.page_budget(), D = c.head_dim, NKV = c.num_kv_heads;
    const PageSelectorDef& def = page_selector_def(q.selector);
    if (!q.full_attention && !def.step_reads)
        throw std::invalid_argument("the " + std::string(def.name) + " selector has no bytes model without running it");
    // Selectors that read page bounds read them in the settings' metadata format; bytes-matched, they select the
    // matched count (the device's rule, kernels/select/page_codes.h: quest_matched_pages + 1 pages).
    const bool formatted = def.uses & kUsesMetadataFormat;
    const MetadataFormat fmt = formatted ? q.metadata : MetadataFormat::Fp16;
    const codes::MatchedBudget match = settings_match(c, q);
    double total = 0, meta = 0;
    for (int l = 0; l < c.num_layers; ++l) {
        SelectionReads r = dense_reads(len, NKV);
        if (q.quest_layer(l) && P > K) {
            StepShape s;
            s.len = len;
            s.page_size = S;
            s.num_kv_heads = NKV;
            s.rows = q.gqa_policy == GqaPolicy::PerHead ? c.num_heads : NKV;
            s.kv_pages = codes::step_pages(len, S, K, match);  // the last page included
            s.head_dim = D;
            r = def.step_reads(s);
        }
        const int64_t b = selection_bytes(r, D, fmt);
        total += static_cast<double>(b);
        meta += static_cast<double>(b - r.kv_tokens * 4ll * D);
    }
    return {total, meta};
}

}  // namespace quest
