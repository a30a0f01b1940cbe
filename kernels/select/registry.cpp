#include "kernels/select/registry.h"

#include <stdexcept>

#include "kernels/select/quest.h"
#include "kernels/select/sparq.h"

namespace quest {

namespace {

int pages_of(const StepShape& s) { return (s.len + s.page_size - 1) / s.page_size; }

// Every row reads the KV of its kv_pages pages; the last page holds len - (P - 1) * S tokens.
int64_t kv_tokens_of(const StepShape& s) {
    const int P = pages_of(s);
    return static_cast<int64_t>(s.rows) *
           (static_cast<int64_t>(s.kv_pages - 1) * s.page_size + (s.len - (P - 1) * s.page_size));
}

SelectionReads quest_reads(const StepShape& s) {  // the bounds of every complete page, per KV head
    SelectionReads r;
    r.pages_scored = static_cast<int64_t>(pages_of(s) - 1) * s.num_kv_heads;
    r.kv_tokens = kv_tokens_of(s);
    r.rows = s.rows;
    return r;
}

SelectionReads streaming_reads(const StepShape& s) {  // pages follow from the position alone
    SelectionReads r;
    r.kv_tokens = kv_tokens_of(s);
    r.rows = s.rows;
    return r;
}

SelectionReads oracle_reads(const StepShape& s) {  // no metadata, every key of every KV head
    SelectionReads r;
    r.keys_scanned = static_cast<int64_t>(s.len) * s.num_kv_heads;
    r.kv_tokens = kv_tokens_of(s);
    r.rows = s.rows;
    return r;
}

// The built-in selectors, in PageSelector's order.
std::vector<PageSelectorDef>& registry() {
    static std::vector<PageSelectorDef> defs = {
        {"quest", "top pages by Quest's upper bound of q.k (the paper)",
         kUsesMetadataFormat | kUsesMassTarget | kUsesMatchBytes | kUsesReuse, quest_policy_ref, quest_reads},
        {"streaming", "the first page and the most recent ones (query-independent baseline)", 0, streaming_policy_ref,
         streaming_reads},
        {"oracle", "top pages by the true softmax mass (reads every key; an evaluation yardstick)", 0,
         oracle_policy_ref, oracle_reads},
        {"two-level", "coarse page bounds shortlist, sub-page bounds re-rank (CPU)",
         kUsesMetadataFormat | kUsesMassTarget | kUsesMatchBytes | kUsesSubPages, two_level_select_ref, nullptr},
        {"sparq", "top pages by their best token's logit on the query's largest D/8 channels (fp8 key sketch); "
                  "with match_bytes as many as fit in fp16 Quest's bytes",
         kUsesMatchBytes, sparq_select_ref, sparq_step_reads},
    };
    return defs;
}

}  // namespace

const PageSelectorDef& page_selector_def(PageSelector id) {
    const auto& defs = registry();
    const int i = static_cast<int>(id);
    if (i < 0 || i >= static_cast<int>(defs.size()))
        throw std::out_of_range("page selector " + std::to_string(i) + " is not registered");
    return defs[static_cast<size_t>(i)];
}

std::string_view page_selector_name(PageSelector id) { return page_selector_def(id).name; }

bool page_selector_from_name(std::string_view name, PageSelector& out) {
    const auto& defs = registry();
    for (size_t i = 0; i < defs.size(); ++i)
        if (defs[i].name == name) {
            out = static_cast<PageSelector>(i);
            return true;
        }
    return false;
}

std::vector<PageSelector> page_selectors() {
    std::vector<PageSelector> ids;
    for (size_t i = 0; i < registry().size(); ++i) ids.push_back(static_cast<PageSelector>(i));
    return ids;
}

std::string page_selector_names() {
    std::string s;
    for (const auto& d : registry()) s += (s.empty() ? "" : ", ") + std::string(d.name);
    return s;
}

PageSelector register_page_selector(const PageSelectorDef& def) {
    PageSelector existing;
    if (def.name.empty() || page_selector_from_name(def.name, existing))
        throw std::invalid_argument("register_page_selector: the name '" + std::string(def.name) +
                                    "' is empty or taken");
    if (!def.select_cpu) throw std::invalid_argument("register_page_selector: '" + std::string(def.name) + "' has no select_cpu");
    registry().push_back(def);
    return static_cast<PageSelector>(registry().size() - 1);
}

}  // namespace quest
