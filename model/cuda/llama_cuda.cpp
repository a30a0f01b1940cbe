#include "model/cuda/llama_cuda.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "kernels/attention/attention_prefill.cuh"
#include "kernels/common/elementwise.cuh"
#include "kernels/linear/gemv.cuh"
#include "kernels/linear/quant.h"
#include "kernels/select/page_codes.cuh"
#include "kernels/select/page_oracle.cuh"
#include "kernels/select/page_select.cuh"
#include "kernels/select/quest.cuh"
#include "model/core/error.h"
#include "model/io/quantize.h"
#include "model/core/rope.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"

namespace quest {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
double gib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

// Rows and columns of the fused linear matrices of a decoder layer: qkv, o, gate|up, down (LinearGroups order).
std::array<std::array<size_t, 2>, 4> linear_shapes(const ModelConfig& c) {
    const size_t H = c.hidden_size, F = c.intermediate_size, q = c.q_dim(), kv = c.kv_dim();
    return {{{q + 2 * kv, H}, {H, q}, {2 * F, H}, {H, F}}};
}

// Device bytes of one linear matrix: FP16 (group 0) or int4 codes + fp16 scales + uint8 zero points.
size_t linear_bytes(size_t rows, size_t cols, int group) {
    if (group <= 0) return align_up(rows * cols * 2);
    const size_t groups = rows * (cols / group);
    return align_up(rows * cols / 2) + align_up(groups * 2) + align_up(groups);
}

size_t weight_bytes(const ModelConfig& c, const LinearGroups& g) {
    const size_t H = c.hidden_size, V = c.vocab_size;
    const auto shapes = linear_shapes(c);
    size_t total = 0;
    for (int l = 0; l < c.num_layers; ++l) {
        for (int k = 0; k < 4; ++k) total += linear_bytes(shapes[k][0], shapes[k][1], g[l][k]);
        total += 2 * align_up(H * 4);
    }
    return total + align_up(V * H * 2) * (c.tie_word_embeddings ? 1 : 2) + align_up(H * 4);
}

// True when the Quest layers score int8 / int4 page codes (kernels/select/page_codes.cuh) instead of the fp16 metadata.
bool uses_page_codes(const QuestSettings& q) {
    return !q.full_attention && q.selector == PageSelector::Quest && q.metadata != MetadataFormat::Fp16;
}

// True when the Quest layers select with the oracle (kernels/select/page_oracle.cuh: every key read, true softmax mass).
bool uses_oracle(const QuestSettings& q) { return !q.full_attention && q.selector == PageSelector::Oracle; }

// Layers that run Quest selection (and keep page codes when uses_page_codes).
int quest_layer_count(const ModelConfig& c, const QuestSettings& q) {
    return q.full_attention ? 0 : std::max(0, c.num_layers - q.dense_layers);
}

// The device-side bytes-matched budget of the settings (off unless the quest selector with match_bytes).
MatchedBudget settings_match(const ModelConfig& c, const QuestSettings& q) {
    if (q.full_attention || q.selector != PageSelector::Quest || !q.match_bytes) return {};
    return matched_budget(q.metadata, c.head_dim, c.num_heads, c.num_kv_heads, q.gqa_policy);
}

// Elements of the largest int4 matrix (the prefill's FP16 dequantization scratch); 0 without int4.
size_t largest_int4(const ModelConfig& c, const LinearGroups& g) {
    const auto shapes = linear_shapes(c);
    size_t n = 0;
    for (const auto& layer : g)
        for (int k = 0; k < 4; ++k)
            if (layer[k] > 0) n = std::max(n, shapes[k][0] * shapes[k][1]);
    return n;
}

}  // namespace

std::string MemoryPlan::describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "weights %.2f GiB + KV cache %.2f GiB + page metadata %.2f GiB + workspace %.2f GiB = %.2f GiB",
                  gib(weights), gib(kv_cache), gib(metadata), gib(workspace), gib(total()));
    return buf;
}

LinearGroups uniform_linear_groups(const ModelConfig& c, int int4_group) {
    LinearGroups g(c.num_layers, {0, 0, 0, 0});
    if (int4_group <= 0) return g;
    const auto shapes = linear_shapes(c);
    for (auto& layer : g)
        for (int k = 0; k < 4; ++k)
            if (int4_quantizable(static_cast<int>(shapes[k][1]), int4_group)) layer[k] = int4_group;
    return g;
}

MemoryPlan plan_memory(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                       const LinearGroups* groups) {
    MemoryPlan p;
    const size_t L = c.num_layers, kv = c.kv_dim(), D = c.head_dim;
    const size_t pages = (capacity + q.page_size - 1) / q.page_size;
    const size_t tokens = pages * q.page_size;
    const LinearGroups uniform = groups ? LinearGroups{} : uniform_linear_groups(c, o.int4_group);
    const LinearGroups& g = groups ? *groups : uniform;
    p.weights = weight_bytes(c, g);
    p.kv_cache = L * 2 * kv * 2 * tokens;
    p.metadata = L * 2 * c.num_kv_heads * pages * D * 2;
    if (uses_page_codes(q))
        p.metadata += static_cast<size_t>(quest_layer_count(c, q)) *
                      (page_codes_bytes(q.metadata, c.num_kv_heads, c.head_dim, static_cast<int>(pages)) +
                       page_code_scales_bytes(c.num_kv_heads, static_cast<int>(pages)));
    const size_t C = std::max(1, std::min(o.prefill_chunk, capacity));
    const size_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, qd = c.q_dim();
    const size_t act = C * (H * 4 /*x*/ + (qd + 2 * kv) * 4 /*qkv*/ + H * 4 /*proj*/ + 2 * F * 4 /*gu*/ +
                            H * 2 /*xn*/ + qd * 2 /*q*/ + qd * 2 /*att*/ + F * 2 /*act*/ + 4 /*tokens*/);
    const int split_tokens = o.split_tokens > 0 ? o.split_tokens : default_split_tokens(static_cast<int>(tokens));
    const size_t splits = decode_max_splits(static_cast<int>(tokens), split_tokens);
    const size_t split_ws = split_workspace_floats(c.num_heads, c.head_dim, static_cast<int>(splits)) * 4;
    const size_t quest_ws = q.full_attention ? 0
                                             : quest_workspace_sizes(c.num_heads, c.num_kv_heads, c.head_dim,
                                                                     q.page_size, static_cast<int>(pages),
                                                                     q.page_budget(), q.gqa_policy, 0,
                                                                     settings_match(c, q))
                                                   .bytes();
    // The oracle selector's page log-sum-exps (one layer's, reused by every layer).
    const size_t oracle_ws = uses_oracle(q) ? oracle_workspace_floats(c.num_heads, static_cast<int>(pages)) * 4 : 0;
    p.workspace = act + split_ws + quest_ws + oracle_ws + V * 4 + largest_int4(c, g) * 2 /* prefill dequantization */ +
                  (64 << 20) /* cuBLAS and slack */;
    return p;
}

CudaLlama::CudaLlama(const ModelConfig& c, const QuestSettings& q, int capacity, const CudaOptions& o,
                     LinearGroups groups)
    : c_(c), quest_(q), opts_(o), capacity_(0), max_pages_(0), groups_(std::move(groups)) {
    quest_.validate();
    if (!quest_.full_attention && quest_.selector == PageSelector::TwoLevel)
        throw InputError("selector '" + std::string(page_selector_name(quest_.selector)) +
                         "': the CUDA backend runs the quest, streaming and oracle selectors (two-level runs on "
                         "--backend cpu)");
    if (!quest_.full_attention && quest_.mass_target > 0)
        throw InputError("mass_target: the adaptive budget runs on --backend cpu only (the CUDA backend reads a page "
                         "count fixed by the position)");
    if (!quest_.full_attention && quest_.reuse_cos != 0)
        throw InputError("reuse_cos: selection reuse runs on --backend cpu only (the CUDA backend selects every step)");
    // (match_bytes with a selector other than quest / two-level is refused by validate(); two-level above.)
    if (uses_page_codes(quest_) &&
        (c.head_dim < 8 || c.head_dim > 256 || (c.head_dim & (c.head_dim - 1)) != 0 ||
         (quest_.metadata == MetadataFormat::Int4 && c.head_dim < 16)))
        throw InputError("metadata '" + std::string(metadata_format_name(quest_.metadata)) +
                         "': the CUDA page codes need head_dim a power of two in [8, 256] (int4: >= 16), got " +
                         std::to_string(c.head_dim));
    if (o.quest_fused && (uses_page_codes(quest_) || settings_match(c, quest_).on()))
        throw InputError("--quest-fused: the fused scoring + top-k reads fp16 metadata and K pages; it does not run "
                         "with --metadata int8|int4 or --match-bytes");
    match_ = settings_match(c, quest_);
    if (cuda_device_count() == 0)
        throw ResourceError("--backend cuda: no CUDA device is available on this machine");
    if (capacity < 1) throw InputError("context capacity must be >= 1");
    max_pages_ = (capacity + q.page_size - 1) / q.page_size;
    capacity_ = max_pages_ * q.page_size;
    if (c.head_dim % 8 != 0 || c.head_dim > 256)
        throw InputError("the CUDA backend needs head_dim to be a multiple of 8 and at most 256, got " +
                         std::to_string(c.head_dim));
    const int group = c.num_heads / c.num_kv_heads;
    if (group != 1 && group != 2 && group != 4 && group != 8)
        throw InputError("the CUDA backend supports GQA group sizes 1, 2, 4 and 8, got " + std::to_string(group));

    plan_ = plan_memory(c_, quest_, capacity_, opts_, &groups_);
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
    for (cudaEvent_t e : profile_events_) cudaEventDestroy(e);
    if (graph_) cudaGraphExecDestroy(graph_);
    if (cublas_) cublasDestroy(cublas_);
    if (ev_start_) cudaEventDestroy(ev_start_);
    if (ev_stop_) cudaEventDestroy(ev_stop_);
    if (h_token_) cudaFreeHost(h_token_);
    if (h_logits_) cudaFreeHost(h_logits_);
    if (stream_) cudaStreamDestroy(stream_);
}

void CudaLlama::allocate() {
    const size_t H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size, qd = c_.q_dim(), kv = c_.kv_dim();
    const size_t L = c_.num_layers, D = c_.head_dim;
    // Weights: one arena, carved in file order.
    weight_arena_ = DeviceBuffer<char>(weight_bytes(c_, groups_));
    char* p = weight_arena_.get();
    auto take = [&](size_t bytes) {
        char* r = p;
        p += align_up(bytes);
        return r;
    };
    // A linear matrix: FP16, or (group > 0) int4 codes, scales and zero points (the FP16 pointer stays null).
    auto take_linear = [&](__half*& w16, Int4View& w4, size_t rows, size_t cols, int group) {
        if (group <= 0) {
            w16 = reinterpret_cast<__half*>(take(rows * cols * 2));
            return;
        }
        const size_t groups = rows * (cols / group);
        w4.qweight = reinterpret_cast<const uint32_t*>(take(rows * cols / 2));
        w4.scales = reinterpret_cast<const __half*>(take(groups * 2));
        w4.zeros = reinterpret_cast<const uint8_t*>(take(groups));
        w4.rows = static_cast<int>(rows);
        w4.cols = static_cast<int>(cols);
        w4.group = group;
    };
    embed_ = reinterpret_cast<__half*>(take(V * H * 2));
    layers_.resize(L);
    for (size_t i = 0; i < L; ++i) {
        Layer& l = layers_[i];
        take_linear(l.wqkv, l.qkv4, qd + 2 * kv, H, groups_[i][0]);
        take_linear(l.wo, l.o4, H, qd, groups_[i][1]);
        take_linear(l.wgu, l.gu4, 2 * F, H, groups_[i][2]);
        take_linear(l.wdown, l.down4, H, F, groups_[i][3]);
        l.attn_norm = reinterpret_cast<float*>(take(H * 4));
        l.mlp_norm = reinterpret_cast<float*>(take(H * 4));
    }
    if (const size_t n = largest_int4(c_, groups_)) dequant_scratch_ = DeviceBuffer<__half>(n);
    final_norm_ = reinterpret_cast<float*>(take(H * 4));
    lm_head_ = c_.tie_word_embeddings ? embed_ : reinterpret_cast<__half*>(take(V * H * 2));

    // KV cache and metadata. Poisoned (0xFF = NaN) so that a read of an unwritten position cannot go unnoticed.
    const size_t kv_elems = L * c_.num_kv_heads * static_cast<size_t>(capacity_) * D;
    const size_t meta_elems = L * c_.num_kv_heads * static_cast<size_t>(max_pages_) * D;
    k_cache_ = DeviceBuffer<__half>(kv_elems);
    v_cache_ = DeviceBuffer<__half>(kv_elems);
    kmin_ = DeviceBuffer<__half>(meta_elems);
    kmax_ = DeviceBuffer<__half>(meta_elems);
    for (auto* b : {&k_cache_, &v_cache_, &kmin_, &kmax_}) b->fill_bytes(0xFF);
    // Page codes of the Quest layers, written when a page completes (poisoned too: an unwritten scale is NaN).
    if (const int ql = quest_layer_count(c_, quest_); uses_page_codes(quest_) && ql > 0) {
        codes_ = DeviceBuffer<uint8_t>(static_cast<size_t>(ql) *
                                       page_codes_bytes(quest_.metadata, c_.num_kv_heads, c_.head_dim, max_pages_));
        code_scales_ = DeviceBuffer<float>(static_cast<size_t>(ql) * page_code_scales_bytes(c_.num_kv_heads, max_pages_) /
                                           sizeof(float));
        codes_.fill_bytes(0xFF);
        code_scales_.fill_bytes(0xFF);
    }

    // RoPE frequencies, once.
    const RopeFrequencies f = rope_frequencies(c_, 1);
    inv_freq_ = DeviceBuffer<float>(f.inv_freq.size());
    inv_freq_.upload(f.inv_freq);
    rope_.inv_freq = inv_freq_.get();
    rope_.attention_scaling = f.attention_scaling;
    rope_.dynamic = rope_depends_on_length(c_);
    rope_.theta = c_.rope_theta;
    rope_.factor = c_.rope.factor;
    rope_.max_position_embeddings = c_.max_position_embeddings;

    // Activations for one prefill chunk (decode uses the first row).
    const size_t C = std::max(1, std::min(opts_.prefill_chunk, capacity_));
    d_pos_ = DeviceBuffer<int>(1);
    d_tokens_ = DeviceBuffer<int>(C);
    x_ = DeviceBuffer<float>(C * H);
    qkv_ = DeviceBuffer<float>(C * (qd + 2 * kv));
    proj_ = DeviceBuffer<float>(C * H);
    gu_ = DeviceBuffer<float>(C * 2 * F);
    logits_ = DeviceBuffer<float>(V);
    xn_ = DeviceBuffer<__half>(C * H);
    q_ = DeviceBuffer<__half>(C * qd);
    att_ = DeviceBuffer<__half>(C * qd);
    act_ = DeviceBuffer<__half>(C * F);
    if (opts_.split_tokens <= 0) opts_.split_tokens = default_split_tokens(capacity_);
    const int splits = decode_max_splits(capacity_, opts_.split_tokens);
    ws_float_ = DeviceBuffer<float>(split_workspace_floats(c_.num_heads, c_.head_dim, splits));
    split_counters_ = DeviceBuffer<int>(c_.num_kv_heads);
    split_counters_.fill_bytes(0);
    split_ws_.o = ws_float_.get();
    split_ws_.ml = ws_float_.get() + static_cast<size_t>(c_.num_heads) * splits * c_.head_dim;
    split_ws_.counters = split_counters_.get();
    split_ws_.max_splits = splits;
    if (!quest_.full_attention) {
        const QuestWorkspaceSizes qs = quest_workspace_sizes(c_.num_heads, c_.num_kv_heads, c_.head_dim,
                                                             quest_.page_size, max_pages_, quest_.page_budget(),
                                                             quest_.gqa_policy, 0, match_);
        quest_scores_ = DeviceBuffer<float>(qs.scores);
        quest_selected_ = DeviceBuffer<int>(qs.selected);
        quest_partial_ = DeviceBuffer<float>(qs.partial_o + qs.partial_ml);
        quest_counters_ = DeviceBuffer<int>(qs.counters);
        quest_counters_.fill_bytes(0);  // the kernels leave them zero after every launch
        quest_ws_.scores = quest_scores_.get();
        quest_ws_.selected = quest_selected_.get();
        quest_ws_.partial_o = quest_partial_.get();
        quest_ws_.partial_ml = quest_partial_.get() + qs.partial_o;
        quest_ws_.counters = quest_counters_.get();
        if (opts_.record_selections) {
            selection_log_ = DeviceBuffer<int>(qs.selected * c_.num_layers);
            score_log_ = DeviceBuffer<float>(qs.scores * c_.num_layers);
        }
    }
    choose_decode_path();
    if (uses_oracle(quest_)) oracle_lse_ = DeviceBuffer<float>(oracle_workspace_floats(c_.num_heads, max_pages_));
    // The fills and uploads above ran on the legacy stream, which stream_ (non-blocking) does not wait for.
    CUDA_CHECK(cudaDeviceSynchronize());
    reset();
}

void CudaLlama::choose_decode_path() {
    const int H = c_.hidden_size, F = c_.intermediate_size, qd = c_.q_dim();
    // Why the fused decode step cannot run, or empty. Every matrix must have a fused kernel: FP16 with cols % 8 == 0
    // (stories260K's 172-wide down projection runs the scalar GEMV), int4 with the default GEMV variant.
    std::string why;
    auto check = [&](const __half* w16, const Int4View& w4, const __half* x, int cols, const char* what) {
        if (!why.empty()) return;
        if (w4.valid()) {
            if (!gemv_int4_fused_available(w4))
                why = std::string("int4 ") + what + ": GEMV variant " + std::to_string(gemv_int4_default_variant()) +
                      " (" + gemv_int4_variant_name(gemv_int4_default_variant()) +
                      ", QUEST_INT4_GEMV) has no fused epilogue" +
                      (gemv_int4_fused_supported(w4) ? "" : ", or the rows are too wide for it");
        } else if (!gemv_fused_supported(w16, x, cols)) {
            why = std::string(what) + ": " + std::to_string(cols) + " columns, not a multiple of 8 (scalar GEMV)";
        }
    };
    int partials = 0;
    for (const Layer& L : layers_) {
        check(L.wqkv, L.qkv4, xn_.get(), H, "qkv");
        check(L.wo, L.o4, att_.get(), qd, "o");
        check(L.wgu, L.gu4, xn_.get(), H, "gate+up");
        check(L.wdown, L.down4, act_.get(), F, "down");
        if (why.empty()) {
            partials = std::max(partials, L.o4.valid() ? gemv_int4_residual_partials(L.o4) : gemv_residual_partials(H));
            partials =
                std::max(partials, L.down4.valid() ? gemv_int4_residual_partials(L.down4) : gemv_residual_partials(H));
        }
    }
    check(lm_head_, Int4View{}, xn_.get(), H, "lm_head");
    if (!opts_.fused_norms) why = "switched off (--fused-norms off)";
    fused_decode_ = why.empty();
    if (fused_decode_) {
        norm_partials_ = DeviceBuffer<float>(static_cast<size_t>(std::max(partials, 1)));
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

SelectionTrace CudaLlama::last_selection(int layer) const {
    if (!opts_.record_selections || selection_log_.size() == 0)
        throw std::logic_error("last_selection: needs CudaOptions::record_selections and Quest layers");
    if (layer < 0 || layer >= c_.num_layers || !quest_.quest_layer(layer) || quest_.selector == PageSelector::Streaming ||
        match_.on())
        throw std::logic_error("last_selection: layer " + std::to_string(layer) +
                               " is not a Quest layer of the quest / oracle selector with a fixed budget");
    const int rows = quest_selection_rows(c_.num_heads, c_.num_kv_heads, quest_.gqa_policy);
    const int K = quest_.page_budget(), S = quest_.page_size;
    const int P = (pos_ + S - 1) / S;
    const size_t sel = selection_log_.size() / c_.num_layers, sc = score_log_.size() / c_.num_layers;
    std::vector<int> pages(sel);
    std::vector<float> scores(sc);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(pages.data(), selection_log_.get() + layer * sel, sel * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(scores.data(), score_log_.get() + layer * sc, sc * sizeof(float), cudaMemcpyDeviceToHost));
    SelectionTrace t;
    const int group = c_.num_heads / c_.num_kv_heads, count = std::min(P, K);
    for (int h = 0; h < c_.num_heads; ++h) {
        const int r = rows == c_.num_heads ? h : h / group;
        const int* row = pages.data() + static_cast<size_t>(r) * (sel / rows);
        t.pages.emplace_back(row, row + count);
        std::sort(t.pages.back().begin(), t.pages.back().end());
        const float* srow = scores.data() + static_cast<size_t>(r) * max_pages_;
        t.scores.emplace_back(P > K ? std::vector<float>(srow, srow + P - 1) : std::vector<float>{});
    }
    return t;
}

void CudaLlama::reset() {
    pos_ = 0;
    CUDA_CHECK(cudaMemsetAsync(d_pos_.get(), 0, sizeof(int), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ------------------------------------------------------------------------------------------------------------------
// Weights
// ------------------------------------------------------------------------------------------------------------------

namespace {

// Which of llama_linear_specs' 7 matrices make up each fused device matrix (qkv, o, gate|up, down), in row order.
const std::vector<int> kFusedParts[4] = {{0, 1, 2}, {3}, {4, 5}, {6}};

// Storage of a folder's fused matrices on the device (CudaOptions::int4_group): 4-bit layers stay as stored (when
// every part is 4-bit with one group the layout holds), FP16 layers become int4 when asked and the group divides
// their input dimension; everything else (mixed parts, -1) is FP16.
LinearGroups folder_linear_groups(const ModelConfig& c, const LinearReader& reader, int int4_group) {
    LinearGroups g(c.num_layers, {0, 0, 0, 0});
    if (int4_group < 0) return g;
    for (int l = 0; l < c.num_layers; ++l) {
        const auto specs = llama_linear_specs(c, l);
        for (int k = 0; k < 4; ++k) {
            int stored = -1;  // the common group of the 4-bit parts; 0 once a part is not 4-bit (or differs)
            bool all_float = true;
            for (int i : kFusedParts[k]) {
                const LinearSpec& s = specs[i];
                const LinearInfo li = reader.inspect(s.prefix, s.rows, s.cols);
                all_float = all_float && !li.int4();
                const bool usable = li.int4() && int4_quantizable(static_cast<int>(s.cols), li.group) &&
                                    (li.storage == LinearInfo::Storage::Int4 || s.rows % 8 == 0);
                stored = !usable ? 0 : stored == -1 || stored == li.group ? li.group : 0;
            }
            const int cols = static_cast<int>(specs[kFusedParts[k][0]].cols);
            if (stored > 0) g[l][k] = stored;
            else if (all_float && int4_group > 0 && int4_quantizable(cols, int4_group)) g[l][k] = int4_group;
        }
    }
    return g;
}

}  // namespace

std::unique_ptr<CudaLlama> CudaLlama::from_folder(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                                  const CudaOptions& opts) {
    LinearGroups groups;
    {
        const ModelFiles files(model.dir);
        const LinearReader reader(files, read_quantization_info(model.dir));
        groups = folder_linear_groups(model.config, reader, opts.int4_group);
    }
    std::unique_ptr<CudaLlama> m(new CudaLlama(model.config, quest, capacity, opts, std::move(groups)));
    m->load_weights(model);
    return m;
}

std::unique_ptr<CudaLlama> CudaLlama::random(const ModelConfig& config, const QuestSettings& quest, int capacity,
                                             uint64_t seed, const CudaOptions& opts) {
    std::unique_ptr<CudaLlama> m(
        new CudaLlama(config, quest, capacity, opts, uniform_linear_groups(config, opts.int4_group)));
    m->randomize_weights(seed);
    return m;
}

void CudaLlama::load_weights(const ModelFolder& model) {
    using N = LlamaTensorNames;
    const ModelFiles files(model.dir);
    const LinearReader reader(files, read_quantization_info(model.dir));
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    // Staging buffer for raw file bytes (the largest tensor), and an overflow counter.
    size_t largest = 0;
    for (const TensorSpec& s : llama_tensor_specs(c_))
        if (const auto t = files.find(s.name)) largest = std::max<size_t>(largest, t->info->nbytes());
    DeviceBuffer<char> staging(largest);
    DeviceBuffer<unsigned long long> overflow(1);
    size_t clamped_total = 0;

    // Converts tensor `name` into dst (fp16) or, for 1-D norm weights, into dst32 (fp32). A 2-D tensor's rows go
    // `row_stride` rows apart in dst (1: contiguous; 2: every second row, the interleaved gate+up matrix).
    auto upload = [&](const std::string& name, std::initializer_list<int64_t> shape, __half* dst, float* dst32,
                      size_t row_stride = 1) {
        const TensorRef t = files.get(name, std::span<const int64_t>(shape.begin(), shape.size()));
        const DType dt = t.info->dtype;
        if (!dtype_is_float(dt))
            throw InputError(t.file->path().string() + ": tensor '" + name +
                             "': dtype mismatch: Expected F32, F16 or BF16, Actual " + std::string(dtype_name(dt)));
        const size_t n = static_cast<size_t>(t.info->numel());
        if (dst32) {  // small: convert on the host
            std::vector<float> host(n);
            convert_to_f32(dt, t.data(), host.data(), n);
            CUDA_CHECK(cudaMemcpy(dst32, host.data(), n * 4, cudaMemcpyHostToDevice));
            return;
        }
        // On stream_, the convert's stream: a plain cudaMemcpy from pageable memory may return before its DMA has
        // landed, and stream_ (non-blocking) does not wait for the legacy stream, so the convert could read the
        // previous tensor's bytes (seen: one model load in four silently corrupted in one process).
        CUDA_CHECK(cudaMemcpyAsync(staging.get(), t.data(), t.info->nbytes(), cudaMemcpyHostToDevice, stream_));
        CUDA_CHECK(cudaMemsetAsync(overflow.get(), 0, sizeof(unsigned long long), stream_));
        if (row_stride == 1) {
            convert_to_half(dst, staging.get(), dt, n, overflow.get(), stream_);
        } else {
            const size_t cols = static_cast<size_t>(t.info->shape.at(1));
            convert_to_half_rows(dst, row_stride * cols, staging.get(), dt, n / cols, cols, overflow.get(), stream_);
        }
        unsigned long long clamped = 0;
        CUDA_CHECK(cudaMemcpyAsync(&clamped, overflow.get(), sizeof clamped, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        if (clamped) {
            spdlog::warn("{}: tensor '{}': {} values outside the FP16 range (|x| > 65504) or NaN; clamped to +-65504",
                         t.file->path().string(), name, clamped);
            clamped_total += clamped;
        }
    };
    // Fused matrix k of layer l, part by part: int4 from 4-bit storage or quantized on the host (round-to-nearest,
    // kernels/linear/quant.h), FP16 from a float tensor or dequantized from 4-bit storage. The parts' rows are appended
    // (qkv), except for gate+up (k = 2), whose two parts are interleaved row by row (gate row i at 2i, up row i at
    // 2i + 1: Layer::wgu), for FP16 and for int4 alike (the int4 device layout permutes within rows only).
    int int4_count = 0, quantized_on_load = 0;
    auto upload_linear = [&](int l, int k, __half* w16, const Int4View& w4) {
        const auto specs = llama_linear_specs(c_, l);
        const bool interleave = k == 2;
        int64_t row0 = 0;
        for (size_t part = 0; part < kFusedParts[k].size(); ++part) {
            const LinearSpec& s = specs[kFusedParts[k][part]];
            // Device row of the part's row j: first + j * stride.
            const int64_t first = interleave ? static_cast<int64_t>(part) : row0;
            const size_t stride = interleave ? kFusedParts[k].size() : 1;
            // Copies `rows` rows of `row_bytes` bytes from host memory to device rows first, first + stride, ...
            auto copy_rows = [&](void* dst_base, const void* src, size_t row_bytes) {
                CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(dst_base) + first * row_bytes, stride * row_bytes, src,
                                        row_bytes, row_bytes, static_cast<size_t>(s.rows), cudaMemcpyHostToDevice));
            };
            const LinearInfo li = reader.inspect(s.prefix, s.rows, s.cols);
            if (w4.valid()) {
                Int4Matrix m;
                if (li.int4()) {
                    m = reader.load_int4(s.prefix, s.rows, s.cols);
                } else {
                    const std::vector<float> w = reader.load_f32(s.prefix, s.rows, s.cols);
                    m = quantize_int4(w.data(), static_cast<int>(s.rows), static_cast<int>(s.cols), w4.group);
                    ++quantized_on_load;
                }
                if (m.group != w4.group)
                    throw InputError("tensor '" + s.prefix + "': group size " + std::to_string(m.group) +
                                     " differs from the other parts of its fused matrix (" +
                                     std::to_string(w4.group) + ")");
                const size_t groups = static_cast<size_t>(s.cols / w4.group);
                // The device layout (kernels/linear/int4_layout.h): a permutation of each row's codes, so parts of a fused
                // matrix are repacked and uploaded one by one.
                int4_to_device_layout(m.qweight, static_cast<int>(s.rows), static_cast<int>(s.cols), w4.group);
                copy_rows(const_cast<uint32_t*>(w4.qweight), m.qweight.data(), static_cast<size_t>(s.cols / 8) * 4);
                copy_rows(const_cast<__half*>(w4.scales), m.scales.data(), groups * 2);
                copy_rows(const_cast<uint8_t*>(w4.zeros), m.zeros.data(), groups);
                ++int4_count;
            } else if (li.int4()) {
                const std::vector<float> w = reader.load_f32(s.prefix, s.rows, s.cols);
                std::vector<uint16_t> h(w.size());
                for (size_t j = 0; j < w.size(); ++j) h[j] = float_to_half(std::clamp(w[j], -65504.0f, 65504.0f));
                copy_rows(w16, h.data(), static_cast<size_t>(s.cols) * 2);
            } else {
                upload(s.prefix + ".weight", {s.rows, s.cols}, w16 + first * s.cols, nullptr, stride);
            }
            row0 += s.rows;
        }
    };
    upload(N::embed(), {V, H}, embed_, nullptr);
    for (int l = 0; l < c_.num_layers; ++l) {
        Layer& L = layers_[l];
        upload(N::layer(l, "input_layernorm.weight"), {H}, nullptr, L.attn_norm);
        upload_linear(l, 0, L.wqkv, L.qkv4);
        upload_linear(l, 1, L.wo, L.o4);
        upload(N::layer(l, "post_attention_layernorm.weight"), {H}, nullptr, L.mlp_norm);
        upload_linear(l, 2, L.wgu, L.gu4);
        upload_linear(l, 3, L.wdown, L.down4);
    }
    upload(N::final_norm(), {H}, nullptr, final_norm_);
    if (!c_.tie_word_embeddings) upload(N::lm_head(), {V, H}, lm_head_, nullptr);
    if (clamped_total)
        spdlog::warn("{} weight values were outside the FP16 range and were clamped (BF16/F32 checkpoint)", clamped_total);
    if (int4_count)
        spdlog::info("int4 weights: {} of {} linear matrices ({} quantized on load, round-to-nearest); decode GEMV {} "
                     "({}, QUEST_INT4_GEMV)", int4_count, 7 * c_.num_layers, quantized_on_load,
                     gemv_int4_default_variant(), gemv_int4_variant_name(gemv_int4_default_variant()));
    // cudaMemcpy from pageable memory may return before its DMA lands; stream_ is non-blocking: settle everything.
    CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaLlama::randomize_weights(uint64_t seed) {
    const size_t H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size, qd = c_.q_dim(), kv = c_.kv_dim();
    uint64_t s = seed * 1000003ull;
    auto fill = [&](__half* p, size_t n, size_t fan_in) {
        fill_random_half(p, n, ++s, 1.0f / std::sqrt(static_cast<float>(fan_in)), 0.0f, stream_);
    };
    // A linear matrix [rows][fan_in]: FP16 uniform in +-1/sqrt(fan_in), or int4 values within about that range.
    auto fill_linear = [&](__half* w16, const Int4View& w4, size_t rows, size_t fan_in) {
        if (!w4.valid()) return fill(w16, rows * fan_in, fan_in);
        fill_random_int4(const_cast<uint32_t*>(w4.qweight), const_cast<__half*>(w4.scales),
                         const_cast<uint8_t*>(w4.zeros), w4.rows, w4.cols, w4.group, ++s,
                         1.0f / std::sqrt(static_cast<float>(fan_in)), stream_);
    };
    auto fill_norm = [&](float* p) { fill_random_float(p, H, ++s, 0.1f, 1.0f, stream_); };
    fill_random_half(embed_, V * H, ++s, 1.0f, 0.0f, stream_);
    for (Layer& l : layers_) {
        fill_linear(l.wqkv, l.qkv4, qd + 2 * kv, H);
        fill_linear(l.wo, l.o4, H, qd);
        fill_linear(l.wgu, l.gu4, 2 * F, H);
        fill_linear(l.wdown, l.down4, H, F);
        fill_norm(l.attn_norm);
        fill_norm(l.mlp_norm);
    }
    fill_norm(final_norm_);
    if (!c_.tie_word_embeddings) fill(lm_head_, V * H, H);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) {
            return l.qkv4.valid() || l.o4.valid() || l.gu4.valid() || l.down4.valid();
        }))
        spdlog::info("random int4 weights; decode GEMV {} ({}, QUEST_INT4_GEMV)", gemv_int4_default_variant(),
                     gemv_int4_variant_name(gemv_int4_default_variant()));
}

// ------------------------------------------------------------------------------------------------------------------
// Prefill
// ------------------------------------------------------------------------------------------------------------------

void CudaLlama::linear_gemm(float* Y, const __half* w16, const Int4View& w4, const __half* X, int T, int rows,
                            int cols) {
    if (w4.valid()) {  // dequantize into the scratch (stream-ordered: the previous GEMM is done with it), then FP16
        dequantize_int4_to_half(dequant_scratch_.get(), w4, stream_);
        w16 = dequant_scratch_.get();
    }
    gemm_cublas(cublas_, Y, w16, X, T, rows, cols, stream_);
}

void CudaLlama::linear_gemv(float* y, const __half* w16, const Int4View& w4, const __half* x, int rows, int cols) {
    if (w4.valid()) gemv_int4(y, w4, x, stream_);
    else gemv(y, w16, x, rows, cols, stream_);
}

NormScale CudaLlama::norm_input() const {
    return NormScale{norm_partials_.get(), norm_count_, c_.hidden_size, static_cast<float>(c_.rms_norm_eps)};
}

void CudaLlama::linear_gemv_scaled(float* y, const __half* w16, const Int4View& w4, int rows, int cols) {
    const NormScale norm = norm_input();
    if (w4.valid()) gemv_int4_scaled(y, w4, xn_.get(), norm, stream_);
    else gemv_scaled(y, w16, xn_.get(), rows, cols, norm, stream_);
}

void CudaLlama::linear_gemv_swiglu(const __half* w16, const Int4View& w4, int rows, int cols) {
    const NormScale norm = norm_input();
    if (w4.valid()) gemv_int4_swiglu(act_.get(), w4, xn_.get(), norm, stream_);
    else gemv_swiglu(act_.get(), w16, xn_.get(), rows, cols, norm, stream_);
}

void CudaLlama::linear_gemv_residual(const float* next_norm, const __half* w16, const Int4View& w4, const __half* x,
                                     int rows, int cols) {
    ResidualNorm r;
    r.x = x_.get();
    r.xg = xn_.get();
    r.g = next_norm;
    r.partials = norm_partials_.get();
    r.partials_capacity = static_cast<int>(norm_partials_.size());
    if (w4.valid()) gemv_int4_residual(r, w4, x, stream_);
    else gemv_residual(r, w16, x, rows, cols, stream_);
    norm_count_ = w4.valid() ? gemv_int4_residual_partials(w4) : gemv_residual_partials(rows);  // the next norm's
}

std::span<const float> CudaLlama::prefill(std::span<const int> tokens, std::vector<float>* all_logits) {
    const int n = static_cast<int>(tokens.size());
    if (n == 0) throw InputError("prefill: no tokens (an empty prompt still holds BOS)");
    if (pos_ + n > capacity_)
        throw ResourceError("context full: " + std::to_string(pos_) + " + " + std::to_string(n) +
                            " tokens exceed the KV cache capacity of " + std::to_string(capacity_) + " tokens");
    for (int t : tokens)
        if (t < 0 || t >= c_.vocab_size)
            throw InputError("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                             std::to_string(c_.vocab_size) + ")");
    const int H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size, qd = c_.q_dim(), kvd = c_.kv_dim();
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    const int C = static_cast<int>(d_tokens_.size());
    if (all_logits) {
        all_logits->assign(static_cast<size_t>(n) * V, 0.0f);
        if (chunk_logits_.size() == 0) chunk_logits_ = DeviceBuffer<float>(static_cast<size_t>(C) * V);
    }
    RopeDeviceParams rope = rope_;
    rope.dynamic_len = pos_ + n;  // dynamic NTK: the whole prompt is one forward pass

    for (int start = 0; start < n; start += C) {
        // Ctrl-C between chunks (chat, generate): wait for the chunks queued so far, and when asked, undo them and
        // stop. Positions and the page holding the first undone token are restored; later pages are rebuilt by the
        // next prefill. Without an interrupt handler (bench) chunks are queued back to back.
        if (start > 0 && interruptible()) {
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            if (interrupt_requested()) {
                const int entry = pos_ - start;
                pos_ = entry;
                CUDA_CHECK(cudaMemcpyAsync(d_pos_.get(), &entry, sizeof(int), cudaMemcpyHostToDevice, stream_));
                if (entry % quest_.page_size != 0)
                    for (int l = 0; l < c_.num_layers; ++l)
                        page_metadata_rebuild(kv_view(l), entry / quest_.page_size, entry / quest_.page_size, entry,
                                              stream_);
                CUDA_CHECK(cudaStreamSynchronize(stream_));
                throw Interrupted("prefill interrupted after " + std::to_string(start) + " of " + std::to_string(n) +
                                  " tokens; the cache holds the " + std::to_string(entry) + " tokens it held before");
            }
        }
        const int T = std::min(C, n - start);
        const int pos0 = pos_;
        CUDA_CHECK(cudaMemcpyAsync(d_tokens_.get(), tokens.data() + start, sizeof(int) * T, cudaMemcpyHostToDevice,
                                   stream_));
        embedding(x_.get(), embed_, d_tokens_.get(), T, H, V, stream_);
        for (int l = 0; l < c_.num_layers; ++l) {
            const Layer& L = layers_[l];
            const KvLayerView kv = kv_view(l);
            rms_norm(xn_.get(), x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm, T, H, eps, stream_);
            linear_gemm(qkv_.get(), L.wqkv, L.qkv4, xn_.get(), T, qd + 2 * kvd, H);
            rope_append_kv(q_.get(), kv, qkv_.get(), d_pos_.get(), T, c_.num_heads, rope, stream_);
            page_metadata_rebuild(kv, pos0 / quest_.page_size, (pos0 + T - 1) / quest_.page_size, pos0 + T, stream_);
            if (const PageCodesView cv = codes_view(l); cv.codes)  // the pages this chunk completed
                page_codes_quantize(cv, kv, pos0 / quest_.page_size, (pos0 + T) / quest_.page_size - 1, pos0 + T,
                                    stream_);
            attention_prefill(att_.get(), q_.get(), kv, T, pos0, c_.num_heads, scale, stream_);
            linear_gemm(proj_.get(), L.wo, L.o4, att_.get(), T, H, qd);
            rms_norm(xn_.get(), x_.get(), proj_.get(), L.mlp_norm, T, H, eps, stream_);
            linear_gemm(gu_.get(), L.wgu, L.gu4, xn_.get(), T, 2 * F, H);
            swiglu_interleaved(act_.get(), gu_.get(), T, F, stream_);
            linear_gemm(proj_.get(), L.wdown, L.down4, act_.get(), T, H, F);
        }
        rms_norm(xn_.get(), x_.get(), proj_.get(), final_norm_, T, H, eps, stream_);
        if (all_logits) {
            gemm_cublas(cublas_, chunk_logits_.get(), lm_head_, xn_.get(), T, V, H, stream_);
            CUDA_CHECK(cudaMemcpyAsync(all_logits->data() + static_cast<size_t>(start) * V, chunk_logits_.get(),
                                       sizeof(float) * T * V, cudaMemcpyDeviceToHost, stream_));
        }
        if (start + T == n) {
            gemv(logits_.get(), lm_head_, xn_.get() + static_cast<size_t>(T - 1) * H, V, H, stream_);
            CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_.get(), sizeof(float) * V, cudaMemcpyDeviceToHost, stream_));
        }
        advance_position(d_pos_.get(), T, stream_);
        pos_ += T;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(logits_host_.data(), h_logits_, sizeof(float) * V);
    return logits_host_;
}

// ------------------------------------------------------------------------------------------------------------------
// Decode
// ------------------------------------------------------------------------------------------------------------------

void CudaLlama::mark(const char* what) {
    if (!opts_.profile) return;
    if (marks_used_ == profile_events_.size()) {  // grows during the first step only
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        profile_events_.push_back(e);
        profile_names_.push_back(what);
    }
    profile_names_[marks_used_] = what;
    CUDA_CHECK(cudaEventRecord(profile_events_[marks_used_++], stream_));
}

void CudaLlama::enqueue_attention(int l, float scale) {
    const KvLayerView kv = kv_view(l);
    const PageCodesView cv = codes_view(l);  // int8 / int4 codes: scored instead of the fp16 metadata
    // The default Quest path (fp16 bounds, separate top-k) folds RoPE + KV append into its launches: one launch less
    // per layer (kernels/select/quest.cuh, QuestDecodeOptions::rope). Every other path launches rope_append_kv.
    const bool quest_default =
        quest_.quest_layer(l) && quest_.selector == PageSelector::Quest && !opts_.quest_fused && !cv.codes;
    if (!quest_default) {
        rope_append_kv(q_.get(), kv, qkv_.get(), d_pos_.get(), 1, c_.num_heads, rope_, stream_);
        mark("rope + kv append");
    }
    if (quest_.quest_layer(l) && quest_.selector == PageSelector::Streaming) {
        const int rows = quest_selection_rows(c_.num_heads, c_.num_kv_heads, quest_.gqa_policy);
        streaming_select(quest_ws_.selected, d_pos_.get(), rows, quest_.page_size, quest_.page_budget(), stream_);
        attention_decode_sparse(att_.get(), q_.get(), kv, d_pos_.get(), quest_ws_.selected, c_.num_heads,
                                quest_.page_budget(), quest_.gqa_policy, scale, quest_ws_, stream_);
        mark("attention streaming");
    } else if (quest_.quest_layer(l) && quest_.selector == PageSelector::Oracle) {
        // Every key read for the true page masses (an evaluation yardstick), then Quest's top-k and attention.
        oracle_select(quest_ws_.selected, quest_ws_.scores, oracle_lse_.get(), q_.get(), kv, d_pos_.get(),
                      c_.num_heads, quest_.page_budget(), quest_.gqa_policy, scale, stream_);
        attention_decode_sparse(att_.get(), q_.get(), kv, d_pos_.get(), quest_ws_.selected, c_.num_heads,
                                quest_.page_budget(), quest_.gqa_policy, scale, quest_ws_, stream_);
        mark("attention oracle");
    } else if (quest_.quest_layer(l)) {
        QuestDecodeOptions qopts;
        qopts.fused = opts_.quest_fused;
        if (cv.codes) qopts.codes = &cv;
        qopts.match = match_;
        QuestRopeAppend ra;
        if (quest_default) {
            ra.qkv = qkv_.get();
            ra.q_out = q_.get();
            ra.rope = rope_;
            qopts.rope = &ra;
        }
        quest_decode(att_.get(), q_.get(), kv, d_pos_.get(), c_.num_heads, quest_.page_budget(), quest_.gqa_policy,
                     scale, quest_ws_, stream_, qopts);
        mark("attention quest");
    } else {
        attention_decode(att_.get(), q_.get(), kv, d_pos_.get(), c_.num_heads, scale, opts_.split_tokens, split_ws_,
                         stream_);
        mark("attention full");
    }
    if (quest_.quest_layer(l) && opts_.record_selections) {
        const size_t sel = quest_selected_.size(), sc = quest_scores_.size();
        CUDA_CHECK(cudaMemcpyAsync(selection_log_.get() + l * sel, quest_selected_.get(), sel * sizeof(int),
                                   cudaMemcpyDeviceToDevice, stream_));
        CUDA_CHECK(cudaMemcpyAsync(score_log_.get() + l * sc, quest_scores_.get(), sc * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
    }
}

void CudaLlama::enqueue_decode_step() {
    const int H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size, qd = c_.q_dim(), kvd = c_.kv_dim();
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    marks_used_ = 0;
    mark("start");
    CUDA_CHECK(cudaMemcpyAsync(d_tokens_.get(), h_token_, sizeof(int), cudaMemcpyHostToDevice, stream_));
    if (fused_decode_) {
        // Norms, residual adds and SwiGLU in the GEMV epilogues (kernels/linear/gemv_epilogue.h): each GEMV that adds into
        // x also writes xg = fp16(x * g) for the next norm's weight g and per-block partial sums of x^2; the next
        // GEMV adds them and scales its sums by rsqrt(ss / H + eps). The mark() groups name the fused work they include.
        embedding_norm_prep(x_.get(), xn_.get(), norm_partials_.get(), embed_, d_tokens_.get(), layers_[0].attn_norm,
                            H, V, stream_);
        norm_count_ = 1;
        mark("embedding + norm");
        for (int l = 0; l < c_.num_layers; ++l) {
            const Layer& L = layers_[l];
            linear_gemv_scaled(qkv_.get(), L.wqkv, L.qkv4, qd + 2 * kvd, H);
            mark("gemv qkv (+norm)");
            enqueue_attention(l, scale);
            linear_gemv_residual(L.mlp_norm, L.wo, L.o4, att_.get(), H, qd);
            mark("gemv o (+residual, norm)");
            linear_gemv_swiglu(L.wgu, L.gu4, 2 * F, H);
            mark("gemv gate+up (+swiglu)");
            const float* next_norm = l + 1 < c_.num_layers ? layers_[l + 1].attn_norm : final_norm_;
            linear_gemv_residual(next_norm, L.wdown, L.down4, act_.get(), H, F);
            mark("gemv down (+residual, norm)");
        }
        gemv_scaled(logits_.get(), lm_head_, xn_.get(), V, H, norm_input(), stream_);
        mark("gemv lm_head (+norm)");
    } else {
        embedding(x_.get(), embed_, d_tokens_.get(), 1, H, V, stream_);
        mark("embedding");
        for (int l = 0; l < c_.num_layers; ++l) {
            const Layer& L = layers_[l];
            rms_norm(xn_.get(), x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm, 1, H, eps, stream_);
            mark("rms_norm");
            linear_gemv(qkv_.get(), L.wqkv, L.qkv4, xn_.get(), qd + 2 * kvd, H);
            mark("gemv qkv");
            enqueue_attention(l, scale);
            linear_gemv(proj_.get(), L.wo, L.o4, att_.get(), H, qd);
            mark("gemv o");
            rms_norm(xn_.get(), x_.get(), proj_.get(), L.mlp_norm, 1, H, eps, stream_);
            mark("rms_norm");
            linear_gemv(gu_.get(), L.wgu, L.gu4, xn_.get(), 2 * F, H);
            mark("gemv gate+up");
            swiglu_interleaved(act_.get(), gu_.get(), 1, F, stream_);
            mark("swiglu");
            linear_gemv(proj_.get(), L.wdown, L.down4, act_.get(), H, F);
            mark("gemv down");
        }
        rms_norm(xn_.get(), x_.get(), proj_.get(), final_norm_, 1, H, eps, stream_);
        mark("rms_norm");
        gemv(logits_.get(), lm_head_, xn_.get(), V, H, stream_);
        mark("gemv lm_head");
    }
    advance_position(d_pos_.get(), 1, stream_);
    CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_.get(), sizeof(float) * V, cudaMemcpyDeviceToHost, stream_));
    mark("logits to host");
}

std::string CudaLlama::profile_report() const {
    if (!opts_.profile || profile_steps_ == 0) return "";
    double total = 0;
    for (const auto& [name, ms] : profile_ms_) total += ms;
    std::string out = "decode step breakdown (eager launches with events, mean over " + std::to_string(profile_steps_) +
                      " steps; the graph hides some launch gaps):\n";
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, ms] : profile_ms_) rows.push_back({ms / profile_steps_, name});
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [ms, name] : rows) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "  %-20s %9.3f ms  %5.1f%%\n", name.c_str(), ms, 100.0 * ms * profile_steps_ / total);
        out += buf;
    }
    return out;
}

std::span<const float> CudaLlama::decode(int token) {
    if (token < 0 || token >= c_.vocab_size)
        throw InputError("token id " + std::to_string(token) + " outside the vocabulary");
    if (pos_ + 1 > capacity_)
        throw ResourceError("context full: the KV cache holds " + std::to_string(capacity_) + " tokens");
    *h_token_ = token;
    // The first step runs eagerly (it also performs one-time kernel attribute set-up); later steps replay a graph.
    // Profiling records events between kernel groups, so it runs eagerly.
    const bool capture = opts_.graph && !opts_.profile && decode_calls_ == 1 && !graph_;
    if (capture) {
        cudaGraph_t g = nullptr;
        CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        enqueue_decode_step();
        CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
        CUDA_CHECK(cudaGraphInstantiate(&graph_, g, 0));
        CUDA_CHECK(cudaGraphDestroy(g));
    }
    CUDA_CHECK(cudaEventRecord(ev_start_, stream_));
    if (graph_) CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
    else enqueue_decode_step();
    CUDA_CHECK(cudaEventRecord(ev_stop_, stream_));
    CUDA_CHECK(cudaEventSynchronize(ev_stop_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev_start_, ev_stop_));
    last_ms_ = ms;
    if (opts_.profile && decode_calls_ > 0) {  // the first step includes one-time set-up
        for (size_t i = 1; i < marks_used_; ++i) {
            float seg = 0;
            CUDA_CHECK(cudaEventElapsedTime(&seg, profile_events_[i - 1], profile_events_[i]));
            profile_ms_[profile_names_[i]] += seg;
        }
        ++profile_steps_;
    }
    ++decode_calls_;
    ++pos_;
    std::memcpy(logits_host_.data(), h_logits_, sizeof(float) * c_.vocab_size);
    return logits_host_;
}

size_t CudaLlama::decode_bytes() const {
    const size_t len = static_cast<size_t>(pos_);
    const size_t kv_token = 2ull * c_.kv_dim() * 2;  // K and V, fp16, per layer
    size_t kv = 0;
    for (int l = 0; l < c_.num_layers; ++l) {
        const size_t pages = (len + quest_.page_size - 1) / quest_.page_size;
        if (!quest_.quest_layer(l) || pages <= static_cast<size_t>(quest_.page_budget())) {
            kv += len * kv_token;
        } else {
            // The complete pages' metadata in the format scored (fp16 min/max, or codes + scale), then the selected
            // pages' KV: K pages, or the bytes-matched count. Streaming scores nothing; the oracle reads every key
            // (the bytes model's keys_scanned: len keys of 2 * head_dim bytes per KV head).
            size_t meta = 0;
            if (quest_.selector == PageSelector::Oracle)
                meta = len * c_.num_kv_heads * 2ull * c_.head_dim;
            else if (quest_.selector != PageSelector::Streaming)
                meta = (pages - 1) * c_.num_kv_heads *
                       static_cast<size_t>(page_metadata_bytes(quest_.metadata, c_.head_dim));
            const size_t sets = quest_.gqa_policy == GqaPolicy::PerHead ? c_.group_size() : 1;
            const size_t selected = static_cast<size_t>(
                codes::step_pages(static_cast<int>(len), quest_.page_size, quest_.page_budget(), match_));
            kv += meta + sets * selected * quest_.page_size * kv_token;
        }
    }
    return weight_bytes(c_, groups_) + kv;
}

}  // namespace quest
