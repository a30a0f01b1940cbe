#pragma once
// Creates the backend a command asks for (--backend cpu|cuda). The CUDA backend exists when the build has it; a
// request for it otherwise is an error, never a silent fall-back to the CPU.
#include <memory>
#include <string>

#include "model/core/backend.h"
#include "model/io/model_folder.h"

namespace quest {

struct BackendOptions {
    std::string kind = "cpu";  // cpu | cuda
    int capacity = 0;          // KV cache tokens
    QuestSettings quest;
    bool cuda_graph = true;      // cuda: replay the decode step as a CUDA graph
    bool cuda_fused_norms = true;  // cuda: the decode step's norms / residual / SwiGLU in the GEMVs' epilogues
    bool quest_fused = false;    // cuda: Quest layers score and select pages in one launch (default: separate launches)
    size_t memory_limit = 0;     // bytes the memory plan may use (0: what the device has free; cpu: host memory)
    bool profile = false;        // cuda: time the decode step's kernel groups (eager launches)
    // Linear layers: as stored (FP16, or the 4-bit layers of quest-int4 / AutoAWQ folders), FP16 (4-bit layers
    // dequantized), or int4 with group int4_group (FP16 layers quantized on load, round-to-nearest; random weights
    // drawn as int4 on the device). The CPU backend always computes in fp32 on the (de)quantized values.
    enum class WeightFormat { Stored, Fp16, Int4 };
    WeightFormat weights = WeightFormat::Stored;
    int int4_group = 128;
};

bool cuda_backend_built();
std::unique_ptr<Backend> create_backend(const ModelFolder& model, const BackendOptions& o);
// Random weights without a checkpoint (benchmarks): generated on the device for cuda, in memory for cpu.
std::unique_ptr<Backend> create_random_backend(const ModelConfig& config, uint64_t seed, const BackendOptions& o);
// Bytes one decode step must read at the backend's current position: the weights as the backend holds them, plus
// the attention's reads under the bytes model (kernels/select/step_bytes.h: Quest's pages and metadata, or the
// whole KV; K and V counted in fp16 on both backends, so that the rows compare).
size_t backend_decode_bytes(const Backend& b);
// The CPU backend's weight bytes per decode step: every parameter in fp32 (it holds every checkpoint format so).
size_t cpu_weight_bytes(const ModelConfig& c);

}  // namespace quest
