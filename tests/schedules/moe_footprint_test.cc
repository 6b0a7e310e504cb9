// dispatch_footprint as a pure function: its phases are made of the buffers that
// dispatch_buffers returns, scale with the element size, double the exchange when
// rounds overlap, and a pass whose lent-weights exchange outweighs its rounds is sized
// by the exchange.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "peakbound/schedules/moe_footprint.h"
#include "peakbound/verify/moe_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

std::uint64_t dispatch_of(const Footprint& f, const char* phase) {
  return f.phase(phase).device[static_cast<std::size_t>(Component::dispatch)];
}

TEST(MoeDispatchFootprint, PhasesFromTheBuffers) {
  const MoeShape s{64, 96, 8, 2};
  DispatchSizes z;
  z.max_sent = 300, z.max_received = 500, z.foreign = 1;
  const Footprint f = dispatch_footprint(s, z, 4);
  // forward: x rows out and in, results back, the round's i64 indices (300 packed, 500
  // grouped, 300 unpacked with their order and 301 segment starts), 3 FFN intermediates
  // and x/out grouped.
  const std::uint64_t fwd = arena_reserved(300 * 64 * 4) + arena_reserved(500 * 64 * 4) + arena_reserved(300 * 64 * 4) +
                            arena_reserved(500 * 64 * 4) + arena_reserved((4 * 300 + 500 + 1) * 8) +
                            2 * arena_reserved(500 * 64 * 4) + 3 * arena_reserved(500 * 96 * 4) +
                            arena_reserved(3 * 64 * 96 * 4);
  EXPECT_EQ(dispatch_of(f, "forward"), fwd);
  EXPECT_GT(dispatch_of(f, "backward"), dispatch_of(f, "forward"));
  EXPECT_EQ(f.device_peak(Component::dispatch), dispatch_of(f, "backward"));
  EXPECT_EQ(f.device_peak_total(), dispatch_of(f, "backward"));
}

TEST(MoeDispatchFootprint, ElementSizeAndDoubleBuffering) {
  const MoeShape s{256, 512, 16, 4};
  DispatchSizes z;
  z.max_sent = 1024, z.max_received = 1280;  // every buffer a multiple of 256 bytes at 2 and 4
  const Footprint f4 = dispatch_footprint(s, z, 4), f2 = dispatch_footprint(s, z, 2);
  const DispatchBuffers b = dispatch_buffers(s, z, DispatchPass::forward, 4);
  // Every float buffer halves at 2 bytes (all multiples of 256 here); the i64 indices do not.
  const std::uint64_t idx = b.indices.reserved();
  EXPECT_EQ(idx, arena_reserved((4 * 1024 + 1280 + 1) * 8));
  EXPECT_EQ(dispatch_of(f4, "forward") - idx, 2 * (dispatch_of(f2, "forward") - idx));
  DispatchSizes zz = z;
  zz.double_buffered = true;
  EXPECT_EQ(dispatch_of(dispatch_footprint(s, zz, 4), "forward") - dispatch_of(f4, "forward"),
            b.send.reserved() + b.recv.reserved() + b.back.reserved() + b.out.reserved() + idx);
}

TEST(MoeDispatchFootprint, LendExchangeCanBeThePeak) {
  const MoeShape s{128, 256, 64, 1};
  DispatchSizes z;
  z.max_sent = 2, z.max_received = 2, z.lent = 10;  // lends 10 experts, holds none, few rows
  const DispatchBuffers b = dispatch_buffers(s, z, DispatchPass::forward, 4);
  ASSERT_GT(b.lend_bytes(), b.rounds_bytes());
  EXPECT_EQ(dispatch_of(dispatch_footprint(s, z, 4), "forward"),
            arena_reserved(10ull * 3 * 128 * 256 * 4) + arena_reserved(10 * 8));  // the weights and their slots
  // Backward holds the returning gradients with the rounds: never the lend exchange alone.
  const DispatchBuffers bb = dispatch_buffers(s, z, DispatchPass::backward, 4);
  EXPECT_EQ(dispatch_of(dispatch_footprint(s, z, 4), "backward"), bb.rounds_bytes());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// The planner's estimate bounds what the plan decides on the harness's problems.
TEST(MoeDispatchFootprint, EstimateBoundsThePlannedSizes) {
  for (int P : {1, 2, 3, 4})
    for (Skew skew : {Skew::uniform, Skew::zipf, Skew::hot, Skew::all_to_one_rank, Skew::one_expert, Skew::source})
      for (std::int64_t K : {1, 2, 4})
        for (std::int64_t tokens : {29, 300}) {
          MoeProblemSpec sp;
          sp.shape = MoeShape{8, 8, 12, K};
          sp.ranks = P;
          sp.tokens = tokens;
          sp.skew = skew;
          const MoeProblem p = make_moe_problem(sp);
          std::vector<std::int64_t> counts(static_cast<std::size_t>(P * 12), 0);
          for (int q = 0; q < P; ++q)
            for (std::int64_t c = 0; c < p.tokens[static_cast<std::size_t>(q)] * K; ++c)
              ++counts[static_cast<std::size_t>(q * 12 + p.ids[static_cast<std::size_t>(p.offset(q) * K + c)])];
          const std::int64_t most_tokens = *std::max_element(p.tokens.begin(), p.tokens.end());
          for (std::int64_t cap : {7, 64, 1024})
            for (DispatchKind kind : {DispatchKind::standard_ep, DispatchKind::llep, DispatchKind::pipelined_llep}) {
              DispatchOptions o;
              o.cap = cap;
              o.min_spill = 8;
              const MoePlan plan = make_moe_plan(kind, P, 12, counts, o);
              const DispatchSizes est = dispatch_sizes_estimate(kind, sp.shape, P, most_tokens, plan.imbalance, o);
              for (int r = 0; r < P; ++r) {
                SCOPED_TRACE("P " + std::to_string(P) + " " + std::string(skew_name(skew)) + " K " + std::to_string(K) +
                             " tokens " + std::to_string(tokens) + " cap " + std::to_string(cap) + " " +
                             std::string(dispatch_kind_name(kind)) + " rank " + std::to_string(r));
                const DispatchSizes z = dispatch_sizes(plan, r, p.tokens[static_cast<std::size_t>(r)]);
                EXPECT_LE(z.max_sent, est.max_sent);
                EXPECT_LE(z.max_received, est.max_received);
                EXPECT_LE(z.foreign, est.foreign);
                EXPECT_LE(z.lent, est.lent);
                EXPECT_LE(static_cast<int>(z.double_buffered), static_cast<int>(est.double_buffered));
                EXPECT_LE(dispatch_footprint(sp.shape, z, 4).device_peak_total(),
                          dispatch_footprint(sp.shape, est, 4).device_peak_total());
              }
            }
        }
}

// Under round_bytes the plan and the planner's estimate both fill the budget: the plan's
// footprint never exceeds it, the estimate's comes within a few copies a round of it,
// and a budget below one copy a round is refused by name.
TEST(MoeDispatchFootprint, RoundBytesBoundPlanAndEstimate) {
  const MoeShape shape{16, 24, 12, 2};
  for (int P : {2, 4})
    for (Skew skew : {Skew::uniform, Skew::hot, Skew::one_expert}) {
      MoeProblemSpec sp;
      sp.shape = shape;
      sp.ranks = P;
      sp.tokens = 700;
      sp.skew = skew;
      const MoeProblem p = make_moe_problem(sp);
      std::vector<std::int64_t> counts(static_cast<std::size_t>(P * 12), 0);
      for (int q = 0; q < P; ++q)
        for (std::int64_t c = 0; c < p.tokens[static_cast<std::size_t>(q)] * 2; ++c)
          ++counts[static_cast<std::size_t>(q * 12 + p.ids[static_cast<std::size_t>(p.offset(q) * 2 + c)])];
      for (std::uint64_t budget : {200000ull, 500000ull, 2000000ull}) {
        SCOPED_TRACE("P " + std::to_string(P) + " " + std::string(skew_name(skew)) + " budget " + std::to_string(budget));
        DispatchOptions o;
        o.round_bytes = budget;
        const MoePlan plan = dispatch_plan(DispatchKind::pipelined_llep, shape, P, counts, o, 4);
        for (int r = 0; r < P; ++r) EXPECT_LE(dispatch_peak_bytes(shape, plan.sizes(r, 0), 4), budget);
        const DispatchSizes est =
            dispatch_sizes_estimate(DispatchKind::pipelined_llep, shape, P, 700, plan.imbalance, o, 4);
        const std::uint64_t e = dispatch_peak_bytes(shape, est, 4);
        EXPECT_LE(e, budget);
        if (plan.rounds > 1) {
          EXPECT_GE(e + 4 * (P + 4) * (10 * 16 + 3 * 24) * 4, budget) << "fills the budget";
        }
      }
    }
  DispatchOptions o;
  o.round_bytes = 1000;
  try {
    dispatch_sizes_estimate(DispatchKind::pipelined_llep, shape, 4, 700, 1.0, o, 4);
    ADD_FAILURE() << "accepted 1000 bytes";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("moe dispatch round_bytes 1000 is too small"), std::string::npos) << e.what();
  }
}

// Under Precision::f32 every spec, phase and peak is the elem_bytes = 4 form's, byte for
// byte (so the f32 dispatch and the planner's f32 numbers are unchanged); the plan and the
// estimate under a round budget too.
TEST(MoeDispatchFootprint, F32PrecisionIsTheFourByteForm) {
  const MoeShape s{20, 13, 12, 2};
  for (std::int64_t ms : {0, 1, 37, 300})
    for (std::int64_t lent : {0, 3})
      for (bool db : {false, true}) {
        DispatchSizes z;
        z.max_sent = ms, z.max_received = 2 * ms + 1, z.foreign = lent ? lent + 1 : 0, z.lent = lent;
        z.double_buffered = db;
        for (DispatchPass pass : {DispatchPass::forward, DispatchPass::backward}) {
          const DispatchBuffers a = dispatch_buffers(s, z, pass, 4), b = dispatch_buffers(s, z, pass, Precision::f32);
          EXPECT_EQ(a.lend_bytes(), b.lend_bytes());
          EXPECT_EQ(a.rounds_bytes(), b.rounds_bytes());
          EXPECT_EQ(b.expert_tile.bytes, 0u);
          using B = DispatchBuffers;
          for (auto m : {&B::foreign_weights, &B::foreign_grads, &B::lend_send, &B::send, &B::recv, &B::back, &B::out,
                         &B::gate_weights, &B::gate, &B::grad_return})
            EXPECT_EQ((a.*m).bytes, (b.*m).bytes);
        }
        for (const char* phase : {"forward", "backward"})
          EXPECT_EQ(dispatch_of(dispatch_footprint(s, z, 4), phase),
                    dispatch_of(dispatch_footprint(s, z, Precision::f32), phase));
        EXPECT_EQ(dispatch_peak_bytes(s, z, 4), dispatch_peak_bytes(s, z, Precision::f32));
      }
  DispatchOptions o;
  o.round_bytes = 200000;
  const DispatchSizes a = dispatch_sizes_estimate(DispatchKind::pipelined_llep, s, 4, 500, 2.0, o, 4);
  const DispatchSizes b = dispatch_sizes_estimate(DispatchKind::pipelined_llep, s, 4, 500, 2.0, o, Precision::f32);
  EXPECT_EQ(a.max_sent, b.max_sent);
  EXPECT_EQ(a.max_received, b.max_received);
}

// Under bf16 the rows (x [H] forward, [x | dy | w] 2H + 2 and [dx | dw] H + 2 backward),
// grouped rows, gate/up/act and lent weights take 2 bytes; the grouped gate weights,
// the lent experts' gradients and the experts' linear tile [min(mr, 256), max(F, H)]
// stay fp32.
TEST(MoeDispatchFootprint, Bf16RowsAndWhatStaysFp32) {
  const MoeShape s{20, 13, 12, 2};
  const std::int64_t H = 20, F = 13, EF = 3 * 13 * 20;
  DispatchSizes z;
  z.max_sent = 37, z.max_received = 300, z.foreign = 2, z.lent = 3;
  const DispatchBuffers f = dispatch_buffers(s, z, DispatchPass::forward, Precision::bf16);
  const DispatchBuffers b = dispatch_buffers(s, z, DispatchPass::backward, Precision::bf16);
  EXPECT_EQ(f.send.bytes, 37u * H * 2);
  EXPECT_EQ(f.recv.bytes, 300u * H * 2);
  EXPECT_EQ(f.back.bytes, 37u * H * 2);
  EXPECT_EQ(b.send.bytes, 37u * (2 * H + 2) * 2);
  EXPECT_EQ(b.recv.bytes, 300u * (2 * H + 2) * 2);
  EXPECT_EQ(b.back.bytes, 37u * (H + 2) * 2);
  EXPECT_EQ(b.out.bytes, 300u * (H + 2) * 2);
  EXPECT_EQ(b.x_grouped.bytes, 300u * H * 2);
  EXPECT_EQ(b.dy_grouped.bytes, 300u * H * 2);
  EXPECT_EQ(b.gate.bytes, 300u * F * 2);
  EXPECT_EQ(b.act.bytes, 300u * F * 2);
  EXPECT_EQ(b.out_grouped.bytes, 300u * H * 2);
  EXPECT_EQ(b.gate_weights.bytes, 2u * 300 * 4);
  EXPECT_EQ(b.foreign_weights.bytes, 2u * EF * 2);
  EXPECT_EQ(b.lend_send.bytes, 3u * EF * 2);
  EXPECT_EQ(b.foreign_grads.bytes, 2u * EF * 4);
  EXPECT_EQ(b.grad_return.bytes, 3u * EF * 4);
  EXPECT_EQ(b.expert_tile.bytes, 256u * H * 4);  // max(F, H) = H
  EXPECT_EQ(b.indices.bytes, dispatch_buffers(s, z, DispatchPass::backward, 4).indices.bytes);
  EXPECT_EQ(b.rounds_bytes(), b.send.reserved() + b.recv.reserved() + b.back.reserved() + b.out.reserved() +
                                  b.indices.reserved() + b.foreign_weights.reserved() + b.foreign_grads.reserved() +
                                  b.x_grouped.reserved() + b.dy_grouped.reserved() + b.gate_weights.reserved() +
                                  3 * b.gate.reserved() + b.expert_tile.reserved() + b.out_grouped.reserved() +
                                  b.grad_return.reserved());
  EXPECT_EQ(dispatch_of(dispatch_footprint(s, z, Precision::bf16), "backward"), b.rounds_bytes());
}

// A round budget buys more copies a round in bf16 (its rows are about half the bytes),
// and the plan's and the estimate's bf16 footprints stay within it.
TEST(MoeDispatchFootprint, RoundBytesUseBf16RowBytes) {
  const MoeShape shape{16, 24, 12, 2};
  DispatchOptions o;
  o.round_bytes = 200000;
  const DispatchKind kind = DispatchKind::pipelined_llep;
  const DispatchSizes f32 = dispatch_sizes_estimate(kind, shape, 4, 700, 1.0, o, Precision::f32);
  const DispatchSizes b16 = dispatch_sizes_estimate(kind, shape, 4, 700, 1.0, o, Precision::bf16);
  EXPECT_GT(b16.max_sent, f32.max_sent + f32.max_sent / 2) << f32.max_sent << " -> " << b16.max_sent;
  EXPECT_LE(dispatch_peak_bytes(shape, b16, Precision::bf16), o.round_bytes);
  EXPECT_GT(dispatch_peak_bytes(shape, b16, Precision::f32), o.round_bytes) << "sized by the bf16 bytes";
  std::vector<std::int64_t> counts(4 * 12, 700 * 2 / 12 + 1);
  const MoePlan p32 = dispatch_plan(DispatchKind::pipelined_llep, shape, 4, counts, o, Precision::f32);
  const MoePlan p16 = dispatch_plan(DispatchKind::pipelined_llep, shape, 4, counts, o, Precision::bf16);
  EXPECT_LT(p16.rounds, p32.rounds);
  for (int r = 0; r < 4; ++r) EXPECT_LE(dispatch_peak_bytes(shape, p16.sizes(r, 0), Precision::bf16), o.round_bytes);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
