// Allocation, Allocator and Buffer. An Allocator hands out Allocations tagged with a
// Component; a Buffer owns one and gives it back when destroyed (move-only, RAII).
// Zero-byte requests are legal (empty experts, ranks with no tokens): they return a
// Buffer with a null pointer that accounts nothing.
#pragma once

#include <cstdint>
#include <utility>

#include "peakbound/core/component.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/tensor.h"

namespace peakbound {

struct Allocation {
  void* ptr = nullptr;
  std::uint64_t offset = 0;    // within the allocator's region (0 where there is none)
  std::uint64_t bytes = 0;     // bytes reserved (requested, rounded up to the alignment)
  Component component = Component::workspace;
};

class Buffer;

// Anything that hands out component-tagged memory: the device Arena, HostMemory.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfBudget with a message naming the component, the request and the budget.
  virtual Buffer allocate(Component c, std::uint64_t bytes) = 0;
  virtual Location location() const = 0;

 protected:
  friend class Buffer;
  virtual void release(const Allocation& a) noexcept = 0;
};

// Owns one allocation; releases it on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator* owner, Allocation a) : owner_(owner), a_(a) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), a_(o.a_) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = std::exchange(o.owner_, nullptr);
      a_ = o.a_;
    }
    return *this;
  }
  ~Buffer() { reset(); }

  void reset() noexcept {
    if (owner_) owner_->release(a_);
    owner_ = nullptr;
    a_ = Allocation{};
  }

  void* data() const { return a_.ptr; }
  template <typename T> T* as() const { return static_cast<T*>(a_.ptr); }
  std::uint64_t bytes() const { return a_.bytes; }
  std::uint64_t offset() const { return a_.offset; }
  Component component() const { return a_.component; }
  bool empty() const { return owner_ == nullptr; }

  // A view of the first shape.numel() elements; throws InternalError if it does not fit.
  Tensor tensor(Shape shape, DType dtype) const;

 private:
  Allocator* owner_ = nullptr;
  Allocation a_{};
};

}  // namespace peakbound
