// NcclCommunicator: the Communicator over NCCL, moving buffers in a CUDA device's
// memory. Bootstrapped over another communicator (MPI): rank 0 creates the NCCL unique
// id and broadcasts it. The Communicator interface is blocking, so every collective is
// enqueued on the communicator's own stream after the device's compute stream (an event
// orders it behind the work that produced its input) and the call returns once that
// stream has finished it; isend and irecv run on two more streams of their own (a send
// and a receive posted on one stream would wait for each other in a ring), and their
// Request waits on an event. all_to_all_v is one NCCL group of sends and receives;
// split is ncclCommSplit (with the bootstrap communicator split the same way). Tags are
// not NCCL's: point-to-point messages between two ranks match in posting order, which
// is how the schedules use them. Every NCCL return code is checked: CommError with
// NCCL's own message. Buffers in host memory (a schedule's counts, plan metadata, the
// dispatch's routing counts) go over the bootstrap communicator instead, so the same
// schedule code runs on the CPU and on GPUs; a collective with one buffer on each side
// is refused by name.
#pragma once

#include <memory>

#include "peakbound/comm/communicator.h"
#include "peakbound/device/cuda/cuda_device.h"

namespace peakbound {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (every rank calls it); dev is this rank's GPU.
  NcclCommunicator(CudaDevice& dev, std::unique_ptr<Communicator> bootstrap);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  std::string backend() const override { return "nccl"; }

  void send(const void* buf, std::size_t count, DType t, int dst, int tag) override;
  void recv(void* buf, std::size_t count, DType t, int src, int tag) override;
  Request isend(const void* buf, std::size_t count, DType t, int dst, int tag) override;
  Request irecv(void* buf, std::size_t count, DType t, int src, int tag) override;
  void sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf, std::size_t recv_count, int src,
                DType t, int tag) override;
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType t, int root) override;
  void all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                    std::span<const std::size_t> send_displs, void* recv, std::span<const std::size_t> recv_counts,
                    std::span<const std::size_t> recv_displs, DType t) override;
  void barrier() override;
  bool enqueues_on_streams() const override { return true; }
  // The group of sends and receives on s's own CUDA stream (s a stream of this
  // communicator's device), without waiting for it.
  void all_to_all_v_on(Device& dev, Stream& s, const void* send, std::span<const std::size_t> send_counts,
                       std::span<const std::size_t> send_displs, void* recv, std::span<const std::size_t> recv_counts,
                       std::span<const std::size_t> recv_displs, DType t) override;
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  struct Split {};
  NcclCommunicator(CudaDevice& dev, std::unique_ptr<Communicator> bootstrap, void* comm, Split);
  void* begin();             // the stream of a collective, ordered after the compute stream
  void finish(void* stream);  // waits for it; rethrows an asynchronous NCCL error
  void check_peer(int peer, const char* what) const;
  // Enqueues all_to_all_v's group of sends and receives on the CUDA stream `stream`.
  void enqueue_all_to_all_v(void* stream, const void* send, std::span<const std::size_t> send_counts,
                            std::span<const std::size_t> send_displs, void* recv,
                            std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                            DType t);

  CudaDevice& dev_;
  std::unique_ptr<Communicator> bootstrap_;
  void* comm_ = nullptr;  // ncclComm_t
  Stream* coll_ = nullptr;
  Stream* send_ = nullptr;
  Stream* recv_ = nullptr;
};

}  // namespace peakbound
