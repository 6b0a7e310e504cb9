#include "peakbound/layers/layer_tensor_checks.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

void expect_layer_tensor(const Tensor& t, const Shape& s, DType want, std::string_view layer, std::string_view which,
                         std::string_view name) {
  if (t.raw() == nullptr || t.dtype() != want || !(t.shape() == s))
    throw InvalidArgument(std::string(layer) + ": " + std::string(which) + " " + std::string(name) + " is " +
                          t.shape().str() + " " + std::string(dtype_name(t.dtype())) +
                          (t.raw() == nullptr ? " (null)" : "") + ", want " + s.str() + " " +
                          std::string(dtype_name(want)));
}

std::int64_t layer_activation_rows(const Tensor& t, std::int64_t hidden, DType want, std::string_view layer,
                                   std::string_view what) {
  PB_CHECK_MSG(t.dtype() == want && t.ndim() == 2 && t.dim(1) == hidden,
               std::string(layer) + ": " + std::string(what) + " is " + t.shape().str() + " " +
                   std::string(dtype_name(t.dtype())) + ", want [T, " + std::to_string(hidden) + "] " +
                   std::string(dtype_name(want)));
  return t.dim(0);
}

}  // namespace peakbound
