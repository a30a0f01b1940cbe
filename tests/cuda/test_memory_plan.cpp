// The CUDA backend's memory plan and its allocation come from one list of buffers (model/cuda/memory_plan.cpp):
// what the backend holds equals the plan less its cuBLAS slack, and the device memory it actually took is that,
// up to the allocator's page rounding, for every kind of buffer set the settings ask for.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "model/core/config.h"
#include "model/cuda/llama_cuda.h"

using namespace quest;

TEST(CudaMemoryPlan, AllocationIsThePlan) {
    QUEST_REQUIRE_GPU();
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 4, "vocab_size": 4000, "max_position_embeddings": 8192})",
        "inline");
    struct Case {
        const char* what;
        QuestSettings q;
        CudaOptions o;
    };
    std::vector<Case> cases(7);
    for (Case& k : cases) k.q.selector = PageSelector::Quest;
    cases[0].what = "fp16 quest";
    cases[1].what = "int4 quest";
    cases[1].o.weights = WeightRequest::int4(128);
    cases[2].what = "full attention";
    cases[2].q.full_attention = true;
    cases[3].what = "oracle";
    cases[3].q.selector = PageSelector::Oracle;
    cases[4].what = "int4 page bounds, bytes-matched";
    cases[4].q.metadata = MetadataFormat::Int4;
    cases[4].q.match_bytes = true;
    cases[5].what = "recorded selections";
    cases[5].o.record_selections = true;
    cases[6].what = "sparq (the default): the fp8 key sketch";
    cases[6].q.selector = PageSelector::Sparq;
    for (auto& k : cases) {
        SCOPED_TRACE(k.what);
        k.q.budget = 256;
        k.q.dense_layers = 1;
        const int capacity = 5000;  // not a multiple of the page size
        const MemoryPlan plan = plan_memory(c, k.q, capacity, k.o);
        auto b = CudaLlama::random(c, k.q, capacity, 7, k.o);
        EXPECT_EQ(b->memory_plan().total(), plan.total());
        EXPECT_EQ(b->buffer_bytes() + (64ull << 20), plan.total());
        // Measured around the allocation: every listed byte, plus at most the allocator's rounding (2 MiB pages)
        // per buffer; a buffer allocated outside the list would show up here.
        const size_t measured = b->device_memory_bytes();
        EXPECT_GE(measured + (2u << 20), b->buffer_bytes());
        EXPECT_LE(measured, b->buffer_bytes() + 40 * (2u << 20));
    }
}
