// The project's exactness metric over a tensor distributed over a group: each rank
// holds its part of the result `a` and the matching part of the reference; the
// relative error is max|a - ref| / max|ref| over the whole tensor (the plain
// max|a - ref| when the reference is all zeros). A NaN anywhere, in the result or
// the reference, on any rank, gives NaN: never a pass. Reduced in f64. Collective.
#pragma once

#include <cstdint>

#include "peakbound/comm/communicator.h"

namespace peakbound::verify {

double group_relative_error(Communicator& g, const float* a, const float* ref, std::int64_t n);

}  // namespace peakbound::verify
