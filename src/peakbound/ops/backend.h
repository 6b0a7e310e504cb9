// The op layer's dispatch: every op in ops/ takes the Device and a Stream of it and
// runs the kernel of the device's backend (kernels/cpu now, kernels/cuda once that
// backend lands). A backend without the op fails with Unavailable naming both, so a
// build without CUDA always links and says clearly what is missing (mlx's no_gpu).
#pragma once

#include <string_view>

#include "peakbound/device/device.h"

namespace peakbound::ops {

// Throws Unavailable: "op 'gemm' has no cuda kernel yet (device cuda:0)".
[[noreturn]] void no_kernel(const Device& dev, std::string_view op);

}  // namespace peakbound::ops
