// MpiCommunicator: the Communicator over MPI (OpenMPI), moving CPU buffers.
// MPI is initialised once, with MPI_THREAD_MULTIPLE requested so a communication
// thread can overlap a compute thread, and finalised at exit. Every call checks its
// MPI return code (errors return, they do not abort) and throws CommError with
// MPI's own message. bf16 travels as 16-bit words with its own sum and max ops.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "peakbound/comm/communicator.h"

namespace peakbound {

class MpiCommunicator final : public Communicator {
 public:
  // MPI_COMM_WORLD (duplicated). Initialises MPI on first use.
  static std::unique_ptr<MpiCommunicator> world();
  // The thread level MPI granted (MPI_THREAD_*).
  static int thread_level();

  explicit MpiCommunicator(MPI_Comm comm);  // takes ownership
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }

  void send(const void* buf, std::size_t count, DType t, int dst, int tag) override;
  void recv(void* buf, std::size_t count, DType t, int src, int tag) override;
  Request isend(const void* buf, std::size_t count, DType t, int dst, int tag) override;
  Request irecv(void* buf, std::size_t count, DType t, int src, int tag) override;
  void sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf,
                std::size_t recv_count, int src, DType t, int tag) override;
  void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType t) override;
  Request iall_gather(const void* send, void* recv, std::size_t count, DType t) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                      ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType t, int root) override;
  void all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                    std::span<const std::size_t> send_displs, void* recv,
                    std::span<const std::size_t> recv_counts,
                    std::span<const std::size_t> recv_displs, DType t) override;
  void barrier() override;
  bool concurrent_threads() const override { return thread_level() == MPI_THREAD_MULTIPLE; }
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  void check_peer(int peer, const char* what) const;
  // reduce_scatter's own algorithm for f32 sums of at least kRingMinElements a rank (the
  // FSDP gradients); smaller ones and other types go to MPI_Reduce_scatter_block.
  void ring_reduce_scatter(const float* send, float* recv, std::size_t n);
  static constexpr std::size_t kRingMinElements = 4096;

  MPI_Comm comm_;
  MPI_Comm ring_comm_ = MPI_COMM_NULL;  // a duplicate for the ring's messages, made on first use
  std::vector<float> ring_scratch_;     // one chunk: the partials that do not land in recv
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace peakbound
