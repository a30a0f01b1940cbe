// The settings tables (model/core/settings_table.h): every Quest setting reads the same through JSON, the command
// line and a --policies spec; the backend settings through their flags.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine/settings_cli.h"
#include "kernels/common/error.h"
#include "model/core/quest_settings.h"

using namespace quest;
using ::testing::HasSubstr;

namespace {

// A non-default value of every Quest setting, as JSON and as text (a new entry without one fails the test).
const std::map<std::string, std::pair<std::string, std::string>> kSample = {
    {"budget", {"512", "512"}},
    {"page_size", {"8", "8"}},
    {"dense_layers", {"3", "3"}},
    {"gqa_policy", {"\"per-head\"", "per-head"}},
    {"selector", {"\"two-level\"", "two-level"}},
    {"metadata", {"\"int8\"", "int8"}},
    {"shortlist", {"3", "3"}},
    {"sub_page", {"2", "2"}},
    {"mass_target", {"0.5", "0.5"}},
    {"match_bytes", {"true", "true"}},
    {"reuse_cos", {"0.25", "0.25"}},
    {"full_attention", {"true", "true"}},
};

QuestSettings from_cli(std::vector<std::string> args, const std::set<std::string>& skip = {}) {
    CLI::App app;
    SettingsFlags f;
    add_settings_flags(app, f, skip);
    args.insert(args.begin(), "quest");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    return f.quest();
}

BackendOptions backend_from_cli(std::vector<std::string> args) {
    CLI::App app;
    SettingsFlags f;
    add_settings_flags(app, f);
    args.insert(args.begin(), "quest");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    return f.backend(0);
}

}  // namespace

TEST(Settings, TableHasEveryJsonKeyOnceWithItsDefault) {
    std::vector<std::string> keys;
    std::set<std::string> flags;
    for (const auto& e : quest_settings_table()) {
        keys.push_back(e.key);
        ASSERT_NE(e.flag, nullptr) << e.key;
        EXPECT_TRUE(flags.insert(e.flag).second) << e.flag;
        EXPECT_TRUE(e.help && *e.help) << e.key;
        if (e.kind == SettingKind::Int || e.kind == SettingKind::Double) {
            EXPECT_LT(e.min, e.max) << e.key;
        }
        if (e.kind == SettingKind::Enum) {
            EXPECT_FALSE(e.names().empty()) << e.key;
        }
    }
    EXPECT_EQ(keys, (std::vector<std::string>{"budget", "page_size", "dense_layers", "gqa_policy", "selector",
                                              "metadata", "shortlist", "sub_page", "mass_target", "match_bytes",
                                              "reuse_cos", "full_attention"}));
    for (const auto& e : backend_settings_table()) {
        if (e.flag) {
            EXPECT_TRUE(flags.insert(e.flag).second) << e.flag;
        }
    }
    // The compiled-in defaults (configs/quest-default.json) are those of the struct.
    const QuestSettings d = default_quest_settings();
    EXPECT_EQ(d, QuestSettings{});
    EXPECT_EQ(d.describe(), "sparq B=2048 S=16 dense_layers=2 gqa=kv-sum");
}

// Each setting on the defaults with, where the default selector does not take it, the first selector that does
// (quest, two-level) set as well: through JSON, the CLI and a policy spec of that selector.
TEST(Settings, EveryQuestSettingRoundTripsThroughJsonCliAndPolicy) {
    for (const auto& e : quest_settings_table()) {
        SCOPED_TRACE(e.key);
        ASSERT_TRUE(kSample.count(e.key)) << "no sample value for " << e.key;
        const auto& [json, text] = kSample.at(e.key);
        QuestSettings defaults = default_quest_settings();
        for (PageSelector s : {PageSelector::Quest, PageSelector::TwoLevel})
            if (!e.applies(defaults)) defaults.selector = s;
        ASSERT_TRUE(e.applies(defaults));
        const std::string sel(page_selector_name(defaults.selector));
        const bool sel_moved = defaults.selector != default_quest_settings().selector;
        const std::string sel_json = sel_moved ? ", \"selector\": \"" + sel + "\"" : "";
        std::vector<std::string> sel_cli;
        if (sel_moved) sel_cli = {"--selector", sel};
        // The expected settings: the defaults with this one entry set.
        QuestSettings want = defaults;
        ASSERT_EQ(e.set_text(want, text), "");
        ASSERT_NE(e.get(want), e.get(defaults)) << "the sample must differ from the default";
        EXPECT_EQ(e.text(want), text);

        const QuestSettings via_json = parse_quest_settings(
            "{\"" + std::string(e.key) + "\": " + json + sel_json + "}", "t.json", default_quest_settings());
        EXPECT_EQ(via_json, want);

        std::vector<std::string> args = sel_cli;
        args.push_back(e.flag);
        if (e.kind != SettingKind::Bool) args.push_back(text);
        EXPECT_EQ(from_cli(args), want);

        if (std::string(e.key) == "selector") {
            EXPECT_EQ(parse_policy(text, defaults), want);
            EXPECT_EQ(want.policy_label(), text);
        } else if (e.token) {
            const std::string opt = e.kind == SettingKind::Enum ? text
                                    : e.kind == SettingKind::Bool ? std::string(e.token)
                                                                  : e.token + text;
            const std::string spec = sel + "+" + opt;
            EXPECT_EQ(parse_policy(spec, defaults), want) << spec;
            if (e.applies(want)) {
                EXPECT_EQ(want.policy_label(), spec);
            }
        }
    }
}

TEST(Settings, EveryBackendSettingReadsFromItsFlag) {
    const BackendOptions d;
    const std::map<std::string, std::string> sample = {
        {"backend", "cuda"}, {"fused_norms", "off"}, {"memory_limit", "512MiB"}, {"prefill_chunk", "512"}, {"tp", "2"}};
    for (const auto& e : backend_settings_table()) {
        if (!e.flag) continue;
        SCOPED_TRACE(e.key);
        std::vector<std::string> args = {e.flag};
        if (e.kind != SettingKind::Bool) args.push_back(sample.at(e.key));
        if (e.key == std::string("tp")) args.insert(args.begin(), {"--backend", "cuda"});  // --tp is for cuda only
        const BackendOptions o = backend_from_cli(args);
        EXPECT_NE(e.get(o), e.get(d));
        if (e.kind != SettingKind::Bool) {
            BackendOptions want;
            ASSERT_EQ(e.set_text(want, sample.at(e.key)), "");
            EXPECT_EQ(e.get(o), e.get(want));
        }
    }
    EXPECT_FALSE(backend_from_cli({"--no-graph"}).graph);
    EXPECT_FALSE(backend_from_cli({"--fused-norms", "off"}).fused_norms);
    EXPECT_EQ(backend_from_cli({"--memory-limit", "1GiB"}).memory_limit, size_t(1) << 30);
    EXPECT_EQ(backend_from_cli({}).prefill_chunk, 2048);
    EXPECT_EQ(backend_from_cli({}).tp, 1);
    EXPECT_THROW(backend_from_cli({"--tp", "2"}), InputError);  // the CPU backend
}

TEST(Settings, ErrorsNameTheFileKeyOrFlag) {
    auto message = [](auto f) {
        try {
            f();
        } catch (const InputError& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    EXPECT_THAT(message([] { parse_quest_settings(R"({"page_size": 512})", "p.json"); }),
                HasSubstr("p.json: field 'page_size': expected an integer between 1 and 256, got 512"));
    EXPECT_THAT(message([] { parse_quest_settings(R"({"budgett": 64})", "p.json"); }),
                HasSubstr("p.json: field 'budgett': unknown setting"));
    EXPECT_THAT(message([] { parse_quest_settings(R"({"budget": 4294967312})", "p.json"); }),
                HasSubstr("field 'budget': expected an integer between -2^31 and 2^31 - 1"));
    EXPECT_THAT(message([] { parse_quest_settings(R"({"budget": 0})", "p.json"); }),
                HasSubstr("field 'budget': expected an integer between 1 and 2147483647, got 0"));
    EXPECT_THAT(message([] { parse_quest_settings(R"({"mass_target": "high"})", "p.json"); }),
                HasSubstr("field 'mass_target': expected a number in [0, 1]"));
    EXPECT_THAT(message([] { from_cli({"--reuse-cos", "2"}); }),
                HasSubstr("--reuse-cos: expected a number in [-1, 1], got '2'"));
    EXPECT_THAT(message([] { from_cli({"--budget", "12abc"}); }), HasSubstr("--budget: expected an integer"));
    EXPECT_THAT(message([] { backend_from_cli({"--memory-limit", "lots"}); }),
                HasSubstr("--memory-limit: expected a size in bytes"));
    EXPECT_THAT(message([] { from_cli({"--gqa-policy", "mean"}); }),
                HasSubstr("--gqa-policy: expected one of kv-max, kv-sum, per-head, got 'mean'"));
    EXPECT_THAT(message([] { parse_policy("quest+S512", QuestSettings{}); }), HasSubstr("--policies: 'quest+S512'"));
    // The flags still go through validate() (rules across settings).
    EXPECT_THAT(message([] { from_cli({"--page-size", "12"}); }), HasSubstr("page_size must be a power of two"));
}

TEST(Settings, CliOverridesTheConfigFileWhichOverridesTheDefaults) {
    const auto dir = std::filesystem::temp_directory_path() / ("quest_settings_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "q.json") << R"({"budget": 256, "page_size": 8})";
    const QuestSettings s = from_cli({"--quest-config", (dir / "q.json").string(), "--page-size", "4"});
    EXPECT_EQ(s.budget, 256);
    EXPECT_EQ(s.page_size, 4);
    EXPECT_EQ(s.dense_layers, 2);
    std::filesystem::remove_all(dir);
    // A subcommand can leave flags out (eval: --budgets sets the budget).
    EXPECT_THROW(from_cli({"--budget", "64"}, {"budget"}), CLI::ParseError);
}
