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
//   - Variants (PersistArgs): `ahead` > 0 adds an L2 run-ahead to every warp's stream (cp.async.bulk.prefetch of
//     the item `ahead` + 1 past the one being consumed, and at each op boundary items 0 .. ahead of the next op
//     before the wait), so that the stream after a wait finds its first items in L2 and DRAM stays busy while the
//     blocks wait; light_signal fences only in thread 0; late_regs loads the next op's first item into registers
//     after the increment. TRACE: thread 0 of each block writes globaltimer and clock64 at the PersistEvents.
//   - Replays: the last block to leave the launch (an exit counter) zeroes the counters; the next launch touches them
//     only after its griddepcontrol.wait, i.e. after this grid has completed. So a graph replays it as is.
// Arithmetic per row: the product's chunk_dot / chunk_dot_i16 (kernels/linear/gemv_int4_device.cuh) on the same chunk
// order per lane and the same warp sums, so the int4 row sums are bit for bit the product's; the norm's inv differs in
// the last bits (its partial sums come from a different number of blocks). The FP16 dot is gemv.cu's dot8 in fp32,
// its chunks summed in another order than gemv.cu's column segments (fp32 rounding).
#include "tests/cuda/dev/persist_layer.h"

#include <algorithm>
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

// L2 prefetch of `bytes` (a multiple of 16) from the 16-byte aligned p: asynchronous (the async proxy), no registers,
// no completion to wait for; a fence does not wait for it.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ void prefetch_l2_line(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
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

// L2 prefetch of item (tile, b) of op: lane r < R takes row r, the 16-byte slots that hold the item's chunks (int4:
// the whole layout batch of 32 << sshift chunks that contains them, int4_chunk_slot permutes within it; an item
// that does not start such a batch was prefetched with the one that does) and their scales and zero points.
template <bool INT4, int R, int U>
__device__ __forceinline__ void prefetch_item(const Op& op, int cpg, int tile, int b, int lane) {
    const int row = tile * R + lane;
    if (lane >= R || row >= op.rows) return;
    int c0 = b * U * 32, c1 = min(op.chunks, c0 + U * 32);
    if constexpr (INT4) {
        const int span = 32 << (cpg < 2 ? cpg : 2);
        if (c0 % span != 0) return;
        c1 = min(op.chunks, c0 + span);
    }
    if (c0 >= c1) return;
    prefetch_l2_bulk(op.w + static_cast<int64_t>(row) * op.chunks + c0, static_cast<uint32_t>(c1 - c0) * 16u);
    if constexpr (INT4) {
        const int64_t g = static_cast<int64_t>(row) * op.groups;
        prefetch_l2_line(op.sc + g + (c0 >> cpg));
        prefetch_l2_line(op.sc + g + ((c1 - 1) >> cpg));
        prefetch_l2_line(op.zp + g + (c0 >> cpg));
        prefetch_l2_line(op.zp + g + ((c1 - 1) >> cpg));
    }
}

// L2 prefetch of the warp's items 0 .. ahead of op (tiles gw, gw + gws, ...).
template <bool INT4, int R, int U>
__device__ __forceinline__ void prefetch_first(const Op& op, int cpg, int gw, int gws, int lane, int ahead) {
    const int tiles = (op.rows + R - 1) / R, batches = batches_of<R, U>(op);
    int t = gw, b = 0;
    for (int i = 0; i <= ahead && t < tiles; ++i) {
        prefetch_item<INT4, R, U>(op, cpg, t, b, lane);
        if (++b == batches) b = 0, t += gws;
    }
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
// ahead > 0: the L2 run-ahead, item i + 1 + ahead prefetched as item i is consumed (items 0 .. ahead were prefetched
// before the op's wait).
template <bool INT4, int R, int U, bool I16, Epi E>
__device__ __forceinline__ float stream_op(const Op& op, int cpg, const uint4* xs, const float2* xc, float inv,
                                           const TileOut& out, Regs& g, int gw, int gws, int lane, int ahead) {
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
        if (ahead > 0) {  // the item ahead + 1 past (t, b), from (t, b): no registers held across the items
            const int pb = b + 1 + ahead, pt = t + pb / batches * gws;
            if (pt < tiles) prefetch_item<INT4, R, U>(op, cpg, pt, pb % batches, lane);
        }
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

// Timestamps of thread 0 (TRACE): trace[0][slot][ev][block] globaltimer, trace[1][...] clock64. Addresses from the
// kernel's parameters at each use (no registers held across the streams).
struct Tracer {
    const PersistArgs& a;

    __device__ __forceinline__ void rec(int slot, int ev) const {
        if (threadIdx.x != 0 || slot >= a.trace_layers) return;
        const size_t i = (static_cast<size_t>(slot) * kPersistEvents + ev) * gridDim.x + blockIdx.x;
        const size_t plane = static_cast<size_t>(a.trace_layers) * kPersistEvents * gridDim.x;
        a.trace[plane + i] = static_cast<uint64_t>(clock64());
        a.trace[i] = globaltimer();
    }
};

// The block's outputs of an op are complete: its stores are made visible, then one increment. light: the block
// barrier, then thread 0 fences (cumulative over what the barrier ordered before it) and increments, as cooperative
// groups' grid sync; else every thread fences first (round 1).
template <bool TRACE>
__device__ __forceinline__ void signal_done(int* counter, bool light, const Tracer& tr, int slot, int op) {
    if (!light) __threadfence();
    __syncthreads();
    if constexpr (TRACE) tr.rec(slot, 6 * op + kEvDone);
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1);
    }
    if constexpr (TRACE) tr.rec(slot, 6 * op + kEvSignaled);
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

// AHEAD: the L2 run-ahead compiled in (a.ahead > 0 then used); LATE: a.late_regs. Compile-time, so that round 1's
// form keeps round 1's registers (the late loads' live ranges made ptxas spill).
template <bool INT4, bool TRACE, bool AHEAD, bool LATE>
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
    const int ahead = AHEAD ? a.ahead : 0;
    const Tracer tr{a};
    if constexpr (TRACE) tr.rec(first, kEvStart);

    Regs g;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) g.q[k] = make_uint4(0, 0, 0, 0), g.s[k] = 0, g.z[k] = 0;
    {
        const Op o0 = op_of<INT4>(layers[first], 0, H, H, cpg);
        if (ahead > 0) prefetch_first<INT4, 2, 4>(o0, cpg, gw, gws, lane, ahead);
        load_first<INT4, 2, 4>(o0, cpg, gw, lane, g);
    }
    if constexpr (TRACE) tr.rec(first, kEvFirst);
    pdl_trigger();
    if constexpr (TRACE) tr.rec(first, kEvWaitIn);
    pdl_wait();
    if constexpr (TRACE) tr.rec(first, kEvWaitOut);

    for (int l = 0; l < count; ++l) {
        const int slot = first + l;
        const PersistLayerDev& L = layers[slot];
        const Op o = op_of<INT4>(L, 0, H, H, cpg), gu = op_of<INT4>(L, 1, 2 * F, H, cpg),
                 down = op_of<INT4>(L, 2, H, F, cpg);

        // op 0: o projection + residual (input: att, written before the launch).
        if (l > 0) {
            if (LATE) load_first<INT4, 2, 4>(o, cpg, gw, lane, g);
            if constexpr (TRACE) tr.rec(slot, kEvWaitIn);
            wait_count(cnt + 3 * (l - 1) + 2, G, a.error, wait_code(l, 0));
            if constexpr (TRACE) tr.rec(slot, kEvWaitOut);
        }
        copy_input<INT4>(xs, a.att, H);
        __syncthreads();
        if constexpr (TRACE) tr.rec(slot, kEvInput);
        float sq = stream_op<INT4, 2, 4, false, Epi::Residual>(o, cpg, xs, xc, 1.0f, TileOut{a.x, a.xg, L.g_mlp, nullptr},
                                                               g, gw, gws, lane, ahead);
        // gate+up's weights in flight across the boundary.
        if (ahead > 0) prefetch_first<INT4, R1, U1>(gu, cpg, gw, gws, lane, ahead);
        if (!LATE) load_first<INT4, R1, U1>(gu, cpg, gw, lane, g);
        if constexpr (TRACE) tr.rec(slot, 6 + kEvFirst);
        float bs = block_sum_fixed(lane == 0 ? sq : 0.0f);
        if (threadIdx.x == 0) __stcg(a.partials + blockIdx.x, bs);
        signal_done<TRACE>(cnt + 3 * l + 0, a.light_signal, tr, slot, 0);
        if (LATE) load_first<INT4, R1, U1>(gu, cpg, gw, lane, g);

        // op 1: gate+up + SwiGLU (input: xg of op 0, normalised by the partials of op 0).
        if constexpr (TRACE) tr.rec(slot, 6 + kEvWaitIn);
        wait_count(cnt + 3 * l + 0, G, a.error, wait_code(l, 1));
        if constexpr (TRACE) tr.rec(slot, 6 + kEvWaitOut);
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
        if constexpr (TRACE) tr.rec(slot, 6 + kEvInput);
        stream_op<INT4, R1, U1, INT4, Epi::SwiGLU>(gu, cpg, xs, xc, INT4 ? 1.0f : inv,
                                                   TileOut{nullptr, nullptr, nullptr, a.act}, g, gw, gws, lane, ahead);
        if (ahead > 0) prefetch_first<INT4, 2, 4>(down, cpg, gw, gws, lane, ahead);
        if (!LATE) load_first<INT4, 2, 4>(down, cpg, gw, lane, g);
        if constexpr (TRACE) tr.rec(slot, 12 + kEvFirst);
        signal_done<TRACE>(cnt + 3 * l + 1, a.light_signal, tr, slot, 1);
        if (LATE) load_first<INT4, 2, 4>(down, cpg, gw, lane, g);

        // op 2: down + residual (input: act of op 1).
        if constexpr (TRACE) tr.rec(slot, 12 + kEvWaitIn);
        wait_count(cnt + 3 * l + 1, G, a.error, wait_code(l, 2));
        if constexpr (TRACE) tr.rec(slot, 12 + kEvWaitOut);
        copy_input<INT4>(xs, a.act, F);
        __syncthreads();
        if constexpr (TRACE) tr.rec(slot, 12 + kEvInput);
        sq = stream_op<INT4, 2, 4, false, Epi::Residual>(down, cpg, xs, xc, 1.0f,
                                                         TileOut{a.x, a.xg, L.g_next, nullptr}, g, gw, gws, lane,
                                                         ahead);
        if (l + 1 < count) {  // the next layer's o (its registers: here, or before its wait with late_regs)
            const Op on = op_of<INT4>(layers[slot + 1], 0, H, H, cpg);
            if (ahead > 0) prefetch_first<INT4, 2, 4>(on, cpg, gw, gws, lane, ahead);
            if (!LATE) load_first<INT4, 2, 4>(on, cpg, gw, lane, g);
            if constexpr (TRACE) tr.rec(slot + 1, kEvFirst);
        }
        bs = block_sum_fixed(lane == 0 ? sq : 0.0f);
        if (threadIdx.x == 0) __stcg(a.partials + G + blockIdx.x, bs);
        signal_done<TRACE>(cnt + 3 * l + 2, a.light_signal, tr, slot, 2);
    }

    // The last block out zeroes the counters for the next launch (which reads them only after this grid completes).
    if (threadIdx.x == 0) {
        if (atomicAdd(cnt + 3 * count, 1) == G - 1) {
            for (int i = 0; i <= 3 * count; ++i) cnt[i] = 0;
            __threadfence();
        }
    }
    if constexpr (TRACE) tr.rec(first + count - 1, kEvEnd);
}

// ---------------------------------------------------------------------------------------------------------------------
// Round 3: the "flow" form (persist_flow_tails). No per-op grid barrier and no fixed tile assignment:
//   - Tasks: the tiles of a launch in one sequence, per layer o's tiles, then gate+up's, then down's, each op in row
//     order (tiles as above: o and down 2 rows, gate+up int4 4 rows = the gate and up rows of 2 act rows, FP16 2
//     rows = 1 act row). Warp gw takes tasks gw and gw + gws (static, so that its first weight loads are issued
//     before griddepcontrol.wait), then claims the next from one atomic counter (task 2 gws + the counter's old
//     value), one claim ahead: a claim is issued as a tile starts and used when the tile after next starts, so its
//     round trip hides behind the tile. Early finishers take more tiles; the claims follow the consumers' order.
//   - Dependencies per unit: a unit is 32 of the consumer's 16-byte chunks per row, i.e. kUnitCols(INT4) = 1024
//     (int4) or 256 (FP16) of its input columns = rows of the producer's output. ready[l][k][q] counts the finished
//     tiles of op k (layer slot l of the launch) whose rows lie in unit q. A tile streams its row items in unit order
//     (unit q = item b, slot u with q = b U + u); before its dot on unit q the warp makes sure unit q is in the
//     block's shared memory (flow_unit: the first warp of the block that needs it waits for ready[...][q], then
//     copies it, int4 gate+up converting it to the integer form; the block's other warps wait on a shared flag). The
//     refill loads of the slots before u are issued by then, the other slots still hold the item's weights: the wait
//     hides behind 8 loads per lane in flight, as the stream does.
//   - The norm before gate+up, deferred: gate+up dots the UNnormalised xg (int4: its block floating point with
//     factor 1) and multiplies the row sums by inv = rsqrtf(sum x^2 / H + eps) in the SwiGLU epilogue, after the
//     sum of squares is complete. o's tiles store their sums of x^2; the tile that completes an o unit sums that
//     unit's tiles (one warp, a fixed order), stores the unit's sum and increments sq_done[l]; a gate+up warp waits
//     for sq_done[l] = the unit count once per layer and sums the units in order. Deterministic, but another
//     summation tree than round 1's per-block partials, so inv differs in its last bits; int4: the product applies
//     inv to every chunk's step (scale * (sx inv) * t), here once to the row sum (inv * sum of scale sx t: one
//     rounding less per chunk), i.e. row sums equal up to fp32 rounding, act up to a flipped fp16 rounding.
//   - o of layer l reads x[row] written by down of layer l - 1: its epilogue waits for down's unit of its rows.
//     Every other hazard is covered by the chain (a gate+up tile needs all of o's units, a down tile all of
//     gate+up's, o's units all of down's before them): a shared input buffer of op k is refilled for the next layer
//     only after every tile of op k of this layer, in every block, has finished reading it.
//   - att (o's input) is the same for every tail of a launch (a launch spans layers only in this bench): copied
//     into shared memory once per launch. down's sums of x^2 (the next layer's norm in the product) are stored per
//     tile, not reduced.
//   - partials (floats): [to] o's tile sums of x^2, [kMaxUnits] o's unit sums, [td] down's tile sums; counters
//     (ints): claim, exit, then per layer slot ready[3][kMaxUnits] and sq_done.
//   - late_regs: the next task's first item is loaded after the tile's signal instead of by the tile's last item
//     (lane 0's fence before the increment then has no loads of its warp to wait for).
//   - Bounded waits as above (kWaitTimeoutNs, error code 1 + 3 l + op of the waiting op); the last block out zeroes
//     the counters; TRACE: lane 0 of each warp stamps each task's start and end (globaltimer) and the ns it waited.
constexpr int kUnitChunks = 32;
constexpr int kMaxUnits = 64;                       // per op and layer (FP16 act: 43 at F = 11008)
constexpr int kFlowLayerInts = 3 * kMaxUnits + 1;   // ready[3][kMaxUnits], sq_done
constexpr int kFlowHead = 2;                        // claim, exit
__host__ __device__ constexpr int unit_cols(bool int4) { return int4 ? kUnitChunks * 32 : kUnitChunks * 8; }

// The shape of a launch's task sequence (per layer: o tiles, gate+up tiles, down tiles).
struct FlowShape {
    int to, tg, td, per_layer;  // tiles of o, gate+up, down; their sum
    int uo, ua, ud;             // units of o's output (gate+up's input), act (down's input), down's output
    int rpt1;                   // gate+up: act rows per tile
};
__host__ __device__ inline FlowShape flow_shape(bool int4, int H, int F) {
    FlowShape s;
    const int R1 = int4 ? 4 : 2, uc = unit_cols(int4);
    s.to = H / 2;
    s.tg = 2 * F / R1;
    s.td = H / 2;
    s.per_layer = s.to + s.tg + s.td;
    s.uo = (H + uc - 1) / uc;
    s.ua = (F + uc - 1) / uc;
    s.ud = s.uo;
    s.rpt1 = R1 / 2;
    return s;
}
// Tiles of an op (rpt output rows each, `tiles` in all) whose rows lie in unit q.
__device__ __forceinline__ int tiles_in_unit(int q, int rpt, int tiles, int uc) {
    return min(tiles, (q + 1) * uc / rpt) - q * uc / rpt;
}

// Lane 0: waits until *p >= target (bounded as wait_count); returns the ns it waited. Then fence (acquire side).
__device__ __forceinline__ uint64_t lane0_wait(const int* p, int target, int* error, int code) {
    if (load_acquire(p) >= target) return 0;
    const uint64_t t0 = globaltimer();
    uint64_t t = t0;
    while (load_acquire(p) < target) {
        if (*reinterpret_cast<volatile int*>(error) != 0) break;
        t = globaltimer();
        if (t - t0 > kWaitTimeoutNs) {
            atomicCAS(error, 0, code);
            break;
        }
    }
    __threadfence();
    return t - t0;
}

// The flow kernel's shared memory: dynamic [H / 8] att, [H / 8] gate+up's input (int4: integer form), int4 [H / 64]
// its chunk steps (float2), [F / 8] act; static: the units' flags.
extern __shared__ uint4 flow_smem[];
__shared__ int flow_st_claim[2 * kMaxUnits];  // the layer slot + 1 a warp of the block took unit [k - 1][q] for
__shared__ int flow_st_done[2 * kMaxUnits];   // the layer slot + 1 whose unit [k - 1][q] is in shared memory

// What every task reads (a: the kernel's parameter, by reference: its fields from the parameter space at each use).
struct FlowCtx {
    const PersistLayerDev* layers;
    const PersistArgs& a;
    int first, cpg, lane;
    bool int4;
    // The shape, from the parameters at each use (fewer registers live across the stream).
    __device__ __forceinline__ FlowShape s() const { return flow_shape(int4, a.hidden, a.inter); }
    __device__ __forceinline__ int* layer_ints(int l) const { return a.counters + kFlowHead + l * kFlowLayerInts; }
    __device__ __forceinline__ uint4* xs0() const { return flow_smem; }
    __device__ __forceinline__ uint4* xs1() const { return flow_smem + a.hidden / 8; }
    __device__ __forceinline__ float2* xc1() const { return reinterpret_cast<float2*>(flow_smem + a.hidden / 4); }
    template <bool INT4>
    __device__ __forceinline__ uint4* xs2() const {
        return flow_smem + a.hidden / 4 + (INT4 ? a.hidden / 64 : 0);
    }
};

// Unit q of op k's input (k = 1 gate+up: xg from o; k = 2 down: act from gate+up), layer slot l of the launch, in
// the block's shared memory when it returns (every lane of the warp calls it). Returns the ns lane 0 waited.
template <bool INT4, int k>
__device__ __forceinline__ uint64_t flow_unit(const FlowCtx& c, int q, int l) {
    const int e = l + 1, j = (k - 1) * kMaxUnits + q;
    volatile int* done = flow_st_done + j;
    int role = 0;  // 0: there, 1: this warp copies it, 2: another warp does
    if (c.lane == 0 && *done != e) role = atomicMax(flow_st_claim + j, e) < e ? 1 : 2;
    role = __shfl_sync(0xffffffffu, role, 0);
    if (role == 0) return 0;
    uint64_t waited = 0;
    if (role == 1) {
        const int uc = unit_cols(INT4);
        if (c.lane == 0) {
            const int target = k == 1 ? tiles_in_unit(q, 2, c.s().to, uc) : tiles_in_unit(q, c.s().rpt1, c.s().tg, uc);
            waited = lane0_wait(c.layer_ints(l) + (k - 1) * kMaxUnits + q, target, c.a.error, wait_code(l, k));
        }
        __syncwarp();
        const int cols = k == 1 ? c.a.hidden : c.a.inter, n16 = cols >> 3, chunks = cols >> 5;
        const uint4* src = reinterpret_cast<const uint4*>(k == 1 ? c.a.xg : c.a.act);
        uint4* xs = k == 1 ? c.xs1() : c.xs2<INT4>();
        if constexpr (INT4) {
#pragma unroll 1
            for (int m = 0; m < 4; ++m) {  // 128 pieces = 32 chunks of 4 pieces; lanes 4i .. 4i + 3: one chunk
                const int i = q * 128 + m * 32 + c.lane;
                const bool in = i < n16;
                const uint4 v = in ? __ldcg(src + i) : make_uint4(0, 0, 0, 0);
                if constexpr (k == 1) {  // whole warps shuffle
                    float sx;
                    int sum;
                    const uint4 o = x_piece_to_i16(v, sx, sum);
                    if (in) {
                        xs[(i & 3) * chunks + (i >> 2)] = o;
                        if ((i & 3) == 0) c.xc1()[i >> 2] = make_float2(sx, __int_as_float(sum));
                    }
                } else if (in) {
                    xs[(i & 3) * chunks + (i >> 2)] = v;
                }
            }
        } else {
            const int i = q * kUnitChunks + c.lane;
            if (i < n16) xs[i] = __ldcg(src + i);
        }
        __syncwarp();
        if (c.lane == 0) {
            __threadfence_block();
            *done = e;
        }
    } else if (c.lane == 0) {
        const uint64_t t0 = globaltimer();
        uint64_t t = t0;
        while (*done != e) {
            if (*reinterpret_cast<volatile int*>(c.a.error) != 0) break;
            t = globaltimer();
            if (t - t0 > kWaitTimeoutNs) {
                atomicCAS(c.a.error, 0, wait_code(l, k));
                break;
            }
        }
        __threadfence_block();
        waited = t - t0;
    }
    __syncwarp();
    return waited;
}

// inv of layer slot l (lane 0 waits for every o unit's sum of squares; the warp sums them in order).
__device__ __forceinline__ float flow_inv(const FlowCtx& c, int l, uint64_t& waited) {
    int* li = c.layer_ints(l);
    if (c.lane == 0) waited += lane0_wait(li + 3 * kMaxUnits, c.s().uo, c.a.error, wait_code(l, 1));
    __syncwarp();
    const float* unitp = c.a.partials + c.s().to;
    float v = c.lane < c.s().uo ? __ldcg(unitp + c.lane) : 0.0f;
    for (int q = c.lane + 32; q < c.s().uo; q += 32) v += __ldcg(unitp + q);
    return rsqrtf(warp_sum(v) / static_cast<float>(c.a.hidden) + c.a.eps);
}

// One tile t of op K (0 o, 1 gate+up, 2 down) of layer slot l, its first item in flight in g; tn >= 0: the warp's
// next tile is tile tn of the same op and layer, whose first item this tile's last item refills (else the caller
// loads the next task's first item). inv: gate+up's cached factor (inv_l: the layer slot it is for).
template <bool INT4, int K>
__device__ __forceinline__ void flow_tile(const FlowCtx& c, int l, int t, int tn, Regs& g, float& inv, int& inv_l,
                                          uint64_t& waited) {
    constexpr int R = (K == 1 && INT4) ? 4 : 2, U = kSlots / R;
    constexpr bool I16 = INT4 && K == 1;
    const int H = c.a.hidden, F = c.a.inter, lane = c.lane, cpg = c.cpg, uc = unit_cols(INT4);
    const PersistLayerDev& L = c.layers[c.first + l];
    const Op op = op_of<INT4>(L, K, K == 1 ? 2 * F : H, K == 2 ? F : H, cpg);
    const uint4* xs = K == 0 ? c.xs0() : K == 1 ? c.xs1() : c.xs2<INT4>();
    const int chunks = op.chunks, batches = batches_of<R, U>(op), sshift = cpg < 2 ? cpg : 2;
    Rows<INT4, R> src;
    src.point(op, t);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int b = 0; b < batches; ++b) {
        const bool last = b + 1 == batches;
        const int bn = last ? 0 : b + 1;
        const bool more = !last || tn >= 0;
        if (last && tn >= 0) src.point(op, tn);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int q = b * U + u;
            const int cc = lane + 32 * q, cn = lane + 32 * (bn * U + u);
            if (K != 0 && q * 32 < chunks) waited += flow_unit<INT4, K>(c, q, l);
            if (cc < chunks) {
                if constexpr (INT4) {
                    uint4 xr[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j) xr[j] = xs[j * chunks + cc];
                    if constexpr (I16) {
                        const float2 xcc = c.xc1()[cc];
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            acc[r] = chunk_dot_i16(g.q[u * R + r], g.s[u * R + r], g.z[u * R + r], xr, xcc, acc[r]);
                    } else {
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            acc[r] = chunk_dot(g.q[u * R + r], g.s[u * R + r], g.z[u * R + r], xr, acc[r]);
                    }
                } else {
                    const uint4 xr = xs[cc];
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r] += dot8(g.q[u * R + r], xr);
                }
            }
            const bool in_next = more && cn < chunks;
            const int slot_next = INT4 ? (in_next ? int4_chunk_slot(cn, chunks, sshift) : 0) : cn;
#pragma unroll
            for (int r = 0; r < R; ++r)
                src.load(r, cn, slot_next, cpg, in_next, g.q[u * R + r], g.s[u * R + r], g.z[u * R + r]);
            if constexpr (I16) __syncwarp();
        }
    }
    float sum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sum[r] = warp_sum(acc[r]);
    int* li = c.layer_ints(l);
    if constexpr (K == 1) {
        if (inv_l != l) {
            inv = flow_inv(c, l, waited);
            inv_l = l;
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r += 2)
                c.a.act[(t * R + r) >> 1] = __float2half_rn(epi_silu_mul(sum[r] * inv, sum[r + 1] * inv));
            __threadfence();
            atomicAdd(li + kMaxUnits + (t * c.s().rpt1) / uc, 1);
        }
        return;
    } else {
        const int row0 = t * R, q = row0 / uc;
        if (K == 0 && l > 0 && lane == 0)  // x[rows] of the previous layer's down
            waited += lane0_wait(c.layer_ints(l - 1) + 2 * kMaxUnits + q, tiles_in_unit(q, 2, c.s().td, uc), c.a.error,
                                 wait_code(l, 0));
        int old = 0;
        if (lane == 0) {
            const float* gv = K == 0 ? L.g_mlp : L.g_next;
            float sq = 0.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int row = row0 + r;
                const float v = __ldcg(c.a.x + row) + sum[r];
                __stcg(c.a.x + row, v);
                c.a.xg[row] = __float2half_rn(v * __ldg(gv + row));
                sq += v * v;
            }
            __stcg(c.a.partials + (K == 0 ? 0 : c.s().to + kMaxUnits) + t, sq);  // o: [to], down: past the units
            __threadfence();
            old = atomicAdd(li + (K == 0 ? 0 : 2 * kMaxUnits) + q, 1);
        }
        if constexpr (K == 0) {  // the tile that completes an o unit sums the unit's squares
            old = __shfl_sync(0xffffffffu, old, 0);
            const int n = tiles_in_unit(q, 2, c.s().to, uc), t0 = q * uc / 2;
            if (old == n - 1) {
                __threadfence();
                float v = 0.0f;
                for (int i = lane; i < n; i += 32) v += __ldcg(c.a.partials + t0 + i);
                v = warp_sum(v);
                if (lane == 0) {
                    __stcg(c.a.partials + c.s().to + q, v);
                    __threadfence();
                    atomicAdd(li + 3 * kMaxUnits, 1);
                }
            }
        }
    }
}

// Task n of the launch: layer slot, op, tile.
struct Task {
    int l, k, t;
};
__device__ __forceinline__ Task task_of(const FlowShape& s, int n) {
    Task r;
    r.l = n / s.per_layer;
    int i = n - r.l * s.per_layer;
    if (i < s.to) return r.k = 0, r.t = i, r;
    i -= s.to;
    if (i < s.tg) return r.k = 1, r.t = i, r;
    return r.k = 2, r.t = i - s.tg, r;
}

template <bool INT4>
__device__ __forceinline__ void load_task(const FlowCtx& c, const Task& tk, Regs& g) {
    const PersistLayerDev& L = c.layers[c.first + tk.l];
    const int H = c.a.hidden, F = c.a.inter;
    if (tk.k == 0) load_first<INT4, 2, 4>(op_of<INT4>(L, 0, H, H, c.cpg), c.cpg, tk.t, c.lane, g);
    else if (tk.k == 1)
        load_first<INT4, INT4 ? 4 : 2, INT4 ? 2 : 4>(op_of<INT4>(L, 1, 2 * F, H, c.cpg), c.cpg, tk.t, c.lane, g);
    else load_first<INT4, 2, 4>(op_of<INT4>(L, 2, H, F, c.cpg), c.cpg, tk.t, c.lane, g);
}

template <bool INT4, bool TRACE>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    flow_tail_kernel(const PersistLayerDev* __restrict__ layers, int first, int count, PersistArgs a, int cpg) {
    __shared__ int last_out;
    const int H = a.hidden;
    const FlowCtx c{layers, a, first, cpg, static_cast<int>(threadIdx.x & 31), INT4};
    const int gw = blockIdx.x * kW + (threadIdx.x >> 5), gws = gridDim.x * kW;
    const int total = count * c.s().per_layer;
    for (int i = threadIdx.x; i < 2 * kMaxUnits; i += kThreads) flow_st_claim[i] = 0, flow_st_done[i] = 0;

    Regs g;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) g.q[k] = make_uint4(0, 0, 0, 0), g.s[k] = 0, g.z[k] = 0;
    int cur = gw, nxt = gw + gws;
    if (cur < total) load_task<INT4>(c, task_of(c.s(), cur), g);
    pdl_trigger();
    pdl_wait();
    copy_input<INT4>(c.xs0(), a.att, H);
    __syncthreads();

    float inv = 0.0f;
    int inv_l = -1;
    int* claim = a.counters;
    while (cur < total) {
        int cl = 0;
        if (c.lane == 0) cl = atomicAdd(claim, 1);  // the task after nxt; used at the next iteration's end
        uint64_t t_start = 0, waited = 0;
        if constexpr (TRACE) t_start = globaltimer();
        const Task tk = task_of(c.s(), cur);
        Task tn{-1, -1, -1};
        if (nxt < total) tn = task_of(c.s(), nxt);
        // late_regs: no refill across tiles, the next task's first item is loaded after the tile's signal (so that
        // lane 0's fence does not wait for those loads); else the same op's next tile is refilled by the last item.
        const int same = (!a.late_regs && tn.l == tk.l && tn.k == tk.k) ? tn.t : -1;
        if (tk.k == 0) flow_tile<INT4, 0>(c, tk.l, tk.t, same, g, inv, inv_l, waited);
        else if (tk.k == 1) flow_tile<INT4, 1>(c, tk.l, tk.t, same, g, inv, inv_l, waited);
        else flow_tile<INT4, 2>(c, tk.l, tk.t, same, g, inv, inv_l, waited);
        if (nxt < total && same < 0) load_task<INT4>(c, tn, g);
        if constexpr (TRACE) {
            if (c.lane == 0 && first + tk.l < a.trace_layers) {
                const int per = c.s().per_layer;
                uint64_t* tr = a.trace + (static_cast<size_t>(first + tk.l) * per + (cur - tk.l * per)) * 3;
                tr[0] = t_start;
                tr[1] = globaltimer();
                tr[2] = waited;
            }
        }
        cur = nxt;
        nxt = 2 * gws + __shfl_sync(0xffffffffu, cl, 0);
    }

    // The last block out zeroes the counters for the next launch (which reads them only after this grid completes).
    __syncthreads();
    if (threadIdx.x == 0) last_out = atomicAdd(a.counters + 1, 1) == static_cast<int>(gridDim.x) - 1;
    __syncthreads();
    if (last_out) {
        const int n = kFlowHead + count * kFlowLayerInts;
        for (int i = threadIdx.x; i < n; i += kThreads) a.counters[i] = 0;
        __threadfence();
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

using TailKernel = void (*)(const PersistLayerDev*, int, int, PersistArgs, int, int);
template <int N>
TailKernel form_at() {
    return persist_tail_kernel<(N & 8) != 0, (N & 4) != 0, (N & 2) != 0, (N & 1) != 0>;
}
// Form index: 8 int4 + 4 traced + 2 run-ahead + 1 late registers.
constexpr int kForms = 16;
int form_of(bool int4, bool trace, bool ahead, bool late) {
    return (int4 ? 8 : 0) + (trace ? 4 : 0) + (ahead ? 2 : 0) + (late ? 1 : 0);
}
TailKernel kernel_of(int form) {
    static const TailKernel table[kForms] = {form_at<0>(),  form_at<1>(),  form_at<2>(),  form_at<3>(),
                                             form_at<4>(),  form_at<5>(),  form_at<6>(),  form_at<7>(),
                                             form_at<8>(),  form_at<9>(),  form_at<10>(), form_at<11>(),
                                             form_at<12>(), form_at<13>(), form_at<14>(), form_at<15>()};
    return table[form];
}

int per_sm_of(int form, int hidden, int inter) {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of(form), kThreads,
                                                             persist_smem((form & 8) != 0, hidden, inter)));
    return per_sm;
}

// The grid of every form (the traced and run-ahead ones must fit as many blocks per SM as the plain one).
template <bool INT4>
int blocks_for(int hidden, int inter) {
    const int base = form_of(INT4, false, false, false);
    const int per_sm = per_sm_of(base, hidden, inter);
    QUEST_REQUIRE(per_sm >= 1, "persist_blocks: the kernel does not fit on an SM");
    const int use = per_sm < kBlocksPerSm ? per_sm : kBlocksPerSm;
    for (int f = base + 1; f < base + 8; ++f)
        QUEST_REQUIRE(per_sm_of(f, hidden, inter) >= use,
                      "persist_blocks: a traced / run-ahead / late form fits fewer blocks per SM than the plain one");
    return sm_count() * use;
}

using FlowKernel = void (*)(const PersistLayerDev*, int, int, PersistArgs, int);
FlowKernel flow_kernel_of(bool int4, bool trace) {
    static const FlowKernel table[4] = {flow_tail_kernel<false, false>, flow_tail_kernel<false, true>,
                                        flow_tail_kernel<true, false>, flow_tail_kernel<true, true>};
    return table[(int4 ? 2 : 0) + (trace ? 1 : 0)];
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
    QUEST_REQUIRE(a.ahead >= 0 && a.ahead <= 64, "persist_layer_tails: ahead must be in [0, 64]");
    QUEST_REQUIRE(!a.trace || first + count <= a.trace_layers, "persist_layer_tails: trace_layers < first + count");
    const int xs_units = static_cast<int>(xs_units_of(a.hidden, a.inter));
    launch_pdl(kernel_of(form_of(int4, a.trace != nullptr, a.ahead > 0, a.late_regs)), dim3(G), dim3(kThreads), smem,
               stream, layers, first, count, a, cpg, xs_units);
}

std::string persist_kernel_info(bool int4, int hidden, int inter) {
    // Registers and local bytes of the forms (form_of order: traced, run-ahead, late registers).
    const int base = form_of(int4, false, false, false);
    std::string r = std::to_string(per_sm_of(base, hidden, inter)) + " blocks of " + std::to_string(kThreads) +
                    " threads fit per SM, " + std::to_string(persist_smem(int4, hidden, inter)) +
                    " B dynamic shared memory; registers / B local of the forms plain, L(ate), A(head), AL, T(raced), "
                    "TL, TA, TAL:";
    for (int f = base; f < base + 8; ++f) {
        cudaFuncAttributes fa{};
        CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel_of(f)));
        r += " " + std::to_string(fa.numRegs) + "/" + std::to_string(fa.localSizeBytes);
    }
    return r;
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


size_t persist_flow_smem(bool int4, int hidden, int inter) {
    return (static_cast<size_t>(hidden) / 4 + (int4 ? hidden / 64 : 0) + inter / 8) * 16;
}
size_t persist_flow_counter_ints(int count) { return kFlowHead + static_cast<size_t>(count) * kFlowLayerInts; }
size_t persist_flow_partial_floats(int hidden) { return static_cast<size_t>(hidden) + kMaxUnits; }
int persist_flow_tasks(bool int4, int hidden, int inter) { return flow_shape(int4, hidden, inter).per_layer; }

void persist_flow_tails(bool int4, const PersistLayerDev* layers, int first, int count, const PersistArgs& a,
                        cudaStream_t stream) {
    QUEST_REQUIRE(layers && first >= 0 && count >= 1, "persist_flow_tails: bad layer range");
    QUEST_REQUIRE(a.att && a.x && a.xg && a.act && a.partials && a.counters && a.error,
                  "persist_flow_tails: missing buffers");
    const int uc = unit_cols(int4);
    QUEST_REQUIRE(a.hidden > 0 && a.hidden % uc == 0 && a.inter > 0 && a.inter % 32 == 0,
                  "persist_flow_tails: hidden must be a multiple of 1024 (int4) / 256 (FP16), inter of 32");
    const FlowShape fs = flow_shape(int4, a.hidden, a.inter);
    QUEST_REQUIRE(fs.uo <= kMaxUnits && fs.ua <= kMaxUnits, "persist_flow_tails: more than kMaxUnits units per op");
    QUEST_REQUIRE(static_cast<int64_t>(count) * fs.per_layer + 4 * 2048 * kW < (int64_t(1) << 31),
                  "persist_flow_tails: too many tasks for the int claim counter");
    QUEST_REQUIRE(is_aligned(a.att, 16) && is_aligned(a.xg, 16) && is_aligned(a.act, 16),
                  "persist_flow_tails: att, xg and act must be 16-byte aligned");
    int cpg = 0;
    if (int4) {
        QUEST_REQUIRE(a.group >= 32 && (a.group & (a.group - 1)) == 0 && a.hidden % a.group == 0 &&
                          a.inter % a.group == 0,
                      "persist_flow_tails: the group must be a power of two >= 32 dividing hidden and inter");
        while ((32 << cpg) < a.group) ++cpg;
    }
    const size_t smem = persist_flow_smem(int4, a.hidden, a.inter);
    QUEST_REQUIRE(smem + 2 * kMaxUnits * 8 + 256 <= 48 * 1024, "persist_flow_tails: x does not fit in 48 KB");
    const int G = persist_flow_blocks(int4, a.hidden, a.inter);
    QUEST_REQUIRE(static_cast<size_t>(a.partials_capacity) >= persist_flow_partial_floats(a.hidden),
                  "persist_flow_tails: partials_capacity < persist_flow_partial_floats(hidden)");
    QUEST_REQUIRE(static_cast<size_t>(a.counters_capacity) >= persist_flow_counter_ints(count),
                  "persist_flow_tails: counters_capacity < persist_flow_counter_ints(count)");
    QUEST_REQUIRE(!a.trace || first + count <= a.trace_layers, "persist_flow_tails: trace_layers < first + count");
    launch_pdl(flow_kernel_of(int4, a.trace != nullptr), dim3(G), dim3(kThreads), smem, stream, layers, first, count,
               a, cpg);
}

int persist_flow_blocks(bool int4, int hidden, int inter) {
    thread_local int cached[2] = {0, 0}, cached_h[2] = {0, 0}, cached_f[2] = {0, 0}, cached_dev[2] = {-1, -1};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const int k = int4 ? 1 : 0;
    if (cached[k] == 0 || cached_h[k] != hidden || cached_f[k] != inter || cached_dev[k] != dev) {
        const size_t smem = persist_flow_smem(int4, hidden, inter);
        int use = kBlocksPerSm;
        for (bool trace : {false, true}) {
            int per_sm = 0;
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, flow_kernel_of(int4, trace), kThreads,
                                                                     smem));
            QUEST_REQUIRE(per_sm >= 1, "persist_flow_blocks: the kernel does not fit on an SM");
            use = std::min(use, per_sm);
        }
        cached[k] = sm_count() * use;
        cached_h[k] = hidden;
        cached_f[k] = inter;
        cached_dev[k] = dev;
    }
    return cached[k];
}

std::string persist_flow_kernel_info(bool int4, int hidden, int inter) {
    std::string r;
    for (bool trace : {false, true}) {
        cudaFuncAttributes fa{};
        CUDA_CHECK(cudaFuncGetAttributes(&fa, flow_kernel_of(int4, trace)));
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, flow_kernel_of(int4, trace), kThreads,
                                                                 persist_flow_smem(int4, hidden, inter)));
        r += std::string(trace ? ", traced " : "plain ") + std::to_string(fa.numRegs) + " registers / " +
             std::to_string(fa.localSizeBytes) + " B local, " + std::to_string(per_sm) + " blocks per SM";
    }
    return r + ", " + std::to_string(persist_flow_smem(int4, hidden, inter)) + " B dynamic shared memory";
}

}  // namespace quest::bench
