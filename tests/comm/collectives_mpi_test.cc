// Every collective of the world communicator, on whatever size it was launched with
// (1 without mpirun, N under mpirun -np N). Values depend on rank and index so a
// misplaced block or a wrong reduction shows.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "peakbound/core/error.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

using testing::world;

float value(int rank, std::size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i)); }

TEST(Collectives, RankAndSize) {
  Communicator& w = world();
  EXPECT_GE(w.size(), 1);
  EXPECT_LT(w.rank(), w.size());
  int r = w.rank();
  std::vector<int> all(static_cast<std::size_t>(w.size()));
  w.all_gather(&r, all.data(), 1, DType::i32);
  for (int i = 0; i < w.size(); ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i);
}

TEST(Collectives, AllReduceSumAndMaxF32) {
  Communicator& w = world();
  const std::size_t n = 1001;
  std::vector<float> s(n), m(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = m[i] = value(w.rank(), i);
  w.all_reduce(s.data(), n, DType::f32, ReduceOp::sum);
  w.all_reduce(m.data(), n, DType::f32, ReduceOp::max);
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < w.size(); ++r) want += value(r, i);
    ASSERT_EQ(s[i], want) << i;
    ASSERT_EQ(m[i], value(w.size() - 1, i)) << i;
  }
}

TEST(Collectives, AllReduceI64AndBf16) {
  Communicator& w = world();
  std::int64_t big = (1ll << 40) + w.rank();
  w.all_reduce(&big, 1, DType::i64, ReduceOp::sum);
  std::int64_t want = 0;
  for (int r = 0; r < w.size(); ++r) want += (1ll << 40) + r;
  EXPECT_EQ(big, want);

  // Small integers are exact in bf16, so the sum is exact too.
  std::vector<bf16> h = {to_bf16(static_cast<float>(w.rank() + 1)), to_bf16(-2.0f)};
  w.all_reduce(h.data(), 2, DType::bf16, ReduceOp::sum);
  EXPECT_EQ(to_f32(h[0]), static_cast<float>(w.size() * (w.size() + 1) / 2));
  EXPECT_EQ(to_f32(h[1]), -2.0f * static_cast<float>(w.size()));
  bf16 mx = to_bf16(static_cast<float>(-w.rank()));
  w.all_reduce(&mx, 1, DType::bf16, ReduceOp::max);
  EXPECT_EQ(to_f32(mx), 0.0f);
}

TEST(Collectives, AllGatherPlacesBlocksByRank) {
  Communicator& w = world();
  const std::size_t n = 7;
  std::vector<float> mine(n), all(n * static_cast<std::size_t>(w.size()));
  for (std::size_t i = 0; i < n; ++i) mine[i] = value(w.rank(), i);
  w.all_gather(mine.data(), all.data(), n, DType::f32);
  for (int r = 0; r < w.size(); ++r)
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(all[static_cast<std::size_t>(r) * n + i], value(r, i));
}

TEST(Collectives, ReduceScatterSumsBlockOfThisRank) {
  Communicator& w = world();
  const std::size_t n = 5;
  auto P = static_cast<std::size_t>(w.size());
  std::vector<float> send(n * P), recv(n);
  for (std::size_t i = 0; i < n * P; ++i) send[i] = value(w.rank(), i);
  w.reduce_scatter(send.data(), recv.data(), n, DType::f32, ReduceOp::sum);
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < w.size(); ++r) want += value(r, static_cast<std::size_t>(w.rank()) * n + i);
    ASSERT_EQ(recv[i], want);
  }
}

// f32 sums of kRingMinElements or more a rank take MpiCommunicator's ring: chunk c summed
// from rank c + 1 round to rank c, ((a[c+1] + a[c+2]) + ...) + a[c], whatever the timing.
// Values of very different magnitudes make another order give other bits. Three sizes
// in a row (the scratch grows, then is reused), one not a multiple of anything.
TEST(Collectives, ReduceScatterRingSumsInItsDocumentedOrder) {
  Communicator& w = world();
  const int P = w.size();
  auto input = [](int rank, std::size_t i) {
    const float scale = (rank % 3 == 0) ? 1e7f : (rank % 3 == 1 ? 1.0f : 3e-4f);
    return scale * static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * rank));
  };
  for (std::size_t n : {std::size_t{4096}, std::size_t{9001}, std::size_t{5000}}) {
    std::vector<float> send(n * static_cast<std::size_t>(P)), recv(n, -1.0f);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = input(w.rank(), i);
    w.reduce_scatter(send.data(), recv.data(), n, DType::f32, ReduceOp::sum);
    const std::size_t base = static_cast<std::size_t>(w.rank()) * n;
    std::size_t wrong = 0, first = n;  // counted, not asserted: every rank makes every call
    for (std::size_t i = 0; i < n; ++i) {
      float want = input((w.rank() + 1) % P, base + i);
      for (int k = 2; k <= P; ++k) want += input((w.rank() + k) % P, base + i);
      if (recv[i] != want && wrong++ == 0) first = i;
    }
    EXPECT_EQ(wrong, 0u) << "n " << n << ", first at element " << first;
  }
}

TEST(Collectives, BroadcastFromTheLastRank) {
  Communicator& w = world();
  int root = w.size() - 1;
  std::vector<std::int32_t> v(3, w.rank() == root ? 99 : -1);
  w.broadcast(v.data(), v.size(), DType::i32, root);
  for (auto x : v) EXPECT_EQ(x, 99);
}

TEST(Collectives, AllToAllVWithUnevenAndZeroCounts) {
  Communicator& w = world();
  auto P = static_cast<std::size_t>(w.size());
  auto me = static_cast<std::size_t>(w.rank());
  // Rank s sends (s + d) % 3 elements to rank d: some blocks are empty.
  auto count = [](std::size_t s, std::size_t d) { return (s + d) % 3; };
  std::vector<std::size_t> sc(P), sd(P), rc(P), rd(P);
  std::size_t stotal = 0, rtotal = 0;
  for (std::size_t d = 0; d < P; ++d) {
    sc[d] = count(me, d);
    sd[d] = stotal;
    stotal += sc[d];
    rc[d] = count(d, me);
    rd[d] = rtotal + 1;  // leave a gap before each block: displacements are honoured
    rtotal += rc[d] + 1;
  }
  std::vector<float> send(stotal), recv(rtotal, -7.0f);
  for (std::size_t d = 0; d < P; ++d)
    for (std::size_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = static_cast<float>(me * 100 + d * 10 + i);
  w.all_to_all_v(send.data(), sc, sd, recv.data(), rc, rd, DType::f32);
  for (std::size_t s = 0; s < P; ++s) {
    EXPECT_EQ(recv[rd[s] - 1], -7.0f) << "gap overwritten";
    for (std::size_t i = 0; i < rc[s]; ++i)
      ASSERT_EQ(recv[rd[s] + i], static_cast<float>(s * 100 + me * 10 + i));
  }
  std::vector<std::size_t> wrong(P + 1);
  EXPECT_THROW(w.all_to_all_v(send.data(), wrong, sd, recv.data(), rc, rd, DType::f32), CommError);
}

TEST(Collectives, RingShiftAndSendRecv) {
  Communicator& w = world();
  int P = w.size(), r = w.rank();
  std::vector<float> mine(4, static_cast<float>(r)), got(4, -1.0f);
  w.ring_shift(mine.data(), got.data(), 4, DType::f32);
  for (float x : got) EXPECT_EQ(x, static_cast<float>((r - 1 + P) % P));
  w.ring_shift(mine.data(), got.data(), 4, DType::f32, -1);
  for (float x : got) EXPECT_EQ(x, static_cast<float>((r + 1) % P));
  // Non-blocking pair around the ring.
  int next = (r + 1) % P, prev = (r - 1 + P) % P;
  std::int64_t out = 10 * r, in = -1;
  Request rr = w.irecv(&in, 1, DType::i64, prev, 5);
  Request sr = w.isend(&out, 1, DType::i64, next, 5);
  sr.wait();
  rr.wait();
  EXPECT_EQ(in, 10 * prev);
  EXPECT_THROW(w.send(&out, 1, DType::i64, P, 0), CommError);
}

TEST(Collectives, BlockingSendRecvBetweenRankPairs) {
  Communicator& w = world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int r = w.rank();
  if (r < 2) {
    double v = 0;
    std::int64_t token = 1234 + r;
    if (r == 0) {
      w.send(&token, 1, DType::i64, 1, 3);
      w.recv(&token, 1, DType::i64, 1, 4);
      EXPECT_EQ(token, 1235);
    } else {
      w.recv(&token, 1, DType::i64, 0, 3);
      EXPECT_EQ(token, 1234);
      token = 1235;
      w.send(&token, 1, DType::i64, 0, 4);
    }
    (void)v;
  }
  w.barrier();
}

TEST(Collectives, SplitIntoEvenAndOddGroups) {
  Communicator& w = world();
  int color = w.rank() % 2;
  auto sub = w.split(color, -w.rank());  // reversed order inside each group
  int members = 0;
  for (int r = 0; r < w.size(); ++r) members += (r % 2 == color);
  EXPECT_EQ(sub->size(), members);
  // Highest world rank first, since keys are negated.
  int expected_rank = 0;
  for (int r = w.rank() + 1; r < w.size(); ++r) expected_rank += (r % 2 == color);
  EXPECT_EQ(sub->rank(), expected_rank);
  std::int32_t s = w.rank();
  sub->all_reduce(&s, 1, DType::i32, ReduceOp::sum);
  std::int32_t want = 0;
  for (int r = 0; r < w.size(); ++r)
    if (r % 2 == color) want += r;
  EXPECT_EQ(s, want);
  w.barrier();
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

TEST(Collectives, F64TravelsAsDoubles) {
  Communicator& w = testing::world();
  // 1 + 2^-40 is not a float: a double sent as float would lose the low bits.
  double v = 1.0 + std::ldexp(1.0, -40) * (w.rank() + 1);
  std::vector<double> all(static_cast<std::size_t>(w.size()));
  w.all_gather(&v, all.data(), 1, DType::f64);
  double sum = v, mx = v;
  w.all_reduce(&sum, 1, DType::f64, ReduceOp::sum);
  w.all_reduce(&mx, 1, DType::f64, ReduceOp::max);
  double want = 0;
  for (int r = 0; r < w.size(); ++r) {
    EXPECT_EQ(all[static_cast<std::size_t>(r)], 1.0 + std::ldexp(1.0, -40) * (r + 1));
    want += 1.0 + std::ldexp(1.0, -40) * (r + 1);
  }
  EXPECT_EQ(sum, want);
  EXPECT_EQ(mx, 1.0 + std::ldexp(1.0, -40) * w.size());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
