// The arithmetic below must not be contracted into fused multiply-adds: ggml's reference rounds d * q and the
// following add separately. CMakeLists.txt compiles this file with -ffp-contract=off; the pragma says the same to
// clang (GCC does not know it).
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "model/io/gguf_quants.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/common/dtype.h"
#include "kernels/common/error.h"

namespace quest {

namespace {

constexpr int kQK = 32;    // elements per Q4_0 / Q4_1 / Q8_0 block
constexpr int kQK_K = 256; // elements per K-quant super-block

inline uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline float load_half(const uint8_t* p) { return half_to_float(load_u16(p)); }

// ggml's get_scale_min_k4: the j-th (0..7) 6-bit scale and min of a Q4_K / Q5_K super-block.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = uint8_t((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

// The j-th sub-block's scale and min of a Q4_K / Q5_K super-block, times the super-block's d and min.
struct ScaleMin {
    float scale, min;
};
inline ScaleMin k4_scale_min(int j, const uint8_t* scales, float d, float min) {
    uint8_t sc, m;
    scale_min_k4(j, scales, sc, m);
    return {d * float(sc), min * float(m)};
}

void dq_q8_0(const uint8_t* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 34, y += kQK) {
        const float d = load_half(x);
        for (int j = 0; j < kQK; ++j) y[j] = float(int8_t(x[2 + j])) * d;
    }
}

void dq_q4_0(const uint8_t* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 18, y += kQK) {
        const float d = load_half(x);
        const uint8_t* qs = x + 2;
        for (int j = 0; j < kQK / 2; ++j) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = float(x0) * d;
            y[j + kQK / 2] = float(x1) * d;
        }
    }
}

void dq_q4_1(const uint8_t* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 20, y += kQK) {
        const float d = load_half(x);
        const float m = load_half(x + 2);
        const uint8_t* qs = x + 4;
        for (int j = 0; j < kQK / 2; ++j) {
            const int x0 = qs[j] & 0x0F;
            const int x1 = qs[j] >> 4;
            y[j] = float(x0) * d + m;
            y[j + kQK / 2] = float(x1) * d + m;
        }
    }
}

void dq_q4_k(const uint8_t* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 144) {
        const float d = load_half(x);
        const float min = load_half(x + 2);
        const uint8_t* scales = x + 4;
        const uint8_t* q = x + 16;
        int is = 0;
        for (int j = 0; j < kQK_K; j += 64) {
            const auto [d1, m1] = k4_scale_min(is + 0, scales, d, min);
            const auto [d2, m2] = k4_scale_min(is + 1, scales, d, min);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

void dq_q5_k(const uint8_t* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 176) {
        const float d = load_half(x);
        const float min = load_half(x + 2);
        const uint8_t* scales = x + 4;
        const uint8_t* qh = x + 16;
        const uint8_t* ql = x + 48;
        int is = 0;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < kQK_K; j += 64) {
            const auto [d1, m1] = k4_scale_min(is + 0, scales, d, min);
            const auto [d2, m2] = k4_scale_min(is + 1, scales, d, min);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 = uint8_t(u1 << 2);
            u2 = uint8_t(u2 << 2);
        }
    }
}

void dq_q6_k(const uint8_t* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += 210) {
        const uint8_t* ql = x;
        const uint8_t* qh = x + 128;
        const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
        const float d = load_half(x + 208);
        for (int n = 0; n < kQK_K; n += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = int8_t((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = int8_t((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = int8_t((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = int8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                // ggml: d * sc[is] * q, evaluated left to right.
                y[l + 0] = d * float(sc[is + 0]) * float(q1);
                y[l + 32] = d * float(sc[is + 2]) * float(q2);
                y[l + 64] = d * float(sc[is + 4]) * float(q3);
                y[l + 96] = d * float(sc[is + 6]) * float(q4);
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

}  // namespace

bool gguf_dequantize_supported(GgmlType t) {
    switch (t) {
        case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
        case GgmlType::Q4_1: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
            return true;
        default:
            return false;
    }
}

void dequantize_row(GgmlType t, const std::byte* src, float* dst, int64_t n) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
    if (!tr || !gguf_dequantize_supported(t))
        throw std::invalid_argument("dequantize_row: unsupported type " + ggml_type_name(t));
    if (n < 0 || n % tr->block != 0)
        throw std::invalid_argument("dequantize_row: " + std::to_string(n) + " elements is not a multiple of the " +
                                    tr->name + " block size");
    const auto* x = reinterpret_cast<const uint8_t*>(src);
    const int64_t nb = n / tr->block;
    switch (t) {
        case GgmlType::F32: std::memcpy(dst, x, size_t(n) * 4); return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) dst[i] = load_half(x + 2 * i);
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load_u16(x + 2 * i));
            return;
        case GgmlType::Q8_0: dq_q8_0(x, dst, nb); return;
        case GgmlType::Q4_0: dq_q4_0(x, dst, nb); return;
        case GgmlType::Q4_1: dq_q4_1(x, dst, nb); return;
        case GgmlType::Q4_K: dq_q4_k(x, dst, nb); return;
        case GgmlType::Q5_K: dq_q5_k(x, dst, nb); return;
        case GgmlType::Q6_K: dq_q6_k(x, dst, nb); return;
        default: break;
    }
    throw std::logic_error("dequantize_row: unhandled type");
}

void dequantize_rows(const GgufFile& f, const GgufTensorInfo& t, int64_t row_begin, int64_t row_count, float* dst) {
    if (!gguf_dequantize_supported(t.type))
        throw InputError(f.name() + ": tensor '" + t.name + "': type " + ggml_type_name(t.type) +
                         " cannot be dequantized (expected F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K)");
    if (row_begin < 0 || row_count < 0 || row_begin > t.rows() || row_count > t.rows() - row_begin)
        throw std::out_of_range("dequantize_rows: rows [" + std::to_string(row_begin) + ", +" +
                                std::to_string(row_count) + ") outside tensor '" + t.name + "'");
    const int64_t cols = t.cols();
    if (cols == 0 || row_count == 0) return;
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t.type));
    const uint64_t row_bytes = uint64_t(cols / tr->block) * uint64_t(tr->bytes);
    const std::byte* base = f.bytes(t).data();
    for (int64_t r = 0; r < row_count; ++r)
        dequantize_row(t.type, base + uint64_t(row_begin + r) * row_bytes, dst + r * cols, cols);
}

std::vector<float> dequantize_tensor(const GgufFile& f, const GgufTensorInfo& t) {
    if (!gguf_dequantize_supported(t.type))  // before allocating
        dequantize_rows(f, t, 0, 0, nullptr);
    std::vector<float> out(size_t(t.numel));
    dequantize_rows(f, t, 0, t.rows(), out.data());
    return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// Q4_0 / Q4_1 -> int4
// ---------------------------------------------------------------------------------------------------------------------

namespace {

// One candidate int4 encoding of a block: value = (code - zero) * scale, code = flip ? 15 - q : q (q the GGUF
// code), or code = constant when constant >= 0.
struct Candidate {
    uint16_t scale;
    uint8_t zero;
    bool flip;
    int constant;
};

inline uint32_t float_bits(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
}

// The int4 value the layout gives, with the expression of Int4Matrix::value.
inline float int4_value(int code, int zero, uint16_t scale) {
    return static_cast<float>(code - zero) * half_to_float(scale);
}

}  // namespace

Int4FromGguf int4_from_gguf_q4(GgmlType t, const std::byte* src, int rows, int cols, std::span<const int> row_order) {
    if (t != GgmlType::Q4_0 && t != GgmlType::Q4_1)
        throw std::invalid_argument("int4_from_gguf_q4: type " + ggml_type_name(t) + " is not Q4_0 or Q4_1");
    if (rows < 0 || cols <= 0 || cols % kQK != 0)
        throw std::invalid_argument("int4_from_gguf_q4: " + std::to_string(rows) + " x " + std::to_string(cols) +
                                    " is not a matrix of whole 32-element rows");
    if (!row_order.empty() && row_order.size() != size_t(rows))
        throw std::invalid_argument("int4_from_gguf_q4: row_order has " + std::to_string(row_order.size()) +
                                    " entries for " + std::to_string(rows) + " rows");
    const int block_bytes = t == GgmlType::Q4_0 ? 18 : 20;
    const int groups = cols / kQK;
    Int4FromGguf result;
    Int4Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.group = kQK;
    m.qweight.assign(size_t(rows) * size_t(cols / 8), 0);
    m.scales.assign(size_t(rows) * size_t(groups), 0);
    m.zeros.assign(size_t(rows) * size_t(groups), 0);

    const auto* x = reinterpret_cast<const uint8_t*>(src);
    for (int r = 0; r < rows; ++r) {
        const int src_row = row_order.empty() ? r : row_order[size_t(r)];
        if (src_row < 0 || src_row >= rows)
            throw std::invalid_argument("int4_from_gguf_q4: row_order entry " + std::to_string(src_row) +
                                        " outside 0.." + std::to_string(rows - 1));
        for (int g = 0; g < groups; ++g) {
            const uint8_t* b = x + (size_t(src_row) * groups + g) * block_bytes;
            ++result.blocks;
            uint8_t q[kQK];
            const uint8_t* qs = b + (t == GgmlType::Q4_0 ? 2 : 4);
            for (int j = 0; j < kQK / 2; ++j) {
                q[j] = qs[j] & 15;
                q[j + kQK / 2] = qs[j] >> 4;
            }
            float want[kQK];  // ggml's values
            dequantize_row(t, reinterpret_cast<const std::byte*>(b), want, kQK);

            Candidate cand[5];
            int n_cand = 0;
            const uint16_t dbits = load_u16(b);
            if (t == GgmlType::Q4_0) {
                cand[n_cand++] = {dbits, 8, false, -1};
            } else {
                const uint16_t mbits = load_u16(b + 2);
                const double d = half_to_float(dbits), mm = half_to_float(mbits);
                if (d != 0 && std::isfinite(d) && std::isfinite(mm)) {
                    const double z = -mm / d;  // exact zero point when m = -z d with z integer
                    const double zr = std::nearbyint(z);
                    if (zr >= 0 && zr <= 15 && zr * d == -mm) {
                        cand[n_cand++] = {dbits, uint8_t(zr), false, -1};
                        cand[n_cand++] = {uint16_t(dbits ^ 0x8000u), uint8_t(15 - zr), true, -1};
                    }
                }
                cand[n_cand++] = {mbits, 0, false, 1};                       // constant block m
                cand[n_cand++] = {uint16_t(mbits ^ 0x8000u), 1, false, 0};   // constant block m, other sign of zero
            }
            bool found = false;
            for (int k = 0; k < n_cand && !found; ++k) {
                const Candidate& c = cand[k];
                uint8_t codes[kQK];
                bool ok = true;
                for (int j = 0; j < kQK && ok; ++j) {
                    codes[j] = uint8_t(c.constant >= 0 ? c.constant : (c.flip ? 15 - q[j] : q[j]));
                    ok = float_bits(int4_value(codes[j], c.zero, c.scale)) == float_bits(want[j]);
                }
                if (!ok) continue;
                found = true;
                const size_t gi = size_t(r) * groups + g;
                m.scales[gi] = c.scale;
                m.zeros[gi] = c.zero;
                for (int w = 0; w < kQK / 8; ++w)
                    m.qweight[size_t(r) * (cols / 8) + size_t(g) * (kQK / 8) + w] = int4_pack_word(codes + 8 * w);
            }
            if (!found) ++result.inexact_blocks;
        }
    }
    if (result.inexact_blocks == 0) result.matrix = std::move(m);
    return result;
}

}  // namespace quest
