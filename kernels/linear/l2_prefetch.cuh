#pragma once
// L2 prefetch of byte ranges (sm_90): one warp walks a short list of ranges and asks L2 to fetch them from DRAM, so
// that a later kernel finds them there. Meant for a forked stream next to a latency-bound phase of the decode step
// (the Quest chain, whose dependent loads leave DRAM mostly idle): it reads nothing into registers, writes nothing,
// and only changes what L2 holds, so every result is bit for bit the same with or without it. One block of 32
// threads: it takes no SM slot that the kernels beside it need.
//
// Forms (L2PrefetchForm):
//   bulk:            cp.async.bulk.prefetch.L2.global, one instruction per chunk (the TMA unit splits it into lines);
//   bulk-evict-last: the same with an L2::evict_last cache policy (createpolicy), so that the lines outlive the
//                    streaming traffic of the phase they overlap (within the context's persisting L2 set-aside:
//                    l2_persisting_limit_bytes());
//   line-evict-last: prefetch.global.L2::evict_last per 128-byte line (the load path; 32 lines per warp step).
// Pacing: rate_gbps > 0 issues chunk i no earlier than i chunk_bytes / rate after the kernel's start (SM clock
// cycles at the device's peak clock), so that the prefetch leaves DRAM to the phase it overlaps instead of queueing
// megabytes ahead of its loads; 0 issues everything at once.
#include <cstddef>
#include <cstdint>

#include "kernels/common/cuda_common.cuh"

namespace quest {

struct L2Range {
    const void* ptr = nullptr;  // 16-byte aligned
    size_t bytes = 0;           // a multiple of 16, > 0
};

// The ranges of one launch (passed by value to the kernel).
struct L2PrefetchList {
    static constexpr int kMaxRanges = 12;
    L2Range ranges[kMaxRanges];
    int count = 0;
    // Appends the 16-byte aligned interior of [p, p + bytes) (nothing when that is empty); false when the list is
    // full (the range is then not taken).
    bool add(const void* p, size_t bytes) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = (a + 15) & ~uintptr_t(15), hi = (a + bytes) & ~uintptr_t(15);
        if (p == nullptr || bytes == 0 || hi <= lo) return true;
        if (count < 0 || count >= kMaxRanges) return false;
        ranges[count++] = L2Range{reinterpret_cast<const void*>(lo), static_cast<size_t>(hi - lo)};
        return true;
    }
    size_t bytes() const {
        size_t n = 0;
        for (int i = 0; i < count; ++i) n += ranges[i].bytes;
        return n;
    }
};

enum class L2PrefetchForm { Bulk, BulkEvictLast, LineEvictLast };
const char* l2_prefetch_form_name(L2PrefetchForm f);  // "bulk", "bulk-evict-last", "line-evict-last"

struct L2PrefetchParams {
    L2PrefetchForm form = L2PrefetchForm::Bulk;
    size_t chunk_bytes = 16 << 10;  // bytes per instruction (bulk) or per paced step (line); a multiple of 128,
                                    // at most 512 KiB
    double rate_gbps = 0;           // pacing, 1e9 bytes per second; 0: unpaced
};

// Prefetches every range of `list` into L2 (a no-op when the list is empty). Requires every range 16-byte aligned
// with a byte count that is a positive multiple of 16, chunk_bytes a positive multiple of 128 up to 512 KiB, and
// rate_gbps finite and >= 0. No allocation or synchronisation (graph-safe). Launched without programmatic dependent
// launch: it orders after the stream's previous work like any kernel.
void l2_prefetch(const L2PrefetchList& list, const L2PrefetchParams& p, cudaStream_t stream);

// The current device's L2 size, the most its context may set aside for persisting (evict_last) lines, and the
// context's current set-aside (cudaLimitPersistingL2CacheSize), in bytes.
size_t l2_cache_bytes();
size_t l2_persisting_max_bytes();
size_t l2_persisting_limit_bytes();

}  // namespace quest
