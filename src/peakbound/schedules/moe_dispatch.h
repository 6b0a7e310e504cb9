// MoeDispatch: the routed-expert part of an MoE layer over an expert-parallel group,
// behind one interface for the three dispatch schedules (see moe_plan.h). Each rank
// brings its own tokens x [T, H] (T may differ per rank, and be 0), their top-k expert
// ids and weights, and the weights of the E/EP experts it owns, each a SwiGLU FFN
// [W_gate [F, H] | W_up [F, H] | W_down [H, F]] stored contiguously.
//   forward:  y[t] = sum_k w[t,k] * FFN_{e[t,k]}(x[t])
//   backward: dx, d w[t,k] (the router-score gradient) and d expert weights (added);
//             helpers' weight gradients go back to the owners once and are summed there.
// Backward is run round by round from x (the layer is recomputed under activation
// checkpointing anyway), so no round's dispatched rows are kept between passes. All
// dispatch memory comes from the Arena under Component::dispatch, allocated from
// dispatch_buffers (moe_footprint.h) and nothing else; compute runs through ops:: on the
// device's compute stream, the exchanges of pipelined rounds on a communication stream
// the dispatch creates once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "peakbound/comm/communicator.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/schedules/moe_plan.h"
#include "peakbound/schedules/moe_shape.h"

namespace peakbound {

struct DispatchStats {
  int rounds = 0;
  std::int64_t round_cap = 0;          // pipelined: most copies a source sent per round
  bool spilled = false;
  double imbalance = 1.0;
  std::int64_t spills = 0;
  std::int64_t max_received_rows = 0;  // the busiest rank's largest round
  std::int64_t foreign_experts = 0;    // experts this rank held a lent copy of
  DispatchSizes sizes;                 // this rank's sizes in the last pass
};

class MoeDispatch {
 public:
  // Throws InvalidArgument for a shape the group cannot run or options out of range.
  MoeDispatch(Device& dev, Communicator& ep_group, MoeShape shape, DispatchKind kind, DispatchOptions options);

  std::string name() const { return std::string(dispatch_kind_name(kind_)); }
  // x [T, H], expert ids [T, K], weights [T, K], own experts [E/EP, 3FH] -> y [T, H] (written).
  void forward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
               const float* expert_params, float* y);
  // Same inputs as forward plus dy [T, H]: writes dx [T, H] and d_weights [T, K], adds
  // into d_expert_params [E/EP, 3FH].
  void backward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                const float* expert_params, const float* dy, float* dx, float* d_weights, float* d_expert_params);
  const DispatchStats& stats() const { return stats_; }
  Device& device() const { return dev_; }

 private:
  // One pass's tensors; backward selects the pass's mode (dy, dx, dw, dparams are its own).
  struct Io {
    bool backward = false;
    const float* x = nullptr;
    std::int64_t tokens = 0;
    const std::int32_t* ids = nullptr;
    const float* w = nullptr;
    const float* params = nullptr;
    const float* dy = nullptr;
    float* y = nullptr;
    float* dx = nullptr;
    float* dw = nullptr;
    float* dparams = nullptr;
  };
  // The pass as an object with named stages: plan, lend, rounds (stage, exchange,
  // compute, combine), return (moe_dispatch_pass.cc).
  class Pass;
  void run(const Io& io);

  Device& dev_;
  Communicator& g_;
  MoeShape s_;
  DispatchKind kind_;
  DispatchOptions options_;
  Stream* comm_ = nullptr;  // the communication thread: host tasks run the exchanges
  DispatchStats stats_;
};

}  // namespace peakbound
