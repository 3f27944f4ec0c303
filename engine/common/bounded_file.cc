#include "engine/common/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace specula {
namespace {

std::string Named(absl::string_view what, const std::string& path) {
  return absl::StrCat(what, " '", path, "'");
}

absl::Status OpenError(absl::string_view what, const std::string& path, int err) {
  const std::string message =
      absl::StrCat(Named(what, path), ": cannot open: ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

absl::Status CheckKind(const struct stat& st, int64_t max_bytes, absl::string_view what,
                       const std::string& path) {
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(Named(what, path), " is a directory"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(what, path), " is not a regular file (a device, FIFO or socket?)"));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(Named(what, path), " is ", st.st_size,
                                                   " bytes, more than the limit of ", max_bytes));
  }
  return absl::OkStatus();
}

// Reads at most one byte past the limit: a file growing while it is read is refused too.
absl::StatusOr<std::string> ReadUpTo(int fd, int64_t max_bytes, absl::string_view what,
                                     const std::string& path, int64_t size_hint) {
  std::string text;
  text.resize(static_cast<size_t>(size_hint) + 1);
  size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (got > static_cast<size_t>(max_bytes)) break;
      text.resize(std::min<size_t>(text.size() * 2, static_cast<size_t>(max_bytes) + 1));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(Named(what, path), ": read failed: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  if (got > static_cast<size_t>(max_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Named(what, path), " grew past the limit of ", max_bytes, " bytes while read"));
  }
  text.resize(got);
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return OpenError(what, path, errno);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Named(what, path), ": cannot stat: ", std::strerror(errno)));
  }
  if (absl::Status kind = CheckKind(st, max_bytes, what, path); !kind.ok()) return kind;
  return ReadUpTo(fd, max_bytes, what, path, st.st_size);
}

}  // namespace specula
