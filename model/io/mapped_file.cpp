#include "model/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kernels/common/error.h"

namespace quest {

FileMap map_file(const std::filesystem::path& path, const std::string& expected) {
    const std::string file = path.string();
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(file + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw InputError(file + ": cannot stat: " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw InputError(file + ": not a regular file");
    }
    const auto size = static_cast<size_t>(st.st_size);
    if (size == 0) {  // mmap of length 0 fails with EINVAL: report the real problem instead
        ::close(fd);
        throw InputError(file + ": file is empty" + (expected.empty() ? "" : " (expected " + expected + ")"));
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_err = errno;
    ::close(fd);  // the mapping keeps the file referenced
    if (map == MAP_FAILED)
        throw InputError(file + ": cannot mmap " + std::to_string(size) + " bytes: " + std::strerror(map_err));
    return {map, size};
}

void unmap_file(const FileMap& m) {
    if (m.data) ::munmap(m.data, m.size);
}

}  // namespace quest
