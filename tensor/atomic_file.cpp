#include "tensor/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tensor/error.h"

namespace mu {

namespace {

std::string errno_text() { return std::strerror(errno); }

// The pid in the name of a temporary "<prefix><pid>" of a save of the same file, or 0
// when `name` is not one: digits only, no leading zero, a positive pid_t.
pid_t temporary_pid(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 9 || digits[0] == '0') return 0;
  long pid = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    pid = pid * 10 + (c - '0');
  }
  return pid_t(pid);
}

// Removes the temporaries "<path>.tmp.<pid>" that saves of `path` left when their
// process died before the rename (a crash, a kill): those whose pid names no process
// (kill(pid, 0) fails with ESRCH). A live process's temporary may be being written right
// now and is never touched, nor is this process's own (the save truncates it).
// A dead writer's pid taken by a new process keeps its file until that one ends; a
// writer on another machine or in another pid namespace cannot be seen from here, and
// its temporary in a shared directory looks stale. Best effort: what cannot be listed
// or removed stays.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string prefix = target.filename().string() + ".tmp.";
  if (prefix == ".tmp.") return;  // a path ending in '/': the save itself will fail
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const pid_t pid = temporary_pid(it->path().filename().string(), prefix);
    if (pid <= 0 || pid == ::getpid()) continue;  // kill(0 or less) would mean process groups
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (EPERM: alive, another user's)
    std::error_code type_ec;
    // Only files: a directory or a link of that name is not a temporary of ours.
    if (it->symlink_status(type_ec).type() == fs::file_type::regular) stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
}

// Durability of the rename itself: flush the directory entry. Best effort, since the
// new file is already complete and in place when this runs.
void sync_directory(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)), temp_(path_ + ".tmp." + std::to_string(::getpid())) {
  remove_stale_temporaries(path_);
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MU_CHECK(fd_ >= 0, what_, ": cannot create ", temp_, ": ", errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;  // interrupted by a signal before writing: retry
    MU_CHECK(k > 0, what_, ": cannot write ", temp_, ": ", errno_text());
    p += k;
    n -= size_t(k);
  }
}

void AtomicFile::write_at(const void* data, size_t n, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::pwrite(fd_, p, n, off_t(offset));
    if (k < 0 && errno == EINTR) continue;
    MU_CHECK(k > 0, what_, ": cannot write ", temp_, ": ", errno_text());
    p += k;
    n -= size_t(k);
    offset += uint64_t(k);
  }
}

void AtomicFile::commit() {
  MU_CHECK(!committed_ && fd_ >= 0, what_, ": the file was already committed");
  // The data must be on disk before the rename makes it the file at `path`.
  MU_CHECK(::fsync(fd_) == 0, what_, ": cannot flush ", temp_, ": ", errno_text());
  const int f = fd_;
  fd_ = -1;
  MU_CHECK(::close(f) == 0, what_, ": cannot close ", temp_, ": ", errno_text());
  MU_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, what_, ": cannot rename ", temp_, " to ", path_, ": ",
           errno_text());
  committed_ = true;
  sync_directory(path_);
}

void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts,
                           const std::string& what) {
  AtomicFile f(path, what);
  for (const auto& [p, n] : parts) f.write(p, n);
  f.commit();
}

}  // namespace mu
