#pragma once
// The CPU backend on the same FP16-rounded weights as the GPU (norm weights stay fp32 on both), for the CUDA model
// tests: what remains between the two is the GPU's fp16 activations and summation order.
#include <memory>

#include "engine/backend.h"
#include "engine/quest_settings.h"
#include "model/dtype.h"
#include "model/llama_cpu.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace quest::test {

inline std::shared_ptr<LlamaWeightsF32> fp16_rounded_weights(const ModelFolder& m) {
    auto w = std::make_shared<LlamaWeightsF32>(load_llama_weights_f32(ModelFiles(m.dir), m.config));
    auto round = [](std::vector<float>& v) {
        for (float& x : v) x = half_to_float(float_to_half(x));
    };
    round(w->embed);
    round(w->lm_head);
    for (auto& l : w->layers)
        for (auto* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) round(*v);
    return w;
}

inline std::unique_ptr<Backend> cpu_fp16_weights(const ModelFolder& m, const QuestSettings& q, int capacity) {
    return std::make_unique<CpuLlama>(fp16_rounded_weights(m), q, capacity);
}

}  // namespace quest::test
