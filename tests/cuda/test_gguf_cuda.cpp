// The CUDA backend from a GGUF file (model/cuda/weights.cpp load_weights_gguf: each tensor dequantized on the host,
// the Q/K rows un-permuted, then the FP16 upload): the same logits as the CUDA backend from the HF folder the
// fixture was made from, and as the CPU backend from the GGUF; SmolLM2-135M-Instruct (Q4_1) against transformers.
#include <gtest/gtest.h>

#include <filesystem>

#include "../smollm2_reference.h"
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

// SmolLM2-135M-Instruct's GGUF (models/smollm2, tools/fetch_smollm2.sh) against transformers reading the same file in
// fp32 (tests/fixtures/smollm2): the 109-token prompt's logits and 32 teacher-forced decode steps, on the CUDA
// backend's FP16 weights, FP16 GEMV / GEMM inputs and KV cache (fp32 residual stream and accumulation). Tolerance:
// max |ours - ref| over the stored logits at most 1% of the largest |ref| logit (~0.2 on SmolLM2's logits of ~20),
// log-sum-exp within 0.1, and transformers' greedy token at every step (its smallest top-2 gap is 0.25). FP16
// rounding of the weights alone measures 0.15% and 0.016 on the CPU (E2eSmolLM2.Fp16RoundedWeightsStayNearTransformers).
TEST(CudaGguf, SmolLM2LogitsMatchTransformers) {
    QUEST_REQUIRE_GPU();
    const auto gguf = test::source_dir() / "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " is absent (run tools/fetch_smollm2.sh to fetch it)";
    const test::SmolLM2Reference ref = test::load_smollm2_reference(test::source_dir());
    QuestSettings q;
    q.full_attention = true;
    for (const bool graph : {true, false}) {
        CudaOptions opts;
        opts.graph = graph;
        auto b = CudaLlama::from_folder(open_model_folder(gguf), q, ref.positions(), opts);
        const test::SmolLM2RunError e =
            test::expect_smollm2_parity(*b, ref, 1e-2, 0.1, graph ? "cuda fp16 (graph)" : "cuda fp16 (no graph)");
        EXPECT_EQ(e.greedy_same, e.greedy_checked);
        EXPECT_EQ(e.greedy_checked, int(ref.decode_ids.size()) + 1);
    }
}
