// The page-selector seam (kernels/select/registry.h): every registered selector is reachable by name, declares the
// settings it takes, and runs on the CPU backend; a selector registered by a test runs like a built-in one.
#include <gtest/gtest.h>

#include <string>

#include "kernels/common/error.h"
#include "kernels/select/registry.h"
#include "model/core/quest_settings.h"
#include "model/core/step_bytes.h"
#include "model/cpu/llama_cpu.h"
#include "test_util.h"
#include "tests/selectors/recent.h"

using namespace quest;

TEST(SelectorSeam, BuiltInsAreRegisteredInTheirOrder) {
    const char* names[] = {"quest", "streaming", "oracle", "two-level"};
    for (int i = 0; i < 4; ++i) {
        PageSelector id;
        ASSERT_TRUE(page_selector_from_name(names[i], id)) << names[i];
        EXPECT_EQ(static_cast<int>(id), i);
        EXPECT_EQ(page_selector_name(id), names[i]);
        EXPECT_NE(page_selector_def(id).select_cpu, nullptr);
    }
    PageSelector id;
    EXPECT_FALSE(page_selector_from_name("nope", id));
    EXPECT_THROW(page_selector_def(static_cast<PageSelector>(999)), std::out_of_range);
}

TEST(SelectorSeam, ARegisteredSelectorIsASettingLikeAnyOther) {
    const PageSelector recent = test::recent_selector();
    EXPECT_EQ(test::recent_selector(), recent);  // idempotent
    EXPECT_THROW(register_page_selector(page_selector_def(recent)), std::invalid_argument);  // name taken
    const QuestSettings s = parse_quest_settings(R"({"selector": "recent", "budget": 64})", "test.json");
    EXPECT_EQ(s.selector, recent);
    EXPECT_EQ(s.policy_label(), "recent");
    EXPECT_NE(s.describe().find("recent B=64"), std::string::npos) << s.describe();
    EXPECT_NE(page_selector_names().find("recent"), std::string::npos);
    // Settings it does not declare are refused, naming it.
    QuestSettings bad = s;
    bad.mass_target = 0.9;
    try {
        bad.validate();
        FAIL() << "mass_target must be refused for a selector that does not take it";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("recent"), std::string::npos) << e.what();
    }
    bad = s;
    bad.match_bytes = true;
    EXPECT_THROW(bad.validate(), InputError);
}

// The CPU backend runs the registered selector: at a selecting step every query head attends the K most recent
// pages, and the reads counted as it runs equal the bytes model's.
TEST(SelectorSeam, CpuBackendRunsARegisteredSelector) {
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    QuestSettings q;
    q.page_size = 16;
    q.budget = 64;
    q.dense_layers = 1;
    q.selector = test::recent_selector();
    auto b = make_cpu_backend(m, q, 400);
    auto& cpu = dynamic_cast<CpuLlama&>(*b);
    std::vector<int> prompt(300);
    for (int i = 0; i < 300; ++i) prompt[i] = 3 + (i * 37) % 400;
    cpu.prefill(prompt);
    cpu.reset_read_stats();
    cpu.decode(5);
    const int len = 301, P = (len + 15) / 16, K = 4;
    const auto& sel = cpu.last_selection();
    ASSERT_EQ(static_cast<int>(sel.size()), m.config.num_layers);
    for (int l = q.dense_layers; l < m.config.num_layers; ++l)
        for (const auto& pages : sel[l]) EXPECT_EQ(pages, (std::vector<int>{P - 4, P - 3, P - 2, P - 1}));
    const double model = quest_step_bytes_model(m.config, q, len).first;
    EXPECT_EQ(static_cast<double>(cpu.read_stats()->quest_layer_bytes + cpu.read_stats()->dense_layer_bytes), model);
    (void)K;
}
