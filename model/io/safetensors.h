#pragma once
// safetensors files: memory-mapped, header parsed and validated before any tensor is used.
//
// File layout: [u64 little-endian N][N bytes of JSON header][data area]. The header maps each tensor name to
// {"dtype": "F32"|"F16"|"BF16"|..., "shape": [..], "data_offsets": [begin, end]} (offsets relative to the data
// area) and may hold "__metadata__": {string: string}.
//
// Validation on open (each failure is an InputError that names the file and, where there is one, the tensor):
//   - the file holds at least the 8-byte length; the header length lies within the file; the header is a JSON object
//   - every tensor has a known dtype, a shape of non-negative integers and data_offsets [begin, end] with
//     begin <= end <= size of the data area
//   - product(shape) * dtype size == end - begin
//   - no two tensors' byte ranges overlap (empty tensors hold no bytes and overlap nothing)
//   - no key appears twice in any JSON object of the header (a tensor listed twice is an error); tensor names are
//     not empty; "__metadata__", when present, is an object of strings
// Holes between tensors and bytes after the last one are accepted; readers accept any header length.
// A model folder holds either model.safetensors or model.safetensors.index.json with its shards.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/common/dtype.h"
#include "model/io/mapped_file.h"

namespace quest {

struct TensorInfo {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets within the data area
    uint64_t end = 0;
    int64_t numel() const;  // product of shape (1 for []); std::overflow_error if it does not fit int64
    uint64_t nbytes() const { return end - begin; }
};

std::string shape_to_string(std::span<const int64_t> shape);  // "[4096, 11008]"

class SafeTensorsFile {
public:
    // Maps and validates the file. Throws InputError (see above).
    static std::unique_ptr<SafeTensorsFile> open(const std::filesystem::path& path);
    SafeTensorsFile(const SafeTensorsFile&) = delete;
    SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

    const std::filesystem::path& path() const { return path_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const TensorInfo* find(const std::string& name) const;
    // Start of a tensor's bytes inside the mapping (not necessarily aligned: read with memcpy or convert_to_f32).
    const std::byte* data(const TensorInfo& t) const { return data_ + t.begin; }

private:
    SafeTensorsFile() = default;
    std::filesystem::path path_;
    MappedFile map_;
    const std::byte* data_ = nullptr;  // start of the data area
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> by_name_;
    std::map<std::string, std::string> metadata_;
};

// A tensor found in a model folder.
struct TensorRef {
    const SafeTensorsFile* file = nullptr;
    const TensorInfo* info = nullptr;
    const std::byte* data() const { return file->data(*info); }
};

// The safetensors files of a model folder: model.safetensors, or the shards listed by
// model.safetensors.index.json ({"weight_map": {tensor: shard file}}; every listed shard must exist inside the
// folder and hold the tensors the index assigns to it). The index wins when both exist. Every tensor of every opened
// file is registered; a tensor found in two shards is an InputError.
class ModelFiles {
public:
    explicit ModelFiles(const std::filesystem::path& dir);
    const std::filesystem::path& dir() const { return dir_; }
    std::optional<TensorRef> find(const std::string& name) const;
    // The tensor `name` with exactly `expected_shape`; a missing tensor or another shape throws InputError naming
    // the file, the tensor, Expected and Actual.
    TensorRef get(const std::string& name, std::span<const int64_t> expected_shape) const;
    std::vector<std::string> names() const;  // sorted
    const std::vector<std::unique_ptr<SafeTensorsFile>>& files() const { return files_; }

private:
    std::filesystem::path dir_;
    std::vector<std::unique_ptr<SafeTensorsFile>> files_;
    std::map<std::string, TensorRef> tensors_;
};

// Writing (used by `quest make-model`, `quest quantize` and the tests). Tensors are written in the given order,
// contiguously, with the header padded with spaces to a multiple of 8 bytes. Bad arguments (bytes.size() !=
// numel * dtype size, a duplicate or empty name, a negative dim) throw std::invalid_argument before any file is
// created; the file is written through an AtomicFile (model/io/atomic_file.h), so `path` never holds a partial file and
// an interrupted writer leaves no temporary (I/O errors throw InputError naming the file).
struct TensorToWrite {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::span<const std::byte> bytes;
};
void write_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace quest
