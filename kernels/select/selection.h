#pragma once
// The vocabulary of page selection shared by the settings, both backends and the selectors: which selector, which
// GQA policy, which metadata format, what one selection chose and read, and the bytes model over those reads.
// C++17 only: the CUDA units (nvcc, C++17) include this header through kernels/select/quest.h.
#include <cstdint>
#include <string_view>
#include <vector>

namespace quest {

// How one page set is chosen for the query heads that share a KV head (grouped-query attention).
enum class GqaPolicy {
    KvMax,    // one page set per KV head, pages ranked by the max of the group's scores
    KvSum,    // one page set per KV head, ranked by the sum of the group's scores (the engine's default)
    PerHead,  // every query head ranks and selects its own pages (the paper's MHA rule, applied per query head)
};
std::string_view gqa_policy_name(GqaPolicy p);
bool gqa_policy_from_name(std::string_view s, GqaPolicy& out);

// How the K-1 pages besides the last one are chosen at a selecting step.
// Built-in selectors; their definitions (what each reads and how it selects) are in kernels/select/registry.cpp,
// whose table lists them in this order. A selector registered at run time (register_page_selector) gets the next
// value.
enum class PageSelector : int {
    Quest,      // top-(K-1) complete pages by the upper bound U(p, q) (the paper; the default)
    Streaming,  // the first page and the K-2 most recent complete pages: StreamingLLM-like, query-independent
    Oracle,     // top-(K-1) complete pages by the true softmax mass (reads every key: an evaluation yardstick)
    TwoLevel,   // coarse page bounds pick a shortlist, sub-page bounds (uint8, rounded outward) re-rank it; the
                // selection is made of sub-pages (two_level_select_ref)
    Sparq,      // pages ranked by their best token's approximate logit on the query's largest channels, from an
                // fp8 channel-major key sketch; top-(K-1), or bytes-matched to fp16 Quest (kernels/select/sparq.h)
};

// Storage format of the page bounds a bound-based selector (quest, two-level's coarse level) reads.
enum class MetadataFormat {
    Fp16,  // kmin/kmax as stored (the keys' own precision: exact); 2 * head_dim values of 2 bytes per page
    Int8,  // int8 codes with one fp32 scale per page, kmin rounded down and kmax rounded up (still a true bound);
           // 2 * head_dim + 4 bytes per page (quantize_page_int8_ref)
    Int4,  // the same with 4-bit codes in [-8, 7]: head_dim + 4 bytes per page (quantize_page_codes_ref)
};
std::string_view metadata_format_name(MetadataFormat f);
bool metadata_format_from_name(std::string_view name, MetadataFormat& out);

// What one selecting step of one layer read, for the bytes model (selection_bytes). Counts are summed over the
// KV heads (metadata) and the selection rows (KV bytes).
struct SelectionReads {
    int64_t pages_scored = 0;      // page metadata entries read (coarse level), over KV heads
    int64_t shortlist_pages = 0;   // TwoLevel: pages re-read with their sub-page codes, over KV heads
    int64_t sub_pages_scored = 0;  // TwoLevel: sub-page metadata entries read, over KV heads
    int64_t keys_scanned = 0;      // Oracle: keys read to compute the true page mass, over KV heads
    int64_t sketch_bytes = 0;      // sparq: its own bytes (token sketches read, the append written), over KV heads
    int64_t kv_tokens = 0;         // tokens whose key and value are read, summed over the selection rows
    int rows = 0;                  // selection rows: KV heads (kv-max, kv-sum) or query heads (per-head)
    bool dense = false;            // true: a dense step (P <= K), every token read, no metadata
};

// The result of one selection: the blocks of block_size tokens each query head attends.
struct Selection {
    int block_size = 0;                    // tokens per block: page_size, or sub_page (TwoLevel)
    std::vector<std::vector<int>> blocks;  // [num_heads] ascending block ids; always covers the last page
    SelectionReads reads;
};

// THE bytes model (docs/quest.md, "Bytes per step"): the bytes one selecting step of one layer reads, with the KV
// cache in FP16 (2 bytes per value, as on the GPU):
//   pages_scored * page_metadata_bytes(format) + shortlist_pages * page_metadata_bytes(format)  [4d | 2d+4 | d+4]
//   + sub_pages_scored * 2 * head_dim (uint8 min and max) + keys_scanned * 2 * head_dim (the oracle's key pass)
//   + sketch_bytes (sparq's token sketches, counted by the selector) + kv_tokens * 4 * head_dim (key and value).
// A dense layer or step is kv_tokens = tokens * KV heads and nothing else.
int64_t page_metadata_bytes(MetadataFormat f, int head_dim);
int64_t selection_bytes(const SelectionReads& r, int head_dim, MetadataFormat f);
// The reads of a dense (full-attention) step over `len` tokens and `num_kv_heads` KV heads.
SelectionReads dense_reads(int len, int num_kv_heads);

}  // namespace quest
