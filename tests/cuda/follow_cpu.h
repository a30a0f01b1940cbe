#pragma once
// A CUDA backend followed against the CPU backend through a question and a greedy answer (the model tests of the
// selectors: tests/cuda/test_page_oracle.cpp, test_sparq.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <span>
#include <vector>

#include "cuda_model_util.h"
#include "cuda_test_util.h"
#include "model/core/backend.h"

namespace quest::test {

struct FollowCpu {
    double worst = 0;     // the largest rel_err of the CUDA logits against the CPU's, over the compared steps
    double vs_other = 0;  // the largest rel_err of `other`'s logits against the CUDA backend's, over the question
    int steps = 0, parted = 0;  // steps decoded; those whose selections parted (logits not compared)
    std::vector<int> cpu_tokens, gpu_tokens;  // the greedy answers, up to the first disagreement
};

// Feeds `question` to cpu, gpu and other (a second CUDA backend with other settings, for comparison), then decodes
// up to `gen` greedy tokens on cpu and gpu while they agree. Every step's CUDA logits must be within `tol` of the
// CPU's (EXPECT, naming the position), except at steps where `agree` (optional, called after each step's decodes)
// says the two backends' selections parted: attending other pages, their logits do not compare (r.parted).
inline FollowCpu follow_cpu(Backend& cpu, Backend& gpu, Backend& other, std::span<const int> question, int gen,
                            double tol = 5e-2, const std::function<bool()>& agree = {}) {
    FollowCpu r;
    std::vector<float> la, lb, lo;
    auto step = [&](int t) {
        const auto a = cpu.decode(t);
        la.assign(a.begin(), a.end());
        const auto b = gpu.decode(t);
        lb.assign(b.begin(), b.end());
        ++r.steps;
        if (agree && !agree()) {
            ++r.parted;
            return;
        }
        const double err = rel_err(lb, la);
        EXPECT_LE(err, tol) << "position " << gpu.position();
        r.worst = std::max(r.worst, err);
    };
    for (int t : question) {
        step(t);
        const auto c = other.decode(t);
        lo.assign(c.begin(), c.end());
        r.vs_other = std::max(r.vs_other, rel_err(lo, lb));
    }
    int a = argmax(la), b = argmax(lb);
    for (int i = 0; i < gen; ++i) {
        r.cpu_tokens.push_back(a);
        r.gpu_tokens.push_back(b);
        if (a != b) break;  // the streams diverged (the caller reports it): the logits no longer compare
        step(a);
        a = argmax(la);
        b = argmax(lb);
    }
    return r;
}

}  // namespace quest::test
