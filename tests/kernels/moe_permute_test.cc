// The MoE dispatch row movement (kernels/cpu/moe_permute.h) on bf16 rows against the f32
// kernels on the widened inputs, on one rank's whole pass (pack, group, dot and scale,
// ungroup, combine): every bf16 output bitwise peakbound::to_bf16(the f32 output), every fp32 output
// (wg, dw) bitwise the f32 kernel's, and the routing weight through a bf16 row bit for bit
// (NaN payloads, denormals, -0 included). Odd H, K 1 to 3, an empty expert, all tokens
// to one expert, no tokens. Through the op layer: the row widths and the refusal of a
// bf16 row sized as an f32 one.
#include "peakbound/kernels/cpu/moe_permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/moe_permute.h"
#include "tests/kernels/bf16_vectors.h"

namespace peakbound::cpu {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using test_bf16::widened;

using I = std::int64_t;

std::vector<bf16> random_bf16(I n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<bf16> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = peakbound::to_bf16(2.0f * d(rng));
  return v;
}

// got[i] == peakbound::to_bf16(want[i]), bit for bit.
void expect_rounded(const std::vector<bf16>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[i].bits, peakbound::to_bf16(want[i]).bits) << what << " element " << i << " (f32 " << want[i] << ")";
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(float_bits(got[i]), float_bits(want[i])) << what << " element " << i;
}

// The fp32 weight in a bf16 row's two slots (high half first).
float slots_weight(const bf16* s) { return bits_float(static_cast<std::uint32_t>(s[0].bits) << 16 | s[1].bits); }

enum class Route { random, one_expert, empty_expert };

struct Case {
  I T, K, H, E;
  Route route;
};

std::string name(const Case& c) {
  return "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " H=" + std::to_string(c.H) + " route " +
         std::to_string(static_cast<int>(c.route));
}

// One rank's pass: every copy sent in a shuffled order (copies), received as sent, grouped
// by expert (perm, stable), and combined token by token (order, starts).
struct Plan {
  I n = 0;
  std::vector<I> copies, perm, order, starts;
  I segments = 0;
};

Plan make_plan(const Case& c, std::mt19937& rng) {
  Plan p;
  p.n = c.T * c.K;
  std::vector<I> expert(static_cast<std::size_t>(p.n));
  for (I q = 0; q < p.n; ++q) {
    I e = static_cast<I>(rng() % static_cast<unsigned>(c.E));
    if (c.route == Route::one_expert) e = c.E - 1;
    if (c.route == Route::empty_expert && e == 1) e = 2;  // expert 1 receives nothing
    expert[static_cast<std::size_t>(q)] = e;
  }
  p.copies.resize(static_cast<std::size_t>(p.n));
  std::iota(p.copies.begin(), p.copies.end(), I{0});
  std::shuffle(p.copies.begin(), p.copies.end(), rng);
  p.perm = std::vector<I>(p.copies.size());
  std::iota(p.perm.begin(), p.perm.end(), I{0});
  std::stable_sort(p.perm.begin(), p.perm.end(), [&](I u, I v) {
    return expert[static_cast<std::size_t>(p.copies[static_cast<std::size_t>(u)])] <
           expert[static_cast<std::size_t>(p.copies[static_cast<std::size_t>(v)])];
  });
  auto token = [&](I q) { return p.copies[static_cast<std::size_t>(q)] / c.K; };
  p.order = std::vector<I>(p.copies.size());
  std::iota(p.order.begin(), p.order.end(), I{0});
  std::stable_sort(p.order.begin(), p.order.end(), [&](I u, I v) { return token(u) < token(v); });
  p.starts.assign(static_cast<std::size_t>(p.n + 1), 0);
  for (I j = 0; j < p.n; ++j)
    if (j == 0 || token(p.order[static_cast<std::size_t>(j)]) != token(p.order[static_cast<std::size_t>(j - 1)]))
      p.starts[static_cast<std::size_t>(p.segments++)] = j;
  p.starts[static_cast<std::size_t>(p.segments)] = p.n;
  return p;
}

void check_pass(const Case& c) {
  SCOPED_TRACE(name(c));
  std::mt19937 rng(static_cast<unsigned>(c.T * 131 + c.K * 17 + c.H));
  const Plan p = make_plan(c, rng);
  const I n = p.n, H = c.H, T = c.T, wb_in = 2 * H + 2, wf_in = 2 * H + 1, wb_out = H + 2, wf_out = H + 1;
  const auto N = [](I k) { return static_cast<std::size_t>(k); };
  const std::vector<bf16> x = random_bf16(T * H, rng), dy = random_bf16(T * H, rng), o = random_bf16(n * H, rng),
                          y0 = random_bf16(T * H, rng), dx0 = random_bf16(T * H, rng);
  std::vector<float> w(N(T * c.K));
  std::uniform_real_distribution<float> ud(0.01f, 1.0f);
  for (float& v : w) v = ud(rng);  // fp32 with low bits a bf16 cannot hold
  const std::vector<float> xf = widened(x), dyf = widened(dy), of = widened(o);

  // Pack (backward rows) and group.
  std::vector<bf16> send(N(n * wb_in));
  std::vector<float> sendf(N(n * wf_in));
  moe_pack_rows(send.data(), wb_in, p.copies.data(), n, c.K, H, x.data(), dy.data(), w.data());
  moe_pack_rows(sendf.data(), wf_in, p.copies.data(), n, c.K, H, xf.data(), dyf.data(), w.data());
  for (I q = 0; q < n; ++q) {
    for (I j = 0; j < 2 * H; ++j)
      ASSERT_EQ(send[N(q * wb_in + j)].bits, peakbound::to_bf16(sendf[N(q * wf_in + j)]).bits) << "send row " << q << " " << j;
    ASSERT_EQ(float_bits(slots_weight(&send[N(q * wb_in + 2 * H)])), float_bits(sendf[N(q * wf_in + 2 * H)]));
  }
  std::vector<bf16> xg(N(n * H)), dyg(N(n * H));
  std::vector<float> xgf(N(n * H)), dygf(N(n * H)), wg(N(n)), wgf(N(n));
  moe_group_rows(xg.data(), dyg.data(), wg.data(), send.data(), wb_in, p.perm.data(), n, H);
  moe_group_rows(xgf.data(), dygf.data(), wgf.data(), sendf.data(), wf_in, p.perm.data(), n, H);
  expect_rounded(xg, xgf, "xg");
  expect_rounded(dyg, dygf, "dyg");
  expect_same_bits(wg, wgf, "wg");

  // dw = dy . o and dy *= w, in place.
  std::vector<float> dwg(N(n)), dwgf(N(n));
  moe_dot_scale_rows(dwg.data(), dyg.data(), o.data(), wg.data(), n, H);
  moe_dot_scale_rows(dwgf.data(), dygf.data(), of.data(), wgf.data(), n, H);
  expect_same_bits(dwg, dwgf, "dw (grouped)");
  expect_rounded(dyg, dygf, "dy scaled");

  // Results back in arrival order: backward [dx | dw] (the scaled dy stands for dx) and
  // forward [out].
  std::vector<bf16> back(N(n * wb_out)), fwd(N(n * H));
  std::vector<float> backf(N(n * wf_out)), fwdf(N(n * H));
  const std::vector<float> dyg_w = widened(dyg);
  moe_ungroup_rows(back.data(), wb_out, dyg.data(), dwg.data(), p.perm.data(), n, H);
  moe_ungroup_rows(backf.data(), wf_out, dyg_w.data(), dwgf.data(), p.perm.data(), n, H);
  moe_ungroup_rows(fwd.data(), H, o.data(), nullptr, p.perm.data(), n, H);
  moe_ungroup_rows(fwdf.data(), H, of.data(), nullptr, p.perm.data(), n, H);
  expect_rounded(fwd, fwdf, "forward result rows");
  for (I q = 0; q < n; ++q) {
    for (I j = 0; j < H; ++j)
      ASSERT_EQ(back[N(q * wb_out + j)].bits, peakbound::to_bf16(backf[N(q * wf_out + j)]).bits) << "back row " << q << " " << j;
    ASSERT_EQ(float_bits(slots_weight(&back[N(q * wb_out + H)])), float_bits(backf[N(q * wf_out + H)]));
  }

  // Combine: y and dx ADDED INTO (from non-zero values), dw written.
  std::vector<bf16> y = y0, dx = dx0;
  std::vector<float> yf = widened(y0), dxf = widened(dx0), dw(w.size(), -7.0f), dwf(w.size(), -7.0f);
  moe_unpack_rows(fwd.data(), H, p.copies.data(), p.order.data(), p.starts.data(), p.segments, c.K, H, y.data(),
                  w.data(), nullptr, nullptr);
  moe_unpack_rows(fwdf.data(), H, p.copies.data(), p.order.data(), p.starts.data(), p.segments, c.K, H, yf.data(),
                  w.data(), nullptr, nullptr);
  expect_rounded(y, yf, "y");
  moe_unpack_rows(back.data(), wb_out, p.copies.data(), p.order.data(), p.starts.data(), p.segments, c.K, H, nullptr,
                  w.data(), dx.data(), dw.data());
  moe_unpack_rows(backf.data(), wf_out, p.copies.data(), p.order.data(), p.starts.data(), p.segments, c.K, H,
                  nullptr, w.data(), dxf.data(), dwf.data());
  expect_rounded(dx, dxf, "dx");
  expect_same_bits(dw, dwf, "dw");
  for (const float v : dw) ASSERT_NE(float_bits(v), float_bits(-7.0f));  // every copy's dw is written
}

TEST(MoePermuteBf16, WholePassIsTheF32PassOnWidenedInputsRoundedOnce) {
  for (const Case& c : {Case{13, 2, 37, 5, Route::random}, Case{13, 2, 37, 5, Route::empty_expert},
                        Case{11, 3, 1, 4, Route::one_expert}, Case{1, 1, 33, 3, Route::random},
                        Case{9, 1, 16, 3, Route::empty_expert}, Case{0, 2, 37, 5, Route::random}})
    check_pass(c);
}

// A token's K rows are summed in fp32 and rounded once: 1 + 3 * 2^-9 rounds to 1 + 2^-7
// (the bf16 step at 1), while rounding after every row would keep 1 (each 1 + 2^-9 is a
// quarter step and rounds back to 1).
TEST(MoePermuteBf16, CombineRoundsOncePerToken) {
  const I K = 3, H = 3;
  const std::vector<bf16> src(static_cast<std::size_t>(K * H), peakbound::to_bf16(0x1p-9f));
  const std::vector<I> copies{0, 1, 2}, order{0, 1, 2}, starts{0, 3};
  const std::vector<float> w{1.0f, 1.0f, 1.0f};
  std::vector<bf16> y(static_cast<std::size_t>(H), peakbound::to_bf16(1.0f)), dx = y;
  std::vector<float> dw(3);
  moe_unpack_rows(src.data(), H, copies.data(), order.data(), starts.data(), 1, K, H, y.data(), w.data(), nullptr,
                  nullptr);
  for (const bf16 v : y) EXPECT_EQ(v.bits, peakbound::to_bf16(1.0f + 0x1p-7f).bits);
  // dx rows of width H + 2 (weight slots zero): the same sum without the weight.
  std::vector<bf16> rows(static_cast<std::size_t>(K * (H + 2)));
  for (I q = 0; q < K; ++q)
    for (I k = 0; k < H; ++k) rows[static_cast<std::size_t>(q * (H + 2) + k)] = peakbound::to_bf16(0x1p-9f);
  moe_unpack_rows(rows.data(), H + 2, copies.data(), order.data(), starts.data(), 1, K, H, nullptr, w.data(),
                  dx.data(), dw.data());
  for (const bf16 v : dx) EXPECT_EQ(v.bits, peakbound::to_bf16(1.0f + 0x1p-7f).bits);
}

// The weight goes through a bf16 row (pack, group, ungroup, unpack) bit for bit, values
// whose low half a bf16 would drop included.
TEST(MoePermuteBf16, RoutingWeightSurvivesTheRowExactly) {
  const std::vector<float> w{0.1f,
                             -0.0f,
                             1.0f + 0x1p-23f,
                             0x1p-149f,
                             -3.4e38f,
                             bits_float(0x7f800001u),
                             bits_float(0xffc01234u),
                             std::numeric_limits<float>::infinity()};
  const I n = static_cast<I>(w.size()), H = 3, in = 2 * H + 2, out = H + 2;
  std::vector<I> copies(w.size()), perm(w.size()), order(w.size()), starts(w.size() + 1);
  std::iota(copies.begin(), copies.end(), I{0});
  std::iota(order.begin(), order.end(), I{0});
  std::iota(starts.begin(), starts.end(), I{0});
  for (I i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = n - 1 - i;
  const std::vector<bf16> x(static_cast<std::size_t>(n * H), peakbound::to_bf16(1.5f));
  std::vector<bf16> send(static_cast<std::size_t>(n * in)), xg(x.size()), dyg(x.size()),
      back(static_cast<std::size_t>(n * out)), dx(x.size());
  std::vector<float> wg(w.size()), dw(w.size());
  moe_pack_rows(send.data(), in, copies.data(), n, 1, H, x.data(), x.data(), w.data());
  moe_group_rows(xg.data(), dyg.data(), wg.data(), send.data(), in, perm.data(), n, H);
  moe_ungroup_rows(back.data(), out, dyg.data(), wg.data(), perm.data(), n, H);
  moe_unpack_rows(back.data(), out, copies.data(), order.data(), starts.data(), n, 1, H, nullptr, w.data(), dx.data(),
                  dw.data());
  for (std::size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(float_bits(wg[static_cast<std::size_t>(n - 1) - i]), float_bits(w[i])) << i;
    EXPECT_EQ(float_bits(dw[i]), float_bits(w[i])) << i;
    EXPECT_EQ(send[i * static_cast<std::size_t>(in) + 2 * H].bits, float_bits(w[i]) >> 16) << "slot 0 is the high half";
  }
}

TEST(MoePermuteBf16, GatherCopiesRows) {
  std::mt19937 rng(5);
  const I width = 7;
  const std::vector<bf16> src = random_bf16(5 * width, rng);
  const std::vector<I> rows{4, 0, 4, 2};
  std::vector<bf16> dst(rows.size() * width);
  std::vector<float> dstf(dst.size());
  const std::vector<float> srcf = widened(src);
  moe_gather_rows(dst.data(), src.data(), rows.data(), 4, width);
  moe_gather_rows(dstf.data(), srcf.data(), rows.data(), 4, width);
  expect_rounded(dst, dstf, "gathered");
}

TEST(MoePermuteOps, RowWidthsAndTheirCheck) {
  EXPECT_EQ(ops::moe_send_width(40, false, DType::bf16), 40);
  EXPECT_EQ(ops::moe_send_width(40, true, DType::f32), 81);
  EXPECT_EQ(ops::moe_send_width(40, true, DType::bf16), 82);
  EXPECT_EQ(ops::moe_result_width(40, true, DType::f32), 41);
  EXPECT_EQ(ops::moe_result_width(40, true, DType::bf16), 42);
  EXPECT_EQ(ops::moe_result_width(40, false, DType::bf16), 40);
  EXPECT_THROW(ops::moe_weight_slots(DType::i32), InvalidArgument);

  CpuDevice dev(1 << 20);
  Stream& s = dev.compute_stream();
  const I H = 4, n = 2;
  const std::vector<I> copies{1, 0};
  const std::vector<float> w{0.3f, 0.7f};
  const std::vector<bf16> x(static_cast<std::size_t>(n * H), peakbound::to_bf16(2.0f));
  std::vector<bf16> rows(static_cast<std::size_t>(n * (2 * H + 2)));
  // A bf16 row sized as an f32 one (2H + 1) is refused at the call.
  EXPECT_THROW(ops::moe_pack_rows(dev, s, rows.data(), 2 * H + 1, copies.data(), n, 1, H, x.data(), x.data(),
                                  w.data()),
               InvalidArgument);
  ops::moe_pack_rows(dev, s, rows.data(), 2 * H + 2, copies.data(), n, 1, H, x.data(), x.data(), w.data());
  dev.synchronize();
  EXPECT_EQ(float_bits(slots_weight(&rows[2 * H])), float_bits(0.7f));
  EXPECT_EQ(float_bits(slots_weight(&rows[(2 * H + 2) + 2 * H])), float_bits(0.3f));
  std::vector<bf16> y(static_cast<std::size_t>(H));
  const std::vector<I> order{0, 1}, starts{0, 2};
  EXPECT_THROW(ops::moe_unpack_rows(dev, s, rows.data(), 2 * H + 2, copies.data(), order.data(), starts.data(), 1, 1,
                                    H, y.data(), w.data(), y.data(), nullptr),
               InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound::cpu
