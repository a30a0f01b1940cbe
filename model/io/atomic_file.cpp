#include "model/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/error.h"

namespace quest {

namespace {
std::string errno_text(int err) { return std::strerror(err); }
}  // namespace

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
    std::filesystem::path dir = path_.parent_path();
    if (dir.empty()) dir = ".";
#ifdef O_TMPFILE
    fd_ = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
#endif
    if (fd_ < 0) {  // no O_TMPFILE here (or not on this filesystem): a named temporary next to the target
        named_tmp_ = path_.string() + ".tmp." + std::to_string(::getpid());
        fd_ = ::open(named_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) {
            const int err = errno;
            named_tmp_.clear();
            throw InputError(path_.string() + ": cannot create: " + errno_text(err));
        }
    }
}

AtomicFile::~AtomicFile() {
    if (!committed_) discard();
}

void AtomicFile::discard() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!named_tmp_.empty()) ::unlink(named_tmp_.c_str());
    named_tmp_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
    if (fd_ < 0 || committed_) throw InputError(path_.string() + ": write after commit");
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n < (size_t(1) << 30) ? n : (size_t(1) << 30));
        if (w < 0) {
            if (errno == EINTR) continue;  // a signal (Ctrl-C) arrived: its handler only set a flag
            const int err = errno;
            discard();
            throw InputError(path_.string() + ": write failed: " + errno_text(err));
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void AtomicFile::commit() {
    if (fd_ < 0 || committed_) throw InputError(path_.string() + ": commit without an open file");
    auto fail = [&](const std::string& what, int err) {
        discard();
        throw InputError(path_.string() + ": " + what + ": " + errno_text(err));
    };
    if (named_tmp_.empty()) {
        // Give the unnamed file a temporary name in the same folder, then rename it over `path` (linkat cannot
        // replace an existing file). /proc/self/fd works without privileges, unlike AT_EMPTY_PATH.
        named_tmp_ = path_.string() + ".tmp." + std::to_string(::getpid());
        ::unlink(named_tmp_.c_str());
        const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
        if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, named_tmp_.c_str(), AT_SYMLINK_FOLLOW) != 0) {
            const int err = errno;
            named_tmp_.clear();
            fail("cannot link the written file", err);
        }
    }
    if (::close(fd_) != 0) {
        const int err = errno;
        fd_ = -1;
        fail("close failed", err);
    }
    fd_ = -1;
    if (::rename(named_tmp_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        fail("cannot rename " + named_tmp_.string() + " to it", err);
    }
    named_tmp_.clear();
    committed_ = true;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
    AtomicFile f(path);
    f.write(bytes);
    f.commit();
}

void copy_file_atomic(const std::filesystem::path& from, const std::filesystem::path& to) {
    const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) throw InputError(from.string() + ": cannot open: " + errno_text(errno));
    try {
        AtomicFile out(to);
        std::vector<char> buf(size_t(1) << 20);
        while (true) {
            const ssize_t r = ::read(in, buf.data(), buf.size());
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) throw InputError(from.string() + ": read error: " + errno_text(errno));
            if (r == 0) break;
            out.write(buf.data(), static_cast<size_t>(r));
        }
        out.commit();
    } catch (...) {
        ::close(in);
        throw;
    }
    ::close(in);
}

}  // namespace quest
