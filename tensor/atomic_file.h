// Writing a file so that its final name only ever holds a complete file: the bytes go to
// "<path>.tmp.<pid>", are flushed to disk, and the temporary is renamed over `path` (then
// the directory entry is flushed too). Temporaries that earlier writers of the same path
// left when their process died before the rename are removed first. Every save in the
// library (safetensors files and checkpoints, token files, meta.json, a metrics log cut
// back on resume) goes through here.
//
//   AtomicFile f(path, "save_thing " + path);
//   f.write(header.data(), header.size());
//   f.commit();            // without it, the destructor removes the temporary
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mu {

class AtomicFile {
 public:
  // Creates the temporary. `what` starts every error message ("save_safetensors <path>").
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();  // uncommitted: closes and removes the temporary
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends n bytes (all of them; a failure is a mu::Error naming the temporary).
  void write(const void* data, size_t n);
  // Writes n bytes at `offset`, leaving the append position where it was.
  void write_at(const void* data, size_t n, uint64_t offset);
  // Flushes the data, closes, renames the temporary to the final path, flushes the
  // directory. After it the destructor leaves the file alone.
  void commit();

  const std::string& temp_path() const { return temp_; }

 private:
  std::string path_, what_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// The parts, (pointer, length) each, written one after another into `path`, atomically.
void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts,
                           const std::string& what);

}  // namespace mu
