// A grouped-query shape with 3 query heads per KV head (SmolLM2-135M's: 9 heads, 3 KV heads, head_dim 64): the CUDA
// backend follows the CPU backend on the same FP16-rounded random weights, prefill and decode steps in the graph,
// with full attention (the split-K kernel's G = 3) and with Quest selecting in every layer but the first.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "model/core/config.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/make_model.h"
#include "model/io/model_folder.h"

using namespace quest;

TEST(CudaModel, GroupOfThreeFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const auto dir = test::temp_dir("gqa3_model");
    write_random_llama(dir, parse_model_config(
        R"({"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 3, "num_attention_heads": 9,
            "num_key_value_heads": 3, "vocab_size": 1000, "max_position_embeddings": 2048, "tie_word_embeddings": true})",
        "inline"), {9, DType::F16});
    const ModelFolder m = open_model_folder(dir);
    ASSERT_EQ(m.config.head_dim, 64);
    const auto w = test::fp16_rounded_weights(m);
    std::vector<int> prompt(700);
    for (int i = 0; i < 700; ++i) prompt[i] = 3 + (i * 37) % 990;
    for (const bool full : {true, false}) {
        SCOPED_TRACE(full ? "full attention" : "quest B=256");
        QuestSettings q;
        q.selector = PageSelector::Quest;  // sparq with groups of three: SparqCuda (the {9, 3} shapes), SelectorParity
        q.full_attention = full;
        q.budget = 256;
        q.dense_layers = 1;
        CpuLlama cpu(w, q, 800);
        auto gpu = CudaLlama::from_folder(m, q, 800);
        const auto lc = cpu.prefill(prompt);
        const std::vector<float> pc(lc.begin(), lc.end());
        const auto lg = gpu->prefill(prompt);
        EXPECT_LE(test::rel_err(std::vector<float>(lg.begin(), lg.end()), pc), 2e-2);
        double worst = 0;
        for (int t = 0; t < 12; ++t) {
            const auto dc = cpu.decode(5 + t);
            const std::vector<float> vc(dc.begin(), dc.end());
            const auto dg = gpu->decode(5 + t);
            worst = std::max(worst, test::rel_err(std::vector<float>(dg.begin(), dg.end()), vc));
        }
        EXPECT_LE(worst, 2e-2);
    }
    std::filesystem::remove_all(dir);
}
