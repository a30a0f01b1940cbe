#pragma once
// The one collective a tensor-parallel rank's forward pass needs (model/cuda/tp_llama.h): an in-place sum of an
// fp32 vector over the ranks. The product's is NCCL (model/cuda/nccl_collective.h); the tests add an in-process one
// that runs several ranks on one GPU.
#include <cuda_runtime.h>

#include <cstddef>

namespace quest {

class Collective {
public:
    virtual ~Collective() = default;
    // data[0, count) := its sum over the ranks, enqueued on `stream` (every rank calls it with the same count, in
    // the same order).
    virtual void all_reduce_sum(float* data, size_t count, cudaStream_t stream) = 0;
    // Whether all_reduce_sum may be recorded in a CUDA graph (NCCL's may; a collective that synchronises the host
    // may not, and its ranks run with CudaOptions::graph off).
    virtual bool capturable() const = 0;
    // Called when some rank failed: makes the other ranks' pending and later collectives fail instead of waiting for
    // a rank that will not come (NCCL: ncclCommAbort).
    virtual void abort() = 0;
};

// What makes a CudaLlama one rank of a tensor-parallel model: its weights are the rank's shard (TpRank::shard,
// model/io/shard_source.h), and its forward pass sums the row-parallel partials (the vocabulary-split embedding, o_proj
// and down_proj) with `collective`.
struct TpRankOptions {
    Collective* collective = nullptr;  // null: the whole model on one GPU
    int vocab_begin = 0;               // the rank's first embedding / lm_head row
    int vocab_size = 0;                // the model's vocabulary, which token ids are checked against
};

}  // namespace quest
