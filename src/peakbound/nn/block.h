// Block: one layer of a checkpointed stack, seen by the schedules that place its
// boundaries. A block maps its input x to its output y of the same shape and dtype
// (the residual stream, [tokens, hidden]); backward gets x back (the checkpoint
// boundary) with dy, recomputes whatever internals it needs from x, writes dx and
// ADDS into its parameter gradients. Internals are allocated from the device's Arena
// inside each call (component `layer`), so nothing but the boundary outlives a call.
// The residual MLP block implements it today; the MoE transformer block will too.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/core/tensor.h"

namespace peakbound {

// A parameter and its gradient (same shape); both live on the block's device.
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;
};

class Block {
 public:
  virtual ~Block() = default;

  // x, y: [tokens, hidden] on the device; y must not alias x unless forward_in_place().
  virtual void forward(const Tensor& x, const Tensor& y) = 0;
  // x: the same input the forward saw; dy: the gradient of y. Writes dx (same shape;
  // must not alias x, nor dy unless backward_in_place()), adds into every parameter's grad.
  virtual void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) = 0;
  // True when backward may write dx over dy (dx.raw() == dy.raw(): the same buffer, in
  // place), so a stack of such blocks needs no gradient buffers of its own.
  virtual bool backward_in_place() const { return false; }
  // True when forward may write y over x (y.raw() == x.raw()): a decoder layer then runs
  // its MLP sublayer on the attention's output in place, with no buffer between them, and
  // a checkpointed stack with a one-slot ring runs its blocks in that slot.
  virtual bool forward_in_place() const { return false; }
  // A forward whose backward comes next, with the same x (a decoder layer's backward
  // recomputing its attention sublayer): the block may keep some of what that backward
  // needs instead of computing it again there, holding it until the backward (or the
  // next forward). The default is forward.
  virtual void forward_for_backward(const Tensor& x, const Tensor& y) { forward(x, y); }
  // The forward again inside a checkpointed stack's backward (CheckpointOptions::
  // group_layers: a group's blocks recompute their inputs): the same y bit for bit, without
  // what a forward records for the step (a router's load counts and balance statistics,
  // which the step's forward took already). The default is forward.
  virtual void forward_recompute(const Tensor& x, const Tensor& y) { forward(x, y); }

  // A block's output produced a row range at a time instead of whole (a decoder layer's
  // backward feeding its attention sublayer's output to its MLP sublayer's tiles, so no
  // [tokens, hidden] buffer holds it). forward_for_rows(x) is forward_for_backward with no
  // y: it keeps what forward_rows and the backward after it need; forward_rows(x, first,
  // rows, y) then writes rows [first, first + rows) of the output into y ([rows, hidden],
  // x's dtype), bitwise what forward would have written there. Only where
  // forward_by_rows(); the defaults refuse.
  virtual bool forward_by_rows() const { return false; }
  virtual void forward_for_rows(const Tensor& /*x*/) {
    throw InternalError("block: this block does not produce its output by rows");
  }
  virtual void forward_rows(const Tensor& /*x*/, std::int64_t /*first*/, std::int64_t /*rows*/, void* /*y*/) {
    throw InternalError("block: this block does not produce its output by rows");
  }
  // An input [tokens, hidden] of dtype given a row range at a time: fill(first, rows, dst)
  // writes rows [first, first + rows) into dst ([rows, hidden]).
  struct RowSource {
    std::int64_t tokens = 0, hidden = 0;
    DType dtype = DType::f32;
    std::function<void(std::int64_t first, std::int64_t rows, void* dst)> fill;
  };
  // backward with its input from a RowSource (each row asked for once),
  // where backward_by_rows(); the same dx and gradients, bit for bit. The default refuses.
  virtual bool backward_by_rows() const { return false; }
  virtual void backward_rows(const RowSource& /*x*/, const Tensor& /*dy*/, const Tensor& /*dx*/) {
    throw InternalError("block: this block does not take its input by rows");
  }

  // Parameters in a fixed order, with their gradients.
  virtual std::vector<Parameter> parameters() const = 0;
  // Sets every parameter gradient to zero.
  virtual void zero_grad() = 0;
};

}  // namespace peakbound
