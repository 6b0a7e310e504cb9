// Token embedding over one vocabulary shard through the device's backend (math and
// shapes in kernels/cpu/embedding.h): forward WRITES out [T, H]; backward ADDS into
// dtable [rows, H]. ids are device memory, checked by the caller to lie in [0, V).
// Under bf16 (mixed precision): forward's table (the gathered shard) and out are bf16;
// backward reads a bf16 dout and adds into the fp32 dtable (a parameter gradient),
// bitwise as the f32 form on the widened dout.
#pragma once

#include <cstdint>

#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound::ops {

void embedding_forward(Device& dev, Stream& s, float* out, const std::int32_t* ids, const float* table,
                       std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_forward(Device& dev, Stream& s, bf16* out, const std::int32_t* ids, const bf16* table,
                       std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_backward(Device& dev, Stream& s, float* dtable, const std::int32_t* ids, const float* dout,
                        std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_backward(Device& dev, Stream& s, float* dtable, const std::int32_t* ids, const bf16* dout,
                        std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows);

}  // namespace peakbound::ops
