#pragma once
// Creates the backend a command asks for (--backend cpu|cuda). The CUDA backend exists when the build has it; a
// request for it otherwise is an error, never a silent fall-back to the CPU.
#include <memory>
#include <string>
#include <vector>

#include "kernels/linear/format.h"
#include "model/core/backend.h"
#include "model/core/settings_table.h"
#include "model/io/model_folder.h"

namespace quest {

// The backend settings, each named as its flag (--fused-norms: fused_norms) here and in CudaOptions
// (model/cuda/llama_cuda.h); backend_settings_table() declares their flags, types, ranges and help once.
struct BackendOptions {
    std::string kind = "cpu";  // --backend: cpu | cuda
    int capacity = 0;          // KV cache tokens (-c)
    QuestSettings quest;
    bool graph = true;          // --no-graph: false. cuda: replay the decode step as a CUDA graph
    bool fused_norms = true;    // --fused-norms: cuda: the decode step's norms / residual / SwiGLU in the GEMVs' epilogues
    bool quest_fused = false;   // --quest-fused: cuda: Quest layers score and select pages in one launch
    size_t memory_limit = 0;    // --memory-limit: bytes the memory plan may use (0: what the device has free; cpu: host)
    int prefill_chunk = 2048;   // --prefill-chunk: cuda: tokens per prefill chunk
    bool profile = false;       // bench --breakdown: cuda: time the decode step's kernel groups (eager launches)
    int tp = 1;                 // --tp: cuda: tensor parallel over this many GPUs (model/cuda/tp_llama.h, NCCL)
    // Linear layers (kernels/linear/format.h): as stored, FP16, or int4 with a group (settings `weights` and
    // `int4_group`; bench --weights sets both per row). The CPU backend always computes in fp32 on the
    // (de)quantized values.
    WeightRequest weights;
};
// Every backend setting once (model/core/settings_table.h): backend, tp, graph, fused_norms, quest_fused,
// memory_limit, prefill_chunk, weights, int4_group.
const std::vector<Setting<BackendOptions>>& backend_settings_table();

bool cuda_backend_built();
std::unique_ptr<Backend> create_backend(const ModelFolder& model, const BackendOptions& o);
// Random weights without a checkpoint (benchmarks): generated on the device for cuda, in memory for cpu.
std::unique_ptr<Backend> create_random_backend(const ModelConfig& config, uint64_t seed, const BackendOptions& o);

}  // namespace quest
