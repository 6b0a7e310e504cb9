// MoeDispatch: the routed-expert part of an MoE layer over an expert-parallel group,
// behind one interface for the three dispatch schedules (see moe_plan.h). Each rank
// brings its own tokens x [T, H] (T may differ per rank, and be 0), their top-k expert
// ids and weights, and the weights of the E/EP experts it owns, each a SwiGLU FFN
// [W_gate [F, H] | W_up [F, H] | W_down [H, F]] stored contiguously.
//   forward:  y[t] = sum_k w[t,k] * FFN_{e[t,k]}(x[t])
//   backward: dx, d w[t,k] (the router-score gradient) and d expert weights (added);
//             helpers' weight gradients go back to the owners once and are summed there.
// Backward is run round by round from x (the layer is recomputed under activation
// checkpointing anyway), so no round's dispatched rows are kept between passes, and the
// experts compute their forward again from the rows, unless the forward kept it (`kept`
// below: gate, up, act and out of every row this rank computed). All
// dispatch memory comes from the Arena under Component::dispatch, allocated from
// dispatch_buffers (moe_footprint.h) and nothing else; compute runs through ops:: on the
// device's compute stream, the exchanges of pipelined rounds on a communication stream
// the dispatch creates once.
//
// Precision (the constructor's, default f32; docs/precision.md): under bf16, x, dy, y, dx,
// the expert weights, the rows exchanged (ops::moe_send_width / moe_result_width bf16
// elements, all_to_all_v in DType::bf16), the grouped rows, gate/up/act and the lent
// weights are bf16; the routing weights and their gradients, the expert weight
// gradients (added into by gemm_bf16) and the lent experts' gradients (returned in
// DType::f32) stay fp32. The routing weight travels bit for bit in two bf16 slots. The
// experts run the bf16 SwiGLU FFN (one rounding per stored activation) and the combine
// sums each token's copies of one round in fp32 and rounds once; a token whose copies
// come home in several pipelined rounds is rounded once per round. A pass in the other
// precision's types throws InvalidArgument. The f32 dispatch makes exactly the op calls
// it made before precisions existed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/precision.h"
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
  MoeDispatch(Device& dev, Communicator& ep_group, MoeShape shape, DispatchKind kind, DispatchOptions options,
              Precision precision = Precision::f32);

  std::string name() const { return std::string(dispatch_kind_name(kind_)); }
  Precision precision() const { return precision_; }
  // x [T, H], expert ids [T, K], weights [T, K], own experts [E/EP, 3FH] -> y [T, H] (written).
  // kept (optional): forward allocates into *kept dispatch_kept_buffer(shape, the rows
  // this rank's experts compute over the pass) and writes their gate, up, act and out there
  // (the same values it computes either way); a backward given it takes them instead of
  // running the experts' forward again (the same routing gives the same rounds and row
  // order: the same bits) and uses them as the FFN backward's scratch, so *kept is spent
  // (the caller frees it). A backward's kept of another size than its plan's rows: InternalError.
  void forward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
               const float* expert_params, float* y, Buffer* kept = nullptr);
  // Same inputs as forward plus dy [T, H]: writes dx [T, H] and d_weights [T, K], adds
  // into d_expert_params [E/EP, 3FH].
  void backward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                const float* expert_params, const float* dy, float* dx, float* d_weights, float* d_expert_params,
                Buffer* kept = nullptr);
  // bf16 forms: x, expert_params, y, dy, dx bf16; weights, d_weights (written) and
  // d_expert_params (added into) fp32.
  void forward(const bf16* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
               const bf16* expert_params, bf16* y, Buffer* kept = nullptr);
  void backward(const bf16* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                const bf16* expert_params, const bf16* dy, bf16* dx, float* d_weights, float* d_expert_params,
                Buffer* kept = nullptr);
  const DispatchStats& stats() const { return stats_; }
  Device& device() const { return dev_; }

 private:
  // One pass's tensors, A the activation type; backward selects the pass's mode (dy, dx,
  // dw, dparams are its own).
  template <class A>
  struct Io {
    bool backward = false;
    const A* x = nullptr;
    std::int64_t tokens = 0;
    const std::int32_t* ids = nullptr;
    const float* w = nullptr;
    const A* params = nullptr;
    const A* dy = nullptr;
    A* y = nullptr;
    A* dx = nullptr;
    float* dw = nullptr;
    float* dparams = nullptr;
    Buffer* kept = nullptr;  // forward: allocated and written; backward: read (see forward)
  };
  // The pass as an object with named stages: plan, lend, rounds (stage, exchange,
  // compute, combine), return (moe_dispatch_pass.cc).
  template <class A>
  class Pass;
  template <class A>
  void run(const Io<A>& io);
  // The public forward / backward for A = float | bf16: the precision checked against A's
  // (one-line InvalidArgument), then run.
  template <class A>
  void run_forward(const A* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                   const A* expert_params, A* y, Buffer* kept);
  template <class A>
  void run_backward(const A* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                    const A* expert_params, const A* dy, A* dx, float* d_weights, float* d_expert_params,
                    Buffer* kept);

  Device& dev_;
  Communicator& g_;
  MoeShape s_;
  DispatchKind kind_;
  DispatchOptions options_;
  Precision precision_;
  Stream* comm_ = nullptr;  // the communication thread: host tasks run the exchanges
  DispatchStats stats_;
};

}  // namespace peakbound
