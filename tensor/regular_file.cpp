#include "tensor/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tensor/error.h"

namespace mu {

namespace {

// What a file of mode `m` is, for messages.
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "of an unknown type";
}

}  // namespace

int open_regular_file(const std::string& path) {
  struct stat st;
  // Refused before it is opened at all: opening a device can have effects of its own.
  // When stat fails, open below reports why in its own words.
  if (::stat(path.c_str(), &st) == 0)
    MU_CHECK(S_ISREG(st.st_mode), "cannot read ", path, ": it is ", kind_of(st.st_mode), ", not a regular file");
  // O_NONBLOCK: an open of a FIFO returns at once instead of waiting for a writer.
  // O_NOCTTY: a terminal opened here never becomes the process's controlling terminal.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  MU_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  int flags = -1;
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (stat_ok && S_ISREG(st.st_mode)) flags = ::fcntl(fd, F_GETFL);
  // Reads of a regular file never block anyway; the flag is cleared so that the
  // descriptor behaves as any other.
  if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) return fd;
  const int fcntl_errno = errno;
  ::close(fd);
  MU_CHECK(stat_ok, "cannot stat ", path, ": ", std::strerror(stat_errno));
  MU_CHECK(S_ISREG(st.st_mode), "cannot read ", path, ": it is ", kind_of(st.st_mode), ", not a regular file");
  MU_FAIL("cannot read ", path, ": fcntl: ", std::strerror(fcntl_errno));
}

}  // namespace mu
