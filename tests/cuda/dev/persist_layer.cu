// Persistent layer-tail kernel (issue 27 stage 1, quest_kernel_bench "persist"; not part of the engine).
//
// What it computes, per layer tail l (the product's fused epilogues, kernels/linear/gemv_epilogue.h):
//   op 0  o:       x += W_o att;            xg = fp16(x g_mlp);  partials[0][block] = sum of x^2 over its rows
//   op 1  gate+up: act[i] = fp16(silu(v[2i]) v[2i + 1]), v = W_gu xg inv, inv = rsqrtf(sum partials[0] / H + eps)
//   op 2  down:    x += W_down act;         xg = fp16(x g_next); partials[1][block]
//
// Design:
//   - Grid: every SM holds kBlocksPerSm = 2 blocks of 8 warps (16 warps per SM, as the product's stream kernels), all
//     resident at once (persist_blocks checks the occupancy), so blocks may wait on each other.
//   - Tasks: each op is split into row tiles as the product's stream kernel splits it (int4: o and down 2-row tiles
//     with 4 chunks per row in flight and the fp16 dot; gate+up 4-row tiles with 2 chunks in flight and the integer
//     dot; FP16: 2-row tiles, 4 16-byte loads per row in flight). Warp g of the G warps takes tiles g, g + G, ... of
//     every op (a static queue: no atomics to take a task), walking its (tile, batch) items with the product's
//     rolling refill (8 16-byte loads per lane always in flight).
//   - Dependencies: one counter per op in global memory. A block that finished its tiles of op i adds 1 (after a
//     fence); op i + 1 starts in a block when the counter of op i reaches the grid's block count (thread 0 spins,
//     bounded by kWaitTimeoutNs; a timeout writes an error code and every later wait gives up at once, so a broken
//     run ends instead of hanging). Each op needs the whole previous output (the norm's sum, all of x or act), so
//     the dependency is op-wide. The first o of a launch waits on the previous kernel (griddepcontrol.wait).
//   - Prefetch across op boundaries: as soon as a warp has consumed its last item of op i, it issues the loads of
//     its FIRST item of op i + 1 (8 x 16 bytes per lane, 4 KB per warp, ~8.6 MB over the grid: all of int4 o, a third
//     of int4 down) into the registers the stream uses, BEFORE the block waits on op i's counter; at a launch's start
//     they are issued before griddepcontrol.wait. So DRAM is busy with op i + 1's weights while op i's last tiles,
//     the counter wait and the block's copy of the next input complete.
//   - Input of each op: copied by every block into shared memory after the wait, with L2 loads (__ldcg: the data was
//     written by other SMs during this launch), in the layouts of the product's kernels (int4: the transposed fp16
//     pieces, or x_to_i16's block floating point for the integer dot; FP16: plain).
//   - Replays: the last block to leave the launch (an exit counter) zeroes the counters; the next launch touches them
//     only after its griddepcontrol.wait, i.e. after this grid has completed. So a graph replays it as is.
// Arithmetic per row: the product's chunk_dot / chunk_dot_i16 (kernels/linear/gemv_int4_device.cuh) on the same chunk
// order per lane and the same warp sums, so the int4 row sums are bit for bit the product's; the norm's inv differs in
// the last bits (its partial sums come from a different number of blocks). The FP16 dot is gemv.cu's dot8 in fp32,
// its chunks summed in another order than gemv.cu's column segments (fp32 rounding).
#include "tests/cuda/dev/persist_layer.h"

#include <cstdint>

#include "kernels/common/cuda_common.cuh"
#include "kernels/common/device_utils.cuh"
#include "kernels/linear/gemv_int4_device.cuh"
#include "kernels/linear/int4_layout.h"

namespace quest::bench {
namespace {

using namespace int4_dot;

constexpr int kW = 8;                // warps per block
constexpr int kThreads = kW * 32;
constexpr int kBlocksPerSm = 2;      // 16 warps per SM
constexpr int kSlots = 8;            // R * U 16-byte loads per lane in flight (every op: R2 U4 or R4 U2)
constexpr uint64_t kWaitTimeoutNs = 200ull * 1000 * 1000;  // 200 ms: a layer tail takes ~30 us

enum class Epi { Residual, SwiGLU };

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// FP16 dot of 8 columns in fp32: kernels/linear/gemv.cu's dot8.
__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
    const __half2* wh = reinterpret_cast<const __half2*>(&w);
    const __half2* xh = reinterpret_cast<const __half2*>(&x);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = __half22float2(wh[i]);
        const float2 b = __half22float2(xh[i]);
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
    }
    return acc;
}

// One op's matrix. A "chunk" is one 16-byte unit of a row: 32 int4 columns (codes at device slot int4_chunk_slot)
// or 8 fp16 columns.
struct Op {
    const uint4* w;            // [rows][chunks]
    const unsigned short* sc;  // int4: [rows][groups] fp16 scale bits
    const uint8_t* zp;         // int4: [rows][groups]
    int rows, chunks, groups;
};

template <bool INT4>
__device__ __forceinline__ Op op_of(const PersistLayerDev& L, int k, int rows, int cols, int cpg) {
    Op op;
    op.w = static_cast<const uint4*>(L.w[k]);
    op.sc = reinterpret_cast<const unsigned short*>(L.scales[k]);
    op.zp = L.zeros[k];
    op.rows = rows;
    op.chunks = INT4 ? cols >> 5 : cols >> 3;
    op.groups = INT4 ? op.chunks >> cpg : 0;
    return op;
}

// The registers of the loads in flight: slot u * R + r holds chunk u of row r of the item being streamed.
struct Regs {
    uint4 q[kSlots];
    uint32_t s[kSlots], z[kSlots];
};

// Row pointers of the tile being loaded (rows past the end re-read the last row; never stored).
template <bool INT4, int R>
struct Rows {
    const uint4* w[R];
    const unsigned short* s[R];
    const uint8_t* z[R];

    __device__ __forceinline__ void point(const Op& op, int tile) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t row = min(tile * R + r, op.rows - 1);
            w[r] = op.w + row * op.chunks;
            if constexpr (INT4) {
                s[r] = op.sc + row * op.groups;
                z[r] = op.zp + row * op.groups;
            }
        }
    }
    // Chunk c (at 16-byte slot `slot` of the row) of row r when `in`; else the registers keep stale contents.
    __device__ __forceinline__ void load(int r, int c, int slot, int cpg, bool in, uint4& q, uint32_t& sv,
                                         uint32_t& zv) const {
        if (in) {
            q = load_stream(w[r] + slot);
            if constexpr (INT4) {
                sv = __ldg(s[r] + (c >> cpg));
                zv = __ldg(z[r] + (c >> cpg));
            }
        }
    }
};

template <int R, int U>
__device__ __forceinline__ int batches_of(const Op& op) {
    return (((op.chunks + 31) >> 5) + U - 1) / U;
}

// Loads the warp's first item (tile gw, batch 0) of op into g: what stream_op expects to find in flight.
template <bool INT4, int R, int U>
__device__ __forceinline__ void load_first(const Op& op, int cpg, int gw, int lane, Regs& g) {
    const int tiles = (op.rows + R - 1) / R;
    if (gw >= tiles) return;
    Rows<INT4, R> src;
    src.point(op, gw);
    const int sshift = cpg < 2 ? cpg : 2;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
        const bool in = c < op.chunks;
        const int slot = INT4 ? (in ? int4_chunk_slot(c, op.chunks, sshift) : 0) : c;
#pragma unroll
        for (int r = 0; r < R; ++r) src.load(r, c, slot, cpg, in, g.q[u * R + r], g.s[u * R + r], g.z[u * R + r]);
    }
}

// Where a tile's sums go.
struct TileOut {
    float* x;         // Residual: [rows]
    __half* xg;       // Residual: [rows]
    const float* gv;  // Residual: [rows] the next norm's weight
    __half* act;      // SwiGLU: [rows / 2]
};

// Streams the warp's tiles gw, gw + gws, ... of op (the product's stream kernel loop: gemv_int4_stream_kernel), its
// first item already in flight in g. x: the op's input in shared memory (INT4: xs[j * chunks + c] = piece j of chunk
// c, fp16 or i16 form with xc; FP16: xs[c]). inv: the SwiGLU's factor on the sums (1 where the input was
// normalised). Returns the warp's sum of the updated x^2 (Residual; lane 0).
template <bool INT4, int R, int U, bool I16, Epi E>
__device__ __forceinline__ float stream_op(const Op& op, int cpg, const uint4* xs, const float2* xc, float inv,
                                           const TileOut& out, Regs& g, int gw, int gws, int lane) {
    static_assert(R * U == kSlots, "the register slots are shared by every op");
    static_assert(E != Epi::SwiGLU || R % 2 == 0, "SwiGLU needs the gate and up rows in one tile");
    const int chunks = op.chunks;
    const int tiles = (op.rows + R - 1) / R;
    const int batches = batches_of<R, U>(op);
    const int sshift = cpg < 2 ? cpg : 2;
    int t = gw, b = 0;
    const bool active = t < tiles;
    Rows<INT4, R> src;
    src.point(op, t);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    float sq = 0.0f;
    while (active) {
        int tn = t, bn = b + 1;
        if (bn == batches) {
            bn = 0;
            tn += gws;
            src.point(op, tn);
        }
        const bool more = tn < tiles;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = lane + 32 * (b * U + u), cn = lane + 32 * (bn * U + u);
            const bool in = c < chunks, in_next = more && cn < chunks;
            if (in) {
                if constexpr (INT4) {
                    uint4 xr[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j) xr[j] = xs[j * chunks + c];
                    if constexpr (I16) {
                        const float2 xcc = xc[c];
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            acc[r] = chunk_dot_i16(g.q[u * R + r], g.s[u * R + r], g.z[u * R + r], xr, xcc, acc[r]);
                    } else {
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            acc[r] = chunk_dot(g.q[u * R + r], g.s[u * R + r], g.z[u * R + r], xr, acc[r]);
                    }
                } else {
                    const uint4 xr = xs[c];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += dot8(g.q[u * R + r], xr);
                }
            }
            const int slot_next = INT4 ? (in_next ? int4_chunk_slot(cn, chunks, sshift) : 0) : cn;
#pragma unroll
            for (int r = 0; r < R; ++r)
                src.load(r, cn, slot_next, cpg, in_next, g.q[u * R + r], g.s[u * R + r], g.z[u * R + r]);
            if constexpr (I16) __syncwarp();  // keeps each chunk's refill right after its dot (gemv_int4.cu)
        }
        if (bn == 0) {  // tile t is complete (warp-uniform)
            float sum[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                sum[r] = warp_sum(acc[r]);
                acc[r] = 0.0f;
            }
            if (lane == 0) {
                if constexpr (E == Epi::SwiGLU) {
#pragma unroll
                    for (int r = 0; r < R; r += 2)
                        if (t * R + r < op.rows)
                            out.act[(t * R + r) >> 1] = __float2half_rn(epi_silu_mul(sum[r] * inv, sum[r + 1] * inv));
                } else {
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const int row = t * R + r;
                        if (row >= op.rows) break;
                        // epi_residual_row, with L2 loads and stores: x[row] was written by another SM in this launch.
                        const float v = __ldcg(out.x + row) + sum[r];
                        __stcg(out.x + row, v);
                        out.xg[row] = __float2half_rn(v * __ldg(out.gv + row));
                        sq += v * v;
                    }
                }
            }
        }
        if (!more) break;
        t = tn;
        b = bn;
    }
    return sq;
}

// Thread 0 waits until *counter >= target (then every thread of the block may read what those blocks wrote, from
// L2); bounded: after kWaitTimeoutNs, or at once when an earlier wait failed, it gives up and records `code`.
__device__ __forceinline__ void wait_count(const int* counter, int target, int* error, int code) {
    if (threadIdx.x == 0) {
        const uint64_t t0 = globaltimer();
        while (load_acquire(counter) < target) {
            if (*reinterpret_cast<volatile int*>(error) != 0) break;
            if (globaltimer() - t0 > kWaitTimeoutNs) {
                atomicCAS(error, 0, code);
                break;
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// The block's outputs of an op are complete: every thread's stores are made visible, then one increment.
__device__ __forceinline__ void signal_done(int* counter) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1);
    }
}

// The op's input into shared memory from L2 (written in this launch or before it): n16 16-byte pieces.
// INT4 (fp16 dot): the transposed layout of the stream kernel, xs[(i & 3) * chunks + (i >> 2)]; FP16: plain.
template <bool INT4>
__device__ __forceinline__ void copy_input(uint4* xs, const __half* src, int cols) {
    const uint4* v = reinterpret_cast<const uint4*>(src);
    const int n16 = cols >> 3, chunks = cols >> 5;
#pragma unroll 4
    for (int i = threadIdx.x; i < n16; i += kThreads) {
        const uint4 p = __ldcg(v + i);
        if constexpr (INT4) xs[(i & 3) * chunks + (i >> 2)] = p;
        else xs[i] = p;
    }
}

// Error codes: 1 + 3 * layer-in-launch + op (the wait before that op).
__device__ __forceinline__ int wait_code(int l, int op) { return 1 + 3 * l + op; }

template <bool INT4>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    persist_tail_kernel(const PersistLayerDev* __restrict__ layers, int first, int count, PersistArgs a, int cpg,
                        int xs_units) {
    extern __shared__ uint4 smem[];
    uint4* xs = smem;                                              // [xs_units]: the widest input
    float2* xc = reinterpret_cast<float2*>(smem + xs_units);       // INT4: [H / 32] the i16 chunk steps
    uint4* stage = smem + xs_units + (INT4 ? a.hidden / 64 : 0);   // INT4: [H / 8] xg in fp16 for x_to_i16
    const int lane = threadIdx.x & 31;
    const int gw = blockIdx.x * kW + (threadIdx.x >> 5), gws = gridDim.x * kW;
    const int H = a.hidden, F = a.inter, G = gridDim.x;
    constexpr int R1 = INT4 ? 4 : 2, U1 = INT4 ? 2 : 4;  // gate+up's tiles (the others: 2 rows, 4 chunks)
    int* cnt = a.counters;

    Regs g;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) g.q[k] = make_uint4(0, 0, 0, 0), g.s[k] = 0, g.z[k] = 0;
    load_first<INT4, 2, 4>(op_of<INT4>(layers[first], 0, H, H, cpg), cpg, gw, lane, g);
    pdl_trigger();
    pdl_wait();

    for (int l = 0; l < count; ++l) {
        const PersistLayerDev& L = layers[first + l];
        const Op o = op_of<INT4>(L, 0, H, H, cpg), gu = op_of<INT4>(L, 1, 2 * F, H, cpg),
                 down = op_of<INT4>(L, 2, H, F, cpg);

        // op 0: o projection + residual (input: att, written before the launch).
        if (l > 0) wait_count(cnt + 3 * (l - 1) + 2, G, a.error, wait_code(l, 0));
        copy_input<INT4>(xs, a.att, H);
        __syncthreads();
        float sq = stream_op<INT4, 2, 4, false, Epi::Residual>(o, cpg, xs, xc, 1.0f, TileOut{a.x, a.xg, L.g_mlp, nullptr},
                                                               g, gw, gws, lane);
        load_first<INT4, R1, U1>(gu, cpg, gw, lane, g);  // gate+up's weights in flight across the boundary
        float bs = block_sum_fixed(lane == 0 ? sq : 0.0f);
        if (threadIdx.x == 0) __stcg(a.partials + blockIdx.x, bs);
        signal_done(cnt + 3 * l + 0);

        // op 1: gate+up + SwiGLU (input: xg of op 0, normalised by the partials of op 0).
        wait_count(cnt + 3 * l + 0, G, a.error, wait_code(l, 1));
        const NormScale norm{a.partials, G, H, a.eps};
        const PartialsShare share = epi_partials_load(norm);
        float inv;
        if constexpr (INT4) {
            const uint4* v = reinterpret_cast<const uint4*>(a.xg);
            for (int i = threadIdx.x; i < H / 8; i += kThreads) stage[i] = __ldcg(v + i);
            inv = epi_inv_rms(norm, epi_partials_add(norm, share));  // barriers: stage is complete after it
            uint4 pre[kXPre];
            x_i16_preload<kThreads>(reinterpret_cast<const __half*>(stage), H >> 5, pre);
            x_to_i16<kThreads>(reinterpret_cast<const __half*>(stage), H >> 5, inv, xs, xc, pre);
        } else {
            copy_input<false>(xs, a.xg, H);
            inv = epi_inv_rms(norm, epi_partials_add(norm, share));
        }
        __syncthreads();
        stream_op<INT4, R1, U1, INT4, Epi::SwiGLU>(gu, cpg, xs, xc, INT4 ? 1.0f : inv,
                                                   TileOut{nullptr, nullptr, nullptr, a.act}, g, gw, gws, lane);
        load_first<INT4, 2, 4>(down, cpg, gw, lane, g);
        signal_done(cnt + 3 * l + 1);

        // op 2: down + residual (input: act of op 1).
        wait_count(cnt + 3 * l + 1, G, a.error, wait_code(l, 2));
        copy_input<INT4>(xs, a.act, F);
        __syncthreads();
        sq = stream_op<INT4, 2, 4, false, Epi::Residual>(down, cpg, xs, xc, 1.0f,
                                                         TileOut{a.x, a.xg, L.g_next, nullptr}, g, gw, gws, lane);
        if (l + 1 < count) load_first<INT4, 2, 4>(op_of<INT4>(layers[first + l + 1], 0, H, H, cpg), cpg, gw, lane, g);
        bs = block_sum_fixed(lane == 0 ? sq : 0.0f);
        if (threadIdx.x == 0) __stcg(a.partials + G + blockIdx.x, bs);
        signal_done(cnt + 3 * l + 2);
    }

    // The last block out zeroes the counters for the next launch (which reads them only after this grid completes).
    if (threadIdx.x == 0) {
        if (atomicAdd(cnt + 3 * count, 1) == G - 1) {
            for (int i = 0; i <= 3 * count; ++i) cnt[i] = 0;
            __threadfence();
        }
    }
}

__global__ void standin_kernel(uint32_t* sink, int64_t ns) {
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x == 0) {
        const uint64_t t0 = globaltimer();
        uint32_t n = 0;
        while (globaltimer() - t0 < static_cast<uint64_t>(ns)) ++n;
        sink[blockIdx.x] = n;
    }
}

size_t xs_units_of(int hidden, int inter) { return static_cast<size_t>(hidden > inter ? hidden : inter) / 8; }

template <bool INT4>
int blocks_for(int hidden, int inter) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persist_tail_kernel<INT4>, kThreads,
                                                             persist_smem(INT4, hidden, inter)));
    QUEST_REQUIRE(per_sm >= 1, "persist_blocks: the kernel does not fit on an SM");
    return sm_count() * (per_sm < kBlocksPerSm ? per_sm : kBlocksPerSm);
}

}  // namespace

size_t persist_smem(bool int4, int hidden, int inter) {
    return (xs_units_of(hidden, inter) + (int4 ? static_cast<size_t>(hidden) / 64 + hidden / 8 : 0)) * 16;
}

int persist_blocks(bool int4, int hidden, int inter) {
    // Cached per format and shape (the launcher asks at every launch, also inside stream capture).
    thread_local int cached[2] = {0, 0}, cached_h[2] = {0, 0}, cached_f[2] = {0, 0}, cached_dev[2] = {-1, -1};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const int k = int4 ? 1 : 0;
    if (cached[k] == 0 || cached_h[k] != hidden || cached_f[k] != inter || cached_dev[k] != dev) {
        cached[k] = int4 ? blocks_for<true>(hidden, inter) : blocks_for<false>(hidden, inter);
        cached_h[k] = hidden;
        cached_f[k] = inter;
        cached_dev[k] = dev;
    }
    return cached[k];
}

size_t persist_counter_ints(int count) { return static_cast<size_t>(3) * count + 1; }

void persist_layer_tails(bool int4, const PersistLayerDev* layers, int first, int count, const PersistArgs& a,
                         cudaStream_t stream) {
    QUEST_REQUIRE(layers && first >= 0 && count >= 1, "persist_layer_tails: bad layer range");
    QUEST_REQUIRE(a.att && a.x && a.xg && a.act && a.partials && a.counters && a.error,
                  "persist_layer_tails: missing buffers");
    QUEST_REQUIRE(a.hidden > 0 && a.hidden % 64 == 0 && a.inter > 0 && a.inter % 32 == 0,
                  "persist_layer_tails: hidden must be a multiple of 64, inter of 32");
    QUEST_REQUIRE(is_aligned(a.att, 16) && is_aligned(a.xg, 16) && is_aligned(a.act, 16),
                  "persist_layer_tails: att, xg and act must be 16-byte aligned");
    int cpg = 0;
    if (int4) {
        QUEST_REQUIRE(a.group >= 32 && (a.group & (a.group - 1)) == 0 && a.hidden % a.group == 0 &&
                          a.inter % a.group == 0,
                      "persist_layer_tails: the group must be a power of two >= 32 dividing hidden and inter");
        while ((32 << cpg) < a.group) ++cpg;
    }
    const size_t smem = persist_smem(int4, a.hidden, a.inter);
    QUEST_REQUIRE(smem + 256 <= 48 * 1024, "persist_layer_tails: x does not fit in 48 KB of shared memory");
    const int G = persist_blocks(int4, a.hidden, a.inter);
    QUEST_REQUIRE(a.partials_capacity >= 2 * G, "persist_layer_tails: partials_capacity < 2 * persist_blocks()");
    QUEST_REQUIRE(static_cast<size_t>(a.counters_capacity) >= persist_counter_ints(count),
                  "persist_layer_tails: counters_capacity < persist_counter_ints(count)");
    const int xs_units = static_cast<int>(xs_units_of(a.hidden, a.inter));
    if (int4)
        launch_pdl(persist_tail_kernel<true>, dim3(G), dim3(kThreads), smem, stream, layers, first, count, a, cpg,
                   xs_units);
    else
        launch_pdl(persist_tail_kernel<false>, dim3(G), dim3(kThreads), smem, stream, layers, first, count, a, cpg,
                   xs_units);
}

std::string persist_kernel_info(bool int4, int hidden, int inter) {
    cudaFuncAttributes fa{};
    if (int4) CUDA_CHECK(cudaFuncGetAttributes(&fa, persist_tail_kernel<true>));
    else CUDA_CHECK(cudaFuncGetAttributes(&fa, persist_tail_kernel<false>));
    int per_sm = 0;
    if (int4)
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persist_tail_kernel<true>, kThreads,
                                                                 persist_smem(true, hidden, inter)));
    else
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persist_tail_kernel<false>, kThreads,
                                                                 persist_smem(false, hidden, inter)));
    return std::to_string(fa.numRegs) + " registers, " + std::to_string(fa.localSizeBytes) + " B local, " +
           std::to_string(per_sm) + " blocks of " + std::to_string(kThreads) + " threads fit per SM, " +
           std::to_string(persist_smem(int4, hidden, inter)) + " B dynamic shared memory";
}

std::string persist_error_text(int code) {
    if (code == 0) return "no error";
    const int l = (code - 1) / 3, op = (code - 1) % 3;
    static const char* const names[3] = {"o (on the previous layer's down)", "gate+up (on o)", "down (on gate+up)"};
    return "a dependency wait timed out: layer " + std::to_string(l) + " of the launch, before " + names[op];
}

void persist_standin(uint32_t* sink, int blocks, int threads, int64_t ns, cudaStream_t stream) {
    QUEST_REQUIRE(sink && blocks > 0 && threads > 0 && threads <= 1024 && ns >= 0, "persist_standin: bad arguments");
    launch_pdl(standin_kernel, dim3(blocks), dim3(threads), 0, stream, sink, ns);
}

}  // namespace quest::bench
