// Whole-model tests of the CPU backend: Hugging Face parity on the committed fixtures (tools/make_hf_fixtures.py),
// the stories260K greedy text, and Quest against full attention at the model level.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "model/core/backend.h"
#include "engine/generate.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace quest;

namespace {

std::filesystem::path fixture_dir(const std::string& name) { return test::source_dir() / "tests/fixtures/hf" / name; }

template <typename T>
std::vector<T> read_tensor(const SafeTensorsFile& f, const std::string& name, DType dtype) {
    const TensorInfo* t = f.find(name);
    if (!t || t->dtype != dtype) throw std::runtime_error("fixture tensor missing: " + name);
    std::vector<T> out(t->numel());
    std::memcpy(out.data(), f.data(*t), t->nbytes());
    return out;
}

// ||a - b|| / ||b||
double rel_err(std::span<const float> a, std::span<const float> b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += double(a[i] - b[i]) * (a[i] - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

QuestSettings full_attention() {
    QuestSettings s;
    s.full_attention = true;
    return s;
}

}  // namespace

class HfParity : public ::testing::TestWithParam<std::string> {};

// Prefill logits at every prompt position, then teacher-forced decode steps, against transformers in fp32.
TEST_P(HfParity, CpuMatchesTransformers) {
    const auto dir = fixture_dir(GetParam());
    const ModelFolder model = open_model_folder(dir);
    const auto ref = SafeTensorsFile::open(dir / "reference.safetensors");
    const auto prompt = read_tensor<int32_t>(*ref, "prompt_ids", DType::I32);
    const auto decode_ids = read_tensor<int32_t>(*ref, "decode_ids", DType::I32);
    const auto prefill_ref = read_tensor<float>(*ref, "prefill_logits", DType::F32);
    const auto decode_ref = read_tensor<float>(*ref, "decode_logits", DType::F32);
    const int V = model.config.vocab_size;

    auto backend = make_cpu_backend(model, full_attention(), int(prompt.size() + decode_ids.size()));
    std::vector<float> all;
    backend->prefill(std::vector<int>(prompt.begin(), prompt.end()), &all);
    ASSERT_EQ(all.size(), prefill_ref.size());
    for (size_t t = 0; t < prompt.size(); ++t) {
        const double e = rel_err({all.data() + t * V, size_t(V)}, {prefill_ref.data() + t * V, size_t(V)});
        EXPECT_LE(e, 1e-4) << "prefill position " << t;
    }
    for (size_t i = 0; i < decode_ids.size(); ++i) {
        const auto logits = backend->decode(decode_ids[i]);
        const double e = rel_err(logits, {decode_ref.data() + i * V, size_t(V)});
        EXPECT_LE(e, 1e-4) << "decode step " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("mha_hd64", "gqa4_hd128", "gqa8_hd64_tied", "linear_x4_legacy",
                                           "dynamic_x2", "yarn_x4_legacy", "llama3_x8", "bf16_gqa2", "f16_gqa4",
                                           "qwen2_gqa2", "qwen2_swa24", "mistral_swa24"));

// The fixtures of the other architectures are what they claim (the parity above would pass for a Llama model too).
TEST(HfParity, ArchitectureFixturesUseTheirFeatures) {
    const ModelConfig q = open_model_folder(fixture_dir("qwen2_gqa2")).config;
    EXPECT_EQ(q.architecture, Architecture::Qwen2);
    EXPECT_TRUE(q.qkv_bias);
    EXPECT_EQ(q.sliding_window, 0);
    const ModelConfig qs = open_model_folder(fixture_dir("qwen2_swa24")).config;
    EXPECT_EQ(qs.attention_window(0), 0);
    EXPECT_EQ(qs.attention_window(1), 24);
    EXPECT_EQ(qs.attention_window(2), 24);
    const ModelConfig m = open_model_folder(fixture_dir("mistral_swa24")).config;
    EXPECT_EQ(m.architecture, Architecture::Mistral);
    EXPECT_FALSE(m.qkv_bias);
    EXPECT_EQ(m.attention_window(0), 24);
    EXPECT_EQ(m.attention_window(1), 24);
}

namespace {
struct WindowRun {
    std::vector<std::vector<float>> logits;                      // [step][vocab]
    std::vector<std::vector<std::vector<std::vector<int>>>> sel;  // [step][layer][head] pages
};
// The fixture's prompt and decode tokens through the CPU backend with `q`.
WindowRun run_fixture(const std::string& name, const QuestSettings& q) {
    const auto dir = fixture_dir(name);
    const ModelFolder model = open_model_folder(dir);
    const auto ref = SafeTensorsFile::open(dir / "reference.safetensors");
    const auto prompt = read_tensor<int32_t>(*ref, "prompt_ids", DType::I32);
    const auto decode_ids = read_tensor<int32_t>(*ref, "decode_ids", DType::I32);
    auto backend = make_cpu_backend(model, q, int(prompt.size() + decode_ids.size()));
    backend->prefill(std::vector<int>(prompt.begin(), prompt.end()));
    WindowRun r;
    for (int id : decode_ids) {
        const auto l = backend->decode(id);
        r.logits.emplace_back(l.begin(), l.end());
        r.sel.push_back(dynamic_cast<CpuLlama&>(*backend).last_selection());
    }
    return r;
}
}  // namespace

// Quest inside a 24-token window (context 57..64, pages of 8): a budget that covers the window (K = 4 pages: the
// window spans at most 4) is a dense step over the window's pages and equals windowed full attention bit for bit
// (which matches transformers: HfParity); a budget of 2 pages selects, always within the window (which pages: the
// brute-force check of tests/test_quest.cpp, SlidingWindow.QuestCandidatesAreTheWindowsPages).
TEST(SlidingWindow, QuestSelectsInsideTheWindow) {
    for (const char* name : {"mistral_swa24", "qwen2_swa24"}) {
        const ModelConfig c = open_model_folder(fixture_dir(name)).config;
        QuestSettings covering;
        covering.page_size = 8;
        covering.budget = 32;
        covering.dense_layers = c.attention_window(0) > 0 ? 0 : 1;  // Quest in every windowed layer
        QuestSettings small = covering;
        small.budget = 16;
        const WindowRun full = run_fixture(name, full_attention());
        const WindowRun cov = run_fixture(name, covering);
        const WindowRun sel = run_fixture(name, small);
        EXPECT_EQ(cov.logits, full.logits) << name;
        const int prompt = 56;
        bool differs = false;
        for (size_t i = 0; i < sel.logits.size(); ++i) {
            differs |= sel.logits[i] != full.logits[i];
            for (float v : sel.logits[i]) ASSERT_TRUE(std::isfinite(v));
            const int len = prompt + int(i) + 1;
            for (int l = covering.dense_layers; l < c.num_layers; ++l) {
                const int w = c.attention_window(l);
                const int first_page = w > 0 ? std::max(0, len - w) / 8 : 0, last = (len - 1) / 8;
                for (const auto& pages : sel.sel[i][l]) {
                    ASSERT_EQ(pages.size(), 2u) << name << " layer " << l;
                    EXPECT_GE(pages.front(), first_page) << name << " layer " << l << " step " << i;
                    EXPECT_EQ(pages.back(), last);
                }
            }
        }
        EXPECT_TRUE(differs) << name << ": the 2-page budget selected everything";
    }
}


TEST(Stories260K, GreedyFromBosGivesTheLilyText) {
    const auto dir = test::shared_dir() / "models/stories260K";
    QUEST_REQUIRE_PATH(dir);
    const ModelFolder model = open_model_folder(dir);
    const auto tok_owner = load_tokenizer(model.dir);
    const Tokenizer& tok = *tok_owner;
    for (bool full : {true, false}) {
        QuestSettings q = full ? full_attention() : QuestSettings{};
        if (!full) q.budget = 512;  // B >= context: Quest must give the same text
        auto backend = make_cpu_backend(model, q, 512);
        Sampler greedy({0.0f, 0, 1.0f, 0});
        const std::vector<int> bos = tok.encode("");
        ASSERT_EQ(bos, std::vector<int>{1});
        const GenerateResult r = generate(*backend, greedy, bos, 60, [](int) { return true; });
        const std::string text = tok.decode(r.tokens);
        EXPECT_THAT(text, ::testing::StartsWith(
                              "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                              "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high"))
            << (full ? "full attention" : "quest B=512");
    }
}

// A random model with enough context for real page selection: Quest with B >= context equals full attention bit
// for bit; Quest with a small budget differs (selection is active) but stays close.
TEST(QuestModel, BudgetCoveringContextEqualsFullAttention) {
    const auto dir = test::temp_dir("quest_model");
    ModelConfig c = parse_model_config(
        R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 512})",
        "inline");
    write_random_llama(dir, c, {7, DType::F32});
    const ModelFolder model = open_model_folder(dir);
    std::vector<int> prompt(150);
    for (int i = 0; i < 150; ++i) prompt[i] = (i * 31 + 7) % 97;

    auto run = [&](const QuestSettings& q) {
        auto b = make_cpu_backend(model, q, 200);
        b->prefill(prompt);
        std::vector<std::vector<float>> out;
        for (int t = 0; t < 20; ++t) {
            auto l = b->decode((t * 13 + 5) % 97);
            out.emplace_back(l.begin(), l.end());
        }
        return out;
    };
    QuestSettings big;
    big.page_size = 16;
    big.budget = 256;  // >= 170 tokens
    QuestSettings small = big;
    small.budget = 32;
    const auto full = run(full_attention());
    const auto quest_big = run(big);
    const auto quest_small = run(small);
    EXPECT_EQ(full, quest_big);
    EXPECT_NE(full, quest_small);
    for (size_t t = 0; t < full.size(); ++t) EXPECT_LT(rel_err(quest_small[t], full[t]), 0.5);
}

TEST(QuestModel, SelectionRecordedForQuestLayersOnly) {
    const auto dir = test::temp_dir("quest_sel");
    ModelConfig c = parse_model_config(
        R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 1, "vocab_size": 50, "max_position_embeddings": 256})",
        "inline");
    write_random_llama(dir, c, {3, DType::BF16});
    QuestSettings q;
    q.page_size = 8;
    q.budget = 24;  // K = 3
    q.dense_layers = 2;
    auto b = make_cpu_backend(open_model_folder(dir), q, 100);
    std::vector<int> prompt(60, 5);
    b->prefill(prompt);
    b->decode(3);  // 61 tokens: 8 pages, the last holds 5
    const auto& sel = dynamic_cast<CpuLlama&>(*b).last_selection();
    EXPECT_TRUE(sel[0].empty());
    EXPECT_TRUE(sel[1].empty());
    for (int l = 2; l < 4; ++l) {
        ASSERT_EQ(sel[l].size(), 4u);
        for (const auto& pages : sel[l]) {
            EXPECT_EQ(pages.size(), 3u);
            EXPECT_EQ(pages.back(), 7);
        }
    }
}

TEST(Model, TruncatedWeightsNameTheFile) {
    const auto dir = test::temp_dir("truncated");
    ModelConfig c = parse_model_config(
        R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 50})",
        "inline");
    write_random_llama(dir, c, {1, DType::F16});
    std::filesystem::resize_file(dir / "model.safetensors", std::filesystem::file_size(dir / "model.safetensors") - 100);
    try {
        make_cpu_backend(open_model_folder(dir), full_attention(), 16);
        FAIL() << "expected an error";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("model.safetensors"));
    }
}

TEST(Model, WrongShapeNamesTensorExpectedActual) {
    const auto dir = test::temp_dir("wrongshape");
    ModelConfig c = parse_model_config(
        R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 50})",
        "inline");
    write_random_llama(dir, c, {1, DType::F32});
    // Claim a different MLP width in config.json than the weights have.
    c.intermediate_size = 48;
    std::ofstream(dir / "config.json") << model_config_to_json(c);
    try {
        make_cpu_backend(open_model_folder(dir), full_attention(), 16);
        FAIL() << "expected an error";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("model.layers.0.mlp.gate_proj.weight"));
        EXPECT_THAT(e.what(), ::testing::HasSubstr("Expected [48, 32]"));
        EXPECT_THAT(e.what(), ::testing::HasSubstr("Actual [64, 32]"));
    }
}

TEST(Model, MakeModelIsDeterministic) {
    const auto a = test::temp_dir("det_a"), b = test::temp_dir("det_b");
    ModelConfig c = parse_model_config(
        R"({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "vocab_size": 40})",
        "inline");
    write_random_llama(a, c, {99, DType::BF16});
    write_random_llama(b, c, {99, DType::BF16});
    auto slurp = [](const std::filesystem::path& p) {
        std::ifstream in(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(slurp(a / "model.safetensors"), slurp(b / "model.safetensors"));
}
