#include "kernels/linear/quant.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/linear/int4_layout.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "kernels/common/parallel.h"

namespace quest {

bool int4_group_valid(int group) { return group >= 32 && group <= 65536 && (group & (group - 1)) == 0; }

bool int4_quantizable(int cols, int group) { return int4_group_valid(group) && cols > 0 && cols % group == 0; }

size_t int4_bytes(int64_t rows, int64_t cols, int group) {
    const size_t groups = static_cast<size_t>(rows) * static_cast<size_t>(cols / group);
    return static_cast<size_t>(rows) * static_cast<size_t>(cols) / 2 + groups * 3;
}

uint8_t Int4Matrix::code(int r, int c) const {
    return int4_word_code(qweight[static_cast<size_t>(r) * words() + c / 8], c % 8);
}

float Int4Matrix::scale(int r, int g) const { return half_to_float(scales[static_cast<size_t>(r) * groups() + g]); }

float Int4Matrix::value(int r, int c) const {
    const size_t gi = static_cast<size_t>(r) * groups() + c / group;
    return static_cast<float>(static_cast<int>(code(r, c)) - static_cast<int>(zeros[gi])) * half_to_float(scales[gi]);
}

uint32_t int4_pack_word(const uint8_t q[8]) {
    uint32_t w = 0;
    for (int j = 0; j < 8; ++j) w |= static_cast<uint32_t>(q[j] & 15u) << (4 * kInt4Slot[j]);
    return w;
}

namespace {

// The smallest fp16 value >= s (s > 0, finite); 0x7C00 (inf) when s is beyond the fp16 range.
uint16_t half_round_up(float s) {
    uint16_t h = float_to_half(s);
    if ((h & 0x7FFFu) >= 0x7C00u) return 0x7C00u;
    if (half_to_float(h) < s) ++h;  // positive halves are ordered like their bit patterns
    return h;
}


// out[cols] = row r of the dequantized matrix.
void dequantize_row(const Int4Matrix& m, int r, float* out) {
    const int G = m.groups(), words = m.words();
    for (int g = 0; g < G; ++g) {
        const float s = half_to_float(m.scales[static_cast<size_t>(r) * G + g]);
        const int z = m.zeros[static_cast<size_t>(r) * G + g];
        for (int c = g * m.group; c < (g + 1) * m.group; c += 8) {
            const uint32_t word = m.qweight[static_cast<size_t>(r) * words + c / 8];
            for (int j = 0; j < 8; ++j) out[c + j] = static_cast<float>(static_cast<int>(int4_word_code(word, j)) - z) * s;
        }
    }
}

}  // namespace

Int4Matrix quantize_int4(const float* W, int rows, int cols, int group, const float* col_scale, int threads) {
    if (rows <= 0 || cols <= 0) throw std::invalid_argument("quantize_int4: empty matrix");
    if (!int4_quantizable(cols, group))
        throw InputError("int4: group size " + std::to_string(group) + " cannot quantize " + std::to_string(cols) +
                         " input columns (the group must be a power of two >= 32 dividing the input dimension)");
    Int4Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.group = group;
    const int G = m.groups(), words = m.words();
    m.qweight.assign(static_cast<size_t>(rows) * words, 0);
    m.scales.assign(static_cast<size_t>(rows) * G, 0);
    m.zeros.assign(static_cast<size_t>(rows) * G, 0);
    parallel_rows(rows, static_cast<int64_t>(rows) * cols, threads, [&](int r0, int r1) {
        std::vector<float> v(group);
        std::vector<uint8_t> q(group);
        for (int r = r0; r < r1; ++r) {
            const float* w = W + static_cast<int64_t>(r) * cols;
            for (int g = 0; g < G; ++g) {
                float lo = 0.0f, hi = 0.0f;
                for (int i = 0; i < group; ++i) {
                    const int c = g * group + i;
                    v[i] = col_scale ? w[c] * col_scale[c] : w[c];
                    if (!std::isfinite(v[i]))
                        throw InputError("int4: weight [" + std::to_string(r) + "][" + std::to_string(c) +
                                         "] is not finite");
                    lo = std::min(lo, v[i]);
                    hi = std::max(hi, v[i]);
                }
                const float s = (hi - lo) / 15.0f;
                uint16_t s16 = 0;
                int zero = 0;
                if (s > 0.0f) {
                    s16 = half_round_up(s);
                    if (s16 == 0x7C00u)
                        throw InputError("int4: row " + std::to_string(r) + " group " + std::to_string(g) +
                                         ": weights span " + std::to_string(hi - lo) +
                                         ", beyond what an fp16 scale can hold");
                    const float sf = half_to_float(s16);
                    zero = static_cast<int>(std::clamp(std::nearbyint(-lo / sf), 0.0f, 15.0f));
                    for (int i = 0; i < group; ++i)
                        q[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(v[i] / sf) + zero, 0.0f, 15.0f));
                } else {
                    std::fill(q.begin(), q.end(), uint8_t(0));  // an all-zero group: scale 0, every value exact
                }
                m.scales[static_cast<size_t>(r) * G + g] = s16;
                m.zeros[static_cast<size_t>(r) * G + g] = static_cast<uint8_t>(zero);
                uint32_t* out = &m.qweight[static_cast<size_t>(r) * words + static_cast<size_t>(g) * group / 8];
                for (int k = 0; k < group / 8; ++k) out[k] = int4_pack_word(&q[8 * k]);
            }
        }
    });
    return m;
}

void dequantize_int4(const Int4Matrix& m, float* W) {
    for (int r = 0; r < m.rows; ++r) dequantize_row(m, r, W + static_cast<int64_t>(r) * m.cols);
}

std::vector<float> dequantize_int4(const Int4Matrix& m) {
    std::vector<float> w(static_cast<size_t>(m.rows) * m.cols);
    dequantize_int4(m, w.data());
    return w;
}

void matvec_int4_ref(float* y, const Int4Matrix& m, const float* x) {
    std::vector<float> row(m.cols);
    for (int r = 0; r < m.rows; ++r) {
        dequantize_row(m, r, row.data());
        float acc = 0.0f;
        for (int c = 0; c < m.cols; ++c) acc += row[c] * x[c];
        y[r] = acc;
    }
}

Int4Matrix int4_from_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int in_features,
                         int out_features, int group) {
    const int K = in_features, N = out_features;
    if (K <= 0 || N <= 0 || N % 8 != 0 || !int4_quantizable(K, group))
        throw std::invalid_argument("int4_from_awq: unsupported shape in_features " + std::to_string(K) +
                                    ", out_features " + std::to_string(N) + ", group " + std::to_string(group));
    Int4Matrix m;
    m.rows = N;
    m.cols = K;
    m.group = group;
    const int G = m.groups(), words = m.words(), packed = N / 8;
    m.qweight.assign(static_cast<size_t>(N) * words, 0);
    m.scales.assign(static_cast<size_t>(N) * G, 0);
    m.zeros.assign(static_cast<size_t>(N) * G, 0);
    // Threads own disjoint words of every row: input columns 8 kw .. 8 kw + 7 for kw in their range.
    parallel_rows(words, static_cast<int64_t>(K) * N, 0, [&](int kw0, int kw1) {
        for (int k = 8 * kw0; k < 8 * kw1; ++k) {
            for (int j = 0; j < packed; ++j) {
                const uint32_t word = static_cast<uint32_t>(qweight[static_cast<size_t>(k) * packed + j]);
                for (int i = 0; i < 8; ++i) {
                    const int n = 8 * j + kInt4Order[i];  // AWQ_ORDER is the same permutation
                    const uint32_t code = (word >> (4 * i)) & 15u;
                    m.qweight[static_cast<size_t>(n) * words + k / 8] |= code << (4 * kInt4Slot[k % 8]);
                }
            }
        }
    });
    for (int g = 0; g < G; ++g) {
        for (int j = 0; j < packed; ++j) {
            const uint32_t word = static_cast<uint32_t>(qzeros[static_cast<size_t>(g) * packed + j]);
            for (int i = 0; i < 8; ++i) {
                const int n = 8 * j + kInt4Order[i];
                m.zeros[static_cast<size_t>(n) * G + g] = static_cast<uint8_t>((word >> (4 * i)) & 15u);
            }
        }
        for (int n = 0; n < N; ++n) m.scales[static_cast<size_t>(n) * G + g] = scales[static_cast<size_t>(g) * N + n];
    }
    return m;
}

namespace {

// Moves chunk c of every row to int4_chunk_slot(c) (to_device) or back.
void int4_permute_rows(std::span<uint32_t> qweight, int rows, int cols, int group, bool to_device) {
    if (!int4_quantizable(cols, group) || rows < 0 ||
        qweight.size() != static_cast<size_t>(rows) * static_cast<size_t>(cols / 8))
        throw std::invalid_argument("int4 device layout: bad matrix shape");
    const int chunks = cols / 32, sshift = int4_segment_shift(group);
    if (sshift == 0) return;  // group 32: the identity
    std::vector<uint32_t> row(static_cast<size_t>(chunks) * 4);
    for (int r = 0; r < rows; ++r) {
        uint32_t* q = qweight.data() + static_cast<size_t>(r) * chunks * 4;
        std::copy(q, q + row.size(), row.begin());
        for (int c = 0; c < chunks; ++c) {
            const size_t logical = static_cast<size_t>(c) * 4;
            const size_t slot = static_cast<size_t>(int4_chunk_slot(c, chunks, sshift)) * 4;
            for (int w = 0; w < 4; ++w) {
                if (to_device)
                    q[slot + w] = row[logical + w];
                else
                    q[logical + w] = row[slot + w];
            }
        }
    }
}

}  // namespace

void int4_to_device_layout(std::span<uint32_t> qweight, int rows, int cols, int group) {
    int4_permute_rows(qweight, rows, cols, group, true);
}

void int4_from_device_layout(std::span<uint32_t> qweight, int rows, int cols, int group) {
    int4_permute_rows(qweight, rows, cols, group, false);
}

double int4_relative_error(const float* W, const Int4Matrix& m) {
    std::vector<float> row(m.cols);
    double num = 0, den = 0;
    for (int r = 0; r < m.rows; ++r) {
        dequantize_row(m, r, row.data());
        const float* w = W + static_cast<int64_t>(r) * m.cols;
        for (int c = 0; c < m.cols; ++c) {
            const double d = static_cast<double>(w[c]) - row[c];
            num += d * d;
            den += static_cast<double>(w[c]) * w[c];
        }
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace quest
