// Rotary position embedding through the device's backend (math and conventions in
// kernels/cpu/rope.h). Tables cos / sin [T, D/2] are computed once per sequence
// and shared by q and k and by every layer; forward and backward rotate q [T, Hq, D]
// and k [T, Hkv, D] IN PLACE. Shapes are checked on the calling thread, so a bad
// one (odd D) throws InvalidArgument here rather than inside the stream. Under bf16
// (mixed precision) q / k and dq / dk are bf16 (the overloads below) and the tables
// stay fp32; the bf16 result is bitwise to_bf16(the f32 rotation of the widened input).
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"
#include "peakbound/model/rope_scaling.h"

namespace peakbound::ops {

// Elements in each of the cos and sin tables: T * D / 2.
std::int64_t rope_table_elems(std::int64_t t, std::int64_t d);

// With YaRN (model/rope_scaling.h): its frequencies and cos/sin factor.
void rope_tables(Device& dev, Stream& s, float* cos, float* sin, std::int64_t t, std::int64_t d,
                 std::int64_t offset, double theta, const RopeScaling& scaling = {});

// q [T, Hq, D] and k [T, Hkv, D] rotated by +angle. Either may be null with 0 heads.
void rope_forward(Device& dev, Stream& s, float* q, float* k, const float* cos, const float* sin,
                  std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d);
void rope_forward(Device& dev, Stream& s, bf16* q, bf16* k, const float* cos, const float* sin,
                  std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d);

// dq [T, Hq, D], dk [T, Hkv, D]: the gradients of the forward's outputs, rotated by
// -angle in place into the gradients of its inputs.
void rope_backward(Device& dev, Stream& s, float* dq, float* dk, const float* cos, const float* sin,
                   std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d);
void rope_backward(Device& dev, Stream& s, bf16* dq, bf16* dk, const float* cos, const float* sin,
                   std::int64_t t, std::int64_t q_heads, std::int64_t kv_heads, std::int64_t d);

}  // namespace peakbound::ops
