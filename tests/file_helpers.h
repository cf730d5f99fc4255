// Scratch directories and whole-file byte I/O for the suites that write files.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <string>

#include "tensor/error.h"

// A fresh directory <tmp>/mumoe_<tag>_<pid>_<n>, n counting up within the process,
// removed when it goes out of scope (however the test case ends).
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("mumoe_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// The whole file as bytes; empty when it cannot be opened.
inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Replaces the file's contents with `bytes`.
inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// What became of a load expected to refuse its file.
struct Outcome {
  bool returned = false;  // within the time allowed
  bool threw_mu = false;  // with a mu::Error
  std::string message;    // its message
};

// Runs `load` on another thread and waits `seconds` for it. A load that blocks (opening
// a FIFO waits for a writer) makes the test fail instead of hang: the FIFO at `fifo`
// (when given) is then opened for writing, which releases the blocked open.
inline Outcome outcome_within(const std::function<void()>& load, double seconds, const std::string& fifo = "") {
  auto run = std::async(std::launch::async, [load] {
    Outcome o;
    try {
      load();
    } catch (const mu::Error& e) {
      o.threw_mu = true;
      o.message = e.what();
    } catch (const std::exception& e) {
      o.message = std::string("not a mu::Error: ") + e.what();
    }
    return o;
  });
  bool in_time = run.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
  if (!in_time && !fifo.empty()) {
    int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // succeeds: a reader waits
    if (fd >= 0) ::close(fd);
  }
  Outcome o = run.get();
  o.returned = in_time;
  return o;
}
