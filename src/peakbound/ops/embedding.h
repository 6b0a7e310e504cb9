// Token embedding over one vocabulary shard through the device's backend (math and
// shapes in kernels/cpu/embedding.h): forward WRITES out [T, H]; backward ADDS into
// dtable [rows, H]. ids are device memory, checked by the caller to lie in [0, V).
#pragma once

#include <cstdint>

#include "peakbound/device/device.h"

namespace peakbound::ops {

void embedding_forward(Device& dev, Stream& s, float* out, const std::int32_t* ids, const float* table,
                       std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows);
void embedding_backward(Device& dev, Stream& s, float* dtable, const std::int32_t* ids, const float* dout,
                        std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows);

}  // namespace peakbound::ops
