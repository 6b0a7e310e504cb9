// The checks a layer makes of the tensors its caller hands it (attention, MoE): one place
// for the one-line messages, each naming the layer.
#pragma once

#include <cstdint>
#include <string_view>

#include "peakbound/core/dtype.h"
#include "peakbound/core/tensor.h"

namespace peakbound {

// A parameter or gradient tensor: InvalidArgument
// "<layer>: <which> <name> is <shape> <dtype>[ (null)], want <s> <want>" unless t is
// non-null, of dtype want and of shape s.
void expect_layer_tensor(const Tensor& t, const Shape& s, DType want, std::string_view layer, std::string_view which,
                         std::string_view name);

// An activation the layer is called with: t must be [T, hidden] of dtype want (a broken
// invariant otherwise: InternalError "<layer>: <what> is <shape> <dtype>, want [T, hidden]
// <want>"). Returns T.
std::int64_t layer_activation_rows(const Tensor& t, std::int64_t hidden, DType want, std::string_view layer,
                                   std::string_view what);

}  // namespace peakbound
