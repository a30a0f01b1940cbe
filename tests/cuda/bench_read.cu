// Read-only roofline kernels for quest_kernel_bench ("read"): how fast can a kernel that only streams N bytes
// (the size of one decode GEMV's weights) and folds them into one word per block go, isolated and back to back under
// programmatic dependent launch? That is the ceiling of any GEMV of the same bytes on this device, ramp and tail
// included. Not part of the engine.
//
//   "ldg U<u> W<w> S<s>": a persistent grid of at most s warps per SM (w per block), each thread keeping u 16-byte
//   loads in flight (a rolling refill: the register just folded is reloaded with the thread's next piece), the first
//   u loads issued before pdl_wait().
//   "bulk P<p> K<k> B<b>": b blocks per SM of 256 threads, each block streaming a contiguous share through a ring of p
//   stages of k KB in shared memory, filled by cp.async.bulk (TMA, one thread, an mbarrier per stage): (p - 1) k KB in
//   flight per block without registers; the first p stages issued before pdl_wait().
//   "tile rows|contiguous W<w> S<s>": a tensor-core GEMV's access pattern without its arithmetic (below).
#include "tests/cuda/bench_read.h"

#include <cstdint>

#include "kernels/common/cuda_common.cuh"
#include "kernels/common/device_utils.cuh"

namespace quest::bench {
namespace {

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

template <int U>
__global__ void read_ldg_kernel(const uint4* __restrict__ src, int64_t n16, uint32_t* __restrict__ out) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = i + u * stride < n16 ? __ldcs(src + i + u * stride) : uint4{0, 0, 0, 0};
    pdl_trigger();
    pdl_wait();
    uint32_t acc = 0;
    for (; i < n16; i += U * stride) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            acc ^= fold(r[u]);
            const int64_t j = i + (U + u) * stride;
            r[u] = j < n16 ? __ldcs(src + j) : uint4{0, 0, 0, 0};
        }
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// One thread: arm `bar` for `bytes` and copy them from global to shared memory (cp.async.bulk, 16-byte multiples).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "wait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
#endif
}

constexpr int kBulkThreads = 256;

template <int P, int KB>
__global__ void __launch_bounds__(kBulkThreads) read_bulk_kernel(const uint4* __restrict__ src, int64_t n16,
                                                                  uint32_t* __restrict__ out) {
    constexpr int kStage16 = KB * 1024 / 16;  // 16-byte pieces per stage
    extern __shared__ uint4 ring[];           // [P][kStage16]
    __shared__ uint64_t full[P];
    // This block's contiguous share [begin, end) of the pieces.
    const int64_t per = (n16 + gridDim.x - 1) / gridDim.x;
    const int64_t begin = per * blockIdx.x, end = begin + per < n16 ? begin + per : n16;
    const int64_t stages = end > begin ? (end - begin + kStage16 - 1) / kStage16 : 0;
    auto issue = [&](int64_t s) {
        const int64_t a = begin + s * kStage16;
        const int64_t n = end - a < kStage16 ? end - a : kStage16;
        bulk_load(ring + (s % P) * kStage16, src + a, static_cast<uint32_t>(n * 16), &full[s % P]);
    };
    if (threadIdx.x == 0) {
        for (int p = 0; p < P; ++p) mbar_init(&full[p], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int64_t s = 0; s < P && s < stages; ++s) issue(s);
    }
    __syncthreads();
    pdl_trigger();
    pdl_wait();
    uint32_t acc = 0;
    for (int64_t s = 0; s < stages; ++s) {
        mbar_wait(&full[s % P], static_cast<uint32_t>((s / P) & 1));
        const int64_t n = end - (begin + s * kStage16) < kStage16 ? end - (begin + s * kStage16) : kStage16;
        const uint4* st = ring + (s % P) * kStage16;
        for (int64_t k = threadIdx.x; k < n; k += kBulkThreads) acc ^= fold(st[k]);
        __syncthreads();  // every thread is done with stage s's slot
        if (threadIdx.x == 0 && s + P < stages) issue(s + P);
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}

// The access pattern of a tensor-core GEMV in the per-row device layout (kernels/linear/int4_layout.h), without its
// arithmetic: a matrix of rows of `row16` 16-byte slots, 16-row tiles taken by blocks of W warps, a tile's items
// (4 KB: 16 rows x 4 slots x 4 runs) split over the warps, each lane holding one item (8 x 16 bytes) and reloading
// each piece with the next item's right after folding it. TILED = false: lane (g, t) reads slot 128 b + 32 j + 4 m + t
// of rows g and g + 8 (8 rows x 64 bytes per instruction: the mma variant's mapping, kernels/linear/gemv_int4.cu);
// TILED = true: the same item's 4 KB stored contiguously (512 bytes per instruction, as a tile-interleaved layout
// would give). docs/measurements.md, seventh session: the difference is 3-6 points of bandwidth.
template <int W, bool TILED>
__global__ void __launch_bounds__(W * 32) read_tile_kernel(const uint4* __restrict__ src, int rows, int row16,
                                                           uint32_t* __restrict__ out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int items = row16 / 16, tiles = rows / 16;
    const int block_tiles = static_cast<int>(blockIdx.x) < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int per_tile = warp < items ? (items - 1 - warp) / W + 1 : 0;
    const int my = block_tiles * per_tile;
    auto addr = [&](int T, int m, int h, int j) -> int64_t {
        if (TILED) return (int64_t(T) * items + m) * 256 + (h * 4 + j) * 32 + lane;
        const int k = 4 * m + t;
        return int64_t(T * 16 + g + 8 * h) * row16 + ((k >> 5) << 7) + 32 * j + (k & 31);
    };
    int ti = blockIdx.x, mi = warp, ki = 0;
    uint4 q[2][4];
    if (my > 0)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 4; ++j) q[h][j] = __ldcs(src + addr(ti, mi, h, j));
    pdl_trigger();
    pdl_wait();
    uint32_t acc = 0;
    for (int i = 0; i < my; ++i) {
        ++ki;
        mi += W;
        if (mi >= items) mi = warp, ti += gridDim.x;
        const bool more = ki < my;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                acc ^= fold(q[h][j]);
                if (more) q[h][j] = __ldcs(src + addr(ti, mi, h, j));
            }
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(out + blockIdx.x, acc);
}

template <int W, int S, bool TILED>
void launch_tile(uint32_t* out, const void* src, size_t bytes, cudaStream_t stream) {
    const int row16 = 128;  // 2 KB rows: 4096 int4 columns
    const int rows = static_cast<int>(bytes / (row16 * 16)) / 16 * 16;
    const int tiles = rows / 16, max_blocks = sm_count() * (S / W);
    const int blocks = tiles < max_blocks ? tiles : max_blocks;
    launch_pdl(read_tile_kernel<W, TILED>, dim3(blocks), dim3(W * 32), 0, stream, static_cast<const uint4*>(src),
               rows, row16, out);
}

template <int U, int W, int S>
void launch_ldg(uint32_t* out, const void* src, size_t bytes, cudaStream_t stream) {
    launch_pdl(read_ldg_kernel<U>, dim3(sm_count() * S / W), dim3(W * 32), 0, stream,
               static_cast<const uint4*>(src), static_cast<int64_t>(bytes / 16), out);
}

template <int P, int KB, int B>
void launch_bulk(uint32_t* out, const void* src, size_t bytes, cudaStream_t stream) {
    const size_t smem = size_t(P) * KB * 1024;
    // A host-side attribute of the function (no stream work); set on every call: the benchmark's single device.
    CUDA_CHECK(cudaFuncSetAttribute(read_bulk_kernel<P, KB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)));
    launch_pdl(read_bulk_kernel<P, KB>, dim3(sm_count() * B), dim3(kBulkThreads), smem, stream,
               static_cast<const uint4*>(src), static_cast<int64_t>(bytes / 16), out);
}

struct ReadVariant {
    const char* name;
    void (*launch)(uint32_t*, const void*, size_t, cudaStream_t);
};

const ReadVariant kReadVariants[] = {
    {"ldg U4 W8 S16", launch_ldg<4, 8, 16>},   {"ldg U8 W8 S16", launch_ldg<8, 8, 16>},
    {"ldg U4 W8 S32", launch_ldg<4, 8, 32>},   {"ldg U8 W8 S32", launch_ldg<8, 8, 32>},
    {"ldg U16 W8 S16", launch_ldg<16, 8, 16>}, {"bulk P4 K16 B1", launch_bulk<4, 16, 1>},
    {"bulk P6 K16 B1", launch_bulk<6, 16, 1>}, {"bulk P4 K8 B2", launch_bulk<4, 8, 2>},
    {"bulk P8 K8 B1", launch_bulk<8, 8, 1>},   {"bulk P4 K32 B1", launch_bulk<4, 32, 1>},
    // 10..: the tensor-core GEMV's access pattern (rows of 2 KB; bytes rounded down to whole 16-row tiles)
    {"tile rows W8 S16", launch_tile<8, 16, false>}, {"tile contiguous W8 S16", launch_tile<8, 16, true>},
    {"tile rows W4 S16", launch_tile<4, 16, false>}, {"tile contiguous W4 S16", launch_tile<4, 16, true>},
    {"tile rows W8 S32", launch_tile<8, 32, false>}, {"tile contiguous W8 S32", launch_tile<8, 32, true>},
};

}  // namespace

int read_variant_count() { return static_cast<int>(sizeof kReadVariants / sizeof kReadVariants[0]); }
const char* read_variant_name(int v) { return kReadVariants[v].name; }
void read_variant(int v, uint32_t* out, const void* src, size_t bytes, cudaStream_t stream) {
    QUEST_REQUIRE(v >= 0 && v < read_variant_count(), "read variant out of range");
    QUEST_REQUIRE(bytes % 16 == 0 && is_aligned(src, 16), "read: 16-byte multiples and alignment");
    kReadVariants[v].launch(out, src, bytes, stream);
}

}  // namespace quest::bench
