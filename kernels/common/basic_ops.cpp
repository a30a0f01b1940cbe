#include "kernels/common/basic_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

namespace quest {

void embedding_ref(float* out, const float* table, int token, int dim) {
    std::memcpy(out, table + static_cast<int64_t>(token) * dim, sizeof(float) * dim);
}

void rms_norm_ref(float* out, const float* x, const float* w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

void matvec_ref(float* y, const float* W, const float* x, int rows, int cols) {
    for (int r = 0; r < rows; ++r) {
        const float* w = W + static_cast<int64_t>(r) * cols;
        float acc = 0.0f;
        for (int c = 0; c < cols; ++c) acc += w[c] * x[c];
        y[r] = acc;
    }
}

void matmul_ref(float* Y, const float* W, const float* X, int tokens, int rows, int cols, int threads) {
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // Small problems are not worth a thread.
    if (static_cast<int64_t>(tokens) * rows * cols < (1 << 22)) threads = 1;
    threads = std::min(threads, rows);
    auto work = [&](int r0, int r1) {
        for (int t = 0; t < tokens; ++t) {
            const float* x = X + static_cast<int64_t>(t) * cols;
            float* y = Y + static_cast<int64_t>(t) * rows;
            matvec_ref(y + r0, W + static_cast<int64_t>(r0) * cols, x, r1 - r0, cols);
        }
    };
    if (threads == 1) {
        work(0, rows);
        return;
    }
    std::vector<std::thread> pool;
    const int chunk = (rows + threads - 1) / threads;
    for (int r0 = 0; r0 < rows; r0 += chunk) pool.emplace_back(work, r0, std::min(rows, r0 + chunk));
    for (auto& th : pool) th.join();
}

void swiglu_ref(float* out, const float* gate, const float* up, int n) {
    for (int i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void rope_ref(float* x, int num_heads, int head_dim, int pos, const float* inv_freq, float scaling) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos) * inv_freq[i];
        const float c = std::cos(angle) * scaling;
        const float s = std::sin(angle) * scaling;
        for (int h = 0; h < num_heads; ++h) {
            float* v = x + static_cast<int64_t>(h) * head_dim;
            const float a = v[i];
            const float b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

void add_inplace_ref(float* a, const float* b, int n) {
    for (int i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace quest
