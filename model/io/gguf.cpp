#include "model/io/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>


#include "kernels/common/error.h"
#include "model/io/mapped_file.h"

namespace quest {

namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint64_t kMaxReserve = 4096;  // most elements reserved ahead of parsing them

// Indexed by type id; {nullptr, 0, 0} for ids ggml no longer knows. Block sizes and bytes as in ggml (and gguf-py's
// GGML_QUANT_SIZES).
constexpr GgmlTypeTraits kTraits[] = {
    {"F32", 1, 4},       {"F16", 1, 2},       {"Q4_0", 32, 18},   {"Q4_1", 32, 20},    {nullptr, 0, 0},
    {nullptr, 0, 0},     {"Q5_0", 32, 22},    {"Q5_1", 32, 24},   {"Q8_0", 32, 34},    {"Q8_1", 32, 40},
    {"Q2_K", 256, 84},   {"Q3_K", 256, 110},  {"Q4_K", 256, 144}, {"Q5_K", 256, 176},  {"Q6_K", 256, 210},
    {"Q8_K", 256, 292},  {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18},  {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82}, {"IQ4_XS", 256, 136}, {"I8", 1, 1},
    {"I16", 1, 2},       {"I32", 1, 4},       {"I64", 1, 8},      {"F64", 1, 8},       {"IQ1_M", 256, 56},
    {"BF16", 1, 2},      {nullptr, 0, 0},     {nullptr, 0, 0},    {nullptr, 0, 0},     {"TQ1_0", 256, 54},
    {"TQ2_0", 256, 66},  {nullptr, 0, 0},     {nullptr, 0, 0},    {nullptr, 0, 0},     {"MXFP4", 32, 17},
    {"NVFP4", 64, 36},   {"Q1_0", 128, 18},
};

// Size in bytes of a scalar of a numeric or bool type; 0 for String and Array.
size_t scalar_size(GgufType t) {
    switch (t) {
        case GgufType::UInt8: case GgufType::Int8: case GgufType::Bool: return 1;
        case GgufType::UInt16: case GgufType::Int16: return 2;
        case GgufType::UInt32: case GgufType::Int32: case GgufType::Float32: return 4;
        case GgufType::UInt64: case GgufType::Int64: case GgufType::Float64: return 8;
        case GgufType::String: case GgufType::Array: return 0;
    }
    return 0;
}

bool known_value_type(uint32_t id) { return id <= uint32_t(GgufType::Float64); }


// A bounds-checked little-endian cursor over the file's bytes. Every read names what it was reading when the file
// ends too early, so that a truncated file says where.
class Cursor {
public:
    Cursor(const std::byte* base, uint64_t size, const std::string& file) : base_(base), size_(size), file_(file) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }
    const std::string& file() const { return file_; }

    [[noreturn]] void truncated(const std::string& what, uint64_t need) const {
        throw InputError(file_ + ": file truncated: " + what + " needs " + std::to_string(need) + " bytes at offset " +
                         std::to_string(pos_) + " but the file is " + std::to_string(size_) + " bytes");
    }
    const std::byte* take(uint64_t n, const std::string& what) {
        if (n > left()) truncated(what, n);
        const std::byte* p = base_ + pos_;
        pos_ += n;
        return p;
    }
    uint64_t uint(int bytes, const std::string& what) {
        const auto* p = reinterpret_cast<const unsigned char*>(take(uint64_t(bytes), what));
        uint64_t v = 0;
        for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | p[k];
        return v;
    }
    uint32_t u32(const std::string& what) { return uint32_t(uint(4, what)); }
    uint64_t u64(const std::string& what) { return uint(8, what); }
    std::string string(const std::string& what) {
        const uint64_t n = u64(what + " length");
        if (n > left())
            throw InputError(file_ + ": " + what + " has length " + std::to_string(n) + " at offset " +
                             std::to_string(pos_ - 8) + ", beyond the end of the file (" + std::to_string(size_) +
                             " bytes)");
        const auto* p = reinterpret_cast<const char*>(take(n, what));
        return std::string(p, size_t(n));
    }

private:
    const std::byte* base_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& file_;
};

// A scalar of type t read from its little-endian bytes into the widened fields of v.
void decode_scalar(GgufType t, uint64_t bits, GgufValue& v) {
    v.type = t;
    switch (t) {
        case GgufType::UInt8: case GgufType::UInt16: case GgufType::UInt32: case GgufType::UInt64: v.u = bits; break;
        case GgufType::Bool: v.u = bits; break;
        case GgufType::Int8: v.i = int8_t(bits); break;
        case GgufType::Int16: v.i = int16_t(bits); break;
        case GgufType::Int32: v.i = int32_t(bits); break;
        case GgufType::Int64: v.i = int64_t(bits); break;
        case GgufType::Float32: {
            const auto b = uint32_t(bits);
            float f;
            std::memcpy(&f, &b, 4);
            v.f = f;
            break;
        }
        case GgufType::Float64: {
            double d;
            std::memcpy(&d, &bits, 8);
            v.f = d;
            break;
        }
        case GgufType::String: case GgufType::Array: break;
    }
}

// One value of type `type` (already read and known). `at` names the key in messages.
GgufValue read_value(Cursor& c, GgufType type, const std::string& at) {
    GgufValue v;
    v.type = type;
    if (type == GgufType::String) {
        v.s = c.string(at + " string value");
        return v;
    }
    if (type != GgufType::Array) {
        const size_t n = scalar_size(type);
        const uint64_t bits = c.uint(int(n), at + " " + std::string(gguf_type_name(type)) + " value");
        decode_scalar(type, bits, v);
        if (type == GgufType::Bool && bits > 1)
            throw InputError(c.file() + ": " + at + ": bool value " + std::to_string(bits) + " (expected 0 or 1)");
        return v;
    }
    const uint32_t elem = c.u32(at + " array element type");
    if (!known_value_type(elem))
        throw InputError(c.file() + ": " + at + ": unknown array element type " + std::to_string(elem) +
                         " (expected 0..12)");
    if (GgufType(elem) == GgufType::Array)
        throw InputError(c.file() + ": " + at + ": array of arrays (nested arrays are not supported)");
    GgufArray& a = v.array;
    a.type = GgufType(elem);
    a.count = c.u64(at + " array count");
    // Bound the count by the bytes left before allocating: a string takes at least its 8-byte length.
    const uint64_t min_elem = a.type == GgufType::String ? 8 : scalar_size(a.type);
    if (a.count > c.left() / min_elem)
        throw InputError(c.file() + ": " + at + ": array of " + std::to_string(a.count) + " " +
                         std::string(gguf_type_name(a.type)) + " elements needs at least " +
                         (a.count > std::numeric_limits<uint64_t>::max() / min_elem
                              ? std::string("more")
                              : std::to_string(a.count * min_elem)) +
                         " bytes but only " + std::to_string(c.left()) + " are left in the file");
    if (a.type == GgufType::String) {
        a.strings.reserve(size_t(std::min<uint64_t>(a.count, kMaxReserve)));
        for (uint64_t k = 0; k < a.count; ++k) a.strings.push_back(c.string(at + " array element " + std::to_string(k)));
    } else {
        const uint64_t n = a.count * min_elem;
        a.raw = {c.take(n, at + " array data"), size_t(n)};
        if (a.type == GgufType::Bool)
            for (std::byte b : a.raw)
                if (uint8_t(b) > 1)
                    throw InputError(c.file() + ": " + at + ": bool array element " + std::to_string(uint8_t(b)) +
                                     " (expected 0 or 1)");
    }
    return v;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
    switch (t) {
        case GgufType::UInt8: return "uint8";
        case GgufType::Int8: return "int8";
        case GgufType::UInt16: return "uint16";
        case GgufType::Int16: return "int16";
        case GgufType::UInt32: return "uint32";
        case GgufType::Int32: return "int32";
        case GgufType::Float32: return "float32";
        case GgufType::Bool: return "bool";
        case GgufType::String: return "string";
        case GgufType::Array: return "array";
        case GgufType::UInt64: return "uint64";
        case GgufType::Int64: return "int64";
        case GgufType::Float64: return "float64";
    }
    return "unknown type";
}

const GgmlTypeTraits* ggml_type_traits(uint32_t id) {
    if (id >= std::size(kTraits) || kTraits[id].name == nullptr) return nullptr;
    return &kTraits[id];
}

std::string ggml_type_name(GgmlType t) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
    return tr ? std::string(tr->name) : "type " + std::to_string(uint32_t(t));
}

// ---------------------------------------------------------------------------------------------------------------------
// GgufFile
// ---------------------------------------------------------------------------------------------------------------------

std::unique_ptr<GgufFile> GgufFile::open(const std::filesystem::path& path) {
    const std::string file = path.string();
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->name_ = file;
    f->map_.reset(map_file(path, "a GGUF file"));  // from here on `f` unmaps it on every error path
    f->base_ = static_cast<const std::byte*>(f->map_.data());
    f->size_ = f->map_.size();
    f->parse();
    return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(std::span<const std::byte> bytes, const std::string& name) {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->name_ = name;
    f->owned_.assign(bytes.begin(), bytes.end());
    f->base_ = f->owned_.data();
    f->size_ = f->owned_.size();
    f->parse();
    return f;
}

void GgufFile::parse() {
    const std::string& file = name_;
    Cursor c(base_, size_, file);

    if (size_ < 4 || std::memcmp(base_, "GGUF", 4) != 0)
        throw InputError(file + ": not a GGUF file (expected the magic bytes \"GGUF\" at offset 0)");
    c.take(4, "magic");
    version_ = c.u32("version");
    if (version_ != 2 && version_ != 3)
        throw InputError(file + ": unsupported GGUF version " + std::to_string(version_) + " (expected 2 or 3)");
    const uint64_t n_tensors = c.u64("tensor count");
    const uint64_t n_kv = c.u64("metadata key count");

    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 (smallest value) bytes; a tensor info at least
    // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset). Counts beyond what the file can hold are refused before
    // any allocation.
    if (n_kv > c.left() / 13)
        throw InputError(file + ": metadata key count " + std::to_string(n_kv) + " cannot fit in the " +
                         std::to_string(c.left()) + " bytes left in the file (each key needs at least 13)");
    if (n_tensors > c.left() / 24)
        throw InputError(file + ": tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                         std::to_string(c.left()) + " bytes left in the file (each tensor info needs at least 24)");

    // Entries are parsed one by one from real bytes; the up-front reservation is capped so that a large count
    // (bounded by the file size, but each record is larger in memory than on disk) never reserves much.
    kv_.reserve(size_t(std::min<uint64_t>(n_kv, kMaxReserve)));
    for (uint64_t k = 0; k < n_kv; ++k) {
        std::string key = c.string("metadata key " + std::to_string(k));
        if (key.empty()) throw InputError(file + ": metadata key " + std::to_string(k) + " is empty");
        const std::string at = "key '" + key + "'";
        if (kv_index_.count(key)) throw InputError(file + ": " + at + " appears twice");
        const uint32_t type = c.u32(at + " value type");
        if (!known_value_type(type))
            throw InputError(file + ": " + at + ": unknown value type " + std::to_string(type) + " (expected 0..12)");
        GgufValue v = read_value(c, GgufType(type), at);
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const GgufValue* a = find_value("general.alignment")) {
        if (a->type != GgufType::UInt32)
            throw InputError(file + ": key 'general.alignment': expected uint32, found " +
                             std::string(gguf_type_name(a->type)));
        if (a->u == 0 || (a->u & (a->u - 1)) != 0)
            throw InputError(file + ": key 'general.alignment': " + std::to_string(a->u) +
                             " is not a power of two");
        alignment_ = uint32_t(a->u);
    } else {
        alignment_ = kDefaultAlignment;
    }

    tensors_.reserve(size_t(std::min<uint64_t>(n_tensors, kMaxReserve)));
    for (uint64_t k = 0; k < n_tensors; ++k) {
        GgufTensorInfo t;
        t.name = c.string("tensor info " + std::to_string(k) + " name");
        if (t.name.empty()) throw InputError(file + ": tensor info " + std::to_string(k) + " has an empty name");
        const std::string at = "tensor '" + t.name + "'";
        if (tensor_index_.count(t.name)) throw InputError(file + ": " + at + " appears twice");
        const uint32_t n_dims = c.u32(at + " n_dims");
        if (n_dims > kMaxDims)
            throw InputError(file + ": " + at + ": n_dims " + std::to_string(n_dims) + " (expected at most 4)");
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne = c.u64(at + " dimension " + std::to_string(d));
            if (ne > uint64_t(std::numeric_limits<int64_t>::max()))
                throw InputError(file + ": " + at + ": dimension " + std::to_string(d) + " is " + std::to_string(ne) +
                                 " (expected a non-negative int64)");
            t.ne.push_back(int64_t(ne));
        }
        const uint32_t type = c.u32(at + " type");
        const GgmlTypeTraits* tr = ggml_type_traits(type);
        if (!tr) throw InputError(file + ": " + at + ": unknown ggml type id " + std::to_string(type));
        t.type = GgmlType(type);
        t.offset = c.u64(at + " offset");

        // Element count and byte size, with every product checked. A zero dimension makes the tensor empty.
        uint64_t numel = 1;
        bool zero = false;
        for (int64_t d : t.ne) zero = zero || d == 0;
        if (zero) {
            numel = 0;
        } else {
            for (int64_t d : t.ne)
                if (__builtin_mul_overflow(numel, uint64_t(d), &numel) ||
                    numel > uint64_t(std::numeric_limits<int64_t>::max()))
                    throw InputError(file + ": " + at + ": dimensions have too many elements (overflow)");
        }
        t.numel = int64_t(numel);
        if (t.cols() % tr->block != 0)
            throw InputError(file + ": " + at + ": row length ne[0] = " + std::to_string(t.cols()) +
                             " is not a multiple of the " + tr->name + " block size " + std::to_string(tr->block));
        const uint64_t blocks = numel / uint64_t(tr->block);
        if (__builtin_mul_overflow(blocks, uint64_t(tr->bytes), &t.nbytes))
            throw InputError(file + ": " + at + ": byte size overflows");
        if (t.offset % alignment_ != 0)
            throw InputError(file + ": " + at + ": offset " + std::to_string(t.offset) +
                             " is not a multiple of the alignment " + std::to_string(alignment_));
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment (it may be empty, at the very end).
    const uint64_t end_of_infos = c.pos();
    data_offset_ = end_of_infos + (alignment_ - end_of_infos % alignment_) % alignment_;
    if (data_offset_ > size_) {
        if (!tensors_.empty() && std::any_of(tensors_.begin(), tensors_.end(), [](auto& t) { return t.nbytes > 0; }))
            throw InputError(file + ": file truncated: the data section starts at offset " +
                             std::to_string(data_offset_) + " but the file is " + std::to_string(size_) + " bytes");
        data_offset_ = size_;  // a file of empty tensors may end without the padding
    }
    const uint64_t data_size = size_ - data_offset_;
    for (const GgufTensorInfo& t : tensors_) {
        if (t.offset > data_size || t.nbytes > data_size - t.offset)
            throw InputError(file + ": tensor '" + t.name + "': bytes [" + std::to_string(t.offset) + ", " +
                             (t.offset > std::numeric_limits<uint64_t>::max() - t.nbytes
                                  ? std::string("overflow")
                                  : std::to_string(t.offset + t.nbytes)) +
                             ") lie beyond the data section of " + std::to_string(data_size) +
                             " bytes (file truncated?)");
    }

    // Overlaps: sorted by offset, a tensor overlaps an earlier one iff it starts before the previous one ends (while
    // no overlap is found, the earlier ranges are disjoint and the previous one ends last). Empty tensors hold no
    // bytes.
    std::vector<const GgufTensorInfo*> order;
    for (const auto& t : tensors_)
        if (t.nbytes > 0) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
        return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
    });
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensorInfo& prev = *order[k - 1];
        const GgufTensorInfo& cur = *order[k];
        if (cur.offset < prev.offset + prev.nbytes)
            throw InputError(file + ": tensor '" + cur.name + "': bytes [" + std::to_string(cur.offset) + ", " +
                             std::to_string(cur.offset + cur.nbytes) + ") overlap those of tensor '" + prev.name +
                             "' [" + std::to_string(prev.offset) + ", " + std::to_string(prev.offset + prev.nbytes) +
                             ")");
    }
}

const GgufValue* GgufFile::find_value(const std::string& key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

void GgufFile::wrong_type(const std::string& key, const GgufValue& v, const char* expected) const {
    std::string found(gguf_type_name(v.type));
    if (v.type == GgufType::Array) found = "array of " + std::string(gguf_type_name(v.array.type));
    throw InputError(name_ + ": key '" + key + "': expected " + expected + ", found " + found);
}

const GgufValue* GgufFile::find_typed(const std::string& key, GgufType type, const char* expected) const {
    const GgufValue* v = find_value(key);
    if (v && v->type != type) wrong_type(key, *v, expected);
    return v;
}

std::optional<uint32_t> GgufFile::get_u32(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::UInt32, "uint32")) return uint32_t(v->u);
    return std::nullopt;
}

std::optional<uint64_t> GgufFile::get_u64(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::UInt64, "uint64")) return v->u;
    return std::nullopt;
}

std::optional<int32_t> GgufFile::get_i32(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::Int32, "int32")) return int32_t(v->i);
    return std::nullopt;
}

std::optional<float> GgufFile::get_f32(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::Float32, "float32")) return float(v->f);
    return std::nullopt;
}

std::optional<double> GgufFile::get_f64(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::Float64, "float64")) return v->f;
    return std::nullopt;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::Bool, "bool")) return v->u != 0;
    return std::nullopt;
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::String, "string")) return v->s;
    return std::nullopt;
}

const GgufArray* GgufFile::get_array(const std::string& key) const {
    if (const GgufValue* v = find_typed(key, GgufType::Array, "array")) return &v->array;
    return nullptr;
}

std::optional<uint64_t> GgufFile::get_uint(const std::string& key) const {
    const GgufValue* v = find_value(key);
    if (!v) return std::nullopt;
    switch (v->type) {
        case GgufType::UInt8: case GgufType::UInt16: case GgufType::UInt32: case GgufType::UInt64: return v->u;
        case GgufType::Int8: case GgufType::Int16: case GgufType::Int32: case GgufType::Int64:
            if (v->i < 0)
                throw InputError(name_ + ": key '" + key + "': expected a non-negative integer, found " +
                                 std::to_string(v->i));
            return uint64_t(v->i);
        default: wrong_type(key, *v, "an integer");
    }
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
    const GgufValue* v = find_value(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::Float32 && v->type != GgufType::Float64) wrong_type(key, *v, "float32 or float64");
    return v->f;
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace quest
