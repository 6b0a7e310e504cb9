// MoeDispatch on a GPU (one rank): the same pass on the CPU device and on the CUDA
// device (NCCL over the single-rank communicator) from the same inputs, forward and
// backward, standard EP in one round and PipelinedLLEP in many overlapped rounds (its
// exchanges enqueued on the communication stream), with an empty expert and all tokens
// to one expert. The combine sums each token's rows in one order on both, so outputs
// differ only by the expert GEMMs' reduction order (cuBLAS against OpenBLAS).
#include <cstring>

#include "peakbound/comm/single_rank.h"
#include "peakbound/schedules/moe_dispatch.h"
#include "peakbound/verify/moe_reference.h"
#include "tests/device/gpu_test_util.h"

#ifdef PEAKBOUND_HAVE_NCCL
#include "peakbound/comm/nccl/nccl_communicator.h"
#endif

namespace peakbound {
namespace {

using testing::kMiB;

struct Outputs {
  std::vector<float> y, dx, dw, dparams;
};

template <typename T>
Buffer to_device(Device& dev, const std::vector<T>& v) {
  Buffer b = dev.allocate(Component::workspace, v.size() * sizeof(T) + 4);
  copy_to_device(dev, b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

std::vector<float> from_device(Device& dev, const Buffer& b, std::size_t n) {
  std::vector<float> out(n);
  copy_to_host(dev, out.data(), b.data(), n * sizeof(float));
  return out;
}

Outputs run(Device& dev, Communicator& comm, const MoeProblem& p, DispatchKind kind, const DispatchOptions& o) {
  const MoeShape& s = p.spec.shape;
  const std::int64_t T = p.tokens[0], H = s.hidden;
  Buffer x = to_device(dev, p.x), ids = to_device(dev, p.ids), w = to_device(dev, p.weights),
         params = to_device(dev, p.params), dy = to_device(dev, p.dy);
  Buffer y = to_device(dev, std::vector<float>(static_cast<std::size_t>(T * H))), dx = to_device(dev, std::vector<float>(static_cast<std::size_t>(T * H))),
         dw = to_device(dev, std::vector<float>(p.weights.size())), dparams = to_device(dev, std::vector<float>(p.params.size()));
  MoeDispatch d(dev, comm, s, kind, o);
  d.forward(x.as<float>(), T, ids.as<std::int32_t>(), w.as<float>(), params.as<float>(), y.as<float>());
  d.backward(x.as<float>(), T, ids.as<std::int32_t>(), w.as<float>(), params.as<float>(), dy.as<float>(),
             dx.as<float>(), dw.as<float>(), dparams.as<float>());
  dev.synchronize();
  return {from_device(dev, y, static_cast<std::size_t>(T * H)), from_device(dev, dx, static_cast<std::size_t>(T * H)),
          from_device(dev, dw, p.weights.size()), from_device(dev, dparams, p.params.size())};
}

TEST(CudaMoeDispatch, MatchesTheCpuDeviceInEveryKindAndSkew) {
#ifndef PEAKBOUND_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  PB_NEED_GPU();
  for (Skew skew : {Skew::uniform, Skew::one_expert, Skew::zipf})
    for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::pipelined_llep}) {
      MoeProblemSpec spec;
      spec.shape = MoeShape{40, 24, 6, 2};  // H, F, E, K: odd sizes
      spec.tokens = 77;
      spec.skew = skew;
      const MoeProblem p = make_moe_problem(spec);
      DispatchOptions o;
      o.cap = 13;  // pipelined: 12 rounds, overlapped
      CpuDevice cpu(256 * kMiB);
      SingleRankCommunicator cpu_comm;
      CudaDevice gpu(256 * kMiB);
      NcclCommunicator gpu_comm(gpu, std::make_unique<SingleRankCommunicator>());
      const Outputs want = run(cpu, cpu_comm, p, kind, o), got = run(gpu, gpu_comm, p, kind, o);
      const std::string what = std::string(skew_name(skew)) + " " + std::string(dispatch_kind_name(kind));
      testing::expect_close(got.y, want.y, 2e-5f, what + " y");
      testing::expect_close(got.dx, want.dx, 2e-5f, what + " dx");
      testing::expect_close(got.dw, want.dw, 2e-5f, what + " d weights");
      testing::expect_close(got.dparams, want.dparams, 2e-5f, what + " d expert params");
    }
#endif
}

}  // namespace
}  // namespace peakbound
