#include "peakbound/comm/single_rank.h"

#include <cstring>
#include <string>

#include "peakbound/core/device_access.h"
#include "peakbound/core/error.h"

namespace peakbound {

void SingleRankCommunicator::check_peer(int peer, const char* what) const {
  if (peer != 0)
    throw CommError(std::string(what) + ": rank " + std::to_string(peer) +
                    " does not exist in a group of 1");
}

void SingleRankCommunicator::send(const void* buf, std::size_t count, DType t, int dst, int tag) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  check_peer(dst, "send");
  std::size_t n = count * dtype_size(t);
  Message m{tag, std::vector<unsigned char>(n)};
  if (n) std::memcpy(m.bytes.data(), buf, n);
  mailbox_.push_back(std::move(m));
}

void SingleRankCommunicator::recv(void* buf, std::size_t count, DType t, int src, int tag) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  check_peer(src, "recv");
  for (auto it = mailbox_.begin(); it != mailbox_.end(); ++it) {
    if (it->tag != tag) continue;
    std::size_t n = count * dtype_size(t);
    if (it->bytes.size() != n)
      throw CommError("recv: expected " + std::to_string(n) + " bytes, the message has " +
                      std::to_string(it->bytes.size()));
    if (n) std::memcpy(buf, it->bytes.data(), n);
    mailbox_.erase(it);
    return;
  }
  throw CommError("recv from self with tag " + std::to_string(tag) +
                  " but nothing was sent: it would block forever");
}

namespace {
struct DoneRequest final : Request::Impl {
  void wait() override {}
  bool test() override { return true; }
};
// A receive from self completes at wait(), after the matching send was posted.
struct SelfRecv final : Request::Impl {
  SingleRankCommunicator* comm;
  void* buf;
  std::size_t count;
  DType t;
  int tag;
  bool done = false;
  SelfRecv(SingleRankCommunicator* c, void* b, std::size_t n, DType d, int g)
      : comm(c), buf(b), count(n), t(d), tag(g) {}
  void wait() override {
    if (!done) comm->recv(buf, count, t, 0, tag);
    done = true;
  }
  bool test() override {
    wait();
    return true;
  }
};
}  // namespace

Request SingleRankCommunicator::isend(const void* buf, std::size_t count, DType t, int dst,
                                      int tag) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  send(buf, count, t, dst, tag);
  return Request(std::make_unique<DoneRequest>());
}

Request SingleRankCommunicator::irecv(void* buf, std::size_t count, DType t, int src, int tag) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  check_peer(src, "irecv");
  return Request(std::make_unique<SelfRecv>(this, buf, count, t, tag));
}

void SingleRankCommunicator::sendrecv(const void* sendbuf, std::size_t send_count, int dst,
                                      void* recvbuf, std::size_t recv_count, int src, DType t,
                                      int) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  check_peer(dst, "sendrecv");
  check_peer(src, "sendrecv");
  if (send_count != recv_count)
    throw CommError("sendrecv with self: sending " + std::to_string(send_count) +
                    " elements but receiving " + std::to_string(recv_count));
  if (send_count && sendbuf != recvbuf) std::memmove(recvbuf, sendbuf, send_count * dtype_size(t));
}

void SingleRankCommunicator::all_reduce(void*, std::size_t, DType, ReduceOp) {}

void SingleRankCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType t) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  if (count && send != recv) std::memmove(recv, send, count * dtype_size(t));
}

void SingleRankCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                            DType t, ReduceOp) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  if (recv_count && send != recv) std::memmove(recv, send, recv_count * dtype_size(t));
}

void SingleRankCommunicator::broadcast(void*, std::size_t, DType, int root) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  check_peer(root, "broadcast");
}

void SingleRankCommunicator::all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                                          std::span<const std::size_t> send_displs, void* recv,
                                          std::span<const std::size_t> recv_counts,
                                          std::span<const std::size_t> recv_displs, DType t) {
  DeviceAccess open;  // the buffers may be device memory (strict mode)
  if (send_counts.size() != 1 || send_displs.size() != 1 || recv_counts.size() != 1 ||
      recv_displs.size() != 1)
    throw CommError("all_to_all_v: counts and displacements must have one entry per rank (1)");
  if (send_counts[0] != recv_counts[0])
    throw CommError("all_to_all_v with self: sending " + std::to_string(send_counts[0]) +
                    " elements but receiving " + std::to_string(recv_counts[0]));
  std::size_t es = dtype_size(t);
  if (send_counts[0])
    std::memmove(static_cast<char*>(recv) + recv_displs[0] * es,
                 static_cast<const char*>(send) + send_displs[0] * es, send_counts[0] * es);
}

std::unique_ptr<Communicator> SingleRankCommunicator::split(int, int) {
  return std::make_unique<SingleRankCommunicator>();
}

}  // namespace peakbound
