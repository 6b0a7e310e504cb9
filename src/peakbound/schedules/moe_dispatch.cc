#include "peakbound/schedules/moe_dispatch.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

MoeDispatch::MoeDispatch(Device& dev, Communicator& ep_group, MoeShape shape, DispatchKind kind,
                         DispatchOptions options, Precision precision)
    : dev_(dev), g_(ep_group), s_(shape), kind_(kind), options_(options), precision_(precision) {
  if (s_.hidden < 1 || s_.ffn < 1 || s_.experts < 1 || s_.top_k < 1)
    throw InvalidArgument("moe dispatch: hidden, ffn, experts and top-k must be positive");
  if (s_.top_k > s_.experts)
    throw InvalidArgument("moe dispatch: top-k " + std::to_string(s_.top_k) + " exceeds the " +
                          std::to_string(s_.experts) + " experts");
  if (s_.experts % g_.size() != 0)
    throw InvalidArgument("moe dispatch: the expert-parallel size " + std::to_string(g_.size()) +
                          " does not divide the " + std::to_string(s_.experts) + " experts");
  check_dispatch_options(options_);
  comm_ = &dev_.create_stream("moe-comm");
}

template <class A>
void MoeDispatch::run_forward(const A* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                              const A* expert_params, A* y, Buffer* kept) {
  check_precision(precision_, precision_of<A>(), "moe dispatch");
  Io<A> io;
  io.x = x, io.tokens = tokens, io.ids = expert_ids, io.w = weights, io.params = expert_params, io.y = y;
  io.kept = kept;
  run(io);
}

template <class A>
void MoeDispatch::run_backward(const A* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                               const A* expert_params, const A* dy, A* dx, float* d_weights, float* d_expert_params,
                               Buffer* kept) {
  check_precision(precision_, precision_of<A>(), "moe dispatch");
  Io<A> io;
  io.backward = true;
  io.x = x, io.tokens = tokens, io.ids = expert_ids, io.w = weights, io.params = expert_params, io.dy = dy;
  io.dx = dx, io.dw = d_weights, io.dparams = d_expert_params, io.kept = kept;
  run(io);
}

void MoeDispatch::forward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                          const float* expert_params, float* y, Buffer* kept) {
  run_forward(x, tokens, expert_ids, weights, expert_params, y, kept);
}

void MoeDispatch::backward(const float* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                           const float* expert_params, const float* dy, float* dx, float* d_weights,
                           float* d_expert_params, Buffer* kept) {
  run_backward(x, tokens, expert_ids, weights, expert_params, dy, dx, d_weights, d_expert_params, kept);
}

void MoeDispatch::forward(const bf16* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                          const bf16* expert_params, bf16* y, Buffer* kept) {
  run_forward(x, tokens, expert_ids, weights, expert_params, y, kept);
}

void MoeDispatch::backward(const bf16* x, std::int64_t tokens, const std::int32_t* expert_ids, const float* weights,
                           const bf16* expert_params, const bf16* dy, bf16* dx, float* d_weights,
                           float* d_expert_params, Buffer* kept) {
  run_backward(x, tokens, expert_ids, weights, expert_params, dy, dx, d_weights, d_expert_params, kept);
}

}  // namespace peakbound
