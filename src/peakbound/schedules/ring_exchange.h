// RingExchange: the hop-by-hop data movement of a ring schedule over a group of P
// ranks (Ring-DTP's weights and activations modes; context-parallel ring attention is
// meant to be the next user). At hop h (0 <= h < P) rank r works on the set that
// originated at rank origin(h) = (r - h) mod P. What travels is a set of lanes, each a
// pair of device buffers (double buffering) sized for the largest origin:
//   carried      read-only data (weight shards, token blocks, K/V blocks): begin(h)
//                posts the receive of hop h+1's data from r-1 and the send of hop h's
//                to r+1, the caller computes on carried(lane) while progress() moves
//                them, end(h) waits and swaps.
//   accumulated  a sum built along the ring (dW, dX, log-sum-exp statistics, dK/dV):
//                at hop 0 the caller writes its own contribution into accumulator(lane);
//                at hop h > 0 begin(h) posts the receive of origin(h)'s running value
//                into it, the caller computes its contribution elsewhere, waits
//                (wait_accumulated), combines, and send_accumulated() passes it on to
//                r+1. After the last hop every origin's value has visited every rank
//                and finish(lane) receives this rank's own complete value from r-1.
// The helper knows nothing of what the buffers mean; counts are per origin rank, in
// elements of the lane's dtype. Sends of device memory follow the compute stream's
// work (it is synchronized first). With P == 1 nothing moves: carried(lane) is the
// rank's own data and the accumulated lanes must not be used.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "peakbound/comm/communicator.h"
#include "peakbound/core/dtype.h"
#include "peakbound/device/device.h"

namespace peakbound {

// One travelling tensor: its two buffers (each holds count[i] elements for every i),
// its element type, and how many elements origin rank i's set has.
struct RingLane {
  std::array<void*, 2> slots{};
  DType type = DType::f32;
  std::vector<std::size_t> count;  // per origin rank, size() == P
};

class RingExchange {
 public:
  // Each lane uses its own tag, tag_base + its index in the order lanes were added.
  RingExchange(Device& dev, Communicator& group, int tag_base);
  RingExchange(const RingExchange&) = delete;
  RingExchange& operator=(const RingExchange&) = delete;
  ~RingExchange();

  // `own` is this rank's data (hop 0); returns the lane's index for carried().
  int add_carried(const void* own, RingLane lane);
  int add_accumulated(RingLane lane);

  int ranks() const { return P_; }
  int origin(int hop) const { return ((r_ - hop) % P_ + P_) % P_; }

  void begin(int hop);
  // This hop's data of a carried lane.
  const void* carried(int lane) const { return carried_[static_cast<std::size_t>(lane)].current; }
  // This hop's slot of an accumulated lane (hop 0: write the own contribution here;
  // later hops: the running value lands here once wait_accumulated() returns).
  void* accumulator(int lane) const;
  // Lets the transfers move (call between chunks of compute).
  void progress();
  void wait_accumulated();
  void send_accumulated();
  void end(int hop);
  // After the last hop: receives this rank's own complete accumulated value into dst
  // (the lane's free slot when dst is null) and returns where it is; waits the lane's
  // sends. Call for every accumulated lane.
  void* finish(int lane, void* dst = nullptr);
  // Bytes this rank has posted to send so far (carried and accumulated lanes).
  std::uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Carried {
    const void* own = nullptr;
    const void* current = nullptr;
    RingLane lane;
  };
  struct Accumulated {
    RingLane lane;
    Request recv;
    std::array<Request, 2> send;
  };
  int next() const { return (r_ + 1) % P_; }
  int prev() const { return (r_ - 1 + P_) % P_; }
  std::size_t count(const RingLane& l, int origin) const { return l.count[static_cast<std::size_t>(origin)]; }
  void sync_compute();

  Device& dev_;
  Communicator& g_;
  int tag_base_, P_, r_;
  int hop_ = 0;
  std::vector<Carried> carried_;
  std::vector<Accumulated> acc_;
  std::vector<Request> in_flight_;  // this hop's carried transfers
  std::uint64_t bytes_sent_ = 0;
};

}  // namespace peakbound
