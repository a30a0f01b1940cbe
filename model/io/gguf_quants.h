#pragma once
// Dequantization of GGUF tensors to fp32 on the CPU, bit-exact with ggml's reference (ggml-quants.c
// dequantize_row_* and the F16/BF16 conversions), and the exact conversion of Q4_0 / Q4_1 matrices to the project's
// int4 layout (kernels/quant.h, "quest-int4").
//
// Supported types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K. Block formats (fp16 = IEEE half, little-endian):
//   Q8_0  32 elements, 34 bytes: fp16 d, int8 qs[32];                          x[j] = qs[j] * d
//   Q4_0  32 elements, 18 bytes: fp16 d, u8 qs[16];   q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4; x = (q - 8) * d
//   Q4_1  32 elements, 20 bytes: fp16 d, fp16 m, u8 qs[16] (nibbles as Q4_0);      x = q * d + m
//   Q4_K  256 elements, 144 bytes: fp16 d, fp16 dmin, u8 scales[12] (8 pairs of 6-bit scale/min), u8 qs[128]
//   Q5_K  256 elements, 176 bytes: as Q4_K plus u8 qh[32] (the 5th bit) before qs
//   Q6_K  256 elements, 210 bytes: u8 ql[128], u8 qh[64], int8 scales[16], fp16 d
// The arithmetic is ggml's, operation for operation in fp32 (this file is compiled without FMA contraction, which
// would change the rounding of the K-quant `d * q - m`).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/linear/quant.h"
#include "model/io/gguf.h"

namespace quest {

// Whether dequantize_row supports the type.
bool gguf_dequantize_supported(GgmlType t);

// Dequantizes n elements of type t (n a multiple of the type's block size) from src, which holds n / block x
// block bytes, into dst[n]. std::invalid_argument for an unsupported type or a bad n (callers check first).
void dequantize_row(GgmlType t, const std::byte* src, float* dst, int64_t n);

// Rows [row_begin, row_begin + row_count) of a tensor (a row is ne[0] elements) into dst[row_count][cols].
// InputError naming the file, the tensor and its type name when the type is unsupported; std::out_of_range when
// the rows are not in the tensor.
void dequantize_rows(const GgufFile& f, const GgufTensorInfo& t, int64_t row_begin, int64_t row_count, float* dst);
// The whole tensor as fp32 [numel] (row-major: ne[0] innermost).
std::vector<float> dequantize_tensor(const GgufFile& f, const GgufTensorInfo& t);

// ---------------------------------------------------------------------------------------------------------------------
// Q4_0 / Q4_1 -> quest-int4 (group 32)
//
// A GGUF row is one int4 row (ne[0] = in_features = int4 columns) and each 32-element block is one int4 group; the
// int4 value is (code - zero) * scale with an fp16 scale and a zero point in 0..15, evaluated in fp32.
//   - Q4_0 is ALWAYS exact: scale = d, zero = 8, code = q. Both sides compute float(q - 8) * float(d), the same fp32
//     operation on the same operands, so the results are equal bit for bit (signed zeros, infinities, NaNs included).
//   - Q4_1 (x = fl(q * d + m)) is exact for a block when m = -z * d for an integer z in 0..15 (m/d an integer in
//     -15..0): then q * d + m = (q - z) * d exactly (a 5-bit integer times an fp16 is exact in fp32), so scale = d,
//     zero = z, code = q gives the same value. Signed zeros need care: for q = z ggml computes z*d + (-z*d) = +0,
//     while (q - z) * d is -0 when d < 0; such blocks use scale = -d, zero = 15 - z, code = 15 - q instead (and a
//     block whose m is -0 with d < 0 keeps scale = d, where ggml's 0*d + -0 = -0). A block with d = 0 holds the
//     constant m and maps to scale = m, zero = 0, code = 1. For a block whose codes take all 16 values these are
//     the only exact mappings (the 16 values must be an arithmetic progression of step |s| = |d| through 0, up to
//     the fp32 rounding of q * d + m), so a block
//     with m/d not an integer in -15..0 is NOT exact: that is what llama.cpp's quantizer produces in general
//     (m = min of the block, d = (max - min) / 15; on SmolLM2-135M Q4_1, 0.27% of the blocks are exact and no
//     matrix). A block using few codes might fit some other scale; it is not searched for and counts as inexact.
// Every candidate mapping is verified element by element against ggml's formula on the block's own codes, so a
// returned matrix dequantizes (dequantize_int4) to exactly the bits dequantize_rows gives.
// ---------------------------------------------------------------------------------------------------------------------
struct Int4FromGguf {
    std::optional<Int4Matrix> matrix;  // set when every block is exact
    int64_t blocks = 0;                // blocks examined (rows x cols / 32)
    int64_t inexact_blocks = 0;        // blocks with no exact int4 representation
};

// Converts a Q4_0 or Q4_1 matrix of `rows` x `cols` (cols % 32 == 0) stored at src (rows x cols / 32 blocks, row
// by row). With row_order (rows entries), int4 row r is GGUF row row_order[r] (e.g. an undone Q/K permutation).
// std::invalid_argument for another type or bad sizes. All blocks are examined, so inexact_blocks is a full count.
Int4FromGguf int4_from_gguf_q4(GgmlType t, const std::byte* src, int rows, int cols,
                               std::span<const int> row_order = {});

}  // namespace quest
