#include "peakbound/schedules/ring_exchange.h"

#include <utility>

#include "peakbound/core/error.h"

namespace peakbound {

RingExchange::RingExchange(Device& dev, Communicator& group, int tag_base)
    : dev_(dev), g_(group), tag_base_(tag_base), P_(group.size()), r_(group.rank()) {}

RingExchange::~RingExchange() {
  // Requests wait in their destructors; make the order explicit: carried first.
  in_flight_.clear();
}

int RingExchange::add_carried(const void* own, RingLane lane) {
  PB_CHECK_MSG(lane.count.size() == static_cast<std::size_t>(P_), "ring lane needs one count per rank");
  carried_.push_back(Carried{own, own, std::move(lane)});
  return static_cast<int>(carried_.size() - 1);
}

int RingExchange::add_accumulated(RingLane lane) {
  PB_CHECK_MSG(lane.count.size() == static_cast<std::size_t>(P_), "ring lane needs one count per rank");
  PB_CHECK_MSG(P_ > 1, "an accumulated ring lane needs more than one rank");
  acc_.push_back(Accumulated{std::move(lane), Request(), {}});
  return static_cast<int>(acc_.size() - 1);
}

void RingExchange::sync_compute() { dev_.synchronize(dev_.compute_stream()); }

void RingExchange::begin(int hop) {
  hop_ = hop;
  if (P_ == 1) return;
  const int tag_acc = tag_base_ + static_cast<int>(carried_.size());
  if (hop < P_ - 1) {
    sync_compute();
    for (std::size_t i = 0; i < carried_.size(); ++i) {
      Carried& c = carried_[i];
      in_flight_.push_back(g_.irecv(c.lane.slots[static_cast<std::size_t>(hop % 2)], count(c.lane, origin(hop + 1)),
                                    c.lane.type, prev(), tag_base_ + static_cast<int>(i)));
    }
    for (std::size_t i = 0; i < carried_.size(); ++i) {
      Carried& c = carried_[i];
      in_flight_.push_back(
          g_.isend(c.current, count(c.lane, origin(hop)), c.lane.type, next(), tag_base_ + static_cast<int>(i)));
      bytes_sent_ += count(c.lane, origin(hop)) * dtype_size(c.lane.type);
    }
  }
  if (hop > 0)
    for (std::size_t i = 0; i < acc_.size(); ++i) {
      Accumulated& a = acc_[i];
      const auto s = static_cast<std::size_t>(hop % 2);
      a.send[s].wait();  // the slot's previous value must have left
      a.recv = g_.irecv(a.lane.slots[s], count(a.lane, origin(hop)), a.lane.type, prev(), tag_acc + static_cast<int>(i));
    }
}

void* RingExchange::accumulator(int lane) const {
  return acc_[static_cast<std::size_t>(lane)].lane.slots[static_cast<std::size_t>(hop_ % 2)];
}

void RingExchange::progress() {
  for (auto& r : in_flight_) r.test();
  for (auto& a : acc_) a.recv.test();
}

void RingExchange::wait_accumulated() {
  for (auto& a : acc_) a.recv.wait();
}

void RingExchange::send_accumulated() {
  if (P_ == 1) return;
  sync_compute();
  const int tag_acc = tag_base_ + static_cast<int>(carried_.size());
  for (std::size_t i = 0; i < acc_.size(); ++i) {
    Accumulated& a = acc_[i];
    const auto s = static_cast<std::size_t>(hop_ % 2);
    a.send[s] = g_.isend(a.lane.slots[s], count(a.lane, origin(hop_)), a.lane.type, next(), tag_acc + static_cast<int>(i));
    bytes_sent_ += count(a.lane, origin(hop_)) * dtype_size(a.lane.type);
  }
}

void RingExchange::end(int hop) {
  for (auto& r : in_flight_) r.wait();
  in_flight_.clear();
  if (hop < P_ - 1)
    for (Carried& c : carried_) c.current = c.lane.slots[static_cast<std::size_t>(hop % 2)];
}

void* RingExchange::finish(int lane, void* dst) {
  Accumulated& a = acc_[static_cast<std::size_t>(lane)];
  const auto spare = static_cast<std::size_t>(P_ % 2);  // the slot not used by the last hop
  a.send[spare].wait();
  void* into = dst ? dst : a.lane.slots[spare];
  g_.recv(into, count(a.lane, r_), a.lane.type, prev(), tag_base_ + static_cast<int>(carried_.size()) + lane);
  for (auto& s : a.send) s.wait();
  return into;
}

}  // namespace peakbound
