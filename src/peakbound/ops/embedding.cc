#include "peakbound/ops/embedding.h"

#include "peakbound/kernels/cpu/embedding.h"
#include "peakbound/kernels/cuda/layers.h"
#include "peakbound/ops/backend.h"

namespace peakbound::ops {

namespace {

// S: the storage of table and out (float or bf16).
template <typename S>
void forward(Device& dev, Stream& s, S* out, const std::int32_t* ids, const S* table, std::int64_t T, std::int64_t H,
             std::int64_t row_offset, std::int64_t rows) {
  dispatch(dev, s, "embedding_forward", {out, ids, table},
           [&](void* stream) { cuda::embedding_forward(stream, out, ids, table, T, H, row_offset, rows); },
           [=] { cpu::embedding_forward(out, ids, table, T, H, row_offset, rows); });
}

// G: the storage of dout (float or bf16); dtable is fp32.
template <typename G>
void backward(Device& dev, Stream& s, float* dtable, const std::int32_t* ids, const G* dout, std::int64_t T,
              std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  dispatch(dev, s, "embedding_backward", {dtable, ids, dout},
           [&](void* stream) { cuda::embedding_backward(stream, dtable, ids, dout, T, H, row_offset, rows); },
           [=] { cpu::embedding_backward(dtable, ids, dout, T, H, row_offset, rows); });
}

}  // namespace

void embedding_forward(Device& dev, Stream& s, float* out, const std::int32_t* ids, const float* table,
                       std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  forward(dev, s, out, ids, table, T, H, row_offset, rows);
}

void embedding_forward(Device& dev, Stream& s, bf16* out, const std::int32_t* ids, const bf16* table,
                       std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  forward(dev, s, out, ids, table, T, H, row_offset, rows);
}

void embedding_backward(Device& dev, Stream& s, float* dtable, const std::int32_t* ids, const float* dout,
                        std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  backward(dev, s, dtable, ids, dout, T, H, row_offset, rows);
}

void embedding_backward(Device& dev, Stream& s, float* dtable, const std::int32_t* ids, const bf16* dout,
                        std::int64_t T, std::int64_t H, std::int64_t row_offset, std::int64_t rows) {
  backward(dev, s, dtable, ids, dout, T, H, row_offset, rows);
}

}  // namespace peakbound::ops
