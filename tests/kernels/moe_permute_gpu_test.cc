// The CUDA backend's MoE dispatch row movement on bf16 rows against the CPU backend, bit
// for bit: one rank's pass (pack with the weight in two bf16 slots, group, dot and
// scale, ungroup, combine forward and backward, and the expert-parameter gather) from the
// same inputs on both devices; every buffer compared byte for byte (both round with
// to_bf16's rule and sum each token's rows in one order, unfused). Odd H, K = 2, random
// routing with an empty expert and all tokens to one expert. Skips without a GPU.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/ops/moe_permute.h"
#include "tests/device/gpu_test_util.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using I = std::int64_t;
using testing::kMiB;
using testing::upload;

std::vector<unsigned char> bytes_of(Device& dev, const Buffer& b, std::size_t n) {
  std::vector<unsigned char> out(n);
  dev.wait(dev.copy_stream(), dev.record(dev.compute_stream()));
  dev.memcpy_async(out.data(), b.data(), n, CopyKind::device_to_host, dev.copy_stream());
  dev.synchronize(dev.copy_stream());
  return out;
}

struct Inputs {
  I T = 0, K = 2, H = 37, n = 0, segments = 0;
  std::vector<bf16> x, dy, o, y0, dx0;
  std::vector<float> w;
  std::vector<I> copies, perm, order, starts, lend;
};

Inputs make_inputs(bool one_expert, std::mt19937& rng) {
  Inputs in;
  in.T = 29;
  in.n = in.T * in.K;
  const I E = 5, H = in.H;
  std::normal_distribution<float> nd;
  auto rand_bf16 = [&](I k) {
    std::vector<bf16> v(static_cast<std::size_t>(k));
    for (auto& e : v) e = to_bf16(2.0f * nd(rng));
    return v;
  };
  in.x = rand_bf16(in.T * H);
  in.dy = rand_bf16(in.T * H);
  in.o = rand_bf16(in.n * H);
  in.y0 = rand_bf16(in.T * H);
  in.dx0 = rand_bf16(in.T * H);
  std::uniform_real_distribution<float> ud(0.01f, 1.0f);
  in.w.resize(static_cast<std::size_t>(in.n));
  for (float& v : in.w) v = ud(rng);
  std::vector<I> expert(static_cast<std::size_t>(in.n));
  for (I& e : expert) e = one_expert ? E - 1 : (rng() % 2 ? 0 : 2 + static_cast<I>(rng() % 3));  // expert 1 empty
  in.copies.resize(static_cast<std::size_t>(in.n));
  std::iota(in.copies.begin(), in.copies.end(), I{0});
  std::shuffle(in.copies.begin(), in.copies.end(), rng);
  const auto at = [](I q) { return static_cast<std::size_t>(q); };
  in.perm = in.copies;
  std::iota(in.perm.begin(), in.perm.end(), I{0});
  std::stable_sort(in.perm.begin(), in.perm.end(),
                   [&](I u, I v) { return expert[at(in.copies[at(u)])] < expert[at(in.copies[at(v)])]; });
  auto token = [&](I q) { return in.copies[at(q)] / in.K; };
  in.order = in.perm;
  std::iota(in.order.begin(), in.order.end(), I{0});
  std::stable_sort(in.order.begin(), in.order.end(), [&](I u, I v) { return token(u) < token(v); });
  in.starts.assign(at(in.n + 1), 0);
  for (I j = 0; j < in.n; ++j)
    if (j == 0 || token(in.order[at(j)]) != token(in.order[at(j - 1)])) in.starts[at(in.segments++)] = j;
  in.starts[at(in.segments)] = in.n;
  in.lend = {3, 0, 3};
  return in;
}

// Every output of the pass, as bytes, in a fixed order.
std::vector<std::vector<unsigned char>> run(Device& dev, const Inputs& in) {
  const I n = in.n, H = in.H, win = ops::moe_send_width(H, true, DType::bf16),
          wout = ops::moe_result_width(H, true, DType::bf16);
  const std::size_t rows = static_cast<std::size_t>(n * H) * sizeof(bf16), ws = static_cast<std::size_t>(n) * 4;
  Buffer x = upload(dev, in.x), dy = upload(dev, in.dy), o = upload(dev, in.o), y = upload(dev, in.y0),
         dx = upload(dev, in.dx0), w = upload(dev, in.w), copies = upload(dev, in.copies), perm = upload(dev, in.perm),
         order = upload(dev, in.order), starts = upload(dev, in.starts), lend = upload(dev, in.lend);
  Buffer send = dev.allocate(Component::workspace, static_cast<std::size_t>(n * win) * sizeof(bf16)),
         back = dev.allocate(Component::workspace, static_cast<std::size_t>(n * wout) * sizeof(bf16)),
         fwd = dev.allocate(Component::workspace, rows), xg = dev.allocate(Component::workspace, rows),
         dyg = dev.allocate(Component::workspace, rows), wg = dev.allocate(Component::workspace, ws),
         dwg = dev.allocate(Component::workspace, ws), dw = dev.allocate(Component::workspace, ws),
         gathered = dev.allocate(Component::workspace, 3 * static_cast<std::size_t>(win) * sizeof(bf16));
  Stream& s = dev.compute_stream();
  const auto* C = copies.as<I>();
  ops::moe_pack_rows(dev, s, send.as<bf16>(), win, C, n, in.K, H, x.as<bf16>(), dy.as<bf16>(), w.as<float>());
  ops::moe_gather_rows(dev, s, gathered.as<bf16>(), send.as<bf16>(), lend.as<I>(), 3, win);
  ops::moe_group_rows(dev, s, xg.as<bf16>(), dyg.as<bf16>(), wg.as<float>(), send.as<bf16>(), win, perm.as<I>(), n, H);
  ops::moe_dot_scale_rows(dev, s, dwg.as<float>(), dyg.as<bf16>(), o.as<bf16>(), wg.as<float>(), n, H);
  ops::moe_ungroup_rows(dev, s, back.as<bf16>(), wout, dyg.as<bf16>(), dwg.as<float>(), perm.as<I>(), n, H);
  ops::moe_ungroup_rows(dev, s, fwd.as<bf16>(), H, o.as<bf16>(), nullptr, perm.as<I>(), n, H);
  ops::moe_unpack_rows(dev, s, fwd.as<bf16>(), H, C, order.as<I>(), starts.as<I>(), in.segments, in.K, H, y.as<bf16>(),
                       w.as<float>(), nullptr, nullptr);
  ops::moe_unpack_rows(dev, s, back.as<bf16>(), wout, C, order.as<I>(), starts.as<I>(), in.segments, in.K, H, nullptr,
                       w.as<float>(), dx.as<bf16>(), dw.as<float>());
  dev.synchronize();
  const std::size_t tok = static_cast<std::size_t>(in.T * H) * sizeof(bf16);
  return {bytes_of(dev, send, static_cast<std::size_t>(n * win) * sizeof(bf16)),
          bytes_of(dev, gathered, 3 * static_cast<std::size_t>(win) * sizeof(bf16)),
          bytes_of(dev, xg, rows), bytes_of(dev, dyg, rows), bytes_of(dev, wg, ws), bytes_of(dev, dwg, ws),
          bytes_of(dev, back, static_cast<std::size_t>(n * wout) * sizeof(bf16)), bytes_of(dev, fwd, rows),
          bytes_of(dev, y, tok), bytes_of(dev, dx, tok), bytes_of(dev, dw, ws)};
}

TEST(CudaKernels, MoePermuteBf16MatchesCpuBitwise) {
  PB_NEED_GPU();
  const char* names[] = {"send rows", "gathered rows", "xg", "dy scaled", "wg", "dw grouped", "result rows (back)",
                         "result rows (forward)", "y", "dx", "dw"};
  for (bool one_expert : {false, true}) {
    std::mt19937 rng(one_expert ? 11 : 7);
    const Inputs in = make_inputs(one_expert, rng);
    CpuDevice cpu(256 * kMiB);
    CudaDevice gpu(256 * kMiB);
    const auto want = run(cpu, in), got = run(gpu, in);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto diff = std::mismatch(want[i].begin(), want[i].end(), got[i].begin());
      EXPECT_TRUE(diff.first == want[i].end())
          << names[i] << (one_expert ? " (one expert)" : "") << ": first differing byte "
          << (diff.first - want[i].begin()) << " of " << want[i].size();
    }
  }
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
