// MappedFile: a regular file mapped read-only for its whole life (model weights, token
// corpora). Opening checks it is a regular file; every failure is an InvalidArgument
// that names the path and the system's reason.
// A mapped file truncated while it is read makes the read fault with SIGBUS: every live
// mapping is registered (address range and path) and a SIGBUS handler, installed at the
// first open, prints `peakbound: error: <file> was truncated or changed while it was
// read (...)` and exits with code 1 instead of a bare "Bus error" that names nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace peakbound {

class MappedFile {
 public:
  static MappedFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::byte* data() const { return static_cast<const std::byte*>(map_->addr); }
  std::uint64_t size() const { return map_->size; }

 private:
  struct Mapping {
    void* addr = nullptr;
    std::size_t size = 0;
    int slot = -1;  // its entry in the SIGBUS handler's registry (-1: none)
    ~Mapping();
  };
  std::string path_;
  std::shared_ptr<Mapping> map_;  // copies share the mapping
};

}  // namespace peakbound
