#pragma once
// Device layout of the int4 codes ("quest-int4" v1 codes permuted within each row), shared by the host repacking
// (kernels/linear/quant.h: int4_to_device_layout / int4_from_device_layout) and every CUDA kernel that reads an Int4View
// (kernels/linear/gemv_int4.cu). Plain C++17, usable from nvcc and from the C++20 host code.
//
// The on-disk / CPU layout (kernels/linear/quant.h) stores a row as `chunks` = cols / 32 consecutive 16-byte chunks (chunk c
// = columns 32c .. 32c + 31, four code words). On the device the chunks of each row are permuted, nothing else:
//   - S = min(group / 32, 4) chunks make a "segment" (segment k = chunks kS .. kS + S - 1: 32 S columns inside one
//     group; for group >= 128 a whole group of 128 columns or a quarter / eighth / ... of a larger one);
//   - the segments of a row are taken 32 at a time ("batch" b = segments 32b .. 32b + n_b - 1, n_b = 32 except
//     for the row's last batch);
//   - inside batch b, chunk j of segment 32b + l goes to slot  32 S b + j n_b + l  of the row.
// So the GEMV that gives segment 32b + l to lane l (kernels/linear/gemv_int4.cu, "seg" kernel) reads, for each j, n_b
// consecutive 16-byte slots across the warp: one fully coalesced 512-byte run per instruction, while each lane's S
// loads cover its whole segment (one scale and zero point, one set of zero-point constants, per segment). Rows stay
// where they were (same size, 16-byte aligned starts), so the permutation is per row: parts of a fused matrix can be
// repacked and uploaded one by one, and one copy of the weights is all the device holds. With group 32 (S = 1) the
// permutation is the identity. Scales and zero points keep the v1 layout ([rows][groups]).
#include <cstdint>

#include "kernels/common/host_device.h"

namespace quest {

// log2 S for a group size (a power of two >= 32): 0 for group 32, 1 for 64, 2 for 128 and above.
constexpr QUEST_HD int int4_segment_shift(int group) { return group >= 128 ? 2 : (group == 64 ? 1 : 0); }

// Device slot (16-byte unit from the row's start) of logical chunk c of a row of `chunks` chunks, S = 1 << sshift
// (sshift = int4_segment_shift(group); S divides chunks since group divides cols).
constexpr QUEST_HD int int4_chunk_slot(int c, int chunks, int sshift) {
    const int k = c >> sshift;                      // segment
    const int j = c & ((1 << sshift) - 1);          // chunk within the segment
    const int b = k >> 5;                           // batch
    const int left = (chunks >> sshift) - (b << 5);  // segments from batch b on
    const int n = left < 32 ? left : 32;            // segments in batch b
    return (b << (5 + sshift)) + j * n + (k & 31);
}

}  // namespace quest
