#include "model/cuda/llama_cuda.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>

#include "kernels/attention/attention_prefill.cuh"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/linear.h"
#include "kernels/select/page_codes.cuh"
#include "kernels/select/quest.cuh"
#include "kernels/select/registry.h"
#include "kernels/select/registry_cuda.h"
#include "model/core/step_bytes.h"
#include "kernels/common/error.h"
#include "model/io/quantize.h"
#include "model/core/rope.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"

#include "model/cuda/layout.h"

namespace quest {

using namespace cuda_layout;


CudaLlama::CudaLlama(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                     LinearLayout layout)
    : c_(c), quest_(q), opts_(o), capacity_(0), max_pages_(0), profiler_(o.profile), layout_(std::move(layout)) {
    quest_.validate();
    if (!quest_.full_attention && !cuda_selector_ops(quest_.selector)) {
        std::string runs;
        for (PageSelector s : page_selectors())
            if (cuda_selector_ops(s)) runs += (runs.empty() ? "" : ", ") + std::string(page_selector_name(s));
        throw InputError("selector '" + std::string(page_selector_name(quest_.selector)) +
                         "': the CUDA backend runs " + runs + " (this one runs on --backend cpu)");
    }
    if (!quest_.full_attention) selector_ = cuda_selector_ops(quest_.selector);
    if (!quest_.full_attention && o.quest_fused)  // the selectors' separate launches honour KvLayerView::window
        for (int l = quest_.dense_layers; l < c.num_layers; ++l)
            if (const int w = c.attention_window(l); w > 0 && w < capacity)
                throw InputError("--quest-fused: layer " + std::to_string(l) + " has a sliding window of " +
                                 std::to_string(w) + " tokens, shorter than the cache (" + std::to_string(capacity) +
                                 "), and the fused scoring + top-k does not honour windows (drop --quest-fused)");
    if (!quest_.full_attention && quest_.mass_target > 0)
        throw InputError("mass_target: the adaptive budget runs on --backend cpu only (the CUDA backend reads a page "
                         "count fixed by the position)");
    if (!quest_.full_attention && quest_.reuse_cos != 0)
        throw InputError("reuse_cos: selection reuse runs on --backend cpu only (the CUDA backend selects every step)");
    if (uses_page_codes(quest_) &&
        (c.head_dim < 8 || c.head_dim > 256 || (c.head_dim & (c.head_dim - 1)) != 0 ||
         (quest_.metadata == MetadataFormat::Int4 && c.head_dim < 16)))
        throw InputError("metadata '" + std::string(metadata_format_name(quest_.metadata)) +
                         "': the CUDA page codes need head_dim a power of two in [8, 256] (int4: >= 16), got " +
                         std::to_string(c.head_dim));
    if (o.quest_fused && !quest_.full_attention && quest_.selector != PageSelector::Quest)
        throw InputError("--quest-fused: the fused scoring + top-k is the quest selector's, not " +
                         std::string(page_selector_name(quest_.selector)) + "'s (add --selector quest)");
    if (o.quest_fused && (uses_page_codes(quest_) || settings_match(c, quest_).on()))
        throw InputError("--quest-fused: the fused scoring + top-k reads fp16 metadata and K pages; it does not run "
                         "with --metadata int8|int4 or --match-bytes");
    if (uses_key_sketch(quest_)) {
        try {
            require_sparq_supported(c.head_dim, quest_.page_size);
        } catch (const std::invalid_argument& e) {
            throw InputError(std::string("selector 'sparq': ") + e.what() + "; --selector quest runs it");
        }
    }
    match_ = settings_match(c, quest_);
    if (o.tp.collective && o.graph && !o.tp.collective->capturable())
        throw std::logic_error("CudaOptions::tp: a collective that cannot be captured needs CudaOptions::graph off");
    if (o.tp.collective && (o.tp.vocab_begin < 0 || o.tp.vocab_begin + c.vocab_size > o.tp.vocab_size))
        throw std::logic_error("CudaOptions::tp: the rank's vocabulary rows lie outside the model's");
    if (cuda_device_count() == 0)
        throw ResourceError("--backend cuda: no CUDA device is available on this machine");
    if (capacity < 1) throw InputError("context capacity must be >= 1");
    max_pages_ = (capacity + q.page_size - 1) / q.page_size;
    capacity_ = max_pages_ * q.page_size;
    if (c.head_dim % 8 != 0 || c.head_dim > 256)
        throw InputError("the CUDA backend needs head_dim to be a multiple of 8 and at most 256, got " +
                         std::to_string(c.head_dim));
    const int group = c.num_heads / c.num_kv_heads;
    if (group != 1 && group != 2 && group != 3 && group != 4 && group != 8)
        throw InputError("the CUDA backend supports GQA group sizes 1, 2, 3, 4 and 8, got " + std::to_string(group));

    plan_ = plan_memory(c_, quest_, capacity_, opts_, &layout_);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t limit = opts_.memory_limit ? opts_.memory_limit : free_b - std::min<size_t>(free_b, 512ull << 20);
    if (plan_.total() > limit) {
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "not enough GPU memory for a %d-token context: need %s, but %.2f GiB are available. Hint: lower "
                      "the context with -c, or use 4-bit weights.",
                      capacity_, plan_.describe().c_str(), gib(limit));
        throw ResourceError(buf);
    }
    spdlog::info("memory plan: {}", plan_.describe());

    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUDA_CHECK(cudaEventCreate(&ev_start_));
    CUDA_CHECK(cudaEventCreate(&ev_stop_));
    CUDA_CHECK(cudaMallocHost(&h_token_, sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&h_logits_, sizeof(float) * c_.vocab_size));
    logits_host_.resize(c_.vocab_size);
    size_t free_after = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_before_, &total_b));
    allocate();
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total_b));
    device_bytes_ = free_before_ - free_after;
}

size_t CudaLlama::device_memory_bytes() const {
    // What the device lost since this backend started allocating: its buffers plus what was allocated later on its
    // behalf (cuBLAS workspaces at the first prefill, the all-logits buffer). Nothing is freed before destruction, so
    // this is also the peak. Another process allocating at the same time would be counted too.
    size_t free_now = 0, total = 0;
    if (cudaMemGetInfo(&free_now, &total) != cudaSuccess || free_now > free_before_) return device_bytes_;
    return std::max(device_bytes_, free_before_ - free_now);
}

CudaLlama::~CudaLlama() {
    if (graph_) cudaGraphExecDestroy(graph_);
    if (cublas_) cublasDestroy(cublas_);
    if (ev_start_) cudaEventDestroy(ev_start_);
    if (ev_stop_) cudaEventDestroy(ev_stop_);
    if (h_token_) cudaFreeHost(h_token_);
    if (h_logits_) cudaFreeHost(h_logits_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaLlama::choose_decode_path() {
    // Why the fused decode step cannot run, or empty: every matrix's format must run the fused epilogues on it
    // (FP16: cols % 8 == 0, so stories260K's 172-wide down projection runs the scalar GEMV; int4: x in shared memory,
    // cols up to ~24K).
    std::string why;
    auto check = [&](const LinearWeight& W, const __half* x, const char* what) {
        if (!why.empty()) return;
        if (const std::string gap = ops_of(W).fused_gap(W, x); !gap.empty())
            why = std::string(linear_format_name(W.storage.format)) + " " + what + ": " + gap;
    };
    int partials = 0;
    for (const Layer& L : layers_) {
        check(L.qkv, xn_.get(), "qkv");
        check(L.o, att_.get(), "o");
        check(L.gu, xn_.get(), "gate+up");
        check(L.down, act_.get(), "down");
        if (why.empty())
            partials = std::max({partials, ops_of(L.o).residual_partials(L.o), ops_of(L.down).residual_partials(L.down)});
    }
    check(lm_head_, xn_.get(), "lm_head");
    if (!opts_.fused_norms) why = "switched off (--fused-norms off)";
    if (opts_.tp.collective) why = "tensor parallel: the residual adds follow the all-reduces";
    fused_decode_ = why.empty();
    if (fused_decode_) {
        if (static_cast<size_t>(partials) > norm_partials_.size())
            throw std::logic_error("choose_decode_path: " + std::to_string(partials) +
                                   " norm partials exceed the planned " + std::to_string(norm_partials_.size()));
        spdlog::info("decode step: RMSNorm, residual and SwiGLU fused into the GEMV epilogues");
    } else {
        spdlog::info("decode step: separate rms_norm / swiglu kernels ({})", why);
    }
}

KvLayerView CudaLlama::kv_view(int layer) const {
    KvLayerView v;
    const size_t kv_stride = static_cast<size_t>(c_.num_kv_heads) * capacity_ * c_.head_dim;
    const size_t meta_stride = static_cast<size_t>(c_.num_kv_heads) * max_pages_ * c_.head_dim;
    v.k = k_cache_.get() + layer * kv_stride;
    v.v = v_cache_.get() + layer * kv_stride;
    v.kmin = kmin_.get() + layer * meta_stride;
    v.kmax = kmax_.get() + layer * meta_stride;
    v.num_kv_heads = c_.num_kv_heads;
    v.head_dim = c_.head_dim;
    v.capacity = capacity_;
    v.page_size = quest_.page_size;
    v.max_pages = max_pages_;
    v.window = c_.attention_window(layer);
    return v;
}

PageCodesView CudaLlama::codes_view(int layer) const {
    PageCodesView v;
    v.format = quest_.metadata;
    v.num_kv_heads = c_.num_kv_heads;
    v.head_dim = c_.head_dim;
    v.max_pages = max_pages_;
    if (codes_.size() == 0 || !quest_.quest_layer(layer)) return v;  // no codes: codes == nullptr
    const size_t i = static_cast<size_t>(layer - quest_.dense_layers);
    v.codes = codes_.get() + i * page_codes_bytes(quest_.metadata, c_.num_kv_heads, c_.head_dim, max_pages_);
    v.scales = code_scales_.get() + i * page_code_scales_bytes(c_.num_kv_heads, max_pages_) / sizeof(float);
    return v;
}

KeySketchView CudaLlama::sketch_view(int layer) const {
    KeySketchView v;
    v.num_kv_heads = c_.num_kv_heads;
    v.head_dim = c_.head_dim;
    v.capacity = sparq_sketch_capacity(capacity_);
    if (sketch_.size() == 0 || !quest_.quest_layer(layer)) return v;
    v.k8 = sketch_.get() + static_cast<size_t>(layer - quest_.dense_layers) * key_sketch_bytes(v.num_kv_heads, v.head_dim, capacity_);
    return v;
}

SelectionTrace CudaLlama::last_selection(int layer) const {
    if (!opts_.record_selections || selection_log_.size() == 0)
        throw std::logic_error("last_selection: needs CudaOptions::record_selections and Quest layers");
    if (layer < 0 || layer >= c_.num_layers || !quest_.quest_layer(layer) || !cuda_selector_ops(quest_.selector)->row_scores ||
        (match_.on() && c_.attention_window(layer) > 0))
        throw std::logic_error("last_selection: layer " + std::to_string(layer) +
                               " is not a Quest layer of a selector that scores pages (bytes-matched: without a window)");
    const int rows = quest_selection_rows(c_.num_heads, c_.num_kv_heads, quest_.gqa_policy);
    const int K = quest_.page_budget(), S = quest_.page_size;
    // A sliding window: the step selected among the pages from f on, its scores in entries 0, 1, ... (quest.cuh).
    const int f = window_start_of(pos_, c_.attention_window(layer)) / S;
    const int P = (pos_ + S - 1) / S - f;
    const size_t sel = selection_log_.size() / c_.num_layers, sc = score_log_.size() / c_.num_layers;
    std::vector<int> pages(sel);
    std::vector<float> scores(sc);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(pages.data(), selection_log_.get() + layer * sel, sel * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(scores.data(), score_log_.get() + layer * sc, sc * sizeof(float), cudaMemcpyDeviceToHost));
    SelectionTrace t;
    // Pages per row: K (or every page at a dense step); bytes-matched, the device's count at this length.
    const int group = c_.num_heads / c_.num_kv_heads,
              count = match_.on() ? codes::step_pages(pos_, S, K, match_) : std::min(P, K);
    for (int h = 0; h < c_.num_heads; ++h) {
        const int r = rows == c_.num_heads ? h : h / group;
        const int* row = pages.data() + static_cast<size_t>(r) * (sel / rows);
        t.pages.emplace_back(row, row + count);
        std::sort(t.pages.back().begin(), t.pages.back().end());
        const float* srow = scores.data() + static_cast<size_t>(r) * max_pages_;
        std::vector<float> s;
        if (P > K) {  // indexed by page: the pages before the window were no candidates
            s.assign(static_cast<size_t>(f), -std::numeric_limits<float>::infinity());
            s.insert(s.end(), srow, srow + P - 1);
        }
        t.scores.push_back(std::move(s));
    }
    return t;
}

void CudaLlama::reset() {
    pos_ = 0;
    CUDA_CHECK(cudaMemsetAsync(d_pos_.get(), 0, sizeof(int), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace quest
