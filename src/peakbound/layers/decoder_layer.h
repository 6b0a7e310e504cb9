// DecoderLayer: one transformer decoder layer as a Block, the attention sublayer then
// the MLP sublayer (MoE or dense), each with its pre-norm and residual:
//   mid = attention(x)   (x + self_attn(input_layernorm(x)))
//   y   = mlp(mid)       (mid + mlp(post_attention_layernorm(mid)))
// The checkpointed stack keeps only x (the layer's boundary). Backward recomputes mid
// with the attention sublayer's forward (forward_for_backward: the attention keeps what
// its backward needs), runs the MLP sublayer's backward from mid into dx (it recomputes
// its own internals), frees mid, then the attention sublayer's backward from x in place
// on dx: the layer's only gradient buffer is the caller's dx, which may be dy itself.
// With an MLP sublayer whose forward runs in place (Block::forward_in_place, the MoE
// layer) the forward holds no mid: the attention writes into y and the MLP turns y into
// its own output there; the backward's recomputation keeps mid (the MLP's backward needs
// its input beside dx).
// With sublayers that can (Block::forward_by_rows, backward_by_rows: the attention and
// MoE layers) the backward holds no mid either: the attention's recomputation keeps its
// output o, and each of the MLP's row tiles takes its rows of mid = x + o Wo^T as it
// starts (by_rows()).
// mid is a per-call buffer (component layer, [T, H]) in x's dtype: f32, or bf16 when both
// sublayers run in bf16 (AttentionLayerConfig::precision, MoeLayerConfig::precision; each
// sublayer refuses tensors of the other dtype).
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/nn/block.h"

namespace peakbound {

// The layer's own buffer on T tokens of hidden H: mid [T, H] in forward (unless the MLP
// runs in place), and in backward until the MLP sublayer's backward is done (unless
// by_rows()) (component layer).
struct DecoderLayerBuffers {
  BufferSpec mid;
};
DecoderLayerBuffers decoder_layer_buffers(std::int64_t tokens, std::int64_t hidden, std::uint64_t elem_bytes);
// The same in activation_dtype(p) (what the layer allocates for x of that dtype).
DecoderLayerBuffers decoder_layer_buffers(std::int64_t tokens, std::int64_t hidden, Precision p);

class DecoderLayer final : public Block {
 public:
  // Both sublayers are borrowed and must outlive the layer; both map [T, H] to [T, H],
  // and the attention's backward runs in place (InvalidArgument otherwise).
  DecoderLayer(Device& dev, std::int64_t hidden, Block& attention, Block& mlp);

  // y may be x when both sublayers run forward in place (forward_in_place).
  void forward(const Tensor& x, const Tensor& y) override;
  // forward with the MLP sublayer's forward_recompute (the attention records nothing).
  void forward_recompute(const Tensor& x, const Tensor& y) override;
  bool forward_in_place() const override { return attention_.forward_in_place() && mlp_.forward_in_place(); }
  // dx may be dy (in place).
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  bool backward_in_place() const override { return true; }
  // True when the backward passes mid by rows (no mid buffer).
  bool by_rows() const { return attention_.forward_by_rows() && mlp_.backward_by_rows(); }
  // The attention sublayer's parameters, then the MLP sublayer's.
  std::vector<Parameter> parameters() const override;
  void zero_grad() override;

 private:
  void forward_as(const Tensor& x, const Tensor& y, bool recompute);

  Device& dev_;
  std::int64_t hidden_;
  Block& attention_;
  Block& mlp_;
};

}  // namespace peakbound
