// MoeDispatch's communication thread (one rank, PipelinedLLEP with many rounds, so the
// exchanges run as host tasks on its stream): it is one thread, created once for the
// dispatch and reused by every pass, and a failure inside an exchange reaches the
// caller as itself, with every dispatch buffer released and the dispatch still usable.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/verify/moe_reference.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

// One rank that records which thread calls all_to_all_v and can fail the n-th call.
class WatchedComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "watched"; }
  void send(const void* b, std::size_t c, DType t, int d, int tag) override { in_.send(b, c, t, d, tag); }
  void recv(void* b, std::size_t c, DType t, int s, int tag) override { in_.recv(b, c, t, s, tag); }
  Request isend(const void* b, std::size_t c, DType t, int d, int tag) override { return in_.isend(b, c, t, d, tag); }
  Request irecv(void* b, std::size_t c, DType t, int s, int tag) override { return in_.irecv(b, c, t, s, tag); }
  void sendrecv(const void* sb, std::size_t sc, int d, void* rb, std::size_t rc, int s, DType t, int tag) override {
    in_.sendrecv(sb, sc, d, rb, rc, s, t, tag);
  }
  void all_reduce(void* b, std::size_t c, DType t, ReduceOp op) override { in_.all_reduce(b, c, t, op); }
  void all_gather(const void* s, void* r, std::size_t c, DType t) override { in_.all_gather(s, r, c, t); }
  void reduce_scatter(const void* s, void* r, std::size_t c, DType t, ReduceOp op) override {
    in_.reduce_scatter(s, r, c, t, op);
  }
  void broadcast(void* b, std::size_t c, DType t, int root) override { in_.broadcast(b, c, t, root); }
  void all_to_all_v(const void* send, std::span<const std::size_t> sc, std::span<const std::size_t> sd, void* recv,
                    std::span<const std::size_t> rc, std::span<const std::size_t> rd, DType t) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
      if (++calls == fail_at) throw CommError("injected exchange failure");
    }
    in_.all_to_all_v(send, sc, sd, recv, rc, rd, t);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleRankCommunicator>(); }

  std::mutex mu;
  std::set<std::thread::id> threads;
  int calls = 0, fail_at = -1;

 private:
  SingleRankCommunicator in_;
};

struct Fixture {
  MoeProblem p;
  std::vector<float> y;
  Fixture() {
    MoeProblemSpec s;
    s.shape = MoeShape{8, 6, 4, 2};
    s.tokens = 30;  // 60 copies, cap 7: 9 rounds
    p = make_moe_problem(s);
    y.resize(30 * 8);
  }
  void forward(MoeDispatch& d) {
    d.forward(p.x.data(), 30, p.ids.data(), p.weights.data(), p.params.data(), y.data());
  }
};

DispatchOptions cap7() {
  DispatchOptions o;
  o.cap = 7;
  return o;
}

TEST(MoeDispatchCommThread, OneThreadCreatedOnceAndReused) {
  Fixture f;
  WatchedComm g;
  CpuDevice dev(64ull << 20);
  MoeDispatch d(dev, g, f.p.spec.shape, DispatchKind::pipelined_llep, cap7());
  f.forward(d);
  ASSERT_GT(d.stats().rounds, 1);
  f.forward(d);
  std::vector<float> dx(f.y.size()), dw(60), dp(static_cast<std::size_t>(4 * f.p.spec.shape.expert_floats()));
  d.backward(f.p.x.data(), 30, f.p.ids.data(), f.p.weights.data(), f.p.params.data(), f.p.dy.data(), dx.data(),
             dw.data(), dp.data());
  std::set<std::thread::id> others = g.threads;
  others.erase(std::this_thread::get_id());
  EXPECT_EQ(others.size(), 1u) << "every pass's exchanges run on the one communication thread";
}

TEST(MoeDispatchCommThread, ExchangeFailureReachesTheCaller) {
  Fixture f;
  WatchedComm g;
  CpuDevice dev(64ull << 20);
  MoeDispatch d(dev, g, f.p.spec.shape, DispatchKind::pipelined_llep, cap7());
  for (int at : {1, 2, 5, 12}) {  // the first dispatch, a later dispatch, a combine, ...
    g.calls = 0;
    g.fail_at = at;
    EXPECT_THROW(f.forward(d), CommError) << "failing call " << at;
    EXPECT_EQ(dev.arena().live(Component::dispatch), 0u);
  }
  g.fail_at = -1;
  EXPECT_NO_THROW(f.forward(d));  // nothing stale left on the stream
  EXPECT_NO_THROW(dev.synchronize());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
