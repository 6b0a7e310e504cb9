// SingleRankCommunicator: the group of one. Collectives are copies; point-to-point
// with itself goes through a mailbox so send-then-recv and sendrecv work.
#pragma once

#include <deque>
#include <vector>

#include "peakbound/comm/communicator.h"

namespace peakbound {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }

  void send(const void* buf, std::size_t count, DType t, int dst, int tag) override;
  void recv(void* buf, std::size_t count, DType t, int src, int tag) override;
  Request isend(const void* buf, std::size_t count, DType t, int dst, int tag) override;
  Request irecv(void* buf, std::size_t count, DType t, int src, int tag) override;
  void sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf,
                std::size_t recv_count, int src, DType t, int tag) override;
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                      ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType t, int root) override;
  void all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                    std::span<const std::size_t> send_displs, void* recv,
                    std::span<const std::size_t> recv_counts,
                    std::span<const std::size_t> recv_displs, DType t) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  struct Message {
    int tag;
    std::vector<unsigned char> bytes;
  };
  void check_peer(int peer, const char* what) const;
  std::deque<Message> mailbox_;
};

}  // namespace peakbound
