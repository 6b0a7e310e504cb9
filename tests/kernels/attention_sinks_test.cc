// Attention sinks (kernels/cpu/attention_sinks.h) with the flash kernel around them, against
// transformers' own gpt-oss eager attention (tests/fixtures/hf/gpt_oss_parts, written by
// scripts/hf_reference/make_gptoss_fixture.py): out and the gradients of q, k, v and the
// sinks, causal and with a sliding window of 7, on tiles that do not divide the 29 tokens;
// the same through two accumulated key blocks; a row that sees no key attends to the sink
// alone (out 0).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "peakbound/io/safetensors.h"
#include "peakbound/kernels/cpu/attention.h"
#include "peakbound/kernels/cpu/attention_sinks.h"
#include "peakbound/kernels/cpu/elementwise.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct SinkRun {
  std::vector<float> out, lse, dq, dk, dv, dsinks;
};

const SafeTensorsFile& fixture() {
  static const SafeTensorsFile f = SafeTensorsFile::open(std::string(PEAKBOUND_SOURCE_DIR) +
                                                         "/tests/fixtures/hf/gpt_oss_parts/gpt_oss_parts.safetensors");
  return f;
}

// Forward (whole, or in two accumulated key blocks split at `split`), the sinks, backward.
SinkRun run(const std::string& c, std::int64_t window, std::int64_t split) {
  const SafeTensorsFile& f = fixture();
  const std::vector<float> q = f.read_f32(c + ".q"), k = f.read_f32(c + ".k"), v = f.read_f32(c + ".v");
  const std::vector<float> sinks = f.read_f32(c + ".sinks"), dout = f.read_f32(c + ".dout");
  AttentionDims a;
  a.q_heads = static_cast<std::int64_t>(sinks.size());
  a.qk_dim = a.v_dim = f.info(c + ".q").shape[2];
  a.kv_heads = f.info(c + ".k").shape[1];
  a.tokens = f.info(c + ".q").shape[0];
  a.window = window;
  a.block_q = 8;
  a.block_k = 5;
  const std::int64_t T = a.tokens, Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim;
  std::vector<float> ws(static_cast<std::size_t>(attention_workspace_floats(a)));
  SinkRun r{std::vector<float>(T * Hq * D), std::vector<float>(T * Hq, -std::numeric_limits<float>::infinity()),
        std::vector<float>(T * Hq * D), std::vector<float>(T * Hkv * D), std::vector<float>(T * Hkv * D),
        std::vector<float>(Hq, 0.0f)};
  if (split == 0) {
    attention_forward(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), a, ws.data());
  } else {
    for (const std::int64_t k0 : {std::int64_t{0}, split}) {
      AttentionDims b = a;
      b.accumulate = true;
      b.kv_tokens = k0 == 0 ? split : T - split;
      b.k_offset = k0;
      attention_forward(r.out.data(), r.lse.data(), q.data(), k.data() + k0 * Hkv * D, v.data() + k0 * Hkv * D, b,
                        ws.data());
    }
  }
  attention_sinks_forward(r.out.data(), r.lse.data(), sinks.data(), T, Hq, D);
  std::vector<float> row_dot(static_cast<std::size_t>(T * Hq));
  attention_row_dot(row_dot.data(), dout.data(), r.out.data(), a);
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(), k.data(), v.data(), r.out.data(),
                     r.lse.data(), a, ws.data(), nullptr, row_dot.data());
  attention_sinks_backward(r.dsinks.data(), r.lse.data(), row_dot.data(), sinks.data(), T, Hq);
  return r;
}

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return relative_error(got.data(), want.data(), static_cast<std::int64_t>(want.size()));
}

TEST(AttentionSinks, TransformersGptOssEagerAttentionForwardAndBackward) {
  for (const auto& [c, window] : {std::pair<std::string, std::int64_t>{"attention.full", 0},
                                  std::pair<std::string, std::int64_t>{"attention.window7", 7}}) {
    for (const std::int64_t split : {std::int64_t{0}, std::int64_t{12}}) {
      SCOPED_TRACE(c + " split " + std::to_string(split));
      const SinkRun r = run(c, window, split);
      const SafeTensorsFile& f = fixture();
      EXPECT_LT(rel(r.out, f.read_f32(c + ".out")), 1e-5);
      EXPECT_LT(rel(r.dq, f.read_f32(c + ".dq")), 1e-5);
      EXPECT_LT(rel(r.dk, f.read_f32(c + ".dk")), 1e-5);
      EXPECT_LT(rel(r.dv, f.read_f32(c + ".dv")), 1e-5);
      EXPECT_LT(rel(r.dsinks, f.read_f32(c + ".dsinks")), 1e-5);
    }
  }
  // The window changes the answer (the fixture's two cases are not the same attention).
  EXPECT_GT(rel(fixture().read_f32("attention.window7.out"), fixture().read_f32("attention.full.out")), 1e-2);
}

TEST(AttentionSinks, ARowThatSeesNoKeyAttendsToTheSinkAlone) {
  std::vector<float> out = {0.0f, 0.0f, 1.0f, 2.0f}, lse = {-std::numeric_limits<float>::infinity(), std::log(3.0f)};
  const std::vector<float> sinks = {0.5f, std::log(1.0f)};  // Hq 2, T 1, Dv 2
  attention_sinks_forward(out.data(), lse.data(), sinks.data(), 1, 2, 2);
  EXPECT_EQ(lse[0], 0.5f);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  // Head 1: keys summing to 3 and the sink's 1: out scaled by 3/4, lse log 4.
  EXPECT_FLOAT_EQ(lse[1], std::log(4.0f));
  EXPECT_FLOAT_EQ(out[2], 0.75f);
  EXPECT_FLOAT_EQ(out[3], 1.5f);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
