#pragma once
// A read-only memory map of a whole model file (safetensors, GGUF): the readers validate its bytes in place.
#include <cstddef>
#include <filesystem>
#include <string>

namespace quest {

struct FileMap {
    void* data = nullptr;  // MAP_PRIVATE, PROT_READ; unmap with unmap_file
    size_t size = 0;       // bytes, > 0
};
// Maps `path`; InputError naming the file when it cannot be opened, is not a regular file, is empty (`expected`
// says what it should have held) or cannot be mapped.
FileMap map_file(const std::filesystem::path& path, const std::string& expected);
void unmap_file(const FileMap& m);

// The map a file reader holds for its lifetime: unmapped when it is destroyed (empty until reset).
class MappedFile {
public:
    MappedFile() = default;
    ~MappedFile() { unmap_file(m_); }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    void reset(const FileMap& m) {
        unmap_file(m_);
        m_ = m;
    }
    const void* data() const { return m_.data; }
    size_t size() const { return m_.size; }

private:
    FileMap m_;
};

}  // namespace quest
