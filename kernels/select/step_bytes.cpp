#include "kernels/select/step_bytes.h"

#include "kernels/select/page_codes.h"
#include "kernels/select/quest.h"

namespace quest {

std::pair<double, double> quest_step_bytes_model(const ModelConfig& c, const QuestSettings& q, int len) {
    const int S = q.page_size, P = (len + S - 1) / S, K = q.page_budget(), D = c.head_dim, NKV = c.num_kv_heads;
    // The quest selector scores the complete pages in its metadata format and, bytes-matched, selects the matched
    // count (the device's rule, kernels/select/page_codes.h: quest_matched_pages + 1 pages); streaming scores nothing.
    const bool quest = q.selector == PageSelector::Quest;
    const MetadataFormat fmt = quest ? q.metadata : MetadataFormat::Fp16;
    const codes::MatchedBudget match =
        quest && q.match_bytes ? matched_budget(q.metadata, D, c.num_heads, NKV, q.gqa_policy) : codes::MatchedBudget{};
    double total = 0, meta = 0;
    for (int l = 0; l < c.num_layers; ++l) {
        SelectionReads r = dense_reads(len, NKV);
        if (q.quest_layer(l) && P > K) {
            const int rows = q.gqa_policy == GqaPolicy::PerHead ? c.num_heads : NKV;
            const int pages = codes::step_pages(len, S, K, match);  // the last page included
            r = SelectionReads{};
            // The streaming selector scores nothing: its pages follow from the position alone. The oracle reads
            // no metadata but every key of every KV head (oracle_policy_ref's keys_scanned).
            const bool bounds = q.selector != PageSelector::Streaming && q.selector != PageSelector::Oracle;
            r.pages_scored = bounds ? static_cast<int64_t>(P - 1) * NKV : 0;
            if (q.selector == PageSelector::Oracle) r.keys_scanned = static_cast<int64_t>(len) * NKV;
            r.kv_tokens = static_cast<int64_t>(rows) * (static_cast<int64_t>(pages - 1) * S + (len - (P - 1) * S));
            r.rows = rows;
        }
        const int64_t b = selection_bytes(r, D, fmt);
        total += static_cast<double>(b);
        meta += static_cast<double>(b - r.kv_tokens * 4ll * D);
    }
    return {total, meta};
}

}  // namespace quest
