// Opening a path for reading only when it is a regular file, without ever blocking.
//
// open() of a FIFO for reading waits for a writer, and a device may never reach an end
// of file: a loader handed such a path would hang. The path is looked at with stat()
// first and refused unless it is a regular file; the open itself is non-blocking
// (O_NONBLOCK, cleared once the descriptor is known to be a file), so a FIFO put in its
// place between the two calls cannot block either, and fstat() checks what was opened.
#pragma once
#include <string>

namespace mu {

// A read-only, close-on-exec, blocking descriptor for the regular file at `path`; the
// caller closes it. Anything else throws a mu::Error naming the path:
//   "cannot open P: No such file or directory"
//   "cannot read P: it is a FIFO (named pipe), not a regular file"
int open_regular_file(const std::string& path);

}  // namespace mu
