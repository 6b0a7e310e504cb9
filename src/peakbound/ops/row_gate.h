// The per-row sigmoid gate (Qwen2-MoE's shared_expert_gate) through the device's
// backend; math and aliasing in kernels/cpu/row_gate.h. Forward writes or ADDS INTO
// out [m, n]; backward WRITES dx [m, n] and dz [m]. Under bf16 (mixed precision) x,
// out, dout, dx and dz are bf16 and the logit z stays fp32 (the gate GEMM's fp32 C);
// dz, the bf16 operand of the gate's gradient GEMMs, must not overlap z there.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound::ops {

void row_gate_forward(Device& dev, Stream& s, float* out, const float* x, const float* z, std::int64_t m,
                      std::int64_t n, bool accumulate);
void row_gate_forward(Device& dev, Stream& s, bf16* out, const bf16* x, const float* z, std::int64_t m,
                      std::int64_t n, bool accumulate);
void row_gate_backward(Device& dev, Stream& s, float* dx, float* dz, const float* dout, const float* x,
                       const float* z, std::int64_t m, std::int64_t n);
void row_gate_backward(Device& dev, Stream& s, bf16* dx, bf16* dz, const bf16* dout, const bf16* x,
                       const float* z, std::int64_t m, std::int64_t n);

}  // namespace peakbound::ops
