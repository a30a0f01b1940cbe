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
#include "kernels/select/quest.cuh"
#include "kernels/select/registry.h"
#include "kernels/select/registry_cuda.h"
#include "model/core/step_bytes.h"
#include "kernels/common/error.h"
#include "model/io/gguf_model.h"
#include "model/io/quantize.h"
#include "model/core/rope.h"
#include "model/io/safetensors.h"
#include "model/io/weights.h"

#include "model/cuda/layout.h"

namespace quest {

using namespace cuda_layout;
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

// The GGUF counterpart: every tensor arrives as fp32, so a fused matrix is int4 when asked (int4_group > 0) and the
// group divides its input dimension, FP16 otherwise.
LinearGroups gguf_linear_groups(const ModelConfig& c, int int4_group) {
    LinearGroups g(c.num_layers, {0, 0, 0, 0});
    if (int4_group <= 0) return g;
    for (int l = 0; l < c.num_layers; ++l) {
        const auto specs = llama_linear_specs(c, l);
        for (int k = 0; k < 4; ++k)
            if (int4_quantizable(static_cast<int>(specs[kFusedParts[k][0]].cols), int4_group)) g[l][k] = int4_group;
    }
    return g;
}

}  // namespace

std::unique_ptr<CudaLlama> CudaLlama::from_folder(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                                  const CudaOptions& opts) {
    LinearGroups groups;
    if (model.is_gguf()) {
        groups = gguf_linear_groups(model.config, opts.int4_group);
    } else {
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
    if (model.is_gguf()) return load_weights_gguf(*model.gguf);
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
        if (L.bqkv)
            upload_qkv_bias(L.bqkv, c_, l, [&](const std::string& n, int64_t len) { return load_tensor_f32(files, n, {&len, 1}); });
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
        spdlog::info("int4 weights: {} of {} linear matrices ({} quantized on load, round-to-nearest)", int4_count,
                     7 * c_.num_layers, quantized_on_load);
    // cudaMemcpy from pageable memory may return before its DMA lands; stream_ is non-blocking: settle everything.
    CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaLlama::load_weights_gguf(const GgufFile& f) {
    using N = LlamaTensorNames;
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    size_t clamped_total = 0;
    // Tensor `name` dequantized on the host (rows un-permuted for q_proj / k_proj: gguf_load_tensor_f32), checked
    // against `shape`.
    auto host = [&](const std::string& name, std::initializer_list<int64_t> shape) {
        return gguf_load_tensor_f32(f, c_, name, std::span<const int64_t>(shape.begin(), shape.size()));
    };
    // A 1-D norm weight in fp32.
    auto upload32 = [&](const std::string& name, float* dst) {
        const std::vector<float> w = host(name, {H});
        CUDA_CHECK(cudaMemcpy(dst, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    };
    // A matrix [rows][cols] in FP16, its row j at device row first + j * stride of dst (clamped to +-65504, as the
    // safetensors path does on the device).
    auto upload16 = [&](const std::string& name, const std::vector<float>& w, int64_t cols, __half* dst,
                        int64_t first, size_t stride) {
        std::vector<uint16_t> h(w.size());
        size_t clamped = 0;
        for (size_t j = 0; j < w.size(); ++j) {
            const float v = w[j];
            if (!(std::fabs(v) <= 65504.0f)) ++clamped;
            h[j] = float_to_half(std::isnan(v) ? 0.0f : std::clamp(v, -65504.0f, 65504.0f));
        }
        const size_t row_bytes = static_cast<size_t>(cols) * 2;
        CUDA_CHECK(cudaMemcpy2D(reinterpret_cast<char*>(dst) + first * row_bytes, stride * row_bytes, h.data(),
                                row_bytes, row_bytes, w.size() / static_cast<size_t>(cols), cudaMemcpyHostToDevice));
        if (clamped) {
            spdlog::warn("{}: tensor '{}': {} values outside the FP16 range (|x| > 65504) or NaN; clamped to +-65504",
                         f.name(), name, clamped);
            clamped_total += clamped;
        }
    };
    // Fused matrix k of layer l, part by part, as load_weights does: rows appended (qkv), gate+up interleaved.
    int int4_count = 0;
    auto upload_linear = [&](int l, int k, __half* w16, const Int4View& w4) {
        const auto specs = llama_linear_specs(c_, l);
        const bool interleave = k == 2;
        int64_t row0 = 0;
        for (size_t part = 0; part < kFusedParts[k].size(); ++part) {
            const LinearSpec& s = specs[kFusedParts[k][part]];
            const int64_t first = interleave ? static_cast<int64_t>(part) : row0;
            const size_t stride = interleave ? kFusedParts[k].size() : 1;
            const std::string name = s.prefix + ".weight";
            const std::vector<float> w = host(name, {s.rows, s.cols});
            if (w4.valid()) {
                Int4Matrix m = quantize_int4(w.data(), static_cast<int>(s.rows), static_cast<int>(s.cols), w4.group);
                const size_t groups = static_cast<size_t>(s.cols / w4.group);
                auto copy_rows = [&](void* dst_base, const void* src, size_t row_bytes) {
                    CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(dst_base) + first * row_bytes, stride * row_bytes, src,
                                            row_bytes, row_bytes, static_cast<size_t>(s.rows),
                                            cudaMemcpyHostToDevice));
                };
                int4_to_device_layout(m.qweight, static_cast<int>(s.rows), static_cast<int>(s.cols), w4.group);
                copy_rows(const_cast<uint32_t*>(w4.qweight), m.qweight.data(), static_cast<size_t>(s.cols / 8) * 4);
                copy_rows(const_cast<__half*>(w4.scales), m.scales.data(), groups * 2);
                copy_rows(const_cast<uint8_t*>(w4.zeros), m.zeros.data(), groups);
                ++int4_count;
            } else {
                upload16(name, w, s.cols, w16, first, stride);
            }
            row0 += s.rows;
        }
    };
    upload16(N::embed(), host(N::embed(), {V, H}), H, embed_, 0, 1);
    for (int l = 0; l < c_.num_layers; ++l) {
        Layer& L = layers_[l];
        upload32(N::layer(l, "input_layernorm.weight"), L.attn_norm);
        upload_linear(l, 0, L.wqkv, L.qkv4);
        if (L.bqkv) upload_qkv_bias(L.bqkv, c_, l, [&](const std::string& n, int64_t len) { return host(n, {len}); });
        upload_linear(l, 1, L.wo, L.o4);
        upload32(N::layer(l, "post_attention_layernorm.weight"), L.mlp_norm);
        upload_linear(l, 2, L.wgu, L.gu4);
        upload_linear(l, 3, L.wdown, L.down4);
    }
    upload32(N::final_norm(), final_norm_);
    if (!c_.tie_word_embeddings) upload16(N::lm_head(), host(N::lm_head(), {V, H}), H, lm_head_, 0, 1);
    if (clamped_total) spdlog::warn("{} weight values were outside the FP16 range and were clamped", clamped_total);
    if (int4_count)
        spdlog::info("int4 weights: {} of {} linear matrices (quantized on load from the GGUF's dequantized values, "
                     "round-to-nearest)",
                     int4_count, 7 * c_.num_layers);
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
        if (l.bqkv) fill_random_float(l.bqkv, qkv_bias_floats(c_), ++s, 0.5f, 0.0f, stream_);
    }
    fill_norm(final_norm_);
    if (!c_.tie_word_embeddings) fill(lm_head_, V * H, H);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) {
            return l.qkv4.valid() || l.o4.valid() || l.gu4.valid() || l.down4.valid();
        }))
        spdlog::info("random int4 weights");
}

}  // namespace quest
