#pragma once
// Element types of tensors stored in safetensors files, and the host-side conversions to fp32.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace quest {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);             // safetensors spelling: "F32", "BF16", ...
bool dtype_from_name(std::string_view s, DType& out);  // false when the name is unknown
inline bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// IEEE binary16 <-> fp32, round to nearest even; exact for every finite half.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
// bfloat16 <-> fp32 (bf16 is the top half of an fp32; rounding to nearest even, NaN kept quiet).
inline float bf16_to_float(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint16_t float_to_bf16(float f);

// Converts n elements of a float dtype (F32/F16/BF16) to fp32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace quest
