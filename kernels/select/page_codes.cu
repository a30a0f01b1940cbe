// Quantized page bounds on the GPU: the quantizer (prefill chunks; the decode step's completed page inside the
// scoring launch) and the Quest scoring kernel that reads the codes. API: kernels/select/page_codes.cuh; layout and
// arithmetic shared with the CPU reference: kernels/select/page_codes.h.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/select/page_codes.cuh"
#include "kernels/common/device_utils.cuh"

namespace quest {

namespace {

constexpr int kThreads = 128;  // 4 warps per block; the unit of work is one warp
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroupTile = 8;  // query heads scored per pass over a KV head's codes

bool pow2_head_dim(int d) { return d == 8 || d == 16 || d == 32 || d == 64 || d == 128 || d == 256; }

// A 16-byte load through L2 that does not allocate in L1 (each code byte is read once per pass). A plain coherent
// load, not the non-coherent path: the same launch writes the codes of the page the current token completed (other
// bytes of the lines read here).
__device__ __forceinline__ uint4 load_codes(const uint8_t* p) {
    uint4 r;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}


// ---------------------------------------------------------------------------------------------------------------------
// Quantization: one warp per (KV head, page). Lane j < D / C takes piece j (C channels): 16-byte loads of its
// channels' fp16 kmin and kmax, the page's largest magnitude reduced over the warp (max: exact, any order), the scale
// and the codes by the shared rule (codes::code_scale / code_floor / code_ceil, bit-identical to
// quantize_page_codes_ref), one 16-byte store of the piece; lane 0 stores the scale. Every lane of the warp must call
// it (shuffles).
// ---------------------------------------------------------------------------------------------------------------------
template <bool INT4>
__device__ __forceinline__ void quantize_page_warp(uint8_t* codes_out, float* scales_out, const __half* kmin, const __half* kmax,
                                   int D, int max_pages, int padded, int h, int p, int lane) {
    constexpr int C = codes::code_piece_channels(INT4);
    constexpr int V = C / 8;  // 16-byte loads per piece and array
    constexpr int qmax = codes::code_max(INT4);
    const int np = D / C;
    const bool mine = lane < np;
    const size_t m0 = (static_cast<size_t>(h) * max_pages + p) * D + static_cast<size_t>(mine ? lane : 0) * C;
    uint4 rmn[V], rmx[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
        rmn[v] = make_uint4(0u, 0u, 0u, 0u);
        rmx[v] = make_uint4(0u, 0u, 0u, 0u);
        if (mine) {
            rmn[v] = *reinterpret_cast<const uint4*>(kmin + m0 + 8 * v);
            rmx[v] = *reinterpret_cast<const uint4*>(kmax + m0 + 8 * v);
        }
    }
    float amax = 0.0f;
#pragma unroll
    for (int v = 0; v < V; ++v) {
        float a[8], b[8];
        half8_to_float(rmn[v], a);
        half8_to_float(rmx[v], b);
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fmaxf(fabsf(a[e]), fabsf(b[e])));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = codes::code_scale(amax, qmax);
    if (mine) {
        uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int v = 0; v < V; ++v) {
            float a[8], b[8];
            half8_to_float(rmn[v], a);
            half8_to_float(rmx[v], b);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                codes::piece_set(w, 8 * v + e, false, INT4, codes::code_floor(a[e], scale, qmax));
                codes::piece_set(w, 8 * v + e, true, INT4, codes::code_ceil(b[e], scale, qmax));
            }
        }
        *reinterpret_cast<uint4*>(codes_out + codes::code_piece_offset(h, p, lane, np, padded)) =
            make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (lane == 0) scales_out[static_cast<size_t>(h) * padded + p] = scale;
}

// Prefill: warps over the (KV head, page) pairs of pages [first_page, first_page + npages), the complete ones only.
template <bool INT4>
__global__ void __launch_bounds__(kThreads) quantize_pages_kernel(uint8_t* codes_out, float* scales_out,
                                                                  const __half* kmin, const __half* kmax, int D,
                                                                  int max_pages, int padded, int num_kv_heads,
                                                                  int first_page, int npages, int len, int page_size) {
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * kThreads + threadIdx.x) >> 5, W = (gridDim.x * kThreads) >> 5;
    const int pairs = num_kv_heads * npages;
    for (int i = gw; i < pairs; i += W) {  // warp-uniform
        const int h = i / npages, p = first_page + i % npages;
        if (static_cast<long long>(p + 1) * page_size <= len)
            quantize_page_warp<INT4>(codes_out, scales_out, kmin, kmax, D, max_pages, padded, h, p, lane);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Scoring.
//
// Work item = one warp x one tile of 32 consecutive candidate pages of one KV head: lane l scores page 32 t + l. With
// the tiled layout, the warp's load of piece j is 512 contiguous bytes (16 per lane, a whole page row piece per
// lane), so the loads are coalesced AND each thread holds its own page's channels in channel order: it sums them
// sequentially like the reference (no shared-memory transpose, no block barrier). A thread loads U = min(D / C, 8)
// pieces (128 bytes) at once, so a warp has 4 KB in flight; with 16-24 warps resident per SM (MIN_BLOCKS blocks of
// 4 warps at 72-128 registers) that is 64-96 KB per SM, above the ~30-40 KB that hide the DRAM latency at full
// bandwidth (4.8 TB/s x ~1 us over 132 SMs). Persistent grid (at most the resident blocks, sized by
// the capacity, so it can be captured once): warp w takes items w, w + W, ... of the current length (items ordered by
// KV head then tile: consecutive warps read consecutive memory); nothing waits on another warp.
//
// Per channel and query head: the code is chosen by the sign of q on the packed words (one LOP3 per 4 int8 / 8 int4
// codes: max where q >= 0, min otherwise, which is max(q cmin, q cmax) for every q), turned into a float exactly by a
// byte permute and an add (code_byte), and accumulated with one FMA: q is fp16, so q * c is exact in fp32 and the FMA
// rounds like the reference's `u += max(...)` (codes::code_term). Then score = u * scale (one rounding, __fmul_rn:
// never contracted with the aggregation's add). The group's query heads (up to 8 per pass; larger groups take
// several passes over the codes) read q and the select masks from the warp's slot of shared memory (broadcast).
// ---------------------------------------------------------------------------------------------------------------------
template <int D, int GT, bool INT4>
struct CodeCfg {
    static constexpr int C = codes::code_piece_channels(INT4);  // channels per piece
    static constexpr int NP = D / C;                             // pieces per page
    static constexpr int U = NP < 8 ? NP : 8;                    // pieces loaded at once per thread
    // Resident blocks the register allocation must allow (a cap of 80 / 128 registers): without a minimum, ptxas
    // (CUDA 13) kept ~56 registers and spilled loop invariants of the item loop to local memory.
    static constexpr int MIN_BLOCKS = GT >= 2 ? 4 : 6;
    static_assert(NP >= 1 && NP % U == 0, "head_dim");
};

template <int D, int GT, bool INT4>
__global__ void __launch_bounds__(kThreads, (CodeCfg<D, GT, INT4>::MIN_BLOCKS)) code_scores_kernel(
    float* __restrict__ scores, const __half* __restrict__ q, uint8_t* codes, float* code_scales,
    const __half* __restrict__ kmin, const __half* __restrict__ kmax, const int* __restrict__ d_pos, int num_heads,
    int num_kv_heads, int max_pages, int page_size_log2, int page_budget, int per_head, int kv_sum, int window) {
    using Cfg = CodeCfg<D, GT, INT4>;
    constexpr int C = Cfg::C, NP = Cfg::NP, U = Cfg::U;
    __shared__ __align__(16) float s_q[kWarps][GT * D];       // the head batch's q, fp32
    __shared__ __align__(16) uint2 s_mask[kWarps][GT * NP];   // per head and piece: the select masks of its 2 words

    pdl_wait();  // q, the position and the metadata come from the kernels before this one
    pdl_trigger();  // dependents may be scheduled now (they pdl_wait for this grid to complete)
    const int len = *d_pos + 1;
    const int S = 1 << page_size_log2;
    const int P = (len + S - 1) >> page_size_log2;
    if (len < 1 || P > max_pages) return;  // outside the cache: write nothing
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = blockIdx.x * kWarps + warp, W = gridDim.x * kWarps;
    const int padded = codes::code_padded_pages(max_pages);

    // The decode step's quantization, first (then nothing but the scoring loop's own values stays live across it):
    // the current token completed page P - 1, which this step does not score (the next one does). The last warps
    // of the grid take it, one KV head each: they have the fewest items (warp w takes items w, w + W, ...).
    if ((len & (S - 1)) == 0) {
        for (int h = W - 1 - gw; h < num_kv_heads; h += W)  // warp-uniform
            quantize_page_warp<INT4>(codes, code_scales, kmin, kmax, D, max_pages, padded, h, P - 1, lane);
    }

    // A sliding window: the candidates are the complete pages from f (holding the window's first token) on, page
    // f + p scored into entry p of the rows (kernels/select/quest.cuh).
    const int f = window_start_of(len, window) >> page_size_log2;
    if (P - f > page_budget) {  // a selecting step: score the complete pages f .. P-2
        const int n = P - f - 1;
        const int G = num_heads / num_kv_heads;
        const int tph = (n + codes::kCodeTile - 1) / codes::kCodeTile;  // tiles per KV head
        const int items = tph * num_kv_heads;
        float* sq = s_q[warp];
        uint2* smask = s_mask[warp];
        int staged = -1;  // the (KV head, head batch) whose q sits in the slot
#pragma unroll 1
        for (int it = gw; it < items; it += W) {  // warp-uniform
            const int kvh = it / tph, tile = it % tph;
            const int p = tile * codes::kCodeTile + lane;
            const bool valid = p < n;
            // Page f + p's pieces: with f = 0 a warp reads its tile's 512 contiguous bytes per piece; with a
            // window the lanes may straddle two tiles.
            const uint8_t* base = codes + codes::code_piece_offset(kvh, f + (valid ? p : 0), 0, NP, padded);
            const float scale = valid ? code_scales[static_cast<size_t>(kvh) * padded + f + p] : 0.0f;
            float agg = 0.0f;
#pragma unroll 1
            for (int gb = 0; gb < G; gb += GT) {
                const int ng = min(GT, G - gb), h0 = kvh * G + gb;
                if (staged != h0) {  // stage q (fp32) and the select masks of heads h0 .. h0 + ng - 1
                    __syncwarp();    // the slot's previous readers are done
                    for (int i = lane; i < GT * D / 2; i += 32) {
                        const int g = i / (D / 2), c2 = i % (D / 2);
                        float2 f = make_float2(0.0f, 0.0f);
                        if (g < ng)
                            f = __half22float2(
                                *reinterpret_cast<const __half2*>(q + static_cast<size_t>(h0 + g) * D + 2 * c2));
                        sq[g * D + 2 * c2] = f.x;
                        sq[g * D + 2 * c2 + 1] = f.y;
                    }
                    constexpr int CW = C / 2;  // channels per word
                    for (int i = lane; i < GT * NP * 2; i += 32) {
                        const int g = i / (NP * 2), j = (i / 2) % NP, hw = i % 2;
                        uint32_t m = 0u;
                        if (g < ng) {
                            const __half* qh = q + static_cast<size_t>(h0 + g) * D + j * C + hw * CW;
                            float qw[CW];
#pragma unroll
                            for (int k = 0; k < CW; ++k) qw[k] = __half2float(qh[k]);
                            m = codes::piece_mask_word<INT4>(qw);
                        }
                        reinterpret_cast<uint32_t*>(smask)[i] = m;  // [g][j][hw]
                    }
                    __syncwarp();
                    staged = h0;
                }
                float acc[GT];
#pragma unroll
                for (int g = 0; g < GT; ++g) acc[g] = 0.0f;
                if (valid) {
#pragma unroll 1
                    for (int j0 = 0; j0 < NP; j0 += U) {
                        uint4 r[U];
#pragma unroll
                        for (int u = 0; u < U; ++u)
                            r[u] = load_codes(base + static_cast<size_t>(j0 + u) * (codes::kCodeTile * codes::kCodePieceBytes));
#pragma unroll
                        for (int u = 0; u < U; ++u) {
                            const int j = j0 + u;
#pragma unroll
                            for (int g = 0; g < GT; ++g) {
                                const uint2 mk = smask[g * NP + j];
                                const uint32_t w[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
                                float qv[C];  // the piece's channels of head g's q (broadcast 16-byte reads)
#pragma unroll
                                for (int v = 0; v < C / 4; ++v) {
                                    const float4 f = *reinterpret_cast<const float4*>(sq + g * D + j * C + 4 * v);
                                    qv[4 * v] = f.x;
                                    qv[4 * v + 1] = f.y;
                                    qv[4 * v + 2] = f.z;
                                    qv[4 * v + 3] = f.w;
                                }
                                const float a = codes::piece_fma<INT4>(w, mk.x, mk.y, qv, acc[g]);
                                acc[g] = a;
                            }
                        }
                    }
                    // Scores of this head batch: u * scale per head, then per-head rows or the group's aggregate.
#pragma unroll
                    for (int g = 0; g < GT; ++g) {
                        if (g < ng) {
                            const float sg = __fmul_rn(acc[g], scale);
                            if (per_head)
                                scores[static_cast<size_t>(h0 + g) * max_pages + p] = sg;
                            else
                                agg = (gb + g == 0) ? sg : (kv_sum ? __fadd_rn(agg, sg) : fmaxf(agg, sg));
                        }
                    }
                }
            }
            if (!per_head && valid) scores[static_cast<size_t>(kvh) * max_pages + p] = agg;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Host-side dispatch
// ---------------------------------------------------------------------------------------------------------------------
template <int D, int GT, bool INT4>
void launch_code_scores(float* scores, const __half* q, const KvLayerView& kv, const PageCodesView& c,
                        const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, cudaStream_t stream) {
    auto kernel = code_scores_kernel<D, GT, INT4>;
    static std::atomic<uint64_t> queried{0};  // devices whose occupancy was queried
    static std::atomic<int> per_sm{0};
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const uint64_t bit = dev < 64 ? (uint64_t{1} << dev) : 0;
    if (!bit || !(queried.load(std::memory_order_acquire) & bit)) {  // first launch on this device
        int b = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0));
        per_sm.store(std::max(b, 1), std::memory_order_relaxed);
        queried.fetch_or(bit, std::memory_order_release);
    }
    // Items at the capacity (tiles of the complete pages of every KV head); at least one block, and at least
    // ceil(num_kv_heads / kWarps) blocks: one warp per KV head quantizes the page a token completes.
    const long long tiles = static_cast<long long>(codes::code_padded_pages(std::max(kv.max_pages - 1, 1))) /
                            codes::kCodeTile;
    const long long max_items = tiles * kv.num_kv_heads;
    const long long need = std::max<long long>((max_items + kWarps - 1) / kWarps, (kv.num_kv_heads + kWarps - 1) / kWarps);
    const long long resident = static_cast<long long>(sm_count()) * per_sm.load(std::memory_order_relaxed);
    const int grid = static_cast<int>(std::max<long long>(1, std::min(need, resident)));
    launch_pdl(kernel, dim3(grid), dim3(kThreads), 0, stream, scores, q, c.codes, c.scales, kv.kmin, kv.kmax, d_pos,
               num_heads, kv.num_kv_heads, kv.max_pages, log2_exact(kv.page_size), page_budget,
               static_cast<int>(policy == GqaPolicy::PerHead), static_cast<int>(policy == GqaPolicy::KvSum),
               kv.window);
}

// Every head_dim and query-head tile (with_head_dim / with_group_tile, kernels/common/cuda_common.cuh); int4 codes need
// head_dim >= 16 (require_page_codes_supported refuses 8 before this).
template <bool INT4>
void launch_code_scores_any(float* scores, const __half* q, const KvLayerView& kv, const PageCodesView& c,
                            const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, cudaStream_t stream) {
    static_assert(kMaxGroupTile == 8, "with_group_tile's largest tile");
    with_head_dim(kv.head_dim, "quest_code_scores", [&](auto d) {
        constexpr int D = decltype(d)::value;
        if constexpr (INT4 && D < 16) {
            QUEST_REQUIRE(false, "quest_code_scores: int4 page codes need head_dim >= 16");
        } else {
            with_group_tile(num_heads / kv.num_kv_heads, [&](auto gt) {
                launch_code_scores<D, decltype(gt)::value, INT4>(scores, q, kv, c, d_pos, num_heads, page_budget,
                                                                 policy, stream);
            });
        }
    });
}

void require_views(const PageCodesView& c, const KvLayerView& kv) {
    require_page_codes_supported(c.format, c.head_dim);
    QUEST_REQUIRE(c.codes && c.scales && kv.kmin && kv.kmax, "null pointer");
    QUEST_REQUIRE(c.num_kv_heads == kv.num_kv_heads && c.head_dim == kv.head_dim && c.max_pages == kv.max_pages,
                  "the codes view must have the KV layer's shape");
    QUEST_REQUIRE(kv.page_size >= 1 && kv.page_size <= 256 && (kv.page_size & (kv.page_size - 1)) == 0,
                  "page_size must be a power of two in [1, 256]");
    QUEST_REQUIRE(kv.max_pages >= 1 && static_cast<long long>(kv.max_pages) * kv.page_size <= kv.capacity,
                  "max_pages * page_size must fit in capacity");
    QUEST_REQUIRE(is_aligned(c.codes, 16) && is_aligned(c.scales, 4) && is_aligned(kv.kmin, 16) &&
                      is_aligned(kv.kmax, 16),
                  "codes and metadata must be 16-byte aligned");
}

}  // namespace

size_t page_codes_bytes(MetadataFormat f, int num_kv_heads, int head_dim, int max_pages) {
    return static_cast<size_t>(num_kv_heads) * codes::code_padded_pages(max_pages) *
           codes::code_page_bytes(f == MetadataFormat::Int4, head_dim);
}

size_t page_code_scales_bytes(int num_kv_heads, int max_pages) {
    return static_cast<size_t>(num_kv_heads) * codes::code_padded_pages(max_pages) * sizeof(float);
}

void require_page_codes_supported(MetadataFormat f, int head_dim) {
    QUEST_REQUIRE(f == MetadataFormat::Int8 || f == MetadataFormat::Int4, "page codes are int8 or int4");
    QUEST_REQUIRE(pow2_head_dim(head_dim), "page codes need head_dim in {8, 16, 32, 64, 128, 256}");
    QUEST_REQUIRE(f != MetadataFormat::Int4 || head_dim >= 16, "int4 page codes need head_dim >= 16");
}

void page_codes_quantize(const PageCodesView& c, const KvLayerView& kv, int first_page, int last_page, int len,
                         cudaStream_t stream) {
    require_views(c, kv);
    QUEST_REQUIRE(first_page >= 0 && last_page < kv.max_pages && len <= kv.capacity, "page_codes_quantize: bad range");
    if (last_page < first_page) return;
    const int npages = last_page - first_page + 1;
    const long long pairs = static_cast<long long>(npages) * kv.num_kv_heads;
    const int grid = static_cast<int>(std::max<long long>(1, std::min<long long>((pairs + kWarps - 1) / kWarps, 4096)));
    if (c.int4())
        quantize_pages_kernel<true><<<grid, kThreads, 0, stream>>>(c.codes, c.scales, kv.kmin, kv.kmax, kv.head_dim,
                                                                   kv.max_pages, c.padded_pages(), kv.num_kv_heads,
                                                                   first_page, npages, len, kv.page_size);
    else
        quantize_pages_kernel<false><<<grid, kThreads, 0, stream>>>(c.codes, c.scales, kv.kmin, kv.kmax, kv.head_dim,
                                                                    kv.max_pages, c.padded_pages(), kv.num_kv_heads,
                                                                    first_page, npages, len, kv.page_size);
    CUDA_CHECK_LAUNCH();
}

void quest_code_scores(float* scores, const __half* q, const KvLayerView& kv, const PageCodesView& c,
                       const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, cudaStream_t stream) {
    require_views(c, kv);
    QUEST_REQUIRE(scores && q && d_pos, "null pointer");
    QUEST_REQUIRE(kv.num_kv_heads >= 1 && num_heads >= 1 && num_heads % kv.num_kv_heads == 0,
                  "num_heads must be a positive multiple of num_kv_heads");
    QUEST_REQUIRE(page_budget >= 1, "page_budget must be >= 1");
    QUEST_REQUIRE(is_aligned(q, 4), "q must be 4-byte aligned");
    if (c.int4())
        launch_code_scores_any<true>(scores, q, kv, c, d_pos, num_heads, page_budget, policy, stream);
    else
        launch_code_scores_any<false>(scores, q, kv, c, d_pos, num_heads, page_budget, policy, stream);
}

}  // namespace quest
