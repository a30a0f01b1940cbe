// The tensor-parallel CUDA backend (model/cuda/tp_llama.h) on one GPU:
//  - one rank through NCCL (a communicator of one, its all-reduces recorded in the decode graph) gives exactly the
//    logits of the whole-model backend on the same kernels (--fused-norms off, which TP runs);
//  - two and more ranks on the same GPU, summing through the host (HostCollective below: a test's stand-in for NCCL,
//    which runs one rank per GPU; eager launches), follow the CPU reference within FP16 tolerance on the HF fixtures
//    (GQA, MHA, tied, BF16, Qwen2 biases, a Mistral sliding window), with full attention and with Quest, and with
//    int4 weights follow the whole-model int4 backend;
//  - a layout that does not fit is refused before anything is allocated.
// What needs several GPUs (NCCL between devices, the benchmarks) runs on the multi-GPU machines only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "../test_util.h"
#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "kernels/common/error.h"
#include "model/cuda/llama_cuda.h"
#include "model/cuda/nccl_collective.h"
#include "model/cuda/tp_llama.h"
#include "model/io/model_folder.h"

using namespace quest;

namespace {

constexpr double kLogitTol = 2e-2;  // as tests/cuda/test_cuda_model.cpp: FP16 activations against the fp32 CPU

// Ranks on one GPU summing through the host: each rank waits for its stream, copies its partial to its slot,
// and after all have, adds the slots in rank order (every rank the same sum) and copies it back. Not capturable.
class HostCollective final : public Collective {
public:
    struct Shared {
        explicit Shared(int n) : ranks(n), slots(n) {}
        int ranks;
        std::mutex m;
        std::condition_variable cv;
        int arrived = 0;
        uint64_t generation = 0;
        bool aborted = false;
        std::vector<std::vector<float>> slots;
        // Every rank waits here until all have arrived; throws after abort().
        void barrier() {
            std::unique_lock<std::mutex> lock(m);
            if (aborted) throw ResourceError("HostCollective: aborted");
            const uint64_t g = generation;
            if (++arrived == ranks) {
                arrived = 0;
                ++generation;
                cv.notify_all();
            } else {
                cv.wait(lock, [&] { return generation != g || aborted; });
            }
            if (aborted) throw ResourceError("HostCollective: aborted");
        }
    };
    HostCollective(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}

    void all_reduce_sum(float* data, size_t count, cudaStream_t stream) override {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        s_->slots[rank_].resize(count);
        CUDA_CHECK(cudaMemcpy(s_->slots[rank_].data(), data, count * sizeof(float), cudaMemcpyDeviceToHost));
        s_->barrier();
        std::vector<float> sum(count, 0.0f);
        for (const auto& slot : s_->slots)
            for (size_t i = 0; i < count; ++i) sum[i] += slot[i];
        s_->barrier();  // nobody refills a slot before every rank has read it
        CUDA_CHECK(cudaMemcpy(data, sum.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    }
    bool capturable() const override { return false; }
    void abort() override {
        std::lock_guard<std::mutex> lock(s_->m);
        s_->aborted = true;
        s_->cv.notify_all();
    }

private:
    std::shared_ptr<Shared> s_;
    int rank_;
};

// `ranks` ranks on device 0 summing through the host.
TpSetup one_gpu(int ranks) {
    TpSetup s;
    s.ranks = ranks;
    s.devices.assign(ranks, 0);
    s.collectives = [](const std::vector<int>& devices) {
        auto shared = std::make_shared<HostCollective::Shared>(static_cast<int>(devices.size()));
        std::vector<std::unique_ptr<Collective>> out;
        for (size_t r = 0; r < devices.size(); ++r) out.push_back(std::make_unique<HostCollective>(shared, int(r)));
        return out;
    };
    return s;
}

CudaOptions eager() {
    CudaOptions o;
    o.graph = false;  // HostCollective synchronises the host
    o.prefill_chunk = 7;  // several chunks, the last one partial
    return o;
}

QuestSettings full() {
    QuestSettings s;
    s.full_attention = true;
    return s;
}

// Pages of 4, a budget of 2 pages, Quest from layer 1: the fixtures' short contexts select.
QuestSettings small_quest() {
    QuestSettings s;
    s.selector = PageSelector::Quest;
    s.page_size = 4;
    s.budget = 8;
    s.dense_layers = 1;
    return s;
}

std::vector<float> row(const std::vector<float>& v, size_t i, size_t n) { return {v.begin() + i * n, v.begin() + (i + 1) * n}; }
std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

// Prefill (every token's logits) and decode steps of two backends on a fixture's reference ids.
void expect_follows(Backend& got, Backend& want, const std::filesystem::path& dir, double tol, const std::string& what) {
    const auto prompt = test::reference_ids(dir / "reference.safetensors", "prompt_ids");
    const auto steps = test::reference_ids(dir / "reference.safetensors", "decode_ids");
    const size_t V = want.config().vocab_size;
    ASSERT_EQ(got.config().vocab_size, int(V));
    std::vector<float> a, b;
    want.prefill(prompt, &a);
    got.prefill(prompt, &b);
    ASSERT_EQ(b.size(), a.size());
    for (size_t t = 0; t < prompt.size(); ++t) {
        EXPECT_LE(test::rel_err(row(b, t, V), row(a, t, V)), tol) << what << ": prefill " << t;
        EXPECT_EQ(test::argmax(row(b, t, V)), test::argmax(row(a, t, V))) << what << ": prefill " << t;
    }
    for (size_t i = 0; i < steps.size(); ++i) {
        const auto la = copy(want.decode(steps[i]));
        const auto lb = copy(got.decode(steps[i]));
        EXPECT_LE(test::rel_err(lb, la), tol) << what << ": decode " << i;
        EXPECT_EQ(test::argmax(lb), test::argmax(la)) << what << ": decode " << i;
    }
    EXPECT_EQ(got.position(), want.position());
}

int fixture_capacity(const std::filesystem::path& dir) {
    return int(test::reference_ids(dir / "reference.safetensors", "prompt_ids").size() +
               test::reference_ids(dir / "reference.safetensors", "decode_ids").size());
}

}  // namespace

// One rank through NCCL: its all-reduces of one rank copy, the embedding is the rank's (all) rows, so the logits
// are bit for bit those of the whole-model backend on the same path (--fused-norms off), graph replay included.
TEST(TpCuda, OneRankThroughNcclEqualsTheWholeModel) {
    QUEST_REQUIRE_GPU();
    if (!nccl_built()) GTEST_SKIP() << "SKIPPED: this build has no NCCL";
    const auto dir = test::source_dir() / "tests/fixtures/hf/gqa4_hd128";
    const ModelFolder m = open_model_folder(dir);
    const int cap = fixture_capacity(dir);
    for (const QuestSettings& q : {full(), small_quest()}) {
        CudaOptions o;
        o.fused_norms = false;
        TpSetup s;
        s.ranks = 1;
        auto tp = TpCudaLlama::from_folder(m, q, cap, o, s);
        auto whole = CudaLlama::from_folder(m, q, cap, o);
        const auto prompt = test::reference_ids(dir / "reference.safetensors", "prompt_ids");
        const auto steps = test::reference_ids(dir / "reference.safetensors", "decode_ids");
        std::vector<float> a, b;
        whole->prefill(prompt, &a);
        tp->prefill(prompt, &b);
        EXPECT_EQ(b, a) << "prefill";
        for (size_t i = 0; i < steps.size(); ++i)  // step 0 eager, then the captured graph
            EXPECT_EQ(copy(tp->decode(steps[i])), copy(whole->decode(steps[i]))) << "decode " << i;
        EXPECT_GT(tp->decode_bytes(), 0u);
        EXPECT_EQ(tp->decode_bytes(), whole->decode_bytes());
    }
}

// NCCL runs one rank per GPU: two ranks named on one device are refused before NCCL is asked.
TEST(TpCuda, NcclRefusesTwoRanksOnOneGpu) {
    QUEST_REQUIRE_GPU();
    if (!nccl_built()) GTEST_SKIP() << "SKIPPED: this build has no NCCL";
    EXPECT_THROW(make_nccl_collectives({0, 0}), InputError);
}

class TpCudaFixture : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Sharded on one GPU, ranks summing through the host, against the CPU reference on the FP16-rounded weights.
TEST_P(TpCudaFixture, RanksOnOneGpuFollowTheCpu) {
    QUEST_REQUIRE_GPU();
    const auto [name, ranks] = GetParam();
    const auto dir = test::source_dir() / "tests/fixtures/hf" / name;
    const ModelFolder m = open_model_folder(dir);
    const int cap = fixture_capacity(dir);
    for (const QuestSettings& q : {full(), small_quest()}) {
        const std::string what = name + " tp" + std::to_string(ranks) + (q.full_attention ? " full" : " quest");
        auto tp = TpCudaLlama::from_folder(m, q, cap, eager(), one_gpu(ranks));
        ASSERT_EQ(tp->ranks(), ranks);
        auto cpu = test::cpu_fp16_weights(m, q, cap);
        expect_follows(*tp, *cpu, dir, kLogitTol, what);
        // A new conversation after reset: the same again.
        tp->reset();
        cpu->reset();
        EXPECT_EQ(tp->position(), 0);
        expect_follows(*tp, *cpu, dir, kLogitTol, what + " after reset");
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpCudaFixture,
                         ::testing::Values(std::tuple{"mha_hd64", 2}, std::tuple{"bf16_gqa2", 2},
                                           std::tuple{"f16_gqa4", 2}, std::tuple{"qwen2_gqa2", 2},
                                           std::tuple{"mistral_swa24", 2}, std::tuple{"gqa4_hd128", 1},
                                           std::tuple{"mha_hd64", 1}),
                         [](const auto& p) {
                             return std::get<0>(p.param) + "_tp" + std::to_string(std::get<1>(p.param));
                         });

// Int4 weights quantized on load: each rank quantizes its shard (whole groups: the intermediate split is in units
// of the group), which are the whole model's groups, so TP follows the whole-model int4 backend.
TEST(TpCuda, Int4RanksFollowTheWholeInt4Model) {
    QUEST_REQUIRE_GPU();
    const auto dir = test::source_dir() / "tests/fixtures/hf/mha_hd64";
    const ModelFolder m = open_model_folder(dir);
    const int cap = fixture_capacity(dir);
    CudaOptions o = eager();
    o.weights.stored = false;
    o.weights.format = LinearFormat::Int4;
    o.weights.group = 32;
    auto tp = TpCudaLlama::from_folder(m, full(), cap, o, one_gpu(2));
    for (int r = 0; r < 2; ++r) EXPECT_EQ(tp->plan().rank[r].ffn.count % 32, 0) << "rank " << r;
    o.fused_norms = false;  // the path the ranks run: what remains is the all-reduce's summation order
    auto whole = CudaLlama::from_folder(m, full(), cap, o);
    expect_follows(*tp, *whole, dir, 2e-3, "int4 tp2");
}

// Random weights of the shard shapes (bench): every rank's shard allocated, steps run, logits finite; the bytes of a
// step are the ranks' summed.
TEST(TpCuda, RandomShardsDecode) {
    QUEST_REQUIRE_GPU();
    ModelConfig c;
    c.hidden_size = 256;
    c.intermediate_size = 688;
    c.num_layers = 4;
    c.num_heads = 8;
    c.num_kv_heads = 4;
    c.head_dim = 32;
    c.vocab_size = 1001;
    auto tp = TpCudaLlama::random(c, QuestSettings{}, 256, 7, eager(), one_gpu(4));
    const std::vector<int> prompt(100, 5);
    tp->prefill(prompt);
    size_t sum = 0;
    for (int r = 0; r < 4; ++r) sum += tp->rank(r).decode_bytes();
    EXPECT_EQ(tp->decode_bytes(), sum);
    for (int i = 0; i < 4; ++i) {
        const auto l = tp->decode(1000 - i);
        ASSERT_EQ(l.size(), 1001u);
        for (float x : l) ASSERT_TRUE(std::isfinite(x));
    }
    EXPECT_EQ(tp->position(), 104);
    EXPECT_THROW(tp->decode(1001), InputError);  // the model's vocabulary, not a rank's slice
}

// A layout whose rank does not fit is refused with the rank's numbers before any rank allocates.
TEST(TpCuda, MemoryPlanRefusesARankThatDoesNotFit) {
    QUEST_REQUIRE_GPU();
    const ModelFolder m = open_model_folder(test::source_dir() / "tests/fixtures/hf/mha_hd64");
    CudaOptions o = eager();
    o.memory_limit = 1 << 20;  // 1 MiB
    EXPECT_THAT([&] { TpCudaLlama::from_folder(m, full(), 256, o, one_gpu(2)); },
                ::testing::ThrowsMessage<ResourceError>(
                    ::testing::AllOf(::testing::HasSubstr("--tp 2: rank"), ::testing::HasSubstr("KV cache"))));
}

// Two GPUs or more (the multi-GPU machines): the trained demo model split over 2 GPUs through NCCL (graph replay,
// the path the product runs) against the same model on one GPU on the same kernels (--fused-norms off): logits
// within FP16 tolerance at prefill tokens and decode steps, full attention and Quest (budget 64 at a 1,500-token
// context: selecting). Under Quest the selections of every Quest layer are compared at every step (the ranks' heads
// in rank order against the one GPU's): while equal the logits must agree; a difference must be a near tie of the
// page scores (the ranks' sums round differently), after which the two caches legitimately differ and the run stops.
TEST(TpCuda, TwoGpusThroughNcclFollowOneGpu) {
    QUEST_REQUIRE_GPU();
    if (!nccl_built()) GTEST_SKIP() << "SKIPPED: this build has no NCCL";
    if (cuda_device_count() < 2) GTEST_SKIP() << "SKIPPED: needs 2 GPUs (this machine has " << cuda_device_count() << ")";
    const auto dir = test::source_dir() / "models/demo";
    QUEST_REQUIRE_PATH(dir);
    const ModelFolder m = open_model_folder(dir);
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> tok(3, m.config.vocab_size - 1);
    std::vector<int> prompt(1500);
    for (int& t : prompt) t = tok(rng);
    prompt[0] = m.config.bos_token_id;
    QuestSettings quest;
    quest.budget = 64;
    for (const QuestSettings& q : {full(), quest}) {
        CudaOptions o;
        o.fused_norms = false;
        o.record_selections = !q.full_attention;
        TpSetup s;
        s.ranks = 2;
        auto tp = TpCudaLlama::from_folder(m, q, 1600, o, s);
        auto one = CudaLlama::from_folder(m, q, 1600, o);
        const std::string what = q.full_attention ? "full" : "quest";
        std::vector<float> a, b;
        one->prefill(prompt, &a);
        tp->prefill(prompt, &b);
        const size_t V = m.config.vocab_size;
        for (size_t t = 0; t < prompt.size(); t += 97)
            EXPECT_LE(test::rel_err(row(b, t, V), row(a, t, V)), kLogitTol) << what << ": prefill " << t;
        int compared = 0;
        for (int i = 0; i < 32; ++i) {  // the first step eager, then both graphs replayed
            const int next = tok(rng);
            const auto la = copy(one->decode(next));
            const auto lb = copy(tp->decode(next));
            bool diverged = false;
            for (int l = q.dense_layers; !q.full_attention && l < m.config.num_layers && !diverged; ++l) {
                const SelectionTrace want = one->last_selection(l);
                SelectionTrace got;
                for (int r = 0; r < tp->ranks(); ++r) {
                    SelectionTrace t = tp->rank(r).last_selection(l);
                    got.pages.insert(got.pages.end(), t.pages.begin(), t.pages.end());
                }
                const test::SelectionCompare c = test::compare_selections(got.pages, want.pages, want.scores, 1e-2);
                ASSERT_TRUE(c.equal || c.near_tie) << what << ": decode " << i << ", layer " << l << ": " << c.what;
                diverged = !c.equal;
            }
            if (diverged) break;
            EXPECT_LE(test::rel_err(lb, la), kLogitTol) << what << ": decode " << i;
            EXPECT_EQ(test::argmax(lb), test::argmax(la)) << what << ": decode " << i;
            ++compared;
        }
        EXPECT_GE(compared, 8) << what << ": the runs diverged (a near tie) within the first steps";
    }
}
