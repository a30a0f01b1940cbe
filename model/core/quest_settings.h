#pragma once
// Quest settings: token budget B, page size S, the dense layers, the GQA policy, or full attention everywhere.
// Defaults come from configs/quest-default.json (compiled in); a JSON file with the same keys overrides them and
// command-line flags override both.
#include <filesystem>
#include <string>
#include <utility>

#include <vector>

#include "kernels/select/registry.h"
#include "kernels/select/selection.h"
#include "model/core/config.h"
#include "model/core/settings_table.h"

namespace quest {

struct QuestSettings {
    bool full_attention = false;  // true: every layer attends every token (no page selection)
    int budget = 2048;            // B: tokens read per step in a Quest layer (a read budget, not a storage cap)
    int page_size = 16;           // S: tokens per KV page (also the granularity of the page metadata)
    int dense_layers = 2;         // layers [0, dense_layers) always use full attention
    GqaPolicy gqa_policy = GqaPolicy::KvSum;   // docs/quest.md: why kv-sum
    PageSelector selector = PageSelector::Sparq;  // sparq (token sketch; docs/quest.md: why the default), quest
                                                  // (the paper), streaming (baseline), oracle (evaluation),
                                                  // two-level (coarse shortlist, sub-page re-rank)
    MetadataFormat metadata = MetadataFormat::Fp16;  // page bounds read by quest / two-level: fp16 (exact), int8, int4
    int shortlist = 4;        // two-level: pages shortlisted = shortlist * (K - 1)
    int sub_page = 4;         // two-level: tokens per sub-page (power of two < page_size)
    double mass_target = 0;   // adaptive budget: 0 off, else (0, 1]: fewest pages whose estimated mass reaches it
    bool match_bytes = false; // quest, two-level, sparq: read as many (sub-)pages as fit in fp16 Quest's bytes at the step
    // quest: 0 off; else in [-1, 1]: a Quest layer keeps its last selection, without reading metadata, while the
    // page count is unchanged and every query head's cosine similarity to its query at that selection is >=
    // reuse_cos (a new page, or a query that moved, selects afresh; -1: whenever the page is unchanged). CPU backend.
    double reuse_cos = 0;

    int page_budget() const { return budget / page_size; }  // K
    // True when layer `l` runs Quest selection (it may still be dense while the sequence has <= K pages).
    bool quest_layer(int l) const { return !full_attention && l >= dense_layers; }
    // Sub-page size the KV cache must keep metadata for (0 unless the selector is two-level).
    int cache_sub_page() const { return !full_attention && takes(kUsesSubPages) ? sub_page : 0; }
    // True when the selector takes the setting `use` (SelectorUses, kernels/select/registry.h).
    bool takes(uint32_t use) const;
    // Throws InputError naming the setting: page size a power of two in [1, 256], budget >= page size, ...
    void validate() const;
    std::string describe() const;  // "quest B=2048 S=16 dense=2 gqa=kv-sum" or "full attention"
    // The policy in `quest eval jsonl --policies` syntax (parse_policy_spec): the selector, then the options that
    // differ from the defaults, e.g. "quest", "two-level+int8+s2", "quest+p0.95"; "full" under full attention.
    std::string policy_label() const;
    bool operator==(const QuestSettings&) const = default;
};

// Every Quest setting, once (model/core/settings_table.h): the JSON keys budget, page_size, dense_layers, gqa_policy,
// selector, metadata, shortlist, sub_page, mass_target, match_bytes, reuse_cos, full_attention, in that order.
const std::vector<Setting<QuestSettings>>& quest_settings_table();

// Reads settings from JSON text (the table's keys); keys that are absent keep the values of `base`. `source`
// names the file in errors; unknown keys and values out of an entry's range are errors too.
QuestSettings parse_quest_settings(const std::string& json_text, const std::string& source,
                                   const QuestSettings& base = {});
QuestSettings load_quest_settings(const std::filesystem::path& file, const QuestSettings& base = {});
// The defaults compiled in from configs/quest-default.json.
QuestSettings default_quest_settings();

// A policy of `quest eval jsonl --policies`: `name[+opt...]`, name a selector (quest, streaming, oracle, two-level),
// each opt a table entry's token: a metadata format (fp16, int8, int4), S<page size>, s<sub-page>, x<shortlist>,
// p<mass target>, m (match bytes), r<reuse cosine>. The settings of `base` with those changed (not validated: the
// budget is set per row); InputError naming the spec otherwise. policy_label() writes this syntax back.
QuestSettings parse_policy(const std::string& spec, const QuestSettings& base);
// The option list of the syntax above, for help and errors: "fp16, int8, int4, S<page_size>, ...".
std::string policy_options_help();

}  // namespace quest
