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
