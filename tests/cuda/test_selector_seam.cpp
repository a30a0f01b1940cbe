// The page-selector seam on the CUDA backend: a selector registered by the test (tests/selectors/recent.h, its
// CUDA definition in recent_cuda.cu) runs inside the decode graph and follows the CPU backend; a selector without a
// CUDA definition is refused by asking the registry, never replaced by another.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "kernels/common/error.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/model_folder.h"
#include "tests/selectors/recent_cuda.h"

using namespace quest;

TEST(SelectorSeamCuda, RegisteredSelectorFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    const auto w = test::fp16_rounded_weights(m);
    std::vector<int> prompt(500);
    for (int i = 0; i < 500; ++i) prompt[i] = 3 + (i * 53) % 500;
    for (GqaPolicy p : {GqaPolicy::KvSum, GqaPolicy::PerHead}) {
        QuestSettings q;
        q.page_size = 16;
        q.budget = 64;
        q.gqa_policy = p;
        q.selector = test::recent_selector_cuda();
        CpuLlama cpu(w, q, 600);
        auto gpu = CudaLlama::from_folder(m, q, 600);
        QuestSettings qs = q;
        qs.selector = PageSelector::Streaming;
        auto gpu_streaming = CudaLlama::from_folder(m, qs, 600);
        cpu.prefill(prompt);
        gpu->prefill(prompt);
        gpu_streaming->prefill(prompt);
        double worst = 0, vs_streaming = 0;
        for (int t = 0; t < 20; ++t) {
            const int tok = 3 + (t * 7) % 500;
            const auto la = cpu.decode(tok);
            const std::vector<float> ca(la.begin(), la.end());
            const auto lb = gpu->decode(tok);
            const std::vector<float> cb(lb.begin(), lb.end());
            const auto ls = gpu_streaming->decode(tok);
            const std::vector<float> cs(ls.begin(), ls.end());
            worst = std::max(worst, test::rel_err(cb, ca));
            vs_streaming = std::max(vs_streaming, test::rel_err(cs, ca));
        }
        EXPECT_LE(worst, 2e-2) << gqa_policy_name(p);
        // The test can fail: streaming keeps page 0 where recent keeps page P - K, which changes the logits.
        EXPECT_GT(vs_streaming, 5 * worst) << gqa_policy_name(p) << ": recent and streaming must differ at B=64";
        // The bytes model of the registered selector is the backend's decode bytes.
        EXPECT_GT(gpu->decode_bytes(), 0u);
    }
}

TEST(SelectorSeamCuda, SelectorWithoutCudaDefinitionIsRefused) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    for (PageSelector s : {test::cpu_only_selector(), PageSelector::TwoLevel}) {
        QuestSettings q;
        q.selector = s;
        try {
            CudaLlama::from_folder(m, q, 256);
            FAIL() << "expected an InputError for " << page_selector_name(s);
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(std::string(page_selector_name(s))), std::string::npos) << e.what();
        }
    }
}
