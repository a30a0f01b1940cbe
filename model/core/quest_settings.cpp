#include "model/core/quest_settings.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "default_config.h"
#include "kernels/common/error.h"

namespace quest {

bool QuestSettings::takes(uint32_t use) const { return (page_selector_def(selector).uses & use) != 0; }

void QuestSettings::validate() const {
    auto bad = [](const std::string& what) { throw InputError("quest settings: " + what); };
    if (page_size < 1 || page_size > 256 || (page_size & (page_size - 1)) != 0)
        bad("page_size must be a power of two between 1 and 256, got " + std::to_string(page_size));
    if (budget < page_size)
        bad("budget (" + std::to_string(budget) + " tokens) is smaller than one page (" + std::to_string(page_size) +
            " tokens)");
    if (dense_layers < 0) bad("dense_layers must be >= 0, got " + std::to_string(dense_layers));
    if (!(mass_target >= 0.0 && mass_target <= 1.0)) bad("mass_target must be in [0, 1] (0: off), got " + std::to_string(mass_target));
    const std::string sel(page_selector_name(selector));
    if (mass_target > 0 && !takes(kUsesMassTarget)) bad("mass_target (the adaptive budget) does not apply to the " + sel + " selector");
    if (match_bytes && !takes(kUsesMatchBytes)) bad("match_bytes does not apply to the " + sel + " selector");
    if (!(reuse_cos >= -1.0 && reuse_cos <= 1.0)) bad("reuse_cos must be in [-1, 1] (0: off), got " + std::to_string(reuse_cos));
    if (reuse_cos != 0 && !takes(kUsesReuse)) bad("reuse_cos (selection reuse) does not apply to the " + sel + " selector");
    if (shortlist < 1 || shortlist > 1024) bad("shortlist must be between 1 and 1024, got " + std::to_string(shortlist));
    if (takes(kUsesSubPages) &&
        (sub_page < 1 || sub_page >= page_size || (sub_page & (sub_page - 1)) != 0))
        bad("sub_page must be a power of two smaller than the page size (" + std::to_string(page_size) + "), got " +
            std::to_string(sub_page));
}

std::string QuestSettings::describe() const {
    if (full_attention) return "full attention";
    std::string d = std::string(page_selector_name(selector)) + " B=" + std::to_string(budget) +
                    " S=" + std::to_string(page_size) + " dense_layers=" + std::to_string(dense_layers) +
                    " gqa=" + std::string(gqa_policy_name(gqa_policy));
    if (takes(kUsesMetadataFormat))
        d += " metadata=" + std::string(metadata_format_name(metadata));
    if (takes(kUsesSubPages))
        d += " shortlist=" + std::to_string(shortlist) + " sub_page=" + std::to_string(sub_page);
    if (mass_target > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " mass_target=%g", mass_target);
        d += buf;
    }
    if (match_bytes) d += " match_bytes";
    if (reuse_cos != 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " reuse_cos=%g", reuse_cos);
        d += buf;
    }
    return d;
}

std::string QuestSettings::policy_label() const {
    if (full_attention) return "full";
    const QuestSettings d;
    std::string l(page_selector_name(selector));
    if (metadata != MetadataFormat::Fp16) l += "+" + std::string(metadata_format_name(metadata));
    if (page_size != d.page_size) l += "+S" + std::to_string(page_size);
    if (takes(kUsesSubPages) && sub_page != d.sub_page) l += "+s" + std::to_string(sub_page);
    if (takes(kUsesSubPages) && shortlist != d.shortlist) l += "+x" + std::to_string(shortlist);
    if (mass_target > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "+p%g", mass_target);
        l += buf;
    }
    if (match_bytes) l += "+m";
    if (reuse_cos != 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "+r%g", reuse_cos);
        l += buf;
    }
    return l;
}

QuestSettings parse_quest_settings(const std::string& json_text, const std::string& source, const QuestSettings& base) {
    using nlohmann::json;
    json j;
    try {
        j = json::parse(json_text);
    } catch (const json::exception& e) {
        throw InputError(source + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw InputError(source + ": expected a JSON object");
    QuestSettings s = base;
    for (const auto& item : j.items()) {
        // Named references, not a structured binding: lambdas cannot capture bindings before clang 16.
        const std::string& key = item.key();
        const json& value = item.value();
        auto fail = [&](const std::string& what) { throw InputError(source + ": field '" + key + "': " + what); };
        auto integer = [&]() -> int {
            // get<int>() would wrap a larger value silently (4294967312 became 16): it must fit an int.
            const bool fits = value.is_number_unsigned()
                                  ? value.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                                  : value.is_number_integer() &&
                                        value.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                        value.get<int64_t>() <= std::numeric_limits<int>::max();
            if (!fits) fail("expected an integer between -2^31 and 2^31 - 1, got " + value.dump());
            return static_cast<int>(value.get<int64_t>());
        };
        if (key == "budget") s.budget = integer();
        else if (key == "page_size") s.page_size = integer();
        else if (key == "dense_layers") s.dense_layers = integer();
        else if (key == "shortlist") s.shortlist = integer();
        else if (key == "sub_page") s.sub_page = integer();
        else if (key == "mass_target") {
            if (!value.is_number()) fail("expected a number in [0, 1]");
            s.mass_target = value.get<double>();
        } else if (key == "reuse_cos") {
            if (!value.is_number()) fail("expected a number in [-1, 1] (0: off)");
            s.reuse_cos = value.get<double>();
        } else if (key == "match_bytes") {
            if (!value.is_boolean()) fail("expected true or false");
            s.match_bytes = value.get<bool>();
        } else if (key == "metadata") {
            if (!value.is_string() || !metadata_format_from_name(value.get<std::string>(), s.metadata))
                fail("expected \"fp16\", \"int8\" or \"int4\", got " + value.dump());
        }
        else if (key == "full_attention") {
            if (!value.is_boolean()) fail("expected true or false");
            s.full_attention = value.get<bool>();
        } else if (key == "selector") {
            if (!value.is_string() || !page_selector_from_name(value.get<std::string>(), s.selector))
                fail("expected one of \"quest\", \"streaming\", \"oracle\", \"two-level\", got " + value.dump());
        } else if (key == "gqa_policy") {
            if (!value.is_string() || !gqa_policy_from_name(value.get<std::string>(), s.gqa_policy))
                fail("expected one of \"kv-max\", \"kv-sum\", \"per-head\", got " + value.dump());
        } else if (key.rfind("_", 0) == 0 || key == "description") {
            // comments
        } else {
            fail("unknown setting (expected budget, page_size, dense_layers, gqa_policy, selector, metadata, shortlist, "
                 "sub_page, mass_target, match_bytes, reuse_cos, full_attention)");
        }
    }
    try {
        s.validate();
    } catch (const InputError& e) {
        throw InputError(source + ": " + e.what());
    }
    return s;
}

QuestSettings load_quest_settings(const std::filesystem::path& file, const QuestSettings& base) {
    std::ifstream in(file);
    if (!in) throw InputError(file.string() + ": cannot open the Quest settings file");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_quest_settings(ss.str(), file.string(), base);
}

QuestSettings default_quest_settings() {
    return parse_quest_settings(kDefaultQuestConfigJson, "configs/quest-default.json (built in)", QuestSettings{});
}

}  // namespace quest
