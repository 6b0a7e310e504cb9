// peakbound as a library: one training step of an LM head on the CPU device.
//   1. the Ring-DTP vocabulary loss, forward and backward, on a small random problem,
//      checked against a naive double-precision cross-entropy computed here;
//   2. one OffloadStreamAdamW step on the head weight with the gradient from 1,
//      checked to have moved every parameter and to have kept them finite.
// Prints one line of JSON; exits 1 if a check fails.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/device.h"
#include "peakbound/schedules/optimizer_schedule.h"
#include "peakbound/schedules/vocab_loss.h"
#include "peakbound/ops/gemm.h"

using namespace peakbound;

// Sum over tokens of log-sum-exp(logits) - logit[target], logits = hidden W^T, in double.
static double naive_cross_entropy(const float* hidden, const std::int32_t* targets, const float* w,
                                  std::int64_t T, std::int64_t H, std::int64_t V) {
  double total = 0;
  std::vector<double> logit(static_cast<std::size_t>(V));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (std::int64_t k = 0; k < H; ++k) s += double(hidden[t * H + k]) * w[v * H + k];
      logit[static_cast<std::size_t>(v)] = s;
    }
    const double mx = *std::max_element(logit.begin(), logit.end());
    double se = 0;
    for (double l : logit) se += std::exp(l - mx);
    total += mx + std::log(se) - logit[static_cast<std::size_t>(targets[t])];
  }
  return total;
}

int main(int, char** argv) try {
  // First thing: where OpenBLAS fell back to its generic kernels on a CPU newer than it
  // knows, re-execute with the kernels this CPU allows (what `peakbound` itself does).
  ops::prefer_blas_kernels(argv);
  const std::int64_t T = 37, H = 24, V = 101;  // tokens, hidden size, vocabulary: odd on purpose

  // The working set is fixed at launch: every device allocation comes from this budget.
  auto dev = make_device("cpu", std::uint64_t{64} << 20);
  SingleRankCommunicator comm;  // a group of one; under mpirun use the MPI communicator
  HostMemory host;              // where the offloaded optimizer state lives
  ThreadPool pool(2);           // host threads: the CPU AdamW update

  // Device buffers, each named by its component (the CPU device's memory is host-addressable).
  Buffer weight = dev->allocate(Component::params, V * H * sizeof(float));
  Buffer d_weight = dev->allocate(Component::grads, V * H * sizeof(float));
  Buffer hidden = dev->allocate(Component::layer, T * H * sizeof(float));
  Buffer d_hidden = dev->allocate(Component::layer, T * H * sizeof(float));
  Buffer targets = dev->allocate(Component::layer, T * sizeof(std::int32_t));

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(V - 1));
  std::vector<float> w0(static_cast<std::size_t>(V * H));
  for (auto& x : w0) x = normal(rng) / std::sqrt(float(H));
  for (std::int64_t i = 0; i < T * H; ++i) hidden.as<float>()[i] = normal(rng);
  for (std::int64_t i = 0; i < T; ++i) targets.as<std::int32_t>()[i] = token(rng);
  std::memset(d_weight.data(), 0, d_weight.bytes());  // backward adds into it

  // The optimizer owns the master weights; load() writes the device parameters from them.
  ParamShard shard;
  shard.params = weight.data();
  shard.param_dtype = DType::f32;
  shard.grads = d_weight.data();
  shard.grad_dtype = DType::f32;
  shard.n = V * H;
  OptimizerOptions opt;
  opt.adam.lr = 1e-2f;
  auto optimizer = make_optimizer_schedule("offload_stream", OptimizerContext{*dev, host, pool, comm}, shard, opt);
  optimizer->load(w0.data());

  // 1. Ring-DTP: logits exist only as [chunk, V] blocks, never as [T, V].
  VocabDims dims;
  dims.vocab = V;
  dims.hidden = H;
  VocabLossOptions vo;
  vo.chunk = 16;
  auto loss_fn = make_ring_dtp_vocab_loss(*dev, comm, dims, vo);
  const LossSum sum = loss_fn->forward(hidden.as<float>(), targets.as<std::int32_t>(), T, weight.as<float>());
  loss_fn->backward(1.0f / float(sum.count), d_hidden.as<float>(), d_weight.as<float>());  // mean loss
  dev->synchronize();

  const double ref = naive_cross_entropy(hidden.as<float>(), targets.as<std::int32_t>(), w0.data(), T, H, V);
  const double loss_rel_err = std::fabs(sum.loss - ref) / std::fabs(ref);
  const bool loss_ok = sum.count == T && loss_rel_err <= 1e-5;

  // 2. One AdamW step: gradients to host in buckets, update there, parameters back.
  optimizer->step(opt.adam.lr);
  std::int64_t changed = 0, finite = 0;
  for (std::int64_t i = 0; i < V * H; ++i) {
    const float p = weight.as<float>()[i];
    changed += p != w0[static_cast<std::size_t>(i)];
    finite += std::isfinite(p);
  }
  // Every logit has a non-zero gradient, so the first Adam step moves every parameter.
  const bool step_ok = changed == V * H && finite == V * H;

  std::printf("{\"loss\": %.9g, \"reference_loss\": %.9g, \"loss_rel_err\": %.3g, \"loss_ok\": %s, "
              "\"optimizer\": \"%s\", \"params_changed\": %lld, \"params_finite\": %lld, \"n\": %lld, "
              "\"step_ok\": %s, \"device_peak_bytes\": %llu}\n",
              sum.loss / double(sum.count), ref / double(T), loss_rel_err, loss_ok ? "true" : "false",
              std::string(optimizer->name()).c_str(), static_cast<long long>(changed),
              static_cast<long long>(finite), static_cast<long long>(V * H), step_ok ? "true" : "false",
              static_cast<unsigned long long>(dev->arena().peak()));
  return loss_ok && step_ok ? 0 : 1;
} catch (const Error& e) {
  std::fprintf(stderr, "peakbound_consumer: error: %s\n", e.what());
  return 1;
}
