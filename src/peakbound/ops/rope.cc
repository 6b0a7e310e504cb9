#include "peakbound/ops/rope.h"

#include <string>

#include "peakbound/core/error.h"
#include "peakbound/kernels/cpu/rope.h"
#include "peakbound/kernels/cuda/layers.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

namespace {

void check_heads(std::int64_t q_heads, std::int64_t kv_heads) {
  if (q_heads < 0 || kv_heads < 0)
    throw InvalidArgument("rope: head counts must be >= 0, got q " + std::to_string(q_heads) +
                          ", kv " + std::to_string(kv_heads));
}

}  // namespace

std::int64_t rope_table_elems(std::int64_t t, std::int64_t d) {
  cpu::rope_check(t, d, 0, 1.0);
  return t * (d / 2);
}

void rope_tables(Device& dev, Stream& s, float* cos, float* sin, std::int64_t t, std::int64_t d,
                 std::int64_t offset, double theta, const RopeScaling& scaling) {
  dispatch(dev, s, "rope_tables", {cos, sin},
           [&] { cpu::rope_check(t, d, offset, theta); },
           [&](void* stream) { cuda::rope_tables(stream, cos, sin, t, d, offset, theta, scaling); },
           [=] { cpu::rope_tables(cos, sin, t, d, offset, theta, scaling); });
}

namespace {

// q and k (float or bf16) rotated by sign x angle on the device's backend.
template <typename S>
void rotate(Device& dev, Stream& s, const char* op, S* q, S* k, const float* cos, const float* sin,
            std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d, float sign) {
  dispatch(dev, s, op, {q, k, cos, sin},
           [&] { cpu::rope_check(t, d, 0, 1.0); check_heads(q_heads, kv_heads); },
           [&](void* stream) {
             cuda::rope_rotate(stream, q, cos, sin, t, q_heads, d, sign);
             cuda::rope_rotate(stream, k, cos, sin, t, kv_heads, d, sign);
           },
           [=] {
             if (sign > 0) {
               cpu::rope_forward(q, cos, sin, t, q_heads, d);
               cpu::rope_forward(k, cos, sin, t, kv_heads, d);
             } else {
               cpu::rope_backward(q, cos, sin, t, q_heads, d);
               cpu::rope_backward(k, cos, sin, t, kv_heads, d);
             }
           });
}

}  // namespace

void rope_forward(Device& dev, Stream& s, float* q, float* k, const float* cos, const float* sin,
                  std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d) {
  rotate(dev, s, "rope_forward", q, k, cos, sin, t, q_heads, kv_heads, d, 1.0f);
}

void rope_forward(Device& dev, Stream& s, bf16* q, bf16* k, const float* cos, const float* sin,
                  std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d) {
  rotate(dev, s, "rope_forward", q, k, cos, sin, t, q_heads, kv_heads, d, 1.0f);
}

void rope_backward(Device& dev, Stream& s, float* dq, float* dk, const float* cos, const float* sin,
                   std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d) {
  rotate(dev, s, "rope_backward", dq, dk, cos, sin, t, q_heads, kv_heads, d, -1.0f);
}

void rope_backward(Device& dev, Stream& s, bf16* dq, bf16* dk, const float* cos, const float* sin,
                   std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d) {
  rotate(dev, s, "rope_backward", dq, dk, cos, sin, t, q_heads, kv_heads, d, -1.0f);
}

}  // namespace peakbound::ops
