#include "kernels/common/dtype.h"

#include <cmath>
#include <stdexcept>

namespace quest {

namespace {
struct DTypeInfo {
    DType type;
    const char* name;
    size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2}, {DType::F64, "F64", 8},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2},   {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::BOOL, "BOOL", 1},
};
const DTypeInfo& info(DType t) {
    for (const auto& i : kInfo)
        if (i.type == t) return i;
    throw std::logic_error("unknown DType");
}
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }

bool dtype_from_name(std::string_view s, DType& out) {
    for (const auto& i : kInfo)
        if (s == i.name) {
            out = i.type;
            return true;
        }
    return false;
}

float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            bits = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u)  // inf or nan
        return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    if (absx >= 0x477ff000u)  // >= 65520 rounds to inf
        return uint16_t(sign | 0x7c00u);
    if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
        // value * 2^24 rounded to nearest even gives the subnormal mantissa.
        float a;
        std::memcpy(&a, &absx, 4);
        const float scaled = a * 16777216.0f;  // exact: power of two
        const auto m = static_cast<uint32_t>(std::nearbyint(scaled));
        return uint16_t(sign | m);
    }
    // normal: rebias exponent and round mantissa from 23 to 10 bits, nearest even
    uint32_t mant = absx & 0x7fffffu;
    uint32_t exp = (absx >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: still correct
    return uint16_t(sign | h);
}

uint16_t float_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
    switch (t) {
        case DType::F32:
            std::memcpy(dst, src, n * 4);
            return;
        case DType::F16:
        case DType::BF16: {
            // Tensor data in a safetensors file need not be 2-byte aligned: read through memcpy.
            auto p = static_cast<const unsigned char*>(src);
            for (size_t i = 0; i < n; ++i) {
                uint16_t v;
                std::memcpy(&v, p + 2 * i, 2);
                dst[i] = t == DType::F16 ? half_to_float(v) : bf16_to_float(v);
            }
            return;
        }
        default:
            throw std::logic_error("convert_to_f32: not a float dtype: " + std::string(dtype_name(t)));
    }
}

}  // namespace quest
