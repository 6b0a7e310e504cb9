#include "peakbound/schedules/checkpoint_offload.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

std::vector<Block*> checked_blocks(std::vector<Block*> blocks) {
  if (blocks.empty()) throw InvalidArgument("checkpoint layers must be >= 1 (the stack got no blocks)");
  for (Block* b : blocks) PB_CHECK_MSG(b != nullptr, "checkpointed stack: null block");
  return blocks;
}

}  // namespace

CheckpointedStack::CheckpointedStack(Device& dev, HostMemory& host, std::vector<Block*> blocks, Shape boundary,
                                     DType dtype, const CheckpointOptions& options)
    : dev_(dev),
      blocks_(checked_blocks(std::move(blocks))),
      shape_(boundary),
      dtype_(dtype),
      options_(options),
      buffers_(checkpoint_buffers(layers(), static_cast<std::uint64_t>(boundary.numel()), dtype_size(dtype), options,
                                  std::all_of(blocks_.begin(), blocks_.end(),
                                              [](const Block* b) { return b->backward_in_place(); }))),
      bytes_(buffers_.boundary.bytes),
      link_(dev, dev.copy_stream(), options.link_gbps) {
  const CheckpointPlacement& p = placement();
  // A one-slot ring: group k's first block writes boundary k + 1 over its own input
  // whenever both are ring boundaries (k + 1 < M).
  if (p.ring_slots == 1)
    for (std::int64_t k = 0; k + 1 < p.ringed(); ++k) {
      const std::int64_t l = group(k).first;
      if (!blocks_[static_cast<std::size_t>(l)]->forward_in_place())
        throw InvalidArgument("checkpoint prefetch_depth 0 (a one-slot ring) needs blocks whose forward runs in "
                              "place; block " + std::to_string(l) + "'s does not (use prefetch_depth >= 1)");
    }
  // A group's blocks after its first run in place on its output (no boundary between them).
  for (std::int64_t k = 0; k < p.layers; ++k) {
    const CheckpointGroup g = group(k);
    for (std::int64_t l = g.first + 1; l < g.first + g.count; ++l)
      if (!blocks_[static_cast<std::size_t>(l)]->forward_in_place())
        throw InvalidArgument("checkpoint group_layers " + std::to_string(options.group_layers) +
                              " needs blocks whose forward runs in place; block " + std::to_string(l) +
                              "'s does not (use group_layers 1)");
  }
  const auto R = static_cast<std::size_t>(p.ring_slots);
  const auto O = static_cast<std::size_t>(p.offloaded);
  ring_.reserve(R);
  for (std::size_t s = 0; s < R; ++s) ring_.push_back(dev_.allocate(buffers_.boundary.component, buffers_.boundary.bytes));
  slot_free_.resize(R);
  host_.reserve(O);
  for (std::size_t l = 0; l < O; ++l)
    host_.push_back(host.allocate(buffers_.host_boundary.component, buffers_.host_boundary.bytes));
  fetched_.resize(O);
  resident_.resize(static_cast<std::size_t>(p.resident));
}

CheckpointedStack::~CheckpointedStack() {
  try {
    dev_.synchronize(link_.stream());
  } catch (...) {
    // A failed copy was reported by the call that waited on it; destruction must not throw.
  }
}

Tensor CheckpointedStack::view(const void* p) const {
  return Tensor(const_cast<void*>(p), shape_, dtype_, Location::device);
}

// Where boundary l lives: a ring slot for l < M, else its own resident buffer.
void* CheckpointedStack::boundary_ptr(std::int64_t l) const {
  const std::int64_t m = placement().ringed();
  if (l < m) return ring_[static_cast<std::size_t>(slot_of(l))].data();
  return resident_[static_cast<std::size_t>(l - m)].data();
}

// Storage for boundary l before it is written: a resident buffer is allocated now; a
// ring slot is reused only after the D2H of its previous boundary has completed.
void* CheckpointedStack::acquire_boundary(std::int64_t l) {
  const std::int64_t m = placement().ringed();
  if (l >= m) {
    Buffer& b = resident_[static_cast<std::size_t>(l - m)];
    b = dev_.allocate(buffers_.boundary.component, buffers_.boundary.bytes);
    return b.data();
  }
  const auto s = static_cast<std::size_t>(slot_of(l));
  wait_for_copy(slot_free_[s]);
  slot_free_[s] = Event();
  // A slot a parked step left freed (abandoned before its backward) is taken again.
  if (ring_[s].bytes() == 0) ring_[s] = dev_.allocate(buffers_.boundary.component, buffers_.boundary.bytes);
  return ring_[s].data();
}

// Compute waits for a copy; on the CPU device (inline compute) this blocks the caller,
// so the time it takes is exactly the copy time overlap failed to hide.
void CheckpointedStack::wait_for_copy(const Event& e) {
  const auto t0 = std::chrono::steady_clock::now();
  dev_.wait(dev_.compute_stream(), e);
  stall_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CheckpointedStack::check_io(const Tensor& in, const Tensor& out, const char* what, bool may_alias) const {
  PB_CHECK_MSG(in.shape() == shape_ && out.shape() == shape_ && in.dtype() == dtype_ && out.dtype() == dtype_,
               std::string("checkpointed stack ") + what + ": tensors must be " + shape_.str() + " " +
                   std::string(dtype_name(dtype_)));
  PB_CHECK_MSG(in.raw() != out.raw() || may_alias,
               std::string("checkpointed stack ") + what + ": input and output must differ");
}

Tensor CheckpointedStack::input() {
  PB_CHECK_MSG(!forward_done_, "checkpointed stack: input() between a forward and its backward");
  if (input_ == nullptr) input_ = acquire_boundary(0);
  return view(input_);
}

void CheckpointedStack::forward(const Tensor& x, const Tensor& y) {
  PB_CHECK_MSG(!forward_done_, "checkpointed stack: forward called twice without a backward");
  check_io(x, y, "forward");
  try {
    forward_impl(x, y);
  } catch (...) {
    abandon();
    throw;
  }
  forward_done_ = true;
}

CheckpointGroup CheckpointedStack::group(std::int64_t k) const {
  return checkpoint_group(layers(), options_.group_layers, k);
}

void CheckpointedStack::forward_impl(const Tensor& x, const Tensor& y) {
  Stream& compute = dev_.compute_stream();
  const std::int64_t n = placement().layers, O = placement().offloaded;
  // Boundary l, once the compute that writes it is done, goes to the host while block l
  // reads it: both only read it, and the copy has block l's compute to hide behind.
  auto offload = [&](std::int64_t l, const void* boundary) {
    if (l >= O) return;
    dev_.wait(link_.stream(), dev_.record(compute));
    slot_free_[static_cast<std::size_t>(slot_of(l))] =
        link_.copy(host_[static_cast<std::size_t>(l)].data(), boundary, bytes_, CopyKind::device_to_host);
  };
  void* in = input_ != nullptr ? input_ : acquire_boundary(0);
  input_ = nullptr;
  if (x.raw() != in) dev_.memcpy_async(in, x.raw(), bytes_, CopyKind::device_to_device, compute);
  offload(0, in);
  for (std::int64_t k = 0; k < n; ++k) {
    // One ring slot: out is in itself (in place), once in's D2H has completed. The group's
    // other blocks run in place on out: their inputs are recomputed in backward.
    void* out = k + 1 < n ? acquire_boundary(k + 1) : y.raw();
    const CheckpointGroup g = group(k);
    blocks_[static_cast<std::size_t>(g.first)]->forward(view(in), view(out));
    for (std::int64_t l = g.first + 1; l < g.first + g.count; ++l)
      blocks_[static_cast<std::size_t>(l)]->forward(view(out), view(out));
    if (k + 1 < n) offload(k + 1, out);
    in = out;
  }
}

void CheckpointedStack::park_slot(void* host) {
  const CheckpointPlacement& p = placement();
  if (!forward_done_ || p.ring_slots != 1 || p.ringed() == 0 || parked_ != nullptr || host == nullptr)
    throw InvalidArgument("checkpointed stack: park_slot needs a one-slot ring (prefetch_depth 0) between a forward "
                          "and its backward, parked once, and a host buffer");
  Stream& compute = dev_.compute_stream();
  wait_for_copy(slot_free_[0]);
  slot_free_[0] = Event();
  // Ordered after the last block's forward (it read the slot); whatever reuses the freed
  // memory next is ordered after the copy on the same stream.
  dev_.memcpy_async(host, ring_[0].data(), bytes_, CopyKind::device_to_host, compute);
  ring_[0].reset();
  parked_ = host;
}

void CheckpointedStack::backward(const Tensor& dy, const Tensor& dx) {
  PB_CHECK_MSG(forward_done_, "checkpointed stack: backward without a forward");
  check_io(dy, dx, "backward", /*may_alias=*/buffers_.in_place);  // an in-place stack may take dx == dy
  try {
    backward_impl(dy, dx);
  } catch (...) {
    abandon();
    throw;
  }
  forward_done_ = false;
}

void CheckpointedStack::backward_impl(const Tensor& dy, const Tensor& dx) {
  Stream& compute = dev_.compute_stream();
  const std::int64_t L = layers(), n = placement().layers, M = placement().ringed(), O = placement().offloaded;
  // In place (every block's backward may write dx over dy): dy is copied into dx once and
  // every block turns it into its own dx there. Otherwise the residual-stream gradient
  // ping-pongs between two buffers and the last block writes dx.
  if (buffers_.in_place && dx.raw() != dy.raw())
    dev_.memcpy_async(dx.raw(), dy.raw(), dy.nbytes(), CopyKind::device_to_device, compute);
  Buffer grad_a, grad_b;
  if (buffers_.grad_buffers == 2) {
    grad_a = dev_.allocate(buffers_.grad.component, buffers_.grad.bytes);
    grad_b = dev_.allocate(buffers_.grad.component, buffers_.grad.bytes);
  }
  if (parked_ != nullptr) {  // park_slot's boundary back into the slot, before its block reads it
    ring_[0] = dev_.allocate(buffers_.boundary.component, buffers_.boundary.bytes);
    dev_.memcpy_async(ring_[0].data(), parked_, bytes_, CopyKind::host_to_device, compute);
    parked_ = nullptr;
  }
  const void* g = buffers_.in_place ? dx.raw() : dy.raw();
  std::int64_t next_fetch = O - 1;  // highest offloaded boundary not yet fetched
  for (std::int64_t k = n - 1; k >= 0; --k) {
    if (k < O) wait_for_copy(fetched_[static_cast<std::size_t>(k)]);
    // The group's forward again from its boundary to the inputs of its other blocks
    // (recompute buffers, each freed once its block's backward is done), then its blocks'
    // backward, last first.
    const CheckpointGroup grp = group(k);
    std::vector<Buffer> inner(static_cast<std::size_t>(grp.count - 1));
    const void* in = boundary_ptr(k);
    for (std::size_t j = 0; j < inner.size(); ++j) {
      inner[j] = dev_.allocate(buffers_.boundary.component, buffers_.boundary.bytes);
      blocks_[static_cast<std::size_t>(grp.first) + j]->forward_recompute(view(in), view(inner[j].data()));
      in = inner[j].data();
    }
    for (std::int64_t j = grp.count - 1; j >= 0; --j) {
      const std::int64_t l = grp.first + j;
      void* out = l == 0 || buffers_.in_place ? dx.raw() : ((L - 1 - l) % 2 == 0 ? grad_a.data() : grad_b.data());
      const void* x = j == 0 ? boundary_ptr(k) : inner[static_cast<std::size_t>(j - 1)].data();
      blocks_[static_cast<std::size_t>(l)]->backward(view(x), view(g), view(out));
      if (j > 0) inner[static_cast<std::size_t>(j - 1)].reset();
      g = out;
    }
    if (k >= M) {
      resident_[static_cast<std::size_t>(k - M)].reset();
    } else if (next_fetch >= 0) {
      // Group k's slot is free: refill it with the next boundary backward will need
      // (slot_of(next_fetch) == slot_of(k): they are R apart).
      dev_.wait(link_.stream(), dev_.record(compute));
      const auto f = static_cast<std::size_t>(next_fetch);
      fetched_[f] = link_.copy(ring_[static_cast<std::size_t>(slot_of(next_fetch))].data(), host_[f].data(), bytes_,
                               CopyKind::host_to_device);
      --next_fetch;
    }
  }
}

// After a failure mid-step: let in-flight copies finish (they touch our buffers),
// drop the resident boundaries, and start over at the next forward.
void CheckpointedStack::abandon() noexcept {
  try {
    dev_.synchronize(link_.stream());
  } catch (...) {
  }
  for (Buffer& b : resident_) b.reset();
  input_ = nullptr;
  parked_ = nullptr;  // a freed slot is taken again when next acquired
  for (Event& e : slot_free_) e = Event();
  for (Event& e : fetched_) e = Event();
  forward_done_ = false;
}

}  // namespace peakbound
