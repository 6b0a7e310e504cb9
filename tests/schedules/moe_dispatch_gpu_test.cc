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

Outputs run(Device& dev, Communicator& comm, const MoeProblem& p, DispatchKind kind, const DispatchOptions& o) {
  const MoeShape& s = p.spec.shape;
  const std::int64_t T = p.tokens[0], H = s.hidden;
  Buffer x = testing::upload(dev, p.x), ids = testing::upload(dev, p.ids), w = testing::upload(dev, p.weights),
         params = testing::upload(dev, p.params), dy = testing::upload(dev, p.dy);
  const std::vector<float> rows(static_cast<std::size_t>(T * H));
  Buffer y = testing::upload(dev, rows), dx = testing::upload(dev, rows),
         dw = testing::upload(dev, std::vector<float>(p.weights.size())),
         dparams = testing::upload(dev, std::vector<float>(p.params.size()));
  MoeDispatch d(dev, comm, s, kind, o);
  d.forward(x.as<float>(), T, ids.as<std::int32_t>(), w.as<float>(), params.as<float>(), y.as<float>());
  d.backward(x.as<float>(), T, ids.as<std::int32_t>(), w.as<float>(), params.as<float>(), dy.as<float>(),
             dx.as<float>(), dw.as<float>(), dparams.as<float>());
  dev.synchronize();
  return {testing::download(dev, y, static_cast<std::size_t>(T * H)), testing::download(dev, dx, static_cast<std::size_t>(T * H)),
          testing::download(dev, dw, p.weights.size()), testing::download(dev, dparams, p.params.size())};
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
