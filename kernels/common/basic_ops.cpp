#include "kernels/common/basic_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/parallel.h"

namespace quest {

namespace {
// Four independent fp32 lanes (GCC / Clang vector extension): each lane's + and * round as the scalar ones do.
typedef float V4 __attribute__((vector_size(16)));
}  // namespace

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
    // Every output is matvec_ref's sum, in column order, of w * x products (the same bits); what changes is how
    // many are in flight: 4 rows x 8 tokens at once from a column-major copy of the 8 tokens (32 chains in 8
    // vector registers), for a tile of 64 tokens that stays in L2 while each 4-row block of W is read from L1 8
    // times. A one-chain dot product waits on each add's latency, and W read once per token is memory-bound.
    constexpr int kTile = 64, kTok = 8, kRows = 4;
    parallel_rows(rows, static_cast<int64_t>(tokens) * rows * cols / 4, threads, [&](int r0, int r1) {
        if (tokens < kTok) {  // a decode step: 8 rows' chains at once, each token on its own
            constexpr int kChains = 8;
            for (int t = 0; t < tokens; ++t) {
                const float* x = X + static_cast<int64_t>(t) * cols;
                for (int r = r0; r < r1; r += kChains) {
                    const int nr = std::min(kChains, r1 - r);
                    const float* w = W + static_cast<int64_t>(r) * cols;
                    float acc[kChains] = {};
                    if (nr == kChains) {
                        for (int c = 0; c < cols; ++c)
                            for (int i = 0; i < kChains; ++i) acc[i] += w[static_cast<int64_t>(i) * cols + c] * x[c];
                    } else {
                        for (int i = 0; i < nr; ++i)
                            for (int c = 0; c < cols; ++c) acc[i] += w[static_cast<int64_t>(i) * cols + c] * x[c];
                    }
                    for (int i = 0; i < nr; ++i) Y[static_cast<int64_t>(t) * rows + r + i] = acc[i];
                }
            }
            return;
        }
        std::vector<float> xt(static_cast<size_t>(kTile) * cols);  // [kTile / kTok][cols][kTok]
        for (int t0 = 0; t0 < tokens; t0 += kTile) {
            const int subs = (std::min(kTile, tokens - t0) + kTok - 1) / kTok;
            for (int s = 0; s < subs; ++s)
                for (int c = 0; c < cols; ++c)
                    for (int j = 0; j < kTok; ++j) {
                        const int t = t0 + s * kTok + j;
                        xt[(static_cast<size_t>(s) * cols + c) * kTok + j] =
                            t < tokens ? X[static_cast<int64_t>(t) * cols + c] : 0.0f;
                    }
            for (int r = r0; r < r1; r += kRows) {
                const int nr = std::min(kRows, r1 - r);
                const float* w[kRows];
                for (int i = 0; i < kRows; ++i) w[i] = W + static_cast<int64_t>(r + std::min(i, nr - 1)) * cols;
                for (int s = 0; s < subs; ++s) {
                    V4 acc[kRows][2] = {};
                    const float* xs = &xt[static_cast<size_t>(s) * cols * kTok];
                    for (int c = 0; c < cols; ++c) {
                        V4 x0, x1;
                        std::memcpy(&x0, xs + static_cast<size_t>(c) * kTok, sizeof(V4));
                        std::memcpy(&x1, xs + static_cast<size_t>(c) * kTok + 4, sizeof(V4));
                        for (int i = 0; i < kRows; ++i) {
                            const float wc = w[i][c];
                            acc[i][0] += wc * x0;
                            acc[i][1] += wc * x1;
                        }
                    }
                    for (int j = 0; j < kTok && t0 + s * kTok + j < tokens; ++j)
                        for (int i = 0; i < nr; ++i)
                            Y[static_cast<int64_t>(t0 + s * kTok + j) * rows + r + i] = acc[i][j / 4][j % 4];
                }
            }
        }
    });
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
