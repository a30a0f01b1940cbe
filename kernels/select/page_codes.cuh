#pragma once
// Quantized page bounds on the GPU (MetadataFormat::Int8 / Int4; issues 4 and 8): per layer, KV head and page, the
// codes of kmin (rounded down) and kmax (rounded up) and one fp32 scale, written once when the page is complete
// (its fp16 kmin/kmax final) and read by the Quest scoring kernel instead of the fp16 metadata (2 * D + 4 bytes per
// page for int8, D + 4 for int4, against 4 * D). The quantization rule, the score arithmetic and the layout are in
// kernels/select/page_codes.h, shared with the CPU reference (quantize_page_codes_ref, page_score_int8_ref in
// kernels/select/quest.h): the GPU's codes, scales and scores are bit-identical to the reference's on the same fp16
// kmin/kmax and q.
#include <cstddef>
#include <cstdint>

#include "kernels/common/cuda_common.cuh"
#include "kernels/select/page_codes.h"
#include "kernels/select/quest.h"
#include "kernels/common/rope.cuh"

namespace quest {

using codes::MatchedBudget;

// One layer's codes and scales (layout: kernels/select/page_codes.h). Allocated once for the capacity (page_codes_bytes,
// page_code_scales_bytes), 16-byte aligned.
struct PageCodesView {
    uint8_t* codes = nullptr;  // [num_kv_heads][padded_pages / 32][D / C pieces][32 pages][16 bytes]
    float* scales = nullptr;   // [num_kv_heads][padded_pages]
    MetadataFormat format = MetadataFormat::Int8;  // Int8 or Int4
    int num_kv_heads = 0;
    int head_dim = 0;   // 8..256, a power of two (>= 16 for Int4)
    int max_pages = 0;  // pages per KV head (as KvLayerView::max_pages); padded_pages rounds it up to 32
    int padded_pages() const { return codes::code_padded_pages(max_pages); }
    bool int4() const { return format == MetadataFormat::Int4; }
};

// Device bytes of one layer's codes / scales.
size_t page_codes_bytes(MetadataFormat f, int num_kv_heads, int head_dim, int max_pages);
size_t page_code_scales_bytes(int num_kv_heads, int max_pages);
// Throws std::invalid_argument naming the reason when the format / head_dim pair has no GPU codes (Fp16, head_dim
// not a power of two in [8, 256], Int4 with head_dim 8).
void require_page_codes_supported(MetadataFormat f, int head_dim);

// Writes the codes and scale of every COMPLETE page p in [first_page, last_page] ((p + 1) * S <= len) of every KV
// head from kv.kmin / kv.kmax (after a prefill chunk: call after page_metadata_rebuild). Pages not complete are left
// as they are. Host-side range: not for graph capture (the decode step quantizes inside quest_code_scores).
void page_codes_quantize(const PageCodesView& c, const KvLayerView& kv, int first_page, int last_page, int len,
                         cudaStream_t stream);

// The Quest page scores from the codes, as quest_page_scores (kernels/select/quest.cuh) does from the fp16 metadata: with
// len = *d_pos + 1 and P = ceil(len / S), when P > page_budget writes scores[r][p] (row stride kv.max_pages) for
// every complete page p < P - 1 of every selection row r, GQA-aggregated by the policy (KvMax: max over the group's
// heads, KvSum: their sum in head order, PerHead: one row per query head); nothing at p >= P - 1; a dense step
// (P <= page_budget) writes no scores. Each score is page_score_int8_ref of the page's codes for the head's q
// (bit-identical; KvSum adds the heads' scores in head order like quest_select_ref).
// Also, in the same launch, the decode step's quantization: when the current token completes its page
// (len % S == 0), writes that page's codes and scale (page P - 1: never scored at this step; the next step scores
// it). With a sliding window (kv.window) the candidates are the window's complete pages, page f + p scored into
// entry p (kernels/select/quest.cuh). Graph-safe: the launch depends on shapes and kv.max_pages only; nothing is
// allocated or synchronised.
// Reads each KV head's codes once per 8 query heads of its group, 16-byte loads, a warp reading 512 contiguous bytes.
void quest_code_scores(float* scores, const __half* q, const KvLayerView& kv, const PageCodesView& codes,
                       const int* d_pos, int num_heads, int page_budget, GqaPolicy policy, cudaStream_t stream);

}  // namespace quest
