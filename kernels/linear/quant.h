#pragma once
// 4-bit weights (W4A16): int4 codes with an FP16 scale and a 4-bit zero point per group of input columns, in the
// project's own layout, and the CPU reference for it: round-to-nearest quantization, dequantization, the int4
// matrix-vector product (the oracle of kernels/linear/gemv_int4.cuh), and the conversion from AutoAWQ "GEMM" tensors.
//
// Layout "quest-int4", version 1, of a weight matrix W [rows = out_features][cols = in_features], group size G:
//   - G is a power of two >= 32 and cols % G == 0 (a matrix whose input dimension is not a multiple of G is not
//     quantized: it stays FP16). So cols % 32 == 0 and every row starts on a 16-byte boundary.
//   - qweight uint32 [rows][cols / 8]: word k of row r holds the 8 consecutive columns 8k .. 8k+7 of that row; the
//     4-bit code of column 8k + kInt4Order[s] sits in bits 4s .. 4s+3 ("slot" s):
//         slot    0  1  2  3  4  5  6  7
//         column  0  2  4  6  1  3  5  7     (kInt4Order; kInt4Slot is its inverse)
//     so the low half-word holds the even columns and the high half-word the odd ones, and (word >> 4i) & 0x000F000F
//     holds the column pair (2i, 2i+1) in its two 16-bit halves: OR 0x64006400 makes it the fp16 pair
//     (1024 + q[2i], 1024 + q[2i+1]) in one LOP3, with no per-element shifts or conversions. It is the nibble order
//     of AutoAWQ's packing, but along the input dimension (AWQ packs output columns). One 16-byte load of a row
//     gives 32 consecutive columns, all inside one group.
//   - scales fp16 [rows][cols / G], zeros uint8 [rows][cols / G] holding 0..15.
//   - w[r][c] = (q[r][c] - zeros[r][c / G]) * scales[r][c / G], computed exactly in fp32 ((q - z) has 5 bits and
//     the scale 11, so the product is exact).
//
// Round-to-nearest quantization of one group of values v: lo = min(0, min v), hi = max(0, max v) (the grid always
// holds 0, so the zero point is an integer in [0, 15]); scale = (hi - lo) / 15 rounded UP to fp16;
// zero = round(-lo / scale); q = clamp(round(v / scale) + zero, 0, 15). Every element then satisfies
// |v - dequantized| <= scale / 2 (the error bound the tests check).
#include <cstdint>
#include <span>
#include <vector>

namespace quest {

inline constexpr int kInt4Order[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // column (within a word) held by slot s
inline constexpr int kInt4Slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};   // slot that holds column j
inline constexpr int kInt4DefaultGroup = 128;

// G is a power of two >= 32 (and small enough to be sane: <= 65536).
bool int4_group_valid(int group);
// The matrix can be stored in the layout: a valid group and cols % group == 0.
bool int4_quantizable(int cols, int group);

// A quantized matrix on the host.
struct Int4Matrix {
    int rows = 0, cols = 0, group = 0;
    std::vector<uint32_t> qweight;  // [rows][cols / 8], layout above
    std::vector<uint16_t> scales;   // [rows][cols / group], fp16 bits
    std::vector<uint8_t> zeros;     // [rows][cols / group], 0..15

    int groups() const { return cols / group; }  // per row
    int words() const { return cols / 8; }       // per row
    size_t bytes() const { return qweight.size() * 4 + scales.size() * 2 + zeros.size(); }
    uint8_t code(int r, int c) const;            // q[r][c]
    float scale(int r, int g) const;             // scales[r][g] as fp32
    float value(int r, int c) const;             // the dequantized w[r][c]
};

// Bytes of the layout for a rows x cols matrix (qweight + scales + zeros).
size_t int4_bytes(int64_t rows, int64_t cols, int group);

// Packs the codes q[0..7] of columns 8k .. 8k+7 into one word; and the code of column j (0..7) of a word.
uint32_t int4_pack_word(const uint8_t q[8]);
inline uint8_t int4_word_code(uint32_t word, int j) { return static_cast<uint8_t>((word >> (4 * kInt4Slot[j])) & 15u); }

// Round-to-nearest quantization of W [rows][cols] (see above). With col_scale (AWQ-style activation-aware
// scaling), quantizes W diag(col_scale), i.e. w[r][c] * col_scale[c]: the caller divides the layer's input by
// col_scale (folded into the previous op). Throws InputError when the group is invalid for cols, or a value is not
// finite or too large for an fp16 scale. Rows are split over `threads` threads (0: all cores).
Int4Matrix quantize_int4(const float* W, int rows, int cols, int group, const float* col_scale = nullptr,
                         int threads = 0);
// W [rows][cols] = the dequantized weights, exact fp32.
void dequantize_int4(const Int4Matrix& m, float* W);
std::vector<float> dequantize_int4(const Int4Matrix& m);

// y[rows] = dequant(W) x in fp32, plain loops: the reference of the CUDA int4 GEMV.
void matvec_int4_ref(float* y, const Int4Matrix& m, const float* x);

// AutoAWQ "GEMM" tensors of one nn.Linear (in_features = K, out_features = N, group G), as WQLinear_GEMM stores
// them: qweight int32 [K][N / 8] and qzeros int32 [K / G][N / 8], nibble i (bits 4i .. 4i+3) of word j holding
// output column 8j + AWQ_ORDER[i], AWQ_ORDER = {0, 2, 4, 6, 1, 3, 5, 7}; scales fp16 [K / G][N];
// w[n][k] = (q[k][n] - z[k / G][n]) * s[k / G][n]. Converted exactly into the layout above (G must be valid for it:
// int4_group_valid; N % 8 == 0; K % G == 0; std::invalid_argument otherwise).
Int4Matrix int4_from_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int in_features,
                         int out_features, int group);

// The codes of a rows x cols matrix (group G) rearranged in place between the layout above and the CUDA device
// layout (kernels/linear/int4_layout.h: the 16-byte chunks of each row permuted; scales and zero points unchanged). The
// CUDA backend repacks at upload; the checkpoint format and the CPU reference keep the layout above. qweight holds
// rows * cols / 8 words; std::invalid_argument when it does not or G is not valid for cols.
void int4_to_device_layout(std::span<uint32_t> qweight, int rows, int cols, int group);
void int4_from_device_layout(std::span<uint32_t> qweight, int rows, int cols, int group);

// ||W - dequant(Q(W))|| / ||W|| (fp64 sums), the figure the quantize summary reports per matrix.
double int4_relative_error(const float* W, const Int4Matrix& m);

}  // namespace quest
