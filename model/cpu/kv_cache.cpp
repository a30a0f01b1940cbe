#include "model/cpu/kv_cache.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/select/quest.h"

namespace quest {

KvCache::KvCache(const KvCacheShape& shape) : shape_(shape) {
    if (shape.num_layers < 1 || shape.num_kv_heads < 1 || shape.head_dim < 1 || shape.page_size < 1 ||
        shape.capacity < 1 ||
        (shape.sub_page && (shape.sub_page < 1 || shape.sub_page >= shape.page_size || shape.page_size % shape.sub_page)))
        throw std::invalid_argument("KvCache: invalid shape");
    shape_.capacity = shape.pages() * shape.page_size;
    const size_t tokens = static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads * shape_.capacity * shape_.head_dim;
    const size_t meta = static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads * shape_.pages() * shape_.head_dim;
    k_.assign(tokens, 0.0f);
    v_.assign(tokens, 0.0f);
    kmin_.assign(meta, 0.0f);
    kmax_.assign(meta, 0.0f);
    const size_t sub = static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads * shape_.sub_pages() * shape_.head_dim;
    sub_kmin_.assign(sub, 0.0f);
    sub_kmax_.assign(sub, 0.0f);
}

void KvCache::truncate(int len) {
    if (len < 0 || len > shape_.capacity) throw std::out_of_range("KvCache::truncate: length beyond the capacity");
    const int d = shape_.head_dim, first = len / shape_.page_size * shape_.page_size;
    if (first == len) return;  // the next write starts a page: it resets that page's metadata itself
    for (int l = 0; l < shape_.num_layers; ++l)
        for (int h = 0; h < shape_.num_kv_heads; ++h) {
            const int64_t m = meta_offset(l, h) + static_cast<int64_t>(len / shape_.page_size) * d;
            for (int t = first; t < len; ++t)
                page_metadata_update_ref(kmin_.data() + m, kmax_.data() + m,
                                         k_.data() + token_offset(l, h) + static_cast<int64_t>(t) * d, d, t == first);
            if (!shape_.sub_page) continue;
            const int sub_first = len / shape_.sub_page * shape_.sub_page;
            const int64_t sm = sub_offset(l, h) + static_cast<int64_t>(len / shape_.sub_page) * d;
            for (int t = sub_first; t < len; ++t)
                page_metadata_update_ref(sub_kmin_.data() + sm, sub_kmax_.data() + sm,
                                         k_.data() + token_offset(l, h) + static_cast<int64_t>(t) * d, d, t == sub_first);
        }
}

void KvCache::copy_tokens_from(const KvCache& src, int len) {
    const KvCacheShape& o = src.shape();
    if (o.num_layers != shape_.num_layers || o.num_kv_heads != shape_.num_kv_heads || o.head_dim != shape_.head_dim ||
        len < 0 || len > o.capacity || len > shape_.capacity)
        throw std::invalid_argument("KvCache::copy_tokens_from: shapes differ or the length exceeds a capacity");
    const int d = shape_.head_dim, nkv = shape_.num_kv_heads;
    std::vector<float> k(static_cast<size_t>(nkv) * d), v(k.size());
    for (int l = 0; l < shape_.num_layers; ++l)
        for (int t = 0; t < len; ++t) {
            for (int h = 0; h < nkv; ++h) {
                std::memcpy(&k[size_t(h) * d], src.keys(l, h) + static_cast<int64_t>(t) * d, sizeof(float) * d);
                std::memcpy(&v[size_t(h) * d], src.values(l, h) + static_cast<int64_t>(t) * d, sizeof(float) * d);
            }
            write(l, t, k.data(), v.data());
        }
}

void KvCache::write(int layer, int pos, const float* k, const float* v) {
    if (pos < 0 || pos >= shape_.capacity) throw std::out_of_range("KvCache::write: position beyond the capacity");
    const int d = shape_.head_dim;
    const int page = pos / shape_.page_size;
    const bool first = pos % shape_.page_size == 0;
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
        const int64_t t = token_offset(layer, h) + static_cast<int64_t>(pos) * d;
        std::memcpy(k_.data() + t, k + static_cast<int64_t>(h) * d, sizeof(float) * d);
        std::memcpy(v_.data() + t, v + static_cast<int64_t>(h) * d, sizeof(float) * d);
        const int64_t m = meta_offset(layer, h) + static_cast<int64_t>(page) * d;
        page_metadata_update_ref(kmin_.data() + m, kmax_.data() + m, k + static_cast<int64_t>(h) * d, d, first);
        if (shape_.sub_page) {
            const int64_t sm = sub_offset(layer, h) + static_cast<int64_t>(pos / shape_.sub_page) * d;
            page_metadata_update_ref(sub_kmin_.data() + sm, sub_kmax_.data() + sm, k + static_cast<int64_t>(h) * d, d,
                                     pos % shape_.sub_page == 0);
        }
    }
}

}  // namespace quest
