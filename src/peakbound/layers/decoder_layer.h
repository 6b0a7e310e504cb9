// DecoderLayer: one transformer decoder layer as a Block, the attention sublayer then
// the MLP sublayer (MoE or dense), each with its pre-norm and residual:
//   mid = attention(x)   (x + self_attn(input_layernorm(x)))
//   y   = mlp(mid)       (mid + mlp(post_attention_layernorm(mid)))
// The checkpointed stack keeps only x (the layer's boundary). Backward recomputes mid
// with the attention sublayer's forward, runs the MLP sublayer's backward from mid (it
// recomputes its own internals), then the attention sublayer's backward from x (which
// recomputes its internals again: one extra attention forward per layer per step, the
// price of keeping no mid-layer activation; see the note in docs/training.md).
// mid and its gradient are per-call buffers (component layer, [T, H] each), in x's dtype:
// f32, or bf16 when both sublayers run in bf16 (AttentionLayerConfig::precision,
// MoeLayerConfig::precision; each sublayer refuses tensors of the other dtype).
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/core/precision.h"
#include "peakbound/device/device.h"
#include "peakbound/nn/block.h"

namespace peakbound {

// The layer's own buffers on T tokens of hidden H: mid [T, H] in forward; mid and
// d_mid [T, H] in backward (component layer).
struct DecoderLayerBuffers {
  BufferSpec mid, d_mid;
};
DecoderLayerBuffers decoder_layer_buffers(std::int64_t tokens, std::int64_t hidden, std::uint64_t elem_bytes);
// The same in activation_dtype(p) (what the layer allocates for x of that dtype).
DecoderLayerBuffers decoder_layer_buffers(std::int64_t tokens, std::int64_t hidden, Precision p);

class DecoderLayer final : public Block {
 public:
  // Both sublayers are borrowed and must outlive the layer; both map [T, H] to [T, H].
  DecoderLayer(Device& dev, std::int64_t hidden, Block& attention, Block& mlp);

  void forward(const Tensor& x, const Tensor& y) override;
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override;
  // The attention sublayer's parameters, then the MLP sublayer's.
  std::vector<Parameter> parameters() const override;
  void zero_grad() override;

 private:
  Device& dev_;
  std::int64_t hidden_;
  Block& attention_;
  Block& mlp_;
};

}  // namespace peakbound
