// MoeDispatch on a GPU (one rank): the same pass on the CPU device and on the CUDA
// device (NCCL over the single-rank communicator) from the same inputs, forward and
// backward, standard EP in one round and PipelinedLLEP in many overlapped rounds (its
// exchanges enqueued on the communication stream), with an empty expert and all tokens
// to one expert. The combine sums each token's rows in one order on both, so outputs
// differ only by the expert GEMMs' reduction order (cuBLAS against OpenBLAS).
#include <cstring>
#include <type_traits>

#include "peakbound/comm/single_rank.h"
#include "peakbound/kernels/cpu/elementwise.h"
#include "peakbound/schedules/moe_dispatch.h"
#include "peakbound/verify/moe_reference.h"
#include "tests/device/gpu_test_util.h"
#include "tests/kernels/bf16_vectors.h"

#ifdef PEAKBOUND_HAVE_NCCL
#include "peakbound/comm/nccl/nccl_communicator.h"
#endif

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::kMiB;

struct Outputs {
  std::vector<float> y, dx, dw, dparams;
};

// v in A: as is, or rounded to bf16.
template <class A>
std::vector<A> as(const std::vector<float>& v) {
  if constexpr (std::is_same_v<A, bf16>)
    return test_bf16::rounded(v);
  else
    return v;
}

// n elements of A from b, widened to f32.
template <class A>
std::vector<float> download_as(Device& dev, const Buffer& b, std::size_t n) {
  if constexpr (std::is_same_v<A, float>) {
    return testing::download(dev, b, n);
  } else {
    std::vector<bf16> out(n);
    dev.wait(dev.copy_stream(), dev.record(dev.compute_stream()));
    dev.memcpy_async(out.data(), b.data(), n * sizeof(bf16), CopyKind::device_to_host, dev.copy_stream());
    dev.synchronize(dev.copy_stream());
    return test_bf16::widened(out);
  }
}

// The dispatch in precision A (float | bf16: x, dy, the experts, y and dx in A; the
// routing weights and every gradient but dx f32).
template <class A>
Outputs run(Device& dev, Communicator& comm, const MoeProblem& p, DispatchKind kind, const DispatchOptions& o) {
  const MoeShape& s = p.spec.shape;
  const std::int64_t T = p.tokens[0], H = s.hidden;
  Buffer x = testing::upload(dev, as<A>(p.x)), ids = testing::upload(dev, p.ids),
         w = testing::upload(dev, p.weights), params = testing::upload(dev, as<A>(p.params)),
         dy = testing::upload(dev, as<A>(p.dy));
  const std::vector<A> rows(static_cast<std::size_t>(T * H));
  Buffer y = testing::upload(dev, rows), dx = testing::upload(dev, rows),
         dw = testing::upload(dev, std::vector<float>(p.weights.size())),
         dparams = testing::upload(dev, std::vector<float>(p.params.size()));
  MoeDispatch d(dev, comm, s, kind, o, std::is_same_v<A, bf16> ? Precision::bf16 : Precision::f32);
  d.forward(x.as<A>(), T, ids.as<std::int32_t>(), w.as<float>(), params.as<A>(), y.as<A>());
  d.backward(x.as<A>(), T, ids.as<std::int32_t>(), w.as<float>(), params.as<A>(), dy.as<A>(), dx.as<A>(),
             dw.as<float>(), dparams.as<float>());
  dev.synchronize();
  const auto n = static_cast<std::size_t>(T * H);
  return {download_as<A>(dev, y, n), download_as<A>(dev, dx, n), testing::download(dev, dw, p.weights.size()),
          testing::download(dev, dparams, p.params.size())};
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
      const Outputs want = run<float>(cpu, cpu_comm, p, kind, o), got = run<float>(gpu, gpu_comm, p, kind, o);
      const std::string what = std::string(skew_name(skew)) + " " + std::string(dispatch_kind_name(kind));
      testing::expect_close(got.y, want.y, 2e-5f, what + " y");
      testing::expect_close(got.dx, want.dx, 2e-5f, what + " dx");
      testing::expect_close(got.dw, want.dw, 2e-5f, what + " d weights");
      testing::expect_close(got.dparams, want.dparams, 2e-5f, what + " d expert params");
    }
#endif
}

// bf16: the same passes on both devices from the same bf16 inputs, compared per output
// in the project's metric max|cuda - cpu| / max|cpu| <= 1e-2. The GEMMs' fp32 sums run in
// other orders (cuBLAS against the CPU's gemm_bf16), so a stored bf16 activation can land
// one ulp (2^-8 relative) apart and the difference travels through a few more roundings.
TEST(CudaMoeDispatch, Bf16MatchesTheCpuDevice) {
#ifndef PEAKBOUND_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  PB_NEED_GPU();
  for (Skew skew : {Skew::uniform, Skew::one_expert})
    for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::pipelined_llep}) {
      MoeProblemSpec spec;
      spec.shape = MoeShape{40, 24, 6, 2};
      spec.tokens = 77;
      spec.skew = skew;
      const MoeProblem p = make_moe_problem(spec);
      DispatchOptions o;
      o.cap = 13;
      CpuDevice cpu(256 * kMiB);
      SingleRankCommunicator cpu_comm;
      CudaDevice gpu(256 * kMiB);
      NcclCommunicator gpu_comm(gpu, std::make_unique<SingleRankCommunicator>());
      const Outputs want = run<bf16>(cpu, cpu_comm, p, kind, o), got = run<bf16>(gpu, gpu_comm, p, kind, o);
      const std::string what = std::string(skew_name(skew)) + " " + std::string(dispatch_kind_name(kind));
      const std::vector<float>* outs[2][4] = {{&got.y, &got.dx, &got.dw, &got.dparams},
                                              {&want.y, &want.dx, &want.dw, &want.dparams}};
      const char* names[4] = {"y", "dx", "d weights", "d expert params"};
      for (int i = 0; i < 4; ++i)
        EXPECT_LE(cpu::relative_error(outs[0][i]->data(), outs[1][i]->data(),
                                      static_cast<std::int64_t>(outs[1][i]->size())),
                  1e-2)
            << what << " " << names[i];
    }
#endif
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
