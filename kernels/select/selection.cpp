#include "kernels/select/selection.h"

#include "kernels/common/names.h"

namespace quest {

std::string_view gqa_policy_name(GqaPolicy p) {
    switch (p) {
        case GqaPolicy::KvMax: return "kv-max";
        case GqaPolicy::KvSum: return "kv-sum";
        case GqaPolicy::PerHead: return "per-head";
    }
    return "?";
}

bool gqa_policy_from_name(std::string_view s, GqaPolicy& out) {
    constexpr GqaPolicy kAll[] = {GqaPolicy::KvMax, GqaPolicy::KvSum, GqaPolicy::PerHead};
    return value_from_name(s, kAll, gqa_policy_name, out);
}

std::string_view metadata_format_name(MetadataFormat f) {
    return f == MetadataFormat::Int8 ? "int8" : f == MetadataFormat::Int4 ? "int4" : "fp16";
}

bool metadata_format_from_name(std::string_view name, MetadataFormat& out) {
    constexpr MetadataFormat kAll[] = {MetadataFormat::Fp16, MetadataFormat::Int8, MetadataFormat::Int4};
    return value_from_name(name, kAll, metadata_format_name, out);
}

int64_t page_metadata_bytes(MetadataFormat f, int head_dim) {
    if (f == MetadataFormat::Int8) return 2ll * head_dim + 4;
    if (f == MetadataFormat::Int4) return static_cast<int64_t>(head_dim) + 4;  // two 4-bit codes per channel
    return 2ll * head_dim * 2;
}

int64_t selection_bytes(const SelectionReads& r, int head_dim, MetadataFormat f) {
    const int64_t page = page_metadata_bytes(f, head_dim);
    return (r.pages_scored + r.shortlist_pages) * page + r.sub_pages_scored * 2ll * head_dim +
           r.keys_scanned * 2ll * head_dim + r.sketch_bytes + r.kv_tokens * 4ll * head_dim;
}

SelectionReads dense_reads(int len, int num_kv_heads) {
    SelectionReads r;
    r.kv_tokens = static_cast<int64_t>(len) * num_kv_heads;
    r.rows = num_kv_heads;
    r.dense = true;
    return r;
}

}  // namespace quest
