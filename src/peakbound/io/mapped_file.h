// MappedFile: a regular file mapped read-only for its whole life (model weights, token
// corpora). Opening checks it is a regular file; every failure is an InvalidArgument
// that names the path and the system's reason.
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
    ~Mapping();
  };
  std::string path_;
  std::shared_ptr<Mapping> map_;  // copies share the mapping
};

}  // namespace peakbound
