#pragma once
// Helpers shared by the libFuzzer targets: a private scratch folder per process (in /dev/shm when there is one, so
// that writing the input to a file costs no disk I/O), and the "bundle" format that packs several files into one
// fuzz input.
//
// Bundle: a sequence of sections, each "@@ NAME\n" followed by the file's bytes up to the next "\n@@ " (or the end).
// Bytes before the first "@@ " are ignored. NAME is kept only when it is a plain file name ([A-Za-z0-9._-], 1 to 100
// characters, not "." or ".."): a section with any other name is dropped, so that a fuzzed name never reaches outside
// the scratch folder. The last section of a name wins; at most 16 sections are used.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Aborts with "<target>: invariant violated: <cond>" unless cond holds: an input accepted against what the validation
// promises is a finding too, not only a crash.
#define QUEST_FUZZ_CHECK(target, cond)                                               \
    do {                                                                             \
        if (!(cond)) {                                                               \
            std::fprintf(stderr, "%s: invariant violated: %s\n", target, #cond);     \
            std::abort();                                                            \
        }                                                                            \
    } while (0)

namespace quest::fuzz {

// A fresh, empty scratch folder (the same path on every call from one process: its contents are removed).
inline std::filesystem::path scratch_dir(const char* target) {
    namespace fs = std::filesystem;
    static const fs::path root = [&] {
        std::error_code ec;
        const fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
        return base / ("quest_fuzz_" + std::string(target) + "_" + std::to_string(::getpid()));
    }();
    std::error_code ec;
    fs::remove_all(root, ec);
    fs::create_directories(root);
    return root;
}

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();  // the scratch folder must be writable: a harness failure, not a finding
}

inline bool plain_name(std::string_view s) {
    if (s.empty() || s.size() > 100 || s == "." || s == "..") return false;
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    return true;
}

// The files of a bundle, in order of appearance (a later section of the same name replaces the earlier one).
inline std::vector<std::pair<std::string, std::string_view>> split_bundle(std::string_view in) {
    std::vector<std::pair<std::string, std::string_view>> files;
    size_t pos = in.starts_with("@@ ") ? 0 : in.find("\n@@ ");
    if (pos == std::string_view::npos) return files;
    if (pos != 0) pos += 1;  // at "@@ "
    int sections = 0;
    while (pos != std::string_view::npos && sections < 16) {
        const size_t name_begin = pos + 3;
        const size_t name_end = in.find('\n', name_begin);
        if (name_end == std::string_view::npos) break;
        const size_t next = in.find("\n@@ ", name_end);
        const size_t body_begin = name_end + 1;
        const size_t body_end = next == std::string_view::npos ? in.size() : next;
        const std::string name(in.substr(name_begin, name_end - name_begin));
        ++sections;
        if (plain_name(name)) {
            const std::string_view body = body_begin <= body_end ? in.substr(body_begin, body_end - body_begin)
                                                                 : std::string_view{};
            bool replaced = false;
            for (auto& f : files)
                if (f.first == name) {
                    f.second = body;
                    replaced = true;
                }
            if (!replaced) files.emplace_back(name, body);
        }
        pos = next == std::string_view::npos ? next : next + 1;
    }
    return files;
}

// Writes the bundle's files into a fresh scratch folder and returns it.
inline std::filesystem::path write_bundle(const char* target, const uint8_t* data, size_t size) {
    const auto dir = scratch_dir(target);
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    for (const auto& [name, body] : split_bundle(in)) write_bytes(dir / name, body);
    return dir;
}

}  // namespace quest::fuzz
