// Writing a file so that its final name only ever holds a complete file: the bytes go to
// "<path>.tmp.<pid>", are flushed to disk, and the temporary is renamed over `path`.
// A failure removes the temporary and throws a mu::Error starting with `what`.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mu::data {

// The parts, (pointer, length) each, written one after another.
void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts,
                           const std::string& what);

}  // namespace mu::data
