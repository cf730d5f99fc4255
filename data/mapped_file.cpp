#include "data/mapped_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tensor/error.h"
#include "tensor/regular_file.h"

namespace mu::data {

struct MappedFile::Mapping {
  std::string path;
  void* base = nullptr;  // the whole file
  size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
};

MappedFile::MappedFile(const std::string& path) {
  auto m = std::make_shared<Mapping>();
  m->path = path;
  const int fd = open_regular_file(path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    MU_FAIL("cannot stat ", path, ": ", why);
  }
  m->bytes = size_t(st.st_size);
  if (m->bytes > 0) {  // mmap refuses a length of 0
    m->base = ::mmap(nullptr, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->base == MAP_FAILED) {
      m->base = nullptr;
      const std::string why = std::strerror(errno);
      ::close(fd);
      MU_FAIL("cannot map ", path, " (", m->bytes, " bytes): ", why);
    }
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  map_ = std::move(m);
}

const std::string& MappedFile::path() const { return map_->path; }
const uint8_t* MappedFile::data() const { return static_cast<const uint8_t*>(map_->base); }
int64_t MappedFile::size() const { return int64_t(map_->bytes); }

}  // namespace mu::data
