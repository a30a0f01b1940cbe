// quest eval: the pass-key prompt, the decode-path protocol, perplexity, and the selection diagnostics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine/eval.h"
#include "model/cpu/llama_cpu.h"
#include "model/io/make_model.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"
#include "tokenizer/sentencepiece.h"
#include "test_util.h"

using namespace quest;

namespace {

struct TinyModel {
    std::shared_ptr<LlamaWeightsF32> w;
    SentencePieceTokenizer tok;
    BackendMaker make;
};

TinyModel tiny_model(const std::string& name, uint64_t seed = 11) {
    const auto dir = test::temp_dir(name);
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096})",
        "inline");
    write_random_llama(dir, c, {seed, DType::F32});
    auto w = std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(dir), c));
    BackendMaker make = [w](const QuestSettings& q, int cap) -> std::unique_ptr<Backend> {
        return std::make_unique<CpuLlama>(w, q, cap);
    };
    return {w, SentencePieceTokenizer(test::source_dir() / "tests/fixtures/tokenizer/demo-512.model"), make};
}

}  // namespace

TEST(Eval, PasskeyPromptHasTheKeyAtTheDepthAndTheLength) {
    const SentencePieceTokenizer tok(test::source_dir() / "tests/fixtures/tokenizer/demo-512.model");
    for (double depth : {0.0, 0.5, 1.0}) {
        const PasskeyPrompt p = make_passkey_prompt(tok, 1000, depth, 48213);
        const int total = static_cast<int>(p.prefill.size() + p.question.size());
        EXPECT_LE(total, 1000);
        EXPECT_GT(total, 900);
        EXPECT_EQ(p.prefill.front(), tok.bos_id());
        const std::string text = tok.decode(p.prefill);
        const size_t at = text.find("48213");
        ASSERT_NE(at, std::string::npos);
        const double rel = static_cast<double>(at) / text.size();
        EXPECT_NEAR(rel, depth, 0.1) << "the key sits at the requested depth";
        EXPECT_THAT(tok.decode(p.question), ::testing::HasSubstr("What is the pass key?"));
    }
}

TEST(Eval, PasskeyRunsThroughTheDecodePathWithDiagnostics) {
    TinyModel m = tiny_model("eval_passkey");
    PasskeyRequest r;
    r.contexts = {300};
    r.budgets = {0, 32, 4096};
    r.samples = 3;
    r.diagnostics = true;
    r.base.page_size = 8;
    r.base.dense_layers = 1;
    const auto rows = run_passkey(m.make, m.tok, r, [](const std::string&) {});
    ASSERT_EQ(rows.size(), 3u);
    for (const auto& row : rows) {
        EXPECT_EQ(row.samples, 3);
        EXPECT_EQ(row.depths_percent, (std::vector<int>{0, 50, 100}));
    }
    EXPECT_FALSE(rows[0].selection.valid) << "full attention selects nothing";
    EXPECT_FALSE(rows[2].selection.valid) << "B >= context: every step is dense";
    const SelectionSummary& s = rows[1].selection;
    ASSERT_TRUE(s.valid);
    EXPECT_GT(s.steps, 0);
    EXPECT_GT(s.selected_mass, 0.0);
    EXPECT_LE(s.selected_mass, s.oracle_mass + 1e-9) << "the oracle holds at least Quest's mass";
    EXPECT_LE(s.oracle_mass, 1.0 + 1e-6);
    for (size_t l = 0; l < s.per_layer_head_selected.size(); ++l)
        for (size_t h = 0; h < s.per_layer_head_selected[l].size(); ++h)
            EXPECT_LE(s.per_layer_head_selected[l][h], s.per_layer_head_oracle[l][h] + 1e-9) << l << "," << h;
}

TEST(Eval, PerplexityQuestCoveringTheContextEqualsFull) {
    TinyModel m = tiny_model("eval_ppl");
    const auto dir = test::temp_dir("eval_ppl_text");
    std::ofstream(dir / "t.txt") << "Once upon a time there was a little fox who lived in the woods. Every day the fox "
                                    "ran to the river to drink and to look at the fish. One day the fox saw a bird.";
    PplRequest r;
    r.text_file = (dir / "t.txt").string();
    r.window = 20;
    r.budgets = {0, 1024, 16};
    r.base.page_size = 4;
    r.base.dense_layers = 1;
    const auto rows = run_ppl(m.make, m.tok, r, [](const std::string&) {});
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_GT(rows[0].tokens, 10);
    EXPECT_GT(rows[0].ppl(), 1.0);
    EXPECT_EQ(rows[1].nll, rows[0].nll) << "a budget covering the context is full attention, bit for bit";
    EXPECT_NE(rows[2].nll, rows[0].nll) << "a 16-token budget selects pages";
}

TEST(Eval, PerplexityComparedModelsGetTheirKlFromTheMainOne) {
    TinyModel a = tiny_model("eval_ppl_kl_a"), b = tiny_model("eval_ppl_kl_b", 12);
    const auto dir = test::temp_dir("eval_ppl_kl_text");
    std::ofstream(dir / "t.txt") << "Once upon a time there was a little fox who lived in the woods. Every day the fox "
                                    "ran to the river to drink and to look at the fish.";
    PplRequest r;
    r.text_file = (dir / "t.txt").string();
    r.window = 10;
    r.budgets = {0};
    r.label = "a";
    r.compare = {{"a-again", a.make}, {"b", b.make}};
    const auto rows = run_ppl(a.make, a.tok, r, [](const std::string&) {});
    ASSERT_EQ(rows.size(), 3u);
    EXPECT_EQ(rows[0].model, "a");
    EXPECT_EQ(rows[1].model, "a-again");
    EXPECT_EQ(rows[2].model, "b");
    EXPECT_EQ(rows[0].kl, 0.0);
    EXPECT_EQ(rows[1].kl, 0.0) << "the same weights: the same distributions, bit for bit";
    EXPECT_EQ(rows[1].nll, rows[0].nll);

    // Model b's NLL and KL from a, recomputed here token by token from two fresh backends.
    const std::vector<int> ids = a.tok.encode(test::slurp(dir / "t.txt"), true);
    QuestSettings full;
    full.full_attention = true;
    auto pa = a.make(full, static_cast<int>(ids.size())), pb = b.make(full, static_cast<int>(ids.size()));
    std::span<const float> la = pa->prefill(std::span<const int>(ids.data(), 10));
    std::vector<float> ca(la.begin(), la.end());
    std::span<const float> lb = pb->prefill(std::span<const int>(ids.data(), 10));
    std::vector<float> cb(lb.begin(), lb.end());
    double kl = 0, nll_b = 0;
    int n = 0;
    for (size_t t = 10; t < ids.size(); ++t, ++n) {
        double za = 0, zb = 0;
        for (float v : ca) za += std::exp(double(v));
        for (float v : cb) zb += std::exp(double(v));
        for (size_t i = 0; i < ca.size(); ++i) {
            const double p = std::exp(double(ca[i])) / za, q = std::exp(double(cb[i])) / zb;
            kl += p * std::log(p / q);
        }
        nll_b -= std::log(std::exp(double(cb[ids[t]])) / zb);
        if (t + 1 < ids.size()) {
            la = pa->decode(ids[t]);
            ca.assign(la.begin(), la.end());
            lb = pb->decode(ids[t]);
            cb.assign(lb.begin(), lb.end());
        }
    }
    EXPECT_EQ(rows[2].tokens, n);
    EXPECT_GT(rows[2].kl, 0.01);
    EXPECT_NEAR(rows[2].kl, kl / n, 1e-9 * std::max(1.0, kl / n));
    EXPECT_NEAR(rows[2].nll, nll_b / n, 1e-9 * std::max(1.0, nll_b / n));
}
