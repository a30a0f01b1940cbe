#pragma once
// Tensor parallelism over the GPUs of one host (docs/tensor_parallel.md): one process, one host thread per rank,
// each rank a CudaLlama over its shard of the weights (model/core/tensor_parallel.h's layout, loaded through
// model/io/shard_source.h) whose forward pass sums the row-parallel partials with a Collective (NCCL's all-reduce,
// recorded in each rank's decode graph). Every rank holds its own heads' KV cache and runs Quest on them: selection
// needs no communication. Each rank's logits are its vocabulary rows; they are gathered on the host.
//
// Per decode step and rank: 1 + 2 x layers all-reduces of hidden_size floats (embedding, o_proj, down_proj).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "model/core/tensor_parallel.h"
#include "model/cuda/collective.h"
#include "model/cuda/llama_cuda.h"
#include "model/io/model_folder.h"

namespace quest {

// Where the ranks run and how they sum.
struct TpSetup {
    int ranks = 1;
    std::vector<int> devices;  // [ranks] the CUDA device of each rank; empty: rank r on device r
    // One collective per rank over `devices` (tests: several ranks on one GPU); empty: NCCL communicators
    // (make_nccl_collectives), which need a build with NCCL and a distinct GPU per rank.
    std::function<std::vector<std::unique_ptr<Collective>>(const std::vector<int>& devices)> collectives;
};

class RankThreads;

class TpCudaLlama final : public Backend {
public:
    // The plan (make_tp_plan; with int4 linear layers the intermediate split keeps whole groups) and each rank's
    // memory plan are checked against its GPU's free memory before any rank allocates: a layout that does not fit
    // is refused with the numbers of the rank that does not (ResourceError).
    static std::unique_ptr<TpCudaLlama> from_folder(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                                    const CudaOptions& opts, const TpSetup& setup);
    // Random weights of the shard shapes, rank r drawn with seed + r (benchmarks of large shapes).
    static std::unique_ptr<TpCudaLlama> random(const ModelConfig& config, const QuestSettings& quest, int capacity,
                                               uint64_t seed, const CudaOptions& opts, const TpSetup& setup);
    ~TpCudaLlama() override;

    std::string name() const override { return "cuda"; }
    const ModelConfig& config() const override { return plan_.model; }
    const QuestSettings& quest() const override { return quest_; }
    int capacity() const override;
    int position() const override;
    void reset() override;
    std::span<const float> prefill(std::span<const int> tokens, std::vector<float>* all_logits = nullptr) override;
    std::span<const float> decode(int token) override;
    double last_decode_ms() const override { return last_ms_; }  // the slowest rank's device time
    size_t device_memory_bytes() const override;                 // summed over the GPUs
    size_t decode_bytes() const override;                        // summed over the ranks: what all GPUs read
    std::string profile_report() const override;                 // rank 0's

    const TpPlan& plan() const { return plan_; }
    int ranks() const { return plan_.ranks; }
    const CudaLlama& rank(int r) const { return *ranks_[r]; }

private:
    TpCudaLlama(TpPlan plan, const QuestSettings& quest, const TpSetup& setup);
    // Builds rank r's backend on its thread (make(r, options of rank r)), after every rank's plan fits.
    using MakeRank = std::function<std::unique_ptr<CudaLlama>(int r, const CudaOptions& o)>;
    void start(const CudaOptions& opts, const std::vector<MemoryPlan>& plans, const MakeRank& make);

    TpPlan plan_;
    QuestSettings quest_;
    std::vector<int> devices_;
    std::function<std::vector<std::unique_ptr<Collective>>(const std::vector<int>&)> make_collectives_;
    std::vector<std::unique_ptr<Collective>> collectives_;  // [ranks]
    std::vector<std::unique_ptr<CudaLlama>> ranks_;         // [ranks], each built and driven by its own thread
    std::unique_ptr<RankThreads> threads_;
    std::vector<float> logits_;                             // [vocab] the ranks' slices in rank order
    double last_ms_ = 0;
};

}  // namespace quest
