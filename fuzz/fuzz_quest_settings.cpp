// libFuzzer target: parse_quest_settings (the --quest-config JSON) on arbitrary text, over the built-in defaults.
// Settings that parse must be valid (validate() passes, at least one page per step) and describable.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/core/quest_settings.h"
#include "kernels/common/error.h"

using namespace quest;

#define FUZZ_CHECK(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            std::fprintf(stderr, "fuzz_quest_settings: invariant violated: %s\n", #cond);     \
            std::abort();                                                                     \
        }                                                                                     \
    } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const QuestSettings defaults = default_quest_settings();
    const std::string text(reinterpret_cast<const char*>(data), size);
    QuestSettings s;
    try {
        s = parse_quest_settings(text, "quest.json", defaults);
    } catch (const InputError&) {
        return 0;
    }
    s.validate();  // must not throw
    FUZZ_CHECK(s.page_size >= 1 && (s.page_size & (s.page_size - 1)) == 0);
    FUZZ_CHECK(s.budget >= s.page_size && s.page_budget() >= 1);
    FUZZ_CHECK(s.dense_layers >= 0);
    FUZZ_CHECK(!s.describe().empty());
    return 0;
}
