// L2 prefetch of byte ranges: kernels/linear/l2_prefetch.cuh.
#include "kernels/linear/l2_prefetch.cuh"

#include <cmath>
#include <string>

namespace quest {

namespace {

constexpr int kThreads = 32;
constexpr uint32_t kLine = 128;
// The bulk prefetch's size travels in 16-byte units in a 16-bit field of the SASS instruction (UBLKPF): < 1 MiB.
constexpr size_t kMaxChunk = 512 << 10;

__device__ __forceinline__ void prefetch_bulk(const char* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void prefetch_bulk_hint(const char* p, uint32_t bytes, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p), "r"(bytes), "l"(policy)
                 : "memory");
#endif
}

__device__ __forceinline__ void prefetch_line_evict_last(const char* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p) : "memory");
#endif
}

// One warp. Chunk c of range r (global index base_r + c) goes to lane (c mod 32); paced, it waits until
// (base_r + c) * cycles_per_chunk cycles after the start.
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2PrefetchList list, L2PrefetchForm form,
                                                               uint32_t chunk, long long cycles_per_chunk) {
    const int lane = threadIdx.x;
    uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (form == L2PrefetchForm::BulkEvictLast)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
    const long long t0 = clock64();
    long long base = 0;
    for (int r = 0; r < list.count; ++r) {
        const char* p = static_cast<const char*>(list.ranges[r].ptr);
        const size_t n = list.ranges[r].bytes;
        const long long chunks = static_cast<long long>((n + chunk - 1) / chunk);
        for (long long c = lane; c < chunks; c += kThreads) {
            if (cycles_per_chunk > 0) {
                const long long due = t0 + (base + c) * cycles_per_chunk;
                while (clock64() < due) __nanosleep(64);
            }
            const size_t off = static_cast<size_t>(c) * chunk;
            const uint32_t len = static_cast<uint32_t>(n - off < chunk ? n - off : chunk);
            if (form == L2PrefetchForm::Bulk) {
                prefetch_bulk(p + off, len);
            } else if (form == L2PrefetchForm::BulkEvictLast) {
                prefetch_bulk_hint(p + off, len, policy);
            } else {
                for (uint32_t o = 0; o < len; o += kLine) prefetch_line_evict_last(p + off + o);
            }
        }
        base += chunks;
    }
}

size_t device_attribute(cudaDeviceAttr a) {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, a, dev));
    return v > 0 ? static_cast<size_t>(v) : 0;
}

}  // namespace

const char* l2_prefetch_form_name(L2PrefetchForm f) {
    switch (f) {
        case L2PrefetchForm::Bulk: return "bulk";
        case L2PrefetchForm::BulkEvictLast: return "bulk-evict-last";
        case L2PrefetchForm::LineEvictLast: return "line-evict-last";
    }
    return "?";
}

void l2_prefetch(const L2PrefetchList& list, const L2PrefetchParams& p, cudaStream_t stream) {
    QUEST_REQUIRE(list.count >= 0 && list.count <= L2PrefetchList::kMaxRanges,
                  "l2_prefetch: range count " + std::to_string(list.count));
    for (int i = 0; i < list.count; ++i) {
        const L2Range& r = list.ranges[i];
        QUEST_REQUIRE(r.ptr != nullptr && is_aligned(r.ptr, 16) && r.bytes > 0 && r.bytes % 16 == 0,
                      "l2_prefetch: range " + std::to_string(i) + " must be 16-byte aligned with a positive multiple "
                      "of 16 bytes, got " + std::to_string(r.bytes) + " bytes");
    }
    QUEST_REQUIRE(p.chunk_bytes >= kLine && p.chunk_bytes % kLine == 0 && p.chunk_bytes <= kMaxChunk,
                  "l2_prefetch: chunk_bytes must be a positive multiple of 128 of at most 512 KiB, got " +
                      std::to_string(p.chunk_bytes));
    QUEST_REQUIRE(std::isfinite(p.rate_gbps) && p.rate_gbps >= 0,
                  "l2_prefetch: rate_gbps must be finite and >= 0, got " + std::to_string(p.rate_gbps));
    QUEST_REQUIRE(p.form == L2PrefetchForm::Bulk || p.form == L2PrefetchForm::BulkEvictLast ||
                      p.form == L2PrefetchForm::LineEvictLast,
                  "l2_prefetch: unknown form");
    if (list.count == 0) return;
    long long cycles_per_chunk = 0;
    if (p.rate_gbps > 0) {
        thread_local int dev = -1;
        thread_local double clock_hz = 0;
        int d = 0;
        CUDA_CHECK(cudaGetDevice(&d));
        if (d != dev) {
            clock_hz = static_cast<double>(device_attribute(cudaDevAttrClockRate)) * 1e3;  // kHz
            dev = d;
        }
        QUEST_REQUIRE(clock_hz > 0, "l2_prefetch: pacing needs the device's clock rate, which it does not report");
        const double cycles = static_cast<double>(p.chunk_bytes) / (p.rate_gbps * 1e9) * clock_hz;
        cycles_per_chunk = static_cast<long long>(std::fmin(std::ceil(cycles), 1e12));
    }
    l2_prefetch_kernel<<<1, kThreads, 0, stream>>>(list, p.form, static_cast<uint32_t>(p.chunk_bytes),
                                                   cycles_per_chunk);
    CUDA_CHECK_LAUNCH();
}

size_t l2_cache_bytes() { return device_attribute(cudaDevAttrL2CacheSize); }
size_t l2_persisting_max_bytes() { return device_attribute(cudaDevAttrMaxPersistingL2CacheSize); }
size_t l2_persisting_limit_bytes() {
    size_t v = 0;
    CUDA_CHECK(cudaDeviceGetLimit(&v, cudaLimitPersistingL2CacheSize));
    return v;
}

}  // namespace quest
