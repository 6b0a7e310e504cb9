#include "peakbound/core/tensor.h"

#include "peakbound/core/buffer.h"

namespace peakbound {

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  PB_CHECK_MSG(dims.size() <= static_cast<std::size_t>(kMaxDims), "too many dimensions");
  for (std::int64_t d : dims) {
    PB_CHECK_MSG(d >= 0, "negative dimension");
    dims_[static_cast<std::size_t>(ndim_++)] = d;
  }
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<std::size_t>(i)];
  return n;
}

Shape Shape::with(int i, std::int64_t v) const {
  PB_CHECK_MSG(0 <= i && i < ndim_ && v >= 0, "dimension " + std::to_string(i) + " of " + str());
  Shape s = *this;
  s.dims_[static_cast<std::size_t>(i)] = v;
  return s;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[static_cast<std::size_t>(i)] != o.dims_[static_cast<std::size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<std::size_t>(i)]);
  return s + "]";
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
  PB_CHECK_MSG(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0),
               "row range [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_.str());
  std::int64_t row = dim(0) == 0 ? 0 : numel() / dim(0);
  Shape s = shape_.with(0, end - begin);
  char* p = static_cast<char*>(data_);
  void* start = p ? p + static_cast<std::uint64_t>(begin * row) * dtype_size(dtype_) : nullptr;
  return Tensor(start, s, dtype_, loc_);
}

Tensor Tensor::view(Shape shape) const {
  PB_CHECK_MSG(shape.numel() == numel(), "view " + shape.str() + " of " + shape_.str());
  return Tensor(data_, shape, dtype_, loc_);
}

Tensor Buffer::tensor(Shape shape, DType dtype) const {
  std::uint64_t need = static_cast<std::uint64_t>(shape.numel()) * dtype_size(dtype);
  PB_CHECK_MSG(need <= a_.bytes, "tensor " + shape.str() + " does not fit in a buffer of " +
                                     std::to_string(a_.bytes) + " bytes");
  Location loc = owner_ ? owner_->location() : Location::host;
  return Tensor(a_.ptr, shape, dtype, loc);
}

}  // namespace peakbound
