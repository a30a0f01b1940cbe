// The L2 prefetch (kernels/linear/l2_prefetch.cuh) and the decode step's use of it (CudaOptions::l2_prefetch,
// model/cuda/prefetch.cpp): the range list keeps only whole 16-byte units inside each range, the launcher refuses
// what the instructions cannot take, pacing holds its rate, nothing in memory changes, and the decode step's logits
// with the prefetch on are bit for bit those with it off (it only changes what L2 holds), in a graph and eagerly,
// FP16 and int4, Quest and full attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/common/device_buffer.h"
#include "kernels/common/error.h"
#include "kernels/linear/l2_prefetch.cuh"
#include "model/core/config.h"
#include "model/cuda/llama_cuda.h"
#include "tests/cuda/cuda_test_util.h"

using namespace quest;

namespace {

const void* at(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(CudaL2Prefetch, ListTakesTheAlignedInteriorOfEachRange) {
    L2PrefetchList list;
    EXPECT_TRUE(list.add(at(0x1003), 100));  // [0x1003, 0x1067) -> [0x1010, 0x1060)
    ASSERT_EQ(list.count, 1);
    EXPECT_EQ(list.ranges[0].ptr, at(0x1010));
    EXPECT_EQ(list.ranges[0].bytes, 0x50u);
    EXPECT_TRUE(list.add(at(0x2001), 20));  // no whole 16-byte unit inside: nothing taken
    EXPECT_TRUE(list.add(nullptr, 4096));
    EXPECT_TRUE(list.add(at(0x3000), 0));
    EXPECT_EQ(list.count, 1);
    EXPECT_TRUE(list.add(at(0x4000), 4096));
    EXPECT_EQ(list.bytes(), 0x50u + 4096u);
    while (list.count < L2PrefetchList::kMaxRanges) ASSERT_TRUE(list.add(at(0x8000), 32));
    EXPECT_FALSE(list.add(at(0x9000), 32)) << "a full list must refuse, not drop silently";
    EXPECT_EQ(list.count, L2PrefetchList::kMaxRanges);
}

// The preconditions are checked before anything reaches the device (no GPU needed).
TEST(CudaL2Prefetch, LauncherChecksItsPreconditions) {
    L2PrefetchList list;
    list.ranges[0] = L2Range{at(0x1008), 64};  // misaligned
    list.count = 1;
    EXPECT_THROW(l2_prefetch(list, {}, nullptr), std::invalid_argument);
    list.ranges[0] = L2Range{at(0x1000), 40};  // not a multiple of 16
    EXPECT_THROW(l2_prefetch(list, {}, nullptr), std::invalid_argument);
    list.ranges[0] = L2Range{nullptr, 64};
    EXPECT_THROW(l2_prefetch(list, {}, nullptr), std::invalid_argument);
    list.ranges[0] = L2Range{at(0x1000), 64};
    L2PrefetchParams p;
    p.chunk_bytes = 100;
    EXPECT_THROW(l2_prefetch(list, p, nullptr), std::invalid_argument);
    p.chunk_bytes = (size_t(512) << 10) + 128;  // the bulk instruction's size field holds < 1 MiB
    EXPECT_THROW(l2_prefetch(list, p, nullptr), std::invalid_argument);
    p = {};
    p.rate_gbps = std::numeric_limits<double>::quiet_NaN();
    EXPECT_THROW(l2_prefetch(list, p, nullptr), std::invalid_argument);
    p.rate_gbps = -1;
    EXPECT_THROW(l2_prefetch(list, p, nullptr), std::invalid_argument);
    list.count = L2PrefetchList::kMaxRanges + 1;
    EXPECT_THROW(l2_prefetch(list, {}, nullptr), std::invalid_argument);
}

// Every form, paced and not, over ranges that end exactly where their allocation ends: the bytes stay as they were
// (run under compute-sanitizer memcheck in tools/device/gpu_check.sh), and a paced prefetch takes at least its
// bytes / rate.
TEST(CudaL2Prefetch, EveryFormLeavesMemoryAsItWasAndPacingHoldsTheRate) {
    QUEST_REQUIRE_GPU();
    const size_t n = (size_t(4) << 20) + 48;  // odd chunk counts, a last chunk of 48 bytes
    std::vector<uint8_t> host(n);
    std::mt19937 g(3);
    for (auto& b : host) b = static_cast<uint8_t>(g());
    DeviceBuffer<uint8_t> a(n), b(4096);
    CUDA_CHECK(cudaMemcpy(a.get(), host.data(), n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b.get(), host.data(), 4096, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (L2PrefetchForm form : {L2PrefetchForm::Bulk, L2PrefetchForm::BulkEvictLast, L2PrefetchForm::LineEvictLast})
        for (double rate : {0.0, 20.0}) {
            SCOPED_TRACE(std::string(l2_prefetch_form_name(form)) + " at " + std::to_string(rate) + " GB/s");
            L2PrefetchList list;
            ASSERT_TRUE(list.add(a.get(), n));
            ASSERT_TRUE(list.add(b.get() + 16, 4096 - 16));
            ASSERT_EQ(list.bytes(), n + 4096 - 16);
            L2PrefetchParams p;
            p.form = form;
            p.rate_gbps = rate;
            p.chunk_bytes = 16 << 10;
            CUDA_CHECK(cudaEventRecord(e0));
            l2_prefetch(list, p, nullptr);
            CUDA_CHECK(cudaEventRecord(e1));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (rate > 0) {
                // Pacing counts SM cycles at the peak clock: a lower clock only stretches it.
                const double floor_ms = static_cast<double>(list.bytes() - p.chunk_bytes) / (rate * 1e9) * 1e3;
                EXPECT_GE(ms, 0.9 * floor_ms);
            }
            std::printf("[ note ] %s, %.0f GB/s: %.1f us for %zu bytes\n", l2_prefetch_form_name(form), rate,
                        ms * 1e3, list.bytes());
            std::vector<uint8_t> back(n);
            CUDA_CHECK(cudaMemcpy(back.data(), a.get(), n, cudaMemcpyDeviceToHost));
            EXPECT_EQ(0, std::memcmp(back.data(), host.data(), n));
        }
    CUDA_CHECK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// The decode step with the prefetch on against off, on the same random weights: logits bit for bit at every step
// (prefill, the eager first step, the captured graph's replays).
TEST(CudaL2Prefetch, DecodeStepLogitsAreBitIdenticalToOff) {
    QUEST_REQUIRE_GPU();
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 3, "num_attention_heads": 8,
            "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 2048})",
        "inline");
    using P = CudaOptions::L2Prefetch;
    struct Case {
        P where;
        L2PrefetchForm form;
        double rate, fraction;
        int group;
        bool graph, full, fused;
    };
    const Case cases[] = {
        {P::Attention, L2PrefetchForm::Bulk, 1000, 0.25, 0, true, false, true},
        {P::Quest, L2PrefetchForm::BulkEvictLast, 0, 0.25, 128, true, false, true},
        {P::All, L2PrefetchForm::LineEvictLast, 1000, 1.0, 128, true, false, true},
        {P::All, L2PrefetchForm::Bulk, 0, 0.01, 0, false, false, true},   // eager: two streams, no graph
        {P::All, L2PrefetchForm::Bulk, 1000, 0.25, 128, true, true, true},  // full attention
        {P::All, L2PrefetchForm::Bulk, 1000, 0.25, 128, true, false, false},  // the separate-norms step
    };
    for (const Case& k : cases) {
        SCOPED_TRACE(std::string("where ") + std::to_string(static_cast<int>(k.where)) + ", " +
                     l2_prefetch_form_name(k.form) + ", rate " + std::to_string(k.rate) + ", fraction " +
                     std::to_string(k.fraction) + (k.group ? ", int4" : ", fp16") + (k.graph ? ", graph" : ", eager") +
                     (k.full ? ", full attention" : ", Quest") + (k.fused ? "" : ", separate norms"));
        QuestSettings q;
        q.budget = 64;
        q.page_size = 16;
        q.dense_layers = 1;
        q.full_attention = k.full;
        CudaOptions off;
        off.weights = k.group ? WeightRequest::int4(k.group) : WeightRequest::as_stored();
        off.graph = k.graph;
        off.fused_norms = k.fused;
        CudaOptions on = off;
        on.l2_prefetch = k.where;
        on.l2_prefetch_fraction = k.fraction;
        on.l2_prefetch_params.form = k.form;
        on.l2_prefetch_params.rate_gbps = k.rate;
        auto a = CudaLlama::random(c, q, 512, 9, off);
        auto b = CudaLlama::random(c, q, 512, 9, on);
        std::vector<int> prompt(200);
        for (int i = 0; i < 200; ++i) prompt[i] = 3 + (i * 37) % 900;
        auto la = a->prefill(prompt);
        auto lb = b->prefill(prompt);
        ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "prefill";
        for (int step = 0; step < 6; ++step) {
            const int token = 5 + step * 11;
            la = a->decode(token);
            lb = b->decode(token);
            bool finite = true;
            for (float v : la) finite = finite && std::isfinite(v);
            ASSERT_TRUE(finite) << step;
            ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "step " << step;
        }
    }
}

TEST(CudaL2Prefetch, BadFractionIsAnInputError) {
    QUEST_REQUIRE_GPU();
    const ModelConfig c = parse_model_config(
        R"({"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "vocab_size": 300, "max_position_embeddings": 512})",
        "inline");
    CudaOptions o;
    o.l2_prefetch = CudaOptions::L2Prefetch::Attention;
    o.l2_prefetch_fraction = 1.5;
    QuestSettings q;
    EXPECT_THROW(CudaLlama::random(c, q, 256, 1, o), InputError);
}

}  // namespace
