#pragma once
// Functions shared by the CUDA kernels and the host code (CPU references and tests): QUEST_HD marks them
// __host__ __device__ under nvcc and plain C++ otherwise; QUEST_UNROLL asks nvcc to unroll the loop after it.
#include <cstdint>

#if defined(__CUDACC__)
#define QUEST_HD __host__ __device__
#define QUEST_UNROLL _Pragma("unroll")
#else
#define QUEST_HD
#define QUEST_UNROLL
#endif

namespace quest {

// __byte_perm(x, y, s) (one PRMT on the device), and its host emulation: byte n of the result is byte
// (s >> 4n) & 7 of the 8 bytes {y:x} (selectors 0-7 only).
QUEST_HD inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, sel);
#else
    const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
    return r;
#endif
}

}  // namespace quest
