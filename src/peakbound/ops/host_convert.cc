#include "peakbound/ops/host_convert.h"

#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound::ops {

void host_to_bf16(bf16* out, const float* in, std::int64_t n) { cpu::to_bf16(out, in, n); }

void host_to_f32(float* out, const bf16* in, std::int64_t n) { cpu::to_f32(out, in, n); }

}  // namespace peakbound::ops
