#include "peakbound/layers/decoder_layer.h"

#include "peakbound/core/error.h"

namespace peakbound {

DecoderLayerBuffers decoder_layer_buffers(std::int64_t tokens, std::int64_t hidden, std::uint64_t elem_bytes) {
  if (tokens < 0 || hidden < 1) throw InvalidArgument("decoder layer: tokens must be >= 0 and hidden >= 1");
  const std::uint64_t n =
      checked_mul(static_cast<std::uint64_t>(tokens), static_cast<std::uint64_t>(hidden), "decoder layer [T, H]");
  DecoderLayerBuffers b;
  b.mid = buffer_spec(Component::layer, n, elem_bytes);
  return b;
}

DecoderLayerBuffers decoder_layer_buffers(std::int64_t tokens, std::int64_t hidden, Precision p) {
  return decoder_layer_buffers(tokens, hidden, dtype_size(activation_dtype(p)));
}

DecoderLayer::DecoderLayer(Device& dev, std::int64_t hidden, Block& attention, Block& mlp)
    : dev_(dev), hidden_(hidden), attention_(attention), mlp_(mlp) {
  if (!attention_.backward_in_place())
    throw InvalidArgument("decoder layer: the attention sublayer's backward must run in place");
}

void DecoderLayer::forward(const Tensor& x, const Tensor& y) { forward_as(x, y, false); }

void DecoderLayer::forward_recompute(const Tensor& x, const Tensor& y) { forward_as(x, y, true); }

void DecoderLayer::forward_as(const Tensor& x, const Tensor& y, bool recompute) {
  if (y.raw() == x.raw() && !forward_in_place())
    throw InvalidArgument("decoder layer: an in-place forward needs sublayers that both run in place");
  const auto mlp = [&](const Tensor& in, const Tensor& out) {
    if (recompute)
      mlp_.forward_recompute(in, out);
    else
      mlp_.forward(in, out);
  };
  if (mlp_.forward_in_place()) {
    // No mid: the attention writes into y and the MLP runs on it in place.
    attention_.forward(x, y);
    mlp(y, y);
    return;
  }
  const DecoderLayerBuffers b = decoder_layer_buffers(x.dim(0), hidden_, dtype_size(x.dtype()));
  Buffer mid = dev_.allocate(b.mid.component, b.mid.bytes);
  const Tensor m = mid.tensor(x.shape(), x.dtype());
  attention_.forward(x, m);
  mlp(m, y);
}

void DecoderLayer::backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (dx.raw() == dy.raw() && !mlp_.backward_in_place())
    throw InvalidArgument("decoder layer: an in-place backward needs an MLP sublayer that runs in place");
  if (by_rows()) {
    // No mid: the MLP's backward takes the attention's output a row tile at a time.
    attention_.forward_for_rows(x);
    Block::RowSource mid{x.dim(0), hidden_, x.dtype(),
                         [&](std::int64_t first, std::int64_t rows, void* dst) {
                           attention_.forward_rows(x, first, rows, dst);
                         }};
    mlp_.backward_rows(mid, dy, dx);
    attention_.backward(x, dx, dx);
    return;
  }
  const DecoderLayerBuffers b = decoder_layer_buffers(x.dim(0), hidden_, dtype_size(x.dtype()));
  Buffer mid = dev_.allocate(b.mid.component, b.mid.bytes);
  const Tensor m = mid.tensor(x.shape(), x.dtype());
  attention_.forward_for_backward(x, m);  // keeps its internals for its backward below
  // d mid into dx (the MLP's backward in place when dx is dy), then d x over it.
  mlp_.backward(m, dy, dx);
  mid.reset();  // its last reader was the MLP's backward (stream-ordered reuse)
  attention_.backward(x, dx, dx);
}

std::vector<Parameter> DecoderLayer::parameters() const {
  std::vector<Parameter> out = attention_.parameters();
  for (Parameter& p : mlp_.parameters()) out.push_back(std::move(p));
  return out;
}

void DecoderLayer::zero_grad() {
  attention_.zero_grad();
  mlp_.zero_grad();
}

}  // namespace peakbound
