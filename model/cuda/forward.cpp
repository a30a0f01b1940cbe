#include "model/cuda/llama_cuda.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "kernels/attention/attention_prefill.cuh"
#include "kernels/common/bias.cuh"
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
// ------------------------------------------------------------------------------------------------------------------
// Prefill
// ------------------------------------------------------------------------------------------------------------------

void CudaLlama::linear_gemm(float* Y, const LinearWeight& W, const __half* X, int T) {
    ops_of(W).gemm(cublas_, Y, W, X, T, gemm_scratch_.get(), stream_);
}

void CudaLlama::linear_gemv(float* y, const LinearWeight& W, const __half* x) { ops_of(W).gemv(y, W, x, stream_); }

NormScale CudaLlama::norm_input() const {
    return NormScale{norm_partials_.get(), norm_count_, c_.hidden_size, static_cast<float>(c_.rms_norm_eps)};
}

void CudaLlama::linear_gemv_scaled(float* y, const LinearWeight& W) {
    ops_of(W).gemv_scaled(y, W, xn_.get(), norm_input(), stream_);
}

void CudaLlama::linear_gemv_swiglu(const LinearWeight& W) {
    ops_of(W).gemv_swiglu(act_.get(), W, xn_.get(), norm_input(), stream_);
}

void CudaLlama::linear_gemv_residual(const float* next_norm, const LinearWeight& W, const __half* x) {
    ResidualNorm r;
    r.x = x_.get();
    r.xg = xn_.get();
    r.g = next_norm;
    r.partials = norm_partials_.get();
    r.partials_capacity = static_cast<int>(norm_partials_.size());
    ops_of(W).gemv_residual(r, W, x, stream_);
    norm_count_ = ops_of(W).residual_partials(W);  // the next norm's
}

std::span<const float> CudaLlama::prefill(std::span<const int> tokens, std::vector<float>* all_logits) {
    const int n = static_cast<int>(tokens.size());
    if (n == 0) throw InputError("prefill: no tokens (an empty prompt still holds BOS)");
    if (pos_ + n > capacity_)
        throw ResourceError("context full: " + std::to_string(pos_) + " + " + std::to_string(n) +
                            " tokens exceed the KV cache capacity of " + std::to_string(capacity_) + " tokens");
    for (int t : tokens)
        if (t < 0 || t >= token_vocab())
            throw InputError("token id " + std::to_string(t) + " outside the vocabulary [0, " +
                             std::to_string(token_vocab()) + ")");
    const int H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size;
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
        embed_tokens(T);
        for (int l = 0; l < c_.num_layers; ++l) {
            const Layer& L = layers_[l];
            const KvLayerView kv = kv_view(l);
            rms_norm(xn_.get(), x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm, T, H, eps, stream_);
            linear_gemm(qkv_.get(), L.qkv, xn_.get(), T);
            if (L.bqkv) add_bias_rows(qkv_.get(), L.bqkv, T, L.qkv.rows, stream_);
            rope_append_kv(q_.get(), kv, qkv_.get(), d_pos_.get(), T, c_.num_heads, rope, stream_);
            page_metadata_rebuild(kv, pos0 / quest_.page_size, (pos0 + T - 1) / quest_.page_size, pos0 + T, stream_);
            if (const KeySketchView sv = sketch_view(l); sv.k8) sparq_sketch_write(sv, kv, pos0, pos0 + T, stream_);
            if (const PageCodesView cv = codes_view(l); cv.codes)  // the pages this chunk completed
                page_codes_quantize(cv, kv, pos0 / quest_.page_size, (pos0 + T) / quest_.page_size - 1, pos0 + T,
                                    stream_);
            attention_prefill(att_.get(), q_.get(), kv, T, pos0, c_.num_heads, scale, stream_);
            linear_gemm(proj_.get(), L.o, att_.get(), T);
            all_reduce(proj_.get(), static_cast<size_t>(T) * H);
            rms_norm(xn_.get(), x_.get(), proj_.get(), L.mlp_norm, T, H, eps, stream_);
            linear_gemm(gu_.get(), L.gu, xn_.get(), T);
            swiglu_interleaved(act_.get(), gu_.get(), T, F, stream_);
            linear_gemm(proj_.get(), L.down, act_.get(), T);
            all_reduce(proj_.get(), static_cast<size_t>(T) * H);
        }
        rms_norm(xn_.get(), x_.get(), proj_.get(), final_norm_, T, H, eps, stream_);
        if (all_logits) {
            linear_gemm(chunk_logits_.get(), lm_head_, xn_.get(), T);
            CUDA_CHECK(cudaMemcpyAsync(all_logits->data() + static_cast<size_t>(start) * V, chunk_logits_.get(),
                                       sizeof(float) * T * V, cudaMemcpyDeviceToHost, stream_));
        }
        if (start + T == n) {
            linear_gemv(logits_.get(), lm_head_, xn_.get() + static_cast<size_t>(T - 1) * H);
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

void CudaLlama::mark(const char* what) { profiler_.mark(what, stream_); }

void CudaLlama::embed_tokens(int T) {
    if (opts_.tp.collective) {
        embedding_rows(x_.get(), embed_, d_tokens_.get(), T, c_.hidden_size, opts_.tp.vocab_begin, c_.vocab_size, stream_);
        all_reduce(x_.get(), static_cast<size_t>(T) * c_.hidden_size);
    } else {
        embedding(x_.get(), embed_, d_tokens_.get(), T, c_.hidden_size, c_.vocab_size, stream_);
    }
}

void CudaLlama::all_reduce(float* data, size_t count) {
    if (opts_.tp.collective) opts_.tp.collective->all_reduce_sum(data, count, stream_);
}

void CudaLlama::enqueue_attention(int l, float scale) {
    const KvLayerView kv = kv_view(l);
    if (!quest_.quest_layer(l)) {
        rope_append_kv(q_.get(), kv, qkv_.get(), d_pos_.get(), 1, c_.num_heads, rope_, stream_);
        mark("rope + kv append");
        attention_decode(att_.get(), q_.get(), kv, d_pos_.get(), c_.num_heads, scale, opts_.split_tokens, split_ws_,
                         stream_);
        mark("attention full");
    } else {
        const PageCodesView cv = codes_view(l);  // int8 / int4 codes: scored instead of the fp16 metadata
        CudaSelectArgs a;
        a.out = att_.get();
        a.q = q_.get();
        a.kv = kv;
        a.d_pos = d_pos_.get();
        a.num_heads = c_.num_heads;
        a.page_budget = quest_.page_budget();
        a.policy = quest_.gqa_policy;
        a.scale = scale;
        a.ws = quest_ws_;
        a.codes = cv.codes ? &cv : nullptr;
        const KeySketchView sv = sketch_view(l);
        a.sketch = sv.k8 ? &sv : nullptr;
        a.match = match_;
        a.fused = opts_.quest_fused;
        a.workspace = selector_ws_.get();
        a.stream = stream_;
        // A selector may fold the token's RoPE + KV append into its own launches (one launch less per layer).
        QuestRopeAppend ra;
        if (selector_->folds_rope_append && selector_->folds_rope_append(a)) {
            ra.qkv = qkv_.get();
            ra.q_out = q_.get();
            ra.rope = rope_;
            a.rope = &ra;
        } else {
            rope_append_kv(q_.get(), kv, qkv_.get(), d_pos_.get(), 1, c_.num_heads, rope_, stream_);
            mark("rope + kv append");
        }
        selector_->decode_layer(a);
        mark("attention selected");
        if (opts_.record_selections) {
            const size_t sel = quest_selected_.size(), sc = quest_scores_.size();
            CUDA_CHECK(cudaMemcpyAsync(selection_log_.get() + l * sel, quest_selected_.get(), sel * sizeof(int),
                                       cudaMemcpyDeviceToDevice, stream_));
            if (selector_->row_scores)  // [rows][max_pages]: sc floats
                CUDA_CHECK(cudaMemcpyAsync(score_log_.get() + l * sc, selector_->row_scores(a), sc * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream_));
        }
    }
}

void CudaLlama::enqueue_decode_step() {
    const int H = c_.hidden_size, F = c_.intermediate_size, V = c_.vocab_size;
    const float eps = static_cast<float>(c_.rms_norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    profiler_.begin_step();
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
            linear_gemv_scaled(qkv_.get(), L.qkv);
            if (L.bqkv) add_bias_rows(qkv_.get(), L.bqkv, 1, L.qkv.rows, stream_);
            mark("gemv qkv (+norm)");
            enqueue_attention(l, scale);
            linear_gemv_residual(L.mlp_norm, L.o, att_.get());
            mark("gemv o (+residual, norm)");
            linear_gemv_swiglu(L.gu);
            mark("gemv gate+up (+swiglu)");
            const float* next_norm = l + 1 < c_.num_layers ? layers_[l + 1].attn_norm : final_norm_;
            linear_gemv_residual(next_norm, L.down, act_.get());
            mark("gemv down (+residual, norm)");
        }
        linear_gemv_scaled(logits_.get(), lm_head_);
        mark("gemv lm_head (+norm)");
    } else {
        embed_tokens(1);
        mark(opts_.tp.collective ? "embedding + all-reduce" : "embedding");
        for (int l = 0; l < c_.num_layers; ++l) {
            const Layer& L = layers_[l];
            rms_norm(xn_.get(), x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm, 1, H, eps, stream_);
            mark("rms_norm");
            linear_gemv(qkv_.get(), L.qkv, xn_.get());
            if (L.bqkv) add_bias_rows(qkv_.get(), L.bqkv, 1, L.qkv.rows, stream_);
            mark("gemv qkv");
            enqueue_attention(l, scale);
            linear_gemv(proj_.get(), L.o, att_.get());
            mark("gemv o");
            if (opts_.tp.collective) {
                all_reduce(proj_.get(), H);
                mark("all-reduce");
            }
            rms_norm(xn_.get(), x_.get(), proj_.get(), L.mlp_norm, 1, H, eps, stream_);
            mark("rms_norm");
            linear_gemv(gu_.get(), L.gu, xn_.get());
            mark("gemv gate+up");
            swiglu_interleaved(act_.get(), gu_.get(), 1, F, stream_);
            mark("swiglu");
            linear_gemv(proj_.get(), L.down, act_.get());
            mark("gemv down");
            if (opts_.tp.collective) {
                all_reduce(proj_.get(), H);
                mark("all-reduce");
            }
        }
        rms_norm(xn_.get(), x_.get(), proj_.get(), final_norm_, 1, H, eps, stream_);
        mark("rms_norm");
        linear_gemv(logits_.get(), lm_head_, xn_.get());
        mark("gemv lm_head");
    }
    advance_position(d_pos_.get(), 1, stream_);
    CUDA_CHECK(cudaMemcpyAsync(h_logits_, logits_.get(), sizeof(float) * V, cudaMemcpyDeviceToHost, stream_));
    mark("logits to host");
}

std::string CudaLlama::profile_report() const { return profiler_.report(); }

std::span<const float> CudaLlama::decode(int token) {
    if (token < 0 || token >= token_vocab())
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
    profiler_.end_step(decode_calls_ > 0);  // the first step includes one-time set-up
    ++decode_calls_;
    ++pos_;
    std::memcpy(logits_host_.data(), h_logits_, sizeof(float) * c_.vocab_size);
    return logits_host_;
}

size_t CudaLlama::decode_bytes() const {
    return weight_bytes(c_, layout_) + static_cast<size_t>(quest_step_bytes_model(c_, quest_, pos_).first);
}

}  // namespace quest
