#pragma once
// Every matrix of a model's fp32 weights rounded to fp16 precision (norm weights stay fp32): the CPU backend then
// computes on exactly the weights the CUDA backend holds, and what remains between the two is activations and order.
#include <vector>

#include "kernels/common/dtype.h"
#include "model/io/weights.h"

namespace quest::test {

inline void round_matrices_to_fp16(LlamaWeightsF32& w) {
    auto round = [](std::vector<float>& v) {
        for (float& x : v) x = half_to_float(float_to_half(x));
    };
    round(w.embed);
    round(w.lm_head);
    for (auto& l : w.layers)
        for (auto* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) round(*v);
}

}  // namespace quest::test
