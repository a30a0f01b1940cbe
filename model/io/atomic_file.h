#pragma once
// Output files that are never partial. The bytes go to an unnamed file in the destination's folder (O_TMPFILE) and
// get their name only when complete, by a link and a rename: a writer that fails, is interrupted (Ctrl-C) or is
// killed leaves nothing behind, neither a half-written `path` nor a stray temporary. Where the filesystem has no
// O_TMPFILE, a named "<path>.tmp.<pid>" is used instead and removed on every error the process survives.
#include <cstddef>
#include <filesystem>
#include <string_view>

namespace quest {

class AtomicFile {
public:
    // Opens the unnamed file. Throws InputError naming `path` when its folder cannot be written.
    explicit AtomicFile(std::filesystem::path path);
    ~AtomicFile();  // without commit(): the bytes are discarded
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, size_t n);  // InputError naming `path` on an I/O error
    void write(std::string_view s) { write(s.data(), s.size()); }
    // Flushes and gives the file its name, replacing what `path` held. InputError on failure (nothing is left then).
    void commit();
    const std::filesystem::path& path() const { return path_; }

private:
    void discard();
    std::filesystem::path path_;
    std::filesystem::path named_tmp_;  // the fallback's temporary name (empty with O_TMPFILE)
    int fd_ = -1;
    bool committed_ = false;
};

// Writes `bytes` to `path` through an AtomicFile.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);
// Copies `from` to `to` through an AtomicFile (InputError naming the file that cannot be read or written).
void copy_file_atomic(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace quest
