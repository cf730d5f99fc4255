#include "data/atomic_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tensor/error.h"

namespace mu::data {

void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts,
                           const std::string& what) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MU_CHECK(fd >= 0, what, ": cannot create ", tmp, ": ", std::strerror(errno));
  auto fail = [&](const char* doing) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    MU_FAIL(what, ": cannot ", doing, " ", tmp, ": ", why);
  };
  for (const auto& [p, len] : parts) {
    const auto* c = static_cast<const char*>(p);
    for (size_t left = len; left > 0;) {
      const ssize_t w = ::write(fd, c, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write");
      c += w;
      left -= size_t(w);
    }
  }
  // On disk before the rename makes it the file at `path`.
  if (::fsync(fd) != 0) fail("flush");
  if (::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    MU_FAIL(what, ": cannot close ", tmp, ": ", why);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    MU_FAIL(what, ": cannot rename ", tmp, " to ", path, ": ", why);
  }
}

}  // namespace mu::data
