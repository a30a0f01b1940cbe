#pragma once
// Device helpers and argument checks shared by the Quest decode kernels' units (quest.cu: page scores; topk.cu:
// top-k; sparse_attention.cu: attention over the selected pages). Internal to kernels/select.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/common/device_utils.cuh"
#include "kernels/select/quest.cuh"

namespace quest {

namespace {

// ---------------------------------------------------------------------------------------------------------------------
// Small device helpers
// ---------------------------------------------------------------------------------------------------------------------

// 16-byte asynchronous copy global -> shared; src_bytes = 0 zero-fills the destination without reading the source.

// Swizzled position of 16-byte piece c of row r in a shared tile whose rows hold CPR pieces (CPR = row bytes / 16).
// Eight consecutive rows reading the same logical piece, or eight consecutive pieces of one row (or of a few rows
// when CPR < 8), land in eight distinct 16-byte bank groups: conflict-free 128-bit shared loads and stores.
template <int CPR>
__device__ __forceinline__ int swz(int r, int c) {
    if constexpr (CPR >= 8)
        return c ^ (r & 7);
    else
        return c ^ ((r / (8 / CPR)) & (CPR - 1));
}

// Sequence length on the device and the derived page count; false when the length is outside the cache.
__device__ __forceinline__ bool device_len(const int* d_pos, int page_size_log2, int max_pages, int& len, int& P) {
    len = *d_pos + 1;
    P = (len + (1 << page_size_log2) - 1) >> page_size_log2;
    return len >= 1 && P <= max_pages;
}

inline bool head_dim_supported(int d) { return d == 8 || d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

inline void require_kv(const KvLayerView& kv, int num_heads, int page_budget) {
    QUEST_REQUIRE(kv.num_kv_heads >= 1 && num_heads >= 1 && num_heads % kv.num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(head_dim_supported(kv.head_dim), "head_dim must be one of 8, 16, 32, 64, 128, 256");
    QUEST_REQUIRE(kv.page_size >= 1 && kv.page_size <= 256 && (kv.page_size & (kv.page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(kv.max_pages >= 1 && page_budget >= 1, "max_pages and page_budget must be >= 1");
    QUEST_REQUIRE(static_cast<long long>(kv.max_pages) * kv.page_size <= kv.capacity,
                  "max_pages * page_size must fit in capacity");
}

}  // namespace

}  // namespace quest
