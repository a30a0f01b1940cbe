// libFuzzer target: parse_quest_settings (the --quest-config JSON) on arbitrary text, over the built-in defaults.
// Settings that parse must be valid (validate() passes, at least one page per step) and describable; every entry of
// quest_settings_table() must be in its range and read back from its own text; the policy label must parse back to
// the same selection settings.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/core/quest_settings.h"
#include "fuzz/fuzz_util.h"
#include "kernels/common/error.h"

using namespace quest;

#define FUZZ_CHECK(cond) QUEST_FUZZ_CHECK("fuzz_quest_settings", cond)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const QuestSettings defaults = default_quest_settings();
    const std::string text(reinterpret_cast<const char*>(data), size);
    QuestSettings s;
    try {
        s = parse_quest_settings(text, "quest.json", defaults);
    } catch (const InputError&) {
        // The same text as a --policies spec: an error, or settings whose every entry is in its range.
        try {
            const QuestSettings p = parse_policy(text, defaults);
            for (const auto& e : quest_settings_table())
                FUZZ_CHECK(e.kind != SettingKind::Int && e.kind != SettingKind::Double ? true : e.in_range(e.get(p)));
        } catch (const InputError&) {
        }
        return 0;
    }
    s.validate();  // must not throw
    FUZZ_CHECK(s.page_size >= 1 && (s.page_size & (s.page_size - 1)) == 0);
    FUZZ_CHECK(s.budget >= s.page_size && s.page_budget() >= 1);
    FUZZ_CHECK(s.dense_layers >= 0);
    FUZZ_CHECK(!s.describe().empty());
    for (const auto& e : quest_settings_table()) {
        if (e.kind == SettingKind::Int) FUZZ_CHECK(e.in_range(e.get(s)));
        if (e.kind == SettingKind::Int || e.kind == SettingKind::Enum || e.kind == SettingKind::Bool) {
            QuestSettings t = defaults;
            FUZZ_CHECK(e.set_text(t, e.text(s)).empty());
            FUZZ_CHECK(e.get(t) == e.get(s));
        }
    }
    if (!s.full_attention) {
        const QuestSettings back = parse_policy(s.policy_label(), s);
        FUZZ_CHECK(back.policy_label() == s.policy_label());
    }
    return 0;
}
