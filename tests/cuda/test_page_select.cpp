// The streaming selector on the GPU (kernels/select/page_select.cuh) against quest_select_ref, the CUDA backend with
// --selector streaming against the CPU backend, and what the CUDA backend still refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "model/core/backend.h"
#include "kernels/select/page_select.cuh"
#include "kernels/select/quest.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "model/cpu/llama_cpu.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/weights.h"

using namespace quest;

// Every (page size, budget, length) of a grid that covers dense steps, K = 1 and 2, lengths that are not page
// multiples and a long context; rows beyond the written count stay poisoned.
TEST(PageSelectCuda, StreamingEqualsReference) {
    QUEST_REQUIRE_GPU();
    const int rows = 3;
    for (int S : {1, 8, 16, 64})
        for (int K : {1, 2, 3, 7, 128})
            for (int len : {1, 5, 16, 17, 100, 1000, 4097, 65536 + 3}) {
                const int cap = K + 4;
                DeviceBuffer<int> sel(static_cast<size_t>(rows) * cap), pos(1);
                std::vector<int> poison(static_cast<size_t>(rows) * cap, -7);
                CUDA_CHECK(cudaMemcpy(sel.get(), poison.data(), poison.size() * 4, cudaMemcpyHostToDevice));
                const int p = len - 1;
                CUDA_CHECK(cudaMemcpy(pos.get(), &p, 4, cudaMemcpyHostToDevice));
                // Row stride K (the contract); the extra tail of the buffer must stay poisoned.
                streaming_select(sel.get(), pos.get(), rows, S, K, nullptr);
                CUDA_CHECK(cudaDeviceSynchronize());
                std::vector<int> got(poison.size());
                CUDA_CHECK(cudaMemcpy(got.data(), sel.get(), got.size() * 4, cudaMemcpyDeviceToHost));

                QuestSelectArgs a;
                a.num_heads = rows;
                a.num_kv_heads = rows;
                a.head_dim = 4;
                a.len = len;
                a.page_size = S;
                a.page_budget = K;
                a.selector = PageSelector::Streaming;
                std::vector<std::vector<int>> want;
                quest_select_ref(a, want);
                const int count = static_cast<int>(want[0].size());
                for (int r = 0; r < rows; ++r) {
                    const std::vector<int> row(got.begin() + r * K, got.begin() + r * K + count);
                    ASSERT_EQ(row, want[r]) << "S=" << S << " K=" << K << " len=" << len << " row " << r;
                    for (int i = count; i < K; ++i) ASSERT_EQ(got[r * K + i], -7) << "wrote past the count";
                }
                for (size_t i = static_cast<size_t>(rows) * K; i < got.size(); ++i) ASSERT_EQ(got[i], -7);
            }
}

// The CUDA backend with the streaming selector follows the CPU backend (same weights rounded to fp16) at a budget
// far below the context, for every GQA policy (the selection does not depend on it, the attention layout does).
TEST(PageSelectCuda, StreamingModelFollowsCpu) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    const auto w = test::fp16_rounded_weights(m);
    std::vector<int> prompt(500);
    for (int i = 0; i < 500; ++i) prompt[i] = 3 + (i * 53) % 500;
    for (GqaPolicy p : {GqaPolicy::KvMax, GqaPolicy::PerHead}) {
        QuestSettings q;
        q.page_size = 16;
        q.budget = 64;
        q.gqa_policy = p;
        q.selector = PageSelector::Streaming;
        CpuLlama cpu(w, q, 600);
        auto gpu = CudaLlama::from_folder(m, q, 600);
        QuestSettings qf = q;
        qf.selector = PageSelector::Quest;
        auto gpu_quest = CudaLlama::from_folder(m, qf, 600);
        cpu.prefill(prompt);
        gpu->prefill(prompt);
        gpu_quest->prefill(prompt);
        double worst = 0, vs_quest = 0;
        for (int t = 0; t < 20; ++t) {
            const int tok = 3 + (t * 7) % 500;
            const auto la = cpu.decode(tok);
            const std::vector<float> ca(la.begin(), la.end());
            const auto lb = gpu->decode(tok);
            const std::vector<float> cb(lb.begin(), lb.end());
            const auto lq = gpu_quest->decode(tok);
            const std::vector<float> cq(lq.begin(), lq.end());
            worst = std::max(worst, test::rel_err(cb, ca));
            vs_quest = std::max(vs_quest, test::rel_err(cq, ca));
        }
        EXPECT_LE(worst, 2e-2) << gqa_policy_name(p);
        // The test can fail: the quest selector at the same budget picks other pages and gives other logits.
        EXPECT_GT(vs_quest, 5 * worst) << gqa_policy_name(p) << ": streaming and quest must differ at B=64 of 500";
    }
}

// Two-level stays CPU-only, with an error that says so (the oracle runs on the GPU: tests/cuda/test_page_oracle.cpp).
TEST(PageSelectCuda, TwoLevelIsRefused) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::demo_model_dir());
    QuestSettings q;
    q.selector = PageSelector::TwoLevel;
    try {
        CudaLlama::from_folder(m, q, 256);
        FAIL() << "expected an InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("two-level"), std::string::npos) << e.what();
    }
    q.selector = PageSelector::Oracle;
    EXPECT_NO_THROW(CudaLlama::from_folder(m, q, 256));
}
