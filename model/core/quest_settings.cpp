#include "model/core/quest_settings.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "default_config.h"
#include "kernels/common/error.h"
#include "model/core/json_object.h"

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
    if (!(reuse_cos >= -1.0 && reuse_cos <= 1.0)) bad("reuse_cos must be in [-1, 1] (0: off), got " + std::to_string(reuse_cos));
    if (shortlist < 1 || shortlist > 1024) bad("shortlist must be between 1 and 1024, got " + std::to_string(shortlist));
    // A setting the selector does not take, changed from its default, would do nothing: an error, naming who takes it.
    const QuestSettings d;
    for (const auto& e : quest_settings_table())
        if (!e.applies(*this) && e.get(*this) != e.get(d))
            bad(std::string(e.key) + " does not apply to the " + sel + " selector (" + e.help + ")");
    if (takes(kUsesSubPages) &&
        (sub_page < 1 || sub_page >= page_size || (sub_page & (sub_page - 1)) != 0))
        bad("sub_page must be a power of two smaller than the page size (" + std::to_string(page_size) + "), got " +
            std::to_string(sub_page));
}

namespace {

// Whether the settings' selector takes a setting (its SelectorUses, kernels/select/registry.h).
bool takes_metadata(const QuestSettings& s) { return s.takes(kUsesMetadataFormat); }
bool takes_sub_pages(const QuestSettings& s) { return s.takes(kUsesSubPages); }
bool takes_mass_target(const QuestSettings& s) { return s.takes(kUsesMassTarget); }
bool takes_match_bytes(const QuestSettings& s) { return s.takes(kUsesMatchBytes); }
bool takes_reuse(const QuestSettings& s) { return s.takes(kUsesReuse); }

// Every registered selector's name, in id order (the registry grows when a test registers one).
std::vector<const char*> selector_names() {
    std::vector<const char*> out;
    for (PageSelector id : page_selectors()) out.push_back(page_selector_def(id).name.data());
    return out;
}

// An enum's names in its order, from its name function (string literals: kernels/select/selection.cpp).
template <class E, class NameOf>
std::vector<const char*> enum_names(int count, NameOf name_of) {
    std::vector<const char*> out;
    for (int i = 0; i < count; ++i) out.push_back(name_of(static_cast<E>(i)).data());
    return out;
}

// Accessors of an int / double / bool / enum member as the table's double.
template <class M>
Setting<QuestSettings> entry(const char* key, const char* flag, SettingKind kind, M QuestSettings::*member,
                             const char* help) {
    auto get = [member](const QuestSettings& s) -> double {
        if constexpr (std::is_enum_v<M>) return static_cast<int>(s.*member);
        else return static_cast<double>(s.*member);
    };
    auto set = [member](QuestSettings& s, double v) {
        if constexpr (std::is_same_v<M, double>) s.*member = v;
        else if constexpr (std::is_same_v<M, bool>) s.*member = v != 0;
        else s.*member = static_cast<M>(static_cast<int>(v));
    };
    return Setting<QuestSettings>{key, flag, kind, help, get, set};
}

std::vector<Setting<QuestSettings>> make_table() {
    using K = SettingKind;
    constexpr double kIntMax = std::numeric_limits<int>::max();
    std::vector<Setting<QuestSettings>> t;
    auto add = [&](Setting<QuestSettings> e) -> Setting<QuestSettings>& { return t.emplace_back(std::move(e)); };

    auto& budget = add(entry("budget", "--budget", K::Int, &QuestSettings::budget,
                             "Quest token budget B: tokens read per step in a Quest layer"));
    budget.min = 1, budget.max = kIntMax, budget.short_name = "B";

    auto& page = add(entry("page_size", "--page-size", K::Int, &QuestSettings::page_size,
                           "KV page size S in tokens (a power of two, at most 256)"));
    page.min = 1, page.max = 256, page.short_name = "S", page.token = "S", page.label_rank = 2;

    auto& dense = add(entry("dense_layers", "--dense-layers", K::Int, &QuestSettings::dense_layers,
                            "layers [0, N) that always use full attention"));
    dense.min = 0, dense.max = kIntMax, dense.short_name = "dense_layers";

    auto& gqa = add(entry("gqa_policy", "--gqa-policy", K::Enum, &QuestSettings::gqa_policy,
                          "page selection for grouped heads (docs/quest.md: why kv-sum)"));
    gqa.choices = enum_names<GqaPolicy>(3, gqa_policy_name), gqa.short_name = "gqa";

    auto& sel = add(entry("selector", "--selector", K::Enum, &QuestSettings::selector,
                          "page selector: quest (the paper), streaming (first + recent pages), oracle (true attention "
                          "mass; evaluation only, reads every key), two-level (coarse shortlist re-ranked by sub-page "
                          "bounds; CPU), sparq (pages ranked by their best token on the query's largest channels, "
                          "from an fp8 key sketch; docs/quest.md)"));
    sel.choices_now = selector_names;

    auto& meta = add(entry("metadata", "--metadata", K::Enum, &QuestSettings::metadata,
                           "page bounds of quest / two-level: fp16 (exact), int8 or int4 (cuda: the quest selector)"));
    meta.choices = enum_names<MetadataFormat>(3, metadata_format_name), meta.short_name = "metadata";
    meta.token = "", meta.label_rank = 1, meta.relevant = takes_metadata;

    auto& shortlist = add(entry("shortlist", "--shortlist", K::Int, &QuestSettings::shortlist,
                                "two-level: pages shortlisted per selected page"));
    shortlist.min = 1, shortlist.max = 1024, shortlist.short_name = "shortlist", shortlist.token = "x";
    shortlist.label_rank = 4, shortlist.relevant = takes_sub_pages;

    auto& sub = add(entry("sub_page", "--sub-page", K::Int, &QuestSettings::sub_page,
                          "two-level: tokens per sub-page (a power of two smaller than the page size)"));
    sub.min = 1, sub.max = 128, sub.short_name = "sub_page", sub.token = "s", sub.label_rank = 3;
    sub.relevant = takes_sub_pages;

    auto& mass = add(entry("mass_target", "--mass-target", K::Double, &QuestSettings::mass_target,
                           "adaptive budget: the fewest pages (at most B/S) whose estimated softmax share reaches this "
                           "(e.g. 0.95; 0 = off; CPU)"));
    mass.min = 0, mass.max = 1, mass.short_name = "mass_target", mass.token = "p", mass.label_rank = 5;
    mass.hidden_when_off = true, mass.relevant = takes_mass_target;

    auto& match = add(entry("match_bytes", "--match-bytes", K::Bool, &QuestSettings::match_bytes,
                            "quest, two-level, sparq: read as many pages (sub-pages) as fit in fp16 Quest's bytes per "
                            "step, not B tokens (cuda: quest and sparq)"));
    match.short_name = "match_bytes", match.token = "m", match.label_rank = 6, match.hidden_when_off = true;
    match.relevant = takes_match_bytes;

    auto& reuse = add(entry("reuse_cos", "--reuse-cos", K::Double, &QuestSettings::reuse_cos,
                            "quest: keep a layer's last page selection while the page count is unchanged and every "
                            "query head's cosine to its query at that selection is >= this (0 = off, -1 = always; "
                            "CPU)"));
    reuse.min = -1, reuse.max = 1, reuse.short_name = "reuse_cos", reuse.token = "r", reuse.label_rank = 7;
    reuse.hidden_when_off = true, reuse.relevant = takes_reuse;

    add(entry("full_attention", "--full-attention", K::Bool, &QuestSettings::full_attention,
              "full attention in every layer (no Quest)"));
    return t;
}

// The entries of a policy (those with a token), in policy_label()'s order.
std::vector<const Setting<QuestSettings>*> policy_entries() {
    std::vector<const Setting<QuestSettings>*> out;
    for (const auto& e : quest_settings_table())
        if (e.token) out.push_back(&e);
    std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->label_rank < b->label_rank; });
    return out;
}

}  // namespace

const std::vector<Setting<QuestSettings>>& quest_settings_table() {
    static const std::vector<Setting<QuestSettings>> table = make_table();
    return table;
}

std::string QuestSettings::describe() const {
    if (full_attention) return "full attention";
    const auto& table = quest_settings_table();
    std::string d = find_setting(table, "selector")->text(*this);
    for (const auto& e : table) {
        if (!e.short_name || !e.applies(*this) || (e.hidden_when_off && e.get(*this) == 0)) continue;
        d.append(" ").append(e.short_name);
        if (e.kind != SettingKind::Bool) d.append("=").append(e.text(*this));
    }
    return d;
}

std::string QuestSettings::policy_label() const {
    if (full_attention) return "full";
    const QuestSettings d;
    std::string l = find_setting(quest_settings_table(), "selector")->text(*this);
    for (const auto* e : policy_entries()) {
        if (!e->applies(*this) || e->get(*this) == e->get(d)) continue;
        l.append("+").append(e->token);
        if (e->kind != SettingKind::Bool) l.append(e->text(*this));
    }
    return l;
}

std::string policy_options_help() {
    std::string h;
    for (const auto* e : policy_entries()) {
        if (!h.empty()) h += ", ";
        if (e->kind == SettingKind::Enum) {
            for (size_t i = 0; i < e->choices.size(); ++i) h += (i ? ", " : "") + std::string(e->choices[i]);
        } else if (e->kind == SettingKind::Bool) {
            h += std::string(e->token) + " (" + e->key + ")";
        } else {
            h += std::string(e->token) + "<" + e->key + ">";
        }
    }
    return h;
}

QuestSettings parse_policy(const std::string& spec, const QuestSettings& base) {
    QuestSettings s = base;
    const auto& selector = *find_setting(quest_settings_table(), "selector");
    auto bad = [&](const std::string& why) {
        throw InputError("--policies: '" + spec + "': " + why + " (expected name[+opt...], name " +
                         selector.expectation().substr(7) + "; opts " + policy_options_help() + ")");
    };
    std::stringstream ss(spec);
    std::string item;
    bool first = true;
    while (std::getline(ss, item, '+')) {
        if (first) {
            if (!selector.set_text(s, item).empty()) bad("unknown selector '" + item + "'");
            first = false;
            continue;
        }
        if (item.empty()) bad("empty option");
        bool done = false;
        for (const auto* e : policy_entries()) {
            if (e->kind == SettingKind::Enum) {
                done = e->set_text(s, item).empty();
            } else if (e->kind == SettingKind::Bool) {
                if (item == e->token) done = e->set_text(s, "true").empty();
            } else if (item.rfind(e->token, 0) == 0) {
                const std::string err = e->set_text(s, item.substr(std::string(e->token).size()));
                if (!err.empty()) bad("'" + item + "': " + e->key + ": " + err);
                done = true;
            }
            if (done) break;
        }
        if (!done) bad("unknown option '" + item + "'");
    }
    if (first) bad("empty");
    return s;
}

QuestSettings parse_quest_settings(const std::string& json_text, const std::string& source, const QuestSettings& base) {
    using nlohmann::json;
    const json j = parse_json_object(json_text, source, "a JSON object");
    const auto& table = quest_settings_table();
    QuestSettings s = base;
    for (const auto& item : j.items()) {
        // Named references, not a structured binding: lambdas cannot capture bindings before clang 16.
        const std::string& key = item.key();
        const json& value = item.value();
        auto fail = [&](const std::string& what) { throw InputError(source + ": field '" + key + "': " + what); };
        if (key.rfind("_", 0) == 0 || key == "description") continue;  // comments
        const Setting<QuestSettings>* e = find_setting(table, key);
        if (!e) {
            std::string keys;
            for (const auto& x : table) keys += (keys.empty() ? "" : ", ") + std::string(x.key);
            fail("unknown setting (expected " + keys + ")");
        }
        const std::string expected = "expected " + e->expectation() + ", got " + value.dump();
        switch (e->kind) {
        case SettingKind::Int: {
            // get<int>() would wrap a larger value silently (4294967312 became 16): it must fit an int.
            const bool fits = value.is_number_unsigned()
                                  ? value.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                                  : value.is_number_integer() &&
                                        value.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                        value.get<int64_t>() <= std::numeric_limits<int>::max();
            if (!fits) fail("expected an integer between -2^31 and 2^31 - 1, got " + value.dump());
            if (!e->in_range(double(value.get<int64_t>()))) fail(expected);
            e->set(s, double(value.get<int64_t>()));
            break;
        }
        case SettingKind::Double:
            if (!value.is_number() || !e->in_range(value.get<double>())) fail(expected);
            e->set(s, value.get<double>());
            break;
        case SettingKind::Bool:
            if (!value.is_boolean()) fail(expected);
            e->set(s, value.get<bool>() ? 1 : 0);
            break;
        case SettingKind::Enum:
        case SettingKind::Bytes:
            if (!value.is_string() || !e->set_text(s, value.get<std::string>()).empty()) fail(expected);
            break;
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
