// The contract every fuzz target checks: on any input a parser either succeeds (and what
// it returns is consistent, FUZZ_CHECK) or throws a peakbound::Error (or the one error type
// its header documents) whose what() is one line. Anything else aborts, so libFuzzer keeps
// the input as a crash: an InternalError (a broken invariant is a bug, not bad input),
// another exception leaking, a multi-line or empty message; ASan/UBSan reports and hangs are
// libFuzzer's own findings.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "peakbound/core/error.h"

namespace peakbound::fuzz {

[[noreturn]] inline void fail(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
  std::abort();
}

#define FUZZ_CHECK(cond) \
  do { if (!(cond)) ::peakbound::fuzz::fail("check failed at " __FILE__, #cond); } while (0)

// The message a user sees: one non-empty line.
inline void check_message(std::string_view what) {
  if (what.empty()) fail("empty error message", "");
  if (what.find_first_of("\r\n") != std::string_view::npos) fail("error message spans lines", what);
}

// Runs `parse`; `Also` is a further error type the parser documents (CLI::ConfigError).
template <typename Also = peakbound::Error, typename F>
void expect_ours(F&& parse) {
  try {
    parse();
  } catch (const peakbound::InternalError& e) {
    fail("internal error (a broken invariant)", e.what());
  } catch (const peakbound::Error& e) {
    check_message(e.what());
  } catch (const Also& e) {
    check_message(e.what());
  } catch (const std::exception& e) {
    fail("an exception other than ours leaked", e.what());
  } catch (...) {
    fail("a non-std exception leaked", "");
  }
}

// The input as a file the readers can open by path: an anonymous in-memory file
// (memfd), named /proc/self/fd/N, closed with this object.
class MemFile {
 public:
  MemFile(const std::uint8_t* data, std::size_t size) {
    fd_ = memfd_create("peakbound-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) fail("memfd_create", "");
    for (std::size_t done = 0; done < size;) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) fail("write to memfd", "");
      done += static_cast<std::size_t>(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace peakbound::fuzz
