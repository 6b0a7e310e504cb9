// ops::attention_{forward,backward} on the CPU device run the CPU kernel: the same bits
// on the compute stream and on a worker stream, and bad dims fail on the caller's thread.
#include "peakbound/ops/attention.h"

#include <gtest/gtest.h>

#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/kernels/cpu/attention.h"
#include "peakbound/kernels/cpu/gemm_bf16.h"
#include "peakbound/ops/gemm.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

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
  const float* none = nullptr;  // a typed null: the f32 overload (a bf16 one exists too)
  EXPECT_THROW(ops::attention_forward(dev, dev.compute_stream(), nullptr, nullptr, none, none, none, a, nullptr),
               InvalidArgument);
}

// The bf16 overloads run the CPU kernel on the process's bf16 GEMM path
// (ops::bf16_gemm_path()): bitwise the kernel called with that path, on either stream.
TEST(AttentionOp, Bf16RunsTheCpuKernelOnTheProcesssGemmPath) {
  CpuDevice dev(1 << 20);
  ops::AttentionDims a;
  a.tokens = 11, a.q_heads = 4, a.kv_heads = 1, a.qk_dim = 7, a.v_dim = 10, a.block_q = 4, a.block_k = 3;
  const std::size_t T = 11;
  std::vector<bf16> q(T * 4 * 7), k(T * 7), v(T * 10), dout(T * 4 * 10), saved(T * 4 * 10);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = to_bf16(0.05f * static_cast<float>(i % 37) - 0.9f);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = to_bf16(0.07f * static_cast<float>(i % 23) - 0.8f);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = to_bf16(0.03f * static_cast<float>(i % 11) - 0.15f);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = to_bf16(0.05f * static_cast<float>(i % 7) - 0.1f);
  std::vector<float> ws(static_cast<std::size_t>(attention_workspace_floats(a, DType::bf16)));
  struct Result {
    std::vector<float> out, lse, dq, dk, dv;
  };
  auto run = [&](Stream* s, cpu::Bf16GemmPath path) {
    Result r{std::vector<float>(dout.size()), std::vector<float>(T * 4), std::vector<float>(q.size()),
             std::vector<float>(k.size()), std::vector<float>(v.size())};
    if (s != nullptr) {
      ops::attention_forward(dev, *s, r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), a, ws.data());
      dev.synchronize(*s);
    } else {
      cpu::attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), a, ws.data(), path);
    }
    for (std::size_t i = 0; i < saved.size(); ++i) saved[i] = to_bf16(r.out[i]);
    if (s != nullptr) {
      ops::attention_backward(dev, *s, r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(),
                              v.data(), saved.data(), r.lse.data(), a, ws.data());
      dev.synchronize(*s);
    } else {
      cpu::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(),
                              saved.data(), r.lse.data(), a, ws.data(), path);
    }
    return r;
  };
  const std::string before = ops::bf16_gemm_path();
  Stream& worker = dev.create_stream("attention-bf16-test");
  for (cpu::Bf16GemmPath path : {cpu::Bf16GemmPath::convert, cpu::Bf16GemmPath::native}) {
    if (!cpu::bf16_gemm_path_supported(path)) continue;
    ops::set_bf16_gemm_path(cpu::bf16_gemm_path_name(path));
    const Result want = run(nullptr, path);
    for (Stream* s : {&dev.compute_stream(), &worker}) {
      const Result got = run(s, path);
      EXPECT_EQ(got.out, want.out);
      EXPECT_EQ(got.lse, want.lse);
      EXPECT_EQ(got.dq, want.dq);
      EXPECT_EQ(got.dk, want.dk);
      EXPECT_EQ(got.dv, want.dv);
    }
  }
  ops::set_bf16_gemm_path(before);
  std::vector<float> row_dot(T * 4), want_row_dot(T * 4);
  ops::attention_row_dot(dev, dev.compute_stream(), row_dot.data(), dout.data(), saved.data(), a);
  dev.synchronize(dev.compute_stream());
  cpu::attention_row_dot(want_row_dot.data(), dout.data(), saved.data(), a);
  EXPECT_EQ(row_dot, want_row_dot);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
