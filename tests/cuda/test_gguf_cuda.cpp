// The CUDA backend from a GGUF file (model/cuda/weights.cpp load_weights_gguf: each tensor dequantized on the host,
// the Q/K rows un-permuted, then the FP16 upload): the same logits as the CUDA backend from the HF folder the
// fixture was made from, and as the CPU backend from the GGUF.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "model/cpu/llama_cpu.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/model_folder.h"

using namespace quest;

TEST(CudaGguf, FixtureRunsLikeItsHfFolder) {
    QUEST_REQUIRE_GPU();
    const ModelFolder g = open_model_folder(test::source_dir() / "tests/fixtures/gguf/llama_gqa4.gguf");
    const ModelFolder hf = open_model_folder(test::source_dir() / "tests/fixtures/hf/f16_gqa4");
    ASSERT_TRUE(g.is_gguf());
    QuestSettings q;
    q.budget = 16;
    q.page_size = 4;
    q.dense_layers = 1;
    auto a = CudaLlama::from_folder(g, q, 64);
    auto b = CudaLlama::from_folder(hf, q, 64);
    auto cpu = make_cpu_backend(g, q, 64);
    std::vector<int> prompt(40);
    for (int i = 0; i < 40; ++i) prompt[i] = 1 + (i * 7) % 50;
    const auto la = a->prefill(prompt);
    const std::vector<float> pa(la.begin(), la.end());
    const auto lb = b->prefill(prompt);
    EXPECT_EQ(pa, std::vector<float>(lb.begin(), lb.end()));  // the same FP16 weights on the device: the same bits
    const auto lc = cpu->prefill(prompt);
    EXPECT_LE(test::rel_err(pa, std::vector<float>(lc.begin(), lc.end())), 2e-2);
    for (int t = 0; t < 8; ++t) {  // decode steps, Quest selecting from the second layer on
        const auto da = a->decode(3 + t);
        const std::vector<float> va(da.begin(), da.end());
        const auto db = b->decode(3 + t);
        EXPECT_EQ(va, std::vector<float>(db.begin(), db.end())) << "step " << t;
        const auto dc = cpu->decode(3 + t);
        EXPECT_LE(test::rel_err(va, std::vector<float>(dc.begin(), dc.end())), 2e-2) << "step " << t;
    }
}
