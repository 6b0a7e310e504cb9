// ops::attention_{forward,backward} on the CPU device run the CPU kernel: the same bits
// on the compute stream and on a worker stream, and bad dims fail on the caller's thread.
#include "peakbound/ops/attention.h"

#include <gtest/gtest.h>

#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/attention.h"

namespace peakbound {
namespace {

TEST(AttentionOp, RunsTheCpuKernelOnEveryStream) {
  CpuDevice dev(1 << 20);
  ops::AttentionDims a;
  a.tokens = 9;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.qk_dim = 6;
  a.v_dim = 5;
  a.block_q = 4;
  a.block_k = 3;
  const std::size_t T = 9;
  std::vector<float> q(T * 4 * 6), k(T * 2 * 6), v(T * 2 * 5), dout(T * 4 * 5);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * static_cast<float>(i % 37) - 0.2f;
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.02f * static_cast<float>(i % 23) - 0.2f;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.03f * static_cast<float>(i % 11) - 0.15f;
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
  std::vector<float> ws(static_cast<std::size_t>(attention_workspace_floats(a)));

  struct Result {
    std::vector<float> out, lse, dq, dk, dv;
  };
  auto run = [&](Stream& s, bool through_ops) {
    Result r{std::vector<float>(dout.size()), std::vector<float>(T * 4), std::vector<float>(q.size()),
             std::vector<float>(k.size()), std::vector<float>(v.size())};
    if (through_ops) {
      ops::attention_forward(dev, s, r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), a, ws.data());
      ops::attention_backward(dev, s, r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(),
                              v.data(), r.out.data(), r.lse.data(), a, ws.data());
      dev.synchronize(s);
    } else {
      cpu::attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), a, ws.data());
      cpu::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(),
                              r.out.data(), r.lse.data(), a, ws.data());
    }
    return r;
  };
  const Result want = run(dev.compute_stream(), false);
  for (Stream* s : {&dev.compute_stream(), &dev.create_stream("attention-test")}) {
    const Result got = run(*s, true);
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(got.lse, want.lse);
    EXPECT_EQ(got.dq, want.dq);
    EXPECT_EQ(got.dk, want.dk);
    EXPECT_EQ(got.dv, want.dv);
  }
  a.kv_heads = 3;  // does not divide 4
  EXPECT_THROW(ops::attention_forward(dev, dev.compute_stream(), nullptr, nullptr, nullptr, nullptr, nullptr, a,
                                      nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace peakbound
