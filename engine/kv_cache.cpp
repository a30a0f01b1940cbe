#include "engine/kv_cache.h"

#include <cstring>
#include <stdexcept>

#include "kernels/quest.h"

namespace quest {

KvCache::KvCache(const KvCacheShape& shape) : shape_(shape) {
    if (shape.num_layers < 1 || shape.num_kv_heads < 1 || shape.head_dim < 1 || shape.page_size < 1 ||
        shape.capacity < 1)
        throw std::invalid_argument("KvCache: invalid shape");
    shape_.capacity = shape.pages() * shape.page_size;
    const size_t tokens = static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads * shape_.capacity * shape_.head_dim;
    const size_t meta = static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads * shape_.pages() * shape_.head_dim;
    k_.assign(tokens, 0.0f);
    v_.assign(tokens, 0.0f);
    kmin_.assign(meta, 0.0f);
    kmax_.assign(meta, 0.0f);
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
    }
}

}  // namespace quest
