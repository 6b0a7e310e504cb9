// Tensor: a light, non-owning view of contiguous row-major memory: pointer, shape,
// dtype and where the memory lives. No autograd: kernels are plain functions that
// take tensors (or raw pointers) and write their outputs in place.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"

namespace peakbound {

enum class Location : std::uint8_t { host, device };

// Up to 6 dimensions; a scalar has ndim 0 and numel 1.
class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);

  int ndim() const { return ndim_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  // A copy with dimension i set to v.
  Shape with(int i, std::int64_t v) const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[4, 256]"

 private:
  std::array<std::int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, Shape shape, DType dtype, Location loc)
      : data_(data), shape_(shape), dtype_(dtype), loc_(loc) {}

  void* raw() const { return data_; }
  template <typename T> T* data() const {
    PB_CHECK_MSG(dtype_of<T>() == dtype_, "tensor is " + std::string(dtype_name(dtype_)));
    return static_cast<T*>(data_);
  }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_[i]; }
  int ndim() const { return shape_.ndim(); }
  DType dtype() const { return dtype_; }
  Location location() const { return loc_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::uint64_t nbytes() const { return static_cast<std::uint64_t>(numel()) * dtype_size(dtype_); }

  // Rows [begin, end) along dim 0.
  Tensor rows(std::int64_t begin, std::int64_t end) const;
  // Same memory, another shape with the same number of elements.
  Tensor view(Shape shape) const;

 private:
  void* data_ = nullptr;
  Shape shape_{};
  DType dtype_ = DType::f32;
  Location loc_ = Location::host;
};

}  // namespace peakbound
