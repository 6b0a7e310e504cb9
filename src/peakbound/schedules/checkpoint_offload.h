// CheckpointedStack: L blocks trained with full activation checkpointing, each block
// keeping only its input (its boundary) from forward to backward, where it recomputes
// its internals from it. Two schedules behind one interface:
//   resident  the baseline: every boundary stays in the Arena (component checkpoints)
//             until its block's backward;
//   sco       Selective Checkpoint Offload: as soon as a boundary is written (x's copy
//             into boundary 0, block l - 1's output into boundary l), it is copied to
//             host memory (HostMemory, component checkpoints) on the copy engine while
//             block l reads it, its device slot reused once that copy has completed;
//             in backward boundaries come back into a fixed ring of prefetch_depth + 1
//             device slots (allocated once, at construction) ahead of the block that
//             needs them (prefetch_depth 0: one slot, each block running forward in
//             place in it, each copy waited for). The selective policy keeps the last K
//             boundaries resident (checkpoint_policy.h); K = L is the baseline.
// Every buffer the stack holds comes from checkpoint_buffers() (checkpoint_policy.h),
// the same numbers checkpoint_footprint() reports.
// Only data placement differs, so outputs and every gradient are bitwise equal
// between the schedules. The stack owns its boundaries: x is copied into boundary 0,
// and the caller may reuse x once forward returns; or the caller writes the input into
// boundary 0 itself (input()) and holds no buffer of its own for it.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/buffer.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/device/device.h"
#include "peakbound/nn/block.h"
#include "peakbound/schedules/checkpoint_link.h"
#include "peakbound/schedules/checkpoint_policy.h"

namespace peakbound {

class CheckpointedStack {
 public:
  // blocks are borrowed and must outlive the stack. boundary: the shape of every
  // block's input and output (e.g. [T, H]). Allocates the ring (device) and the
  // offloaded boundaries' host buffers (host) now. Throws InvalidArgument for bad
  // options (naming the option), OutOfBudget when the placement does not fit.
  CheckpointedStack(Device& dev, HostMemory& host, std::vector<Block*> blocks, Shape boundary,
                    DType dtype, const CheckpointOptions& options);
  ~CheckpointedStack();
  CheckpointedStack(const CheckpointedStack&) = delete;
  CheckpointedStack& operator=(const CheckpointedStack&) = delete;

  // Boundary 0's storage, for the caller to write the stack's input into (on the
  // compute stream) and pass to forward, which then copies nothing: the input needs no
  // buffer beside the stack's. Acquired at the first call before a forward.
  Tensor input();
  // x [boundary] -> y [boundary], both on the device, distinct. Keeps every block's
  // input per the schedule until backward. x may be input().
  void forward(const Tensor& x, const Tensor& y);
  // dy -> dx (device, distinct unless every block's backward runs in place, when dx may
  // be dy), recomputing block by block from the boundaries, last block first; parameter
  // gradients are added into by the blocks. Must follow forward. In place, every block
  // works on dx and the stack holds no gradient buffer (CheckpointBuffers::in_place).
  void backward(const Tensor& dy, const Tensor& dx);
  // The one-slot ring (prefetch depth 0) between a forward and its backward: the slot's
  // boundary (the last ringed block's input, the one boundary that ring never sends to the
  // host) is copied to `host` (a [boundary] host buffer the caller owns until backward)
  // on the compute stream and the slot's device memory is freed; backward first takes the
  // slot again and brings the boundary back (the copy on the compute stream, before the
  // block that reads it). For a caller whose work between forward and backward (a loss)
  // needs the device more than two copies of a boundary cost; the same bits.
  // InvalidArgument without a one-slot ring, outside forward..backward or parked already.
  void park_slot(void* host);

  const CheckpointOptions& options() const { return options_; }
  const CheckpointPlacement& placement() const { return buffers_.placement; }
  const CheckpointBuffers& buffers() const { return buffers_; }
  const CheckpointLink& link() const { return link_; }
  // The stack's blocks (its boundaries, one per checkpoint group: placement().layers).
  std::int64_t layers() const { return static_cast<std::int64_t>(blocks_.size()); }
  // Seconds compute has spent waiting for copies so far (a slot's D2H in forward, a
  // boundary's H2D in backward): the copy time that overlap did not hide.
  double stall_seconds() const { return stall_seconds_; }

 private:
  void* acquire_boundary(std::int64_t l);
  void* boundary_ptr(std::int64_t l) const;
  std::int64_t slot_of(std::int64_t k) const { return k % placement().ring_slots; }
  CheckpointGroup group(std::int64_t k) const;  // checkpoint group k's blocks
  Tensor view(const void* p) const;
  void forward_impl(const Tensor& x, const Tensor& y);
  void backward_impl(const Tensor& dy, const Tensor& dx);
  void abandon() noexcept;
  // may_alias: out may be in itself (an in-place stack's backward).
  void check_io(const Tensor& in, const Tensor& out, const char* what, bool may_alias = false) const;
  void wait_for_copy(const Event& e);

  Device& dev_;
  std::vector<Block*> blocks_;
  Shape shape_;
  DType dtype_;
  CheckpointOptions options_;
  CheckpointBuffers buffers_;
  std::uint64_t bytes_;  // one boundary, unrounded: buffers_.boundary.bytes
  CheckpointLink link_;

  std::vector<Buffer> ring_;       // R device slots, allocated once
  std::vector<Event> slot_free_;   // per slot: the D2H that last read it
  std::vector<Buffer> host_;       // per offloaded boundary, allocated once
  std::vector<Event> fetched_;     // per offloaded boundary: its H2D in this backward
  std::vector<Buffer> resident_;   // per resident boundary, allocated in forward
  void* input_ = nullptr;          // boundary 0 once input() acquired it, until forward
  void* parked_ = nullptr;         // park_slot's host buffer until backward takes it back
  bool forward_done_ = false;
  double stall_seconds_ = 0;
};

}  // namespace peakbound
