#pragma once
// GGUF files (llama.cpp's model format, versions 2 and 3): memory-mapped, header, metadata and tensor infos parsed
// and validated before any tensor is used.
//
// File layout (all integers little-endian):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x  { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment | data section (tensor offsets are relative to its start)
// A string is { u64 length | bytes } (no terminator); an array value is { u32 element_type | u64 count | elements }.
// ne[0] is the innermost (contiguous) dimension: a matrix [rows][cols] is stored with ne = {cols, rows}.
//
// Validation on open (each failure is an InputError naming the file and what was expected):
//   - magic "GGUF"; version 2 or 3 (1 used 32-bit counts and is refused, like any other version)
//   - every count (tensors, keys, array elements) is bounded by the bytes left in the file before anything is
//     allocated for it; every string lies within the file; keys and tensor names are unique and not empty
//   - value types are the 13 of the format; arrays of arrays are refused (no writer emits them)
//   - general.alignment, when present, is a uint32 power of two (default 32)
//   - each tensor: n_dims <= 4; dims >= 0 with a product that fits int64; a known ggml type (an unknown id names the
//     tensor and the id); ne[0] a multiple of the type's block size; offset a multiple of the alignment; offset +
//     byte size within the data section; no two tensors' bytes overlap (holes between tensors are accepted)
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/io/mapped_file.h"

namespace quest {

// GGUF metadata value types (gguf_type in ggml's gguf.h).
enum class GgufType : uint32_t {
    UInt8 = 0,
    Int8 = 1,
    UInt16 = 2,
    Int16 = 3,
    UInt32 = 4,
    Int32 = 5,
    Float32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    UInt64 = 10,
    Int64 = 11,
    Float64 = 12,
};
std::string_view gguf_type_name(GgufType t);  // "uint32", "string", "array", ...; "type <id>" when unknown

// ggml tensor types (ggml_type in ggml.h). Ids 4, 5, 31..33 and 36..38 were removed from ggml and are unknown here.
enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
    I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

// Block geometry of a ggml type: `block` elements (along ne[0]) are stored in `bytes` bytes.
struct GgmlTypeTraits {
    const char* name;  // ggml's spelling: "F32", "Q4_K", ...
    int block;
    int bytes;
};
// The traits of a known type id; nullptr when the id is unknown.
const GgmlTypeTraits* ggml_type_traits(uint32_t id);
std::string ggml_type_name(GgmlType t);  // "Q4_K"; "type <id>" when unknown

// An array value. Numeric and bool elements stay in the mapping (`raw`: count x element size bytes, little-endian);
// strings are copied out.
struct GgufArray {
    GgufType type = GgufType::UInt8;  // element type (never Array)
    uint64_t count = 0;
    std::span<const std::byte> raw;    // numeric/bool elements; empty for strings
    std::vector<std::string> strings;  // string elements [count]
};

// One metadata value. Integers are widened to u (unsigned types, bool) or i (signed types), floats to f.
struct GgufValue {
    GgufType type = GgufType::UInt8;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    std::string s;     // String
    GgufArray array;   // Array
};

struct GgufTensorInfo {
    std::string name;
    GgmlType type = GgmlType::F32;
    std::vector<int64_t> ne;  // dims innermost first: ne[0] = columns (contiguous); n_dims entries (0..4)
    uint64_t offset = 0;      // byte offset within the data section
    uint64_t nbytes = 0;      // ne[0] / block x type bytes x ne[1] x ne[2] x ne[3]
    int64_t numel = 0;        // product of ne (1 for n_dims 0)
    int64_t cols() const { return ne.empty() ? 1 : ne[0]; }  // elements per row
    int64_t rows() const { return cols() == 0 ? 0 : numel / cols(); }  // ne[1] x ne[2] x ne[3]
    // Row-major shape, outermost first (ne reversed): a matrix [rows][cols] as {rows, cols}.
    std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }
};

class GgufFile {
public:
    // Maps and validates the file. Throws InputError (see above).
    static std::unique_ptr<GgufFile> open(const std::filesystem::path& path);
    // Validates bytes held in memory (tests, fuzzing); `name` stands for the file in error messages. The bytes are
    // copied.
    static std::unique_ptr<GgufFile> from_memory(std::span<const std::byte> bytes, const std::string& name);
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& name() const { return name_; }  // the path, as it appears in messages
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }  // start of the data section in the file
    uint64_t file_size() const { return size_; }

    // Metadata, in file order; lookup by key (nullptr when absent).
    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find_value(const std::string& key) const;

    // Typed lookups: nullopt when the key is absent; InputError "<file>: key 'X': expected uint32, found string"
    // when the stored type is another (no conversions, like llama.cpp's loader).
    std::optional<uint32_t> get_u32(const std::string& key) const;
    std::optional<uint64_t> get_u64(const std::string& key) const;
    std::optional<int32_t> get_i32(const std::string& key) const;
    std::optional<float> get_f32(const std::string& key) const;
    std::optional<double> get_f64(const std::string& key) const;
    std::optional<bool> get_bool(const std::string& key) const;
    std::optional<std::string> get_string(const std::string& key) const;
    const GgufArray* get_array(const std::string& key) const;  // nullptr when absent; InputError when not an array
    // Any integer type whose value is >= 0 and fits uint64 (writers differ in the width they use for ids).
    std::optional<uint64_t> get_uint(const std::string& key) const;
    // Float32 or Float64.
    std::optional<double> get_float(const std::string& key) const;

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
    const GgufTensorInfo* find(const std::string& name) const;
    // The tensor's bytes inside the mapping (aligned to alignment() relative to the file start).
    std::span<const std::byte> bytes(const GgufTensorInfo& t) const {
        return {base_ + data_offset_ + t.offset, size_t(t.nbytes)};
    }

private:
    GgufFile() = default;
    void parse();  // validates base_[0, size_)
    [[noreturn]] void wrong_type(const std::string& key, const GgufValue& v, const char* expected) const;
    // The value of key (nullptr when absent); wrong_type when its type is not `type` (named `expected`).
    const GgufValue* find_typed(const std::string& key, GgufType type, const char* expected) const;

    std::string name_;
    MappedFile map_;  // the file (open), or empty
    std::vector<std::byte> owned_;  // the bytes (from_memory)
    const std::byte* base_ = nullptr;
    uint64_t size_ = 0;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace quest
