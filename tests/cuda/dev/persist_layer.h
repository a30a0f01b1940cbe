#pragma once
// Prototype for issue 27, stage 1 (quest_kernel_bench "persist"; not part of the engine): the tail of decode layers
// (o projection + residual -> RMSNorm -> gate+up + SwiGLU -> down + residual, batch 1) as ONE persistent kernel per
// launch of `count` layer tails, against the product's three fused-epilogue GEMV launches per tail. The design is in
// tests/cuda/dev/persist_layer.cu. Plain C++ (bench_persist.cpp includes it).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace quest::bench {

// One layer tail's immutable inputs, as the device reads them (an array of these lives in device memory).
// Matrices in the product's layouts: int4 "quest-int4" v1 with the device layout of kernels/linear/int4_layout.h
// (codes, fp16 scales, uint8 zero points), or FP16 row-major; gate+up with its rows interleaved (2i gate_i, 2i + 1
// up_i) as the product uploads it.
struct PersistLayerDev {
    const void* w[3] = {};           // o [H][H], gate+up [2F][H], down [H][F]: int4 codes (uint32) or fp16 weights
    const __half* scales[3] = {};    // int4: [rows][cols / group]; FP16: null
    const uint8_t* zeros[3] = {};    // int4: [rows][cols / group]; FP16: null
    const float* g_mlp = nullptr;    // [H] the post-attention RMSNorm's weight (o's residual epilogue writes x * g)
    const float* g_next = nullptr;   // [H] the next layer's input RMSNorm's weight (down's residual epilogue)
};

// The mutable state the tails share (one residual stream, as in the product's decode step).
struct PersistArgs {
    const __half* att = nullptr;   // [H] o's input (the attention output)
    float* x = nullptr;            // [H] fp32 residual stream, updated in place
    __half* xg = nullptr;          // [H] fp16(x * g): the next GEMV's un-normalised input (16-byte aligned)
    __half* act = nullptr;         // [F] fp16(silu(gate) * up): down's input (16-byte aligned)
    float* partials = nullptr;     // [2][persist_blocks()] per-block sums of x^2: o's, then down's
    int partials_capacity = 0;
    int* counters = nullptr;       // [persist_counter_ints(count)] zero before the first launch; each launch leaves
    int counters_capacity = 0;     //   them zero (its last block out resets them)
    int* error = nullptr;          // [1] 0; a dependency wait that times out writes a nonzero code (persist_error_text)
    int hidden = 0, inter = 0;     // H, F
    int group = 0;                 // int4 group size (power of two >= 32 dividing H and F)
    float eps = 0.0f;              // RMSNorm epsilon
    // Variants (round 2; the defaults are round 1's kernel):
    int ahead = 0;              // L2 run-ahead: each warp keeps its next `ahead` items (4 KB per warp each) of the
                                //   weight stream on their way to L2 (cp.async.bulk.prefetch), within an op and across
                                //   the op boundary (items 0 .. ahead of the next op before the wait); 0: none
    bool light_signal = false;  // an op's end: only thread 0 fences before its increment (the block barrier orders the
                                //   other threads' stores, as cooperative groups' grid sync); false: every thread
    bool late_regs = false;     // the next op's first item into registers after the block's increment (so that thread
                                //   0's fence does not wait for those loads); false: before it
    uint64_t* trace = nullptr;  // [2][trace_layers][kPersistEvents][persist_blocks()]: globaltimer, then clock64, of
    int trace_layers = 0;       //   thread 0 of each block at each PersistEvent of layer slot first + l; null: the
                                //   kernel without timestamps
};

// Timestamps of the traced kernel, per block and layer slot (thread 0). Per op k (0 o, 1 gate+up, 2 down), event
// 6 k + e: e = 0 FIRST (the op's first weight loads issued, registers or L2 prefetch: right after warp 0 finished the
// op before, except for a launch's first o; with late_regs and ahead 0 nothing is issued yet, the register loads
// follow the increment), 1 WAIT_IN (the wait on the op before, or griddepcontrol.wait, entered),
// 2 WAIT_OUT (left; for the counter waits the block barrier after it passed), 3 INPUT (the op's input in shared
// memory, block barrier passed), 4 DONE (every warp of the block finished op k: the block barrier before the
// increment; round 1's every-thread fence included), 5 SIGNALED (thread 0's fence and increment done). 18 START
// (kernel entry), 19 END (exit), in the slots of the launch's first / last layer.
constexpr int kPersistEvents = 20;
enum PersistEvent { kEvFirst = 0, kEvWaitIn, kEvWaitOut, kEvInput, kEvDone, kEvSignaled, kEvStart = 18, kEvEnd = 19 };

// Blocks of the persistent grid for the format: SMs x min(2, resident blocks per SM), so that every block is resident
// at once (the dependency waits need that); 8 warps each.
int persist_blocks(bool int4, int hidden, int inter);
size_t persist_counter_ints(int count);
// Dynamic shared memory per block (x of the widest op, plus the integer dot's form for int4).
size_t persist_smem(bool int4, int hidden, int inter);

// Layer tails first .. first + count - 1 of `layers` (a device array) in one launch, with programmatic dependent
// launch (the first o tiles' weights are loaded before the wait on the previous kernel). Requires the shapes above,
// 16-byte aligned matrices and vectors, and enough partials / counters. No allocation or synchronisation
// (graph-safe).
void persist_layer_tails(bool int4, const PersistLayerDev* layers, int first, int count, const PersistArgs& a,
                         cudaStream_t stream);

// Registers, spilled bytes and resident blocks per SM of the format's kernel, for the bench's header line.
std::string persist_kernel_info(bool int4, int hidden, int inter);

// What a nonzero error code says (op and layer of the wait that timed out).
std::string persist_error_text(int code);

// Round 3, the "flow" form (persist_layer.cu says how it works): no per-op grid barrier, dependencies per unit of
// 1024 (int4) / 256 (FP16) rows, tiles claimed from an atomic counter, the norm before gate+up deferred to its
// epilogue. Same arguments as persist_layer_tails; partials and counters sized by the functions below (a.ahead and
// a.light_signal unused; a.late_regs: the next task's first item loaded after each tile's signal; a.trace:
// [trace_layers][persist_flow_tasks()][3] of start ns, end ns, ns waited, per task, by globaltimer).
int persist_flow_blocks(bool int4, int hidden, int inter);
int persist_flow_tasks(bool int4, int hidden, int inter);  // tasks (tiles) per layer tail
size_t persist_flow_smem(bool int4, int hidden, int inter);
size_t persist_flow_counter_ints(int count);
size_t persist_flow_partial_floats(int hidden);
void persist_flow_tails(bool int4, const PersistLayerDev* layers, int first, int count, const PersistArgs& a,
                        cudaStream_t stream);
std::string persist_flow_kernel_info(bool int4, int hidden, int inter);

// Stand-in for the attention phase of a layer, during which DRAM is idle: `blocks` blocks of `threads` threads that
// wait on the previous kernel, let the next one be scheduled (pdl_trigger, as the sparse attention does right after its
// wait), then spin for `ns` nanoseconds without memory traffic; sink[block] gets the spin count.
void persist_standin(uint32_t* sink, int blocks, int threads, int64_t ns, cudaStream_t stream);

// The bench mode (tests/cuda/dev/bench_persist.cpp): prints one line per variant, appends JSON objects to `json`;
// returns false when a comparison failed or a kernel reported an error.
bool bench_persist(std::vector<std::string>& json);

}  // namespace quest::bench
