#include "kernels/linear/format.h"

namespace quest {

const char* linear_format_name(LinearFormat f) {
    switch (f) {
        case LinearFormat::F16: return "fp16";
        case LinearFormat::Int4: return "int4";
    }
    return "?";
}

std::string LinearStorage::describe() const {
    std::string s = linear_format_name(format);
    if (format == LinearFormat::Int4) s += " g" + std::to_string(group);
    return s;
}

bool linear_storage_holds(const LinearStorage& storage, int64_t, int64_t cols) {
    switch (storage.format) {
        case LinearFormat::F16: return true;
        case LinearFormat::Int4: return int4_quantizable(static_cast<int>(cols), storage.group);
    }
    return false;
}

LinearStorage choose_linear_storage(const WeightRequest& request, std::span<const LinearStorage> parts, int64_t rows,
                                    int64_t cols) {
    if (parts.empty() || (!request.stored && request.format == LinearFormat::F16)) return LinearStorage::f16();
    bool all_float = true, all_same = true;
    for (const LinearStorage& p : parts) {
        all_float = all_float && p.is_f16();
        all_same = all_same && p == parts[0];
    }
    if (!all_float) return all_same && linear_storage_holds(parts[0], rows, cols) ? parts[0] : LinearStorage::f16();
    if (!request.stored && linear_storage_holds(request.target(), rows, cols)) return request.target();
    return LinearStorage::f16();
}

HostLinear HostLinear::floats(std::vector<float> w, int64_t rows, int64_t cols) {
    HostLinear h;
    h.rows = rows;
    h.cols = cols;
    h.dtype = DType::F32;
    h.owned = std::move(w);
    return h;
}

HostLinear HostLinear::mapped(DType dtype, const void* bytes, int64_t rows, int64_t cols) {
    HostLinear h;
    h.rows = rows;
    h.cols = cols;
    h.dtype = dtype;
    h.mapped_bytes = bytes;
    return h;
}

HostLinear HostLinear::quantized(Int4Matrix m) {
    HostLinear h;
    h.storage = LinearStorage::int4(m.group);
    h.rows = m.rows;
    h.cols = m.cols;
    h.int4 = std::move(m);
    return h;
}

}  // namespace quest
