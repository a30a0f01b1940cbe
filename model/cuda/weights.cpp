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

}  // namespace

// The storage of each fused matrix on the device (kernels/linear/format.h: choose_linear_storage from how the
// source stores its parts).
LinearLayout source_linear_layout(const ModelConfig& c, const WeightSource& source, const WeightRequest& request) {
    LinearLayout g(c.num_layers);
    for (int l = 0; l < c.num_layers; ++l) {
        const auto specs = llama_linear_specs(c, l);
        for (int k = 0; k < 4; ++k) {
            std::vector<LinearStorage> parts;
            for (int i : kFusedParts[k]) parts.push_back(source.stored(specs[i]));
            int64_t rows = 0;
            for (int i : kFusedParts[k]) rows += specs[i].rows;
            g[l][k] = choose_linear_storage(request, parts, rows, specs[kFusedParts[k][0]].cols);
        }
    }
    return g;
}

std::unique_ptr<CudaLlama> CudaLlama::from_folder(const ModelFolder& model, const QuestSettings& quest, int capacity,
                                                  const CudaOptions& opts) {
    const std::unique_ptr<WeightSource> source = open_weight_source(model);
    return from_source(model.config, *source, quest, capacity, opts);
}

std::unique_ptr<CudaLlama> CudaLlama::from_source(const ModelConfig& config, const WeightSource& source,
                                                  const QuestSettings& quest, int capacity, const CudaOptions& opts) {
    LinearLayout layout = source_linear_layout(config, source, opts.weights);
    std::unique_ptr<CudaLlama> m(new CudaLlama(config, quest, capacity, opts, std::move(layout)));
    m->load_weights(source);
    return m;
}

std::unique_ptr<CudaLlama> CudaLlama::random(const ModelConfig& config, const QuestSettings& quest, int capacity,
                                             uint64_t seed, const CudaOptions& opts) {
    std::unique_ptr<CudaLlama> m(
        new CudaLlama(config, quest, capacity, opts, uniform_linear_layout(config, opts.weights)));
    m->randomize_weights(seed);
    return m;
}

void CudaLlama::load_weights(const WeightSource& source) {
    using N = LlamaTensorNames;
    const int64_t H = c_.hidden_size, V = c_.vocab_size;
    // Device staging for one float tensor's bytes (grown to the largest one), and the clamp counter.
    DeviceBuffer<char> staging;
    DeviceBuffer<unsigned long long> overflow(1);
    size_t clamped_total = 0;
    // Writes h into W's rows first, first + stride, ... in W's format (converting h on the host when the source
    // stores it otherwise).
    auto upload = [&](const LinearWeight& W, HostLinear h, const std::string& name, int64_t first, int64_t stride) {
        h = convert_host_linear(std::move(h), W.storage);
        if (h.storage.is_f16() && h.float_bytes() > staging.size()) staging = DeviceBuffer<char>(h.float_bytes());
        const UploadStaging st{staging.get(), staging.size(), overflow.get(), stream_};
        if (const size_t clamped = ops_of(W).upload(W, h, first, stride, st)) {
            spdlog::warn("{}: tensor '{}': {} values outside the FP16 range (|x| > 65504) or NaN; clamped to +-65504",
                         source.describe(), name, clamped);
            clamped_total += clamped;
        }
    };
    auto matrix = [](__half* p, int64_t rows, int64_t cols) {
        return LinearWeight{LinearStorage::f16(), static_cast<int>(rows), static_cast<int>(cols),
                            reinterpret_cast<char*>(p)};
    };
    auto norm = [&](const std::string& name, float* dst) {
        const int64_t shape[] = {H};
        const std::vector<float> w = linear_format(LinearFormat::F16).to_f32(source.tensor(name, shape));
        CUDA_CHECK(cudaMemcpy(dst, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    };
    // Fused matrix k of layer l, part by part: the parts' rows appended (qkv), except for gate+up (k = 2), whose two
    // parts are interleaved row by row (gate row i at 2i, up row i at 2i + 1: Layer::gu), in every format (the int4
    // device layout permutes within rows only).
    int converted = 0;
    auto fused = [&](int l, int k, const LinearWeight& W) {
        const auto specs = llama_linear_specs(c_, l);
        const bool interleave = k == 2;
        int64_t row0 = 0;
        for (size_t part = 0; part < kFusedParts[k].size(); ++part) {
            const LinearSpec& s = specs[kFusedParts[k][part]];
            converted += source.stored(s) != W.storage;
            upload(W, source.linear(s), s.prefix, interleave ? static_cast<int64_t>(part) : row0,
                   interleave ? static_cast<int64_t>(kFusedParts[k].size()) : 1);
            row0 += s.rows;
        }
    };
    {
        const int64_t shape[] = {V, H};
        upload(matrix(embed_, V, H), source.tensor(N::embed(), shape), N::embed(), 0, 1);
    }
    for (int l = 0; l < c_.num_layers; ++l) {
        Layer& L = layers_[l];
        norm(N::layer(l, "input_layernorm.weight"), L.attn_norm);
        fused(l, 0, L.qkv);
        if (L.bqkv)
            upload_qkv_bias(L.bqkv, c_, l, [&](const std::string& n, int64_t len) {
                const int64_t shape[] = {len};
                return linear_format(LinearFormat::F16).to_f32(source.tensor(n, shape));
            });
        fused(l, 1, L.o);
        norm(N::layer(l, "post_attention_layernorm.weight"), L.mlp_norm);
        fused(l, 2, L.gu);
        fused(l, 3, L.down);
    }
    norm(N::final_norm(), final_norm_);
    if (!c_.tie_word_embeddings) {
        const int64_t shape[] = {V, H};
        upload(lm_head_, source.tensor(N::lm_head(), shape), N::lm_head(), 0, 1);
    }
    if (clamped_total)
        spdlog::warn("{} weight values were outside the FP16 range and were clamped", clamped_total);
    std::map<std::string, int> counts;
    for (const Layer& L : layers_)
        for (const LinearWeight* W : {&L.qkv, &L.o, &L.gu, &L.down}) ++counts[W->storage.describe()];
    std::string held;
    for (const auto& [what, n] : counts) held += (held.empty() ? "" : ", ") + std::to_string(n) + " " + what;
    spdlog::info("linear matrices: {} ({} of {} parts converted on load{})", held, converted, 7 * c_.num_layers,
                 converted ? ", round-to-nearest where quantized" : "");
    // cudaMemcpy from pageable memory may return before its DMA lands; stream_ is non-blocking: settle everything.
    CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaLlama::randomize_weights(uint64_t seed) {
    const size_t H = c_.hidden_size, V = c_.vocab_size;
    uint64_t s = seed * 1000003ull;
    // A linear matrix [rows][fan_in]: values within about +-1/sqrt(fan_in) in its format.
    auto fill_linear = [&](const LinearWeight& W) {
        ops_of(W).randomize(W, ++s, 1.0f / std::sqrt(static_cast<float>(W.cols)), stream_);
    };
    auto fill_norm = [&](float* p) { fill_random_float(p, H, ++s, 0.1f, 1.0f, stream_); };
    fill_random_half(embed_, V * H, ++s, 1.0f, 0.0f, stream_);
    for (Layer& l : layers_) {
        fill_linear(l.qkv);
        fill_linear(l.o);
        fill_linear(l.gu);
        fill_linear(l.down);
        fill_norm(l.attn_norm);
        fill_norm(l.mlp_norm);
        if (l.bqkv) fill_random_float(l.bqkv, qkv_bias_floats(c_), ++s, 0.5f, 0.0f, stream_);
    }
    fill_norm(final_norm_);
    if (!c_.tie_word_embeddings) fill_linear(lm_head_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) {
            return !l.qkv.storage.is_f16() || !l.o.storage.is_f16() || !l.gu.storage.is_f16() || !l.down.storage.is_f16();
        }))
        spdlog::info("random int4 weights");
}

}  // namespace quest
