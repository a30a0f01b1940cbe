#pragma once
// The CUDA backend: FP16 weights, paged FP16 KV cache with FP16 page metadata, chunked flash prefill, split-K
// decode attention (Quest selection in the Quest layers), and the whole decode step captured once in a CUDA graph
// and replayed (the position lives on the device; the only host synchronisation per step is reading the logits).
#include <cublas_v2.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/core/backend.h"
#include "model/io/model_folder.h"
#include "model/io/weight_source.h"
#include "kernels/attention/attention_decode.cuh"
#include "kernels/common/device_buffer.h"
#include "kernels/linear/linear.h"
#include "kernels/select/quest.cuh"
#include "kernels/select/registry_cuda.h"
#include "kernels/common/rope.cuh"
#include "model/core/config.h"
#include "model/cuda/collective.h"
#include "model/cuda/profiler.h"

namespace quest {

struct CudaOptions {
    int prefill_chunk = 2048;   // --prefill-chunk: tokens per prefill chunk (activations scale with it, not with the prompt)
    int split_tokens = 0;       // tokens per block of the split-K decode attention (0: default_split_tokens)
    bool graph = true;          // --no-graph: false. capture the decode step in a CUDA graph (false: launch kernel by kernel)
    size_t memory_limit = 0;    // bytes the plan may use; 0: what the device has free (minus a safety margin)
    bool profile = false;       // time kernel groups with events (eager launches, no graph): profile_report()
    bool quest_fused = false;   // Quest layers: quest_decode's fused scoring + top-k (default: the separate launches)
    // Storage of the linear layers (kernels/linear/format.h): as the checkpoint holds them (4-bit layers of
    // quest-int4 / AutoAWQ folders in int4, fused dequantize + GEMV in the decode step), every layer FP16, or int4 with
    // a group (FP16 checkpoints quantized on load, round-to-nearest; random weights drawn as int4).
    WeightRequest weights;
    // Decode step: the RMSNorms, residual adds and SwiGLU in the epilogues of the GEMVs around them
    // (kernels/linear/gemv_epilogue.h) instead of the separate rms_norm / swiglu kernels (what the prefill runs), when every
    // linear matrix has a fused kernel; chosen once at load and logged (faster: docs/performance.md). false: the
    // separate kernels.
    bool fused_norms = true;  // --fused-norms
    // Tests and diagnostics: after each Quest layer of a decode step, copy its selected pages and page scores to a
    // per-layer log (two device-to-device copies per Quest layer, in the graph), read by last_selection().
    bool record_selections = false;
    // One rank of a tensor-parallel model (model/cuda/tp_llama.h): the config is the rank's shard, the embedding and
    // lm_head its vocabulary rows, and the decode step runs the separate norm kernels (the residual adds follow the
    // all-reduces). Default: the whole model.
    TpRankOptions tp;
};

// One Quest layer's selection at the last decode step (CudaLlama::last_selection).
struct SelectionTrace {
    std::vector<std::vector<int>> pages;     // [query head] pages it attended, ascending (CpuLlama::last_selection)
    std::vector<std::vector<float>> scores;  // [query head] its selection row's scores of pages [0, P - 1) (the
                                             // last page is always taken; -inf before a sliding window's first
                                             // page); empty at a dense step (the window's pages <= budget)
};

// Storage of the linear matrices of each decoder layer on the device: [layer][qkv, o, gate|up, down].
using LinearLayout = std::vector<std::array<LinearStorage, 4>>;
// Every matrix FP16, or (request Int4) int4 where the group divides its input dimension: the layout of random weights.
LinearLayout uniform_linear_layout(const ModelConfig& c, const WeightRequest& request);

// Device memory the backend needs, computed before anything is allocated.
struct MemoryPlan {
    size_t weights = 0;
    size_t kv_cache = 0;   // layers x 2 x kv_dim x 2 bytes per token
    size_t metadata = 0;   // page min/max (fp16), and the int8 / int4 page codes + scales of the Quest layers
    size_t workspace = 0;  // activations, attention and Quest workspaces, logits
    size_t total() const { return weights + kv_cache + metadata + workspace; }
    std::string describe() const;
    enum class Kind { Weights, KvCache, Metadata, Workspace };
    void add(Kind k, size_t bytes) {
        (k == Kind::Weights ? weights : k == Kind::KvCache ? kv_cache : k == Kind::Metadata ? metadata : workspace) += bytes;
    }
};
// layout: the linear layers' storage (null: uniform_linear_layout(c, o.weights)).
MemoryPlan plan_memory(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                       const LinearLayout* layout = nullptr);
// The storage of each fused matrix of a checkpoint's layers as CudaLlama::from_source would hold it.
LinearLayout source_linear_layout(const ModelConfig& c, const WeightSource& source, const WeightRequest& request);

class CudaLlama final : public Backend {
public:
    // Weights from a model folder or GGUF file (model/io/weight_source.h): float tensors in FP16 on the device
    // (values beyond the FP16 range are clamped to +-65504 and reported, never turned into inf); linear layers in the
    // storage CudaOptions::weights chooses (4-bit layers of quest-int4 / AutoAWQ folders stay int4 by default). A
    // GGUF model's tensors are dequantized to fp32 on the host first.
    static std::unique_ptr<CudaLlama> from_folder(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                                  const CudaOptions& opts = {});
    // The same from any weight source (a tensor-parallel rank: model/io/shard_source.h), `config` the source's.
    static std::unique_ptr<CudaLlama> from_source(const ModelConfig& config, const WeightSource& source,
                                                  const QuestSettings& quest, int capacity, const CudaOptions& opts = {});
    // Random FP16 (or, with opts.weights int4, int4) weights generated on the device (benchmarks of large shapes
    // without a checkpoint).
    static std::unique_ptr<CudaLlama> random(const ModelConfig& config, const QuestSettings& quest, int capacity,
                                             uint64_t seed, const CudaOptions& opts = {});
    ~CudaLlama() override;

    std::string name() const override { return "cuda"; }
    const ModelConfig& config() const override { return c_; }
    bool fused_decode() const { return fused_decode_; }  // the decode step's norms in the GEMV epilogues (CudaOptions)
    const QuestSettings& quest() const override { return quest_; }
    int capacity() const override { return capacity_; }
    int position() const override { return pos_; }
    void reset() override;
    std::span<const float> prefill(std::span<const int> tokens, std::vector<float>* all_logits = nullptr) override;
    std::span<const float> decode(int token) override;
    double last_decode_ms() const override { return last_ms_; }
    size_t device_memory_bytes() const override;  // device memory held (and peak): see the definition

    const MemoryPlan& memory_plan() const { return plan_; }
    // Bytes of the device buffers the backend holds, summed over the same list the plan sums (memory_plan.cpp):
    // memory_plan().total() less its slack for cuBLAS, unless the all-logits buffer was allocated since.
    size_t buffer_bytes() const;
    std::string profile_report() const override;
    // Bytes one decode step must read at the current position (weights + KV or Quest's share + metadata).
    size_t decode_bytes() const override;

    // The device buffers of a layer (tests and tools read them back): its KV cache and fp16 page metadata, and its
    // int8 / int4 page codes (QuestSettings::metadata; kernels/select/page_codes.cuh), which only the Quest layers of the
    // quest selector keep (codes == nullptr otherwise).
    KvLayerView kv_view(int layer) const;
    PageCodesView codes_view(int layer) const;
    // The fp8 key sketch of a Quest layer of the sparq selector (k8 == nullptr otherwise).
    KeySketchView sketch_view(int layer) const;
    // With CudaOptions::record_selections: layer l's selection at the last decode step (l a Quest layer of the quest
    // or oracle selector; without a bytes-matched budget). Synchronises; not for the decode loop.
    SelectionTrace last_selection(int layer) const;

private:
    CudaLlama(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o, LinearLayout layout);
    // Every device buffer, for plan_memory (self null) and allocate() (memory_plan.cpp).
    template <class F>
    static void for_each_buffer(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                                const LinearLayout& g, CudaLlama* self, F&& f);
    friend MemoryPlan plan_memory(const ModelConfig&, const QuestSettings&, int, const CudaOptions&,
                                  const LinearLayout*);
    void allocate();
    void carve_weights();
    void load_weights(const WeightSource& source);  // weights.cpp
    void randomize_weights(uint64_t seed);
    void enqueue_decode_step();  // every kernel of one decode step on stream_
    void enqueue_attention(int l, float scale);  // decode: RoPE + KV append and the attention of layer l
    void choose_decode_path();   // fused_decode_ (at load: which kernels the decode step runs), partials
    void mark(const char* what);  // profiling: an event after the kernels of `what`
    // Tensor parallelism (CudaOptions::tp): the embedding of T tokens into x_ (the rank's rows, summed over the
    // ranks), the sum over the ranks of a row-parallel partial, and the vocabulary token ids are checked against.
    void embed_tokens(int T);
    void all_reduce(float* data, size_t count);
    int token_vocab() const { return opts_.tp.collective ? opts_.tp.vocab_size : c_.vocab_size; }

    struct Layer {
        LinearWeight qkv;   // [q_dim + 2 kv_dim][hidden]  (q_proj | k_proj | v_proj rows)
        LinearWeight o;     // [hidden][q_dim]
        LinearWeight gu;    // [2 intermediate][hidden]    rows interleaved: 2i = gate_proj i, 2i + 1 = up_proj i
        LinearWeight down;  // [hidden][intermediate]
        float* attn_norm = nullptr;  // [hidden] (norm weights stay fp32: 0.01% of the bytes)
        float* mlp_norm = nullptr;   // [hidden]
        float* bqkv = nullptr;       // [q_dim + 2 kv_dim] q|k|v biases (Qwen2), else null: added after the qkv GEMV
    };
    // The linear matrices through their format's ops (kernels/linear/linear.h): y = W x (decode), Y = X W^T
    // (prefill), and the fused decode GEMVs (kernels/linear/gemv_epilogue.h).
    void linear_gemv(float* y, const LinearWeight& W, const __half* x);
    void linear_gemm(float* Y, const LinearWeight& W, const __half* X, int T);
    NormScale norm_input() const;  // the fused step's next norm: norm_partials_[0 .. norm_count_)
    void linear_gemv_scaled(float* y, const LinearWeight& W);
    void linear_gemv_swiglu(const LinearWeight& W);
    void linear_gemv_residual(const float* next_norm, const LinearWeight& W, const __half* x);

    ModelConfig c_;
    QuestSettings quest_;
    CudaOptions opts_;
    int capacity_;
    int max_pages_;
    MemoryPlan plan_;
    int pos_ = 0;
    double last_ms_ = 0;

    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    cudaEvent_t ev_start_ = nullptr, ev_stop_ = nullptr;
    cudaGraphExec_t graph_ = nullptr;
    int decode_calls_ = 0;
    size_t device_bytes_ = 0;  // measured with cudaMemGetInfo around the allocations
    size_t free_before_ = 0;   // free device memory before the first allocation
    StepProfiler profiler_;  // CudaOptions::profile: events between the decode step's kernel groups

    // Device memory.
    DeviceBuffer<char> weight_arena_;
    std::vector<Layer> layers_;
    LinearLayout layout_;                   // storage of each layer's linear matrices
    DeviceBuffer<__half> gemm_scratch_;     // the prefill GEMMs' FP16 expansion of a non-FP16 matrix (gemm_scratch)
    __half* embed_ = nullptr;     // [vocab][hidden]
    LinearWeight lm_head_;        // [vocab][hidden] FP16 (the embedding's bytes when tied)
    float* final_norm_ = nullptr;
    DeviceBuffer<__half> k_cache_, v_cache_, kmin_, kmax_;  // [layers][kv_heads][capacity or pages][head_dim]
    // Page codes of the Quest layers (dense_layers .. layers-1), when the metadata format is int8 / int4.
    DeviceBuffer<uint8_t> codes_;      // [Quest layers][page_codes_bytes]
    DeviceBuffer<float> code_scales_;  // [Quest layers][kv_heads][padded pages]
    DeviceBuffer<uint8_t> sketch_;     // sparq: [Quest layers][kv_heads][head_dim][capacity] fp8 e4m3 keys
    MatchedBudget match_;              // bytes-matched budget (QuestSettings::match_bytes), else off
    DeviceBuffer<float> inv_freq_;
    RopeDeviceParams rope_;
    DeviceBuffer<int> d_pos_, d_tokens_;
    DeviceBuffer<float> x_, qkv_, proj_, gu_, logits_, ws_float_;
    // Fused decode step (fused_decode_): xn_ holds xg = fp16(x * g) (not normalised) and norm_partials_ the partial
    // sums of x^2 of the kernel that wrote it: norm_count_ of them (1 after embedding_norm_prep, the residual GEMV's
    // block count after it; set while the step is enqueued).
    bool fused_decode_ = false;
    DeviceBuffer<float> norm_partials_;
    int norm_count_ = 0;
    DeviceBuffer<int> split_counters_;
    DeviceBuffer<__half> xn_, q_, att_, act_;  // xn_: the fp16 input of qkv / gate+up / lm_head (see norm_partials_)
    DeviceBuffer<float> quest_scores_, quest_partial_;
    DeviceBuffer<int> quest_selected_, quest_counters_;
    const CudaSelectorOps* selector_ = nullptr;  // the Quest layers' selector (kernels/select/registry_cuda.h)
    DeviceBuffer<float> selector_ws_;  // its own scratch (CudaSelectorOps::workspace_floats), shared by the layers
    QuestWorkspace quest_ws_;
    // CudaOptions::record_selections: [layers][rows][select stride] and [layers][rows][max_pages] copies of
    // quest_selected_ / quest_scores_ after each Quest layer.
    DeviceBuffer<int> selection_log_;
    DeviceBuffer<float> score_log_;
    SplitWorkspace split_ws_;
    DeviceBuffer<float> chunk_logits_;  // [prefill_chunk][vocab], allocated when all logits are asked for

    // Pinned host memory for the graph's copies.
    int* h_token_ = nullptr;
    float* h_logits_ = nullptr;
    std::vector<float> logits_host_;
};

}  // namespace quest
