// Communicator: a group of ranks that exchange buffers (the mlx "distributed group"
// shape). Counts are in elements of `dtype`. Collectives must be called by every
// rank of the group in the same order. Implementations: single-rank (always built)
// and MPI (comm/mpi, OpenMPI, CPU buffers); NCCL for GPU buffers comes with CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "peakbound/core/dtype.h"

namespace peakbound {

class Device;
class Stream;

enum class ReduceOp : std::uint8_t { sum, max };

// A pending non-blocking send or receive; wait() completes it. Move-only.
class Request {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;
  ~Request();  // waits if still pending: a dropped request must not leave a live buffer

  void wait();
  bool test();  // true once complete

 private:
  std::unique_ptr<Impl> impl_;
};

// all_to_all_v's displacements for blocks packed back to back: the exclusive prefix sums
// of counts.
inline std::vector<std::size_t> packed_displs(std::span<const std::size_t> counts) {
  std::vector<std::size_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "single", "mpi"

  virtual void send(const void* buf, std::size_t count, DType t, int dst, int tag = 0) = 0;
  virtual void recv(void* buf, std::size_t count, DType t, int src, int tag = 0) = 0;
  virtual Request isend(const void* buf, std::size_t count, DType t, int dst, int tag = 0) = 0;
  virtual Request irecv(void* buf, std::size_t count, DType t, int src, int tag = 0) = 0;
  // Sends to dst and receives from src at once (no deadlock in a ring).
  virtual void sendrecv(const void* sendbuf, std::size_t send_count, int dst, void* recvbuf,
                        std::size_t recv_count, int src, DType t, int tag = 0) = 0;
  // Ring shift by `step`: send to rank+step, receive from rank-step (mod size).
  void ring_shift(const void* sendbuf, void* recvbuf, std::size_t count, DType t, int step = 1);

  // In place: buf holds this rank's contribution and receives the reduction.
  virtual void all_reduce(void* buf, std::size_t count, DType t, ReduceOp op) = 0;
  // recv holds size() * count elements, rank r's block at r * count.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType t) = 0;
  // The same all-gather started (MPI_Iallgather on MPI): it moves the same bits, and the
  // request's wait() completes it; send and recv must stay untouched until then. Other
  // collectives of the group may run while it is in flight (in the same order on every
  // rank). The default gathers at once and returns a completed request.
  virtual Request iall_gather(const void* send, void* recv, std::size_t count, DType t);
  // send holds size() * recv_count elements; rank r gets the reduction of block r.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType t,
                              ReduceOp op) = 0;
  virtual void broadcast(void* buf, std::size_t count, DType t, int root) = 0;
  // Block j of send (send_counts[j] elements at send_displs[j]) goes to rank j; block
  // from rank j lands at recv_displs[j]. Zero counts are fine. packed_displs gives the
  // displacements of blocks packed back to back.
  virtual void all_to_all_v(const void* send, std::span<const std::size_t> send_counts,
                            std::span<const std::size_t> send_displs, void* recv,
                            std::span<const std::size_t> recv_counts,
                            std::span<const std::size_t> recv_displs, DType t) = 0;
  virtual void barrier() = 0;

  // Whether the collectives below can be enqueued on a device stream (NCCL: the
  // stream's own CUDA stream) instead of being called from a host thread. A CUDA host
  // task may make no CUDA call, so on a GPU a schedule that overlaps its exchanges
  // with compute enqueues them; on the CPU device it runs blocking calls on a stream's
  // thread (Device::host_task).
  virtual bool enqueues_on_streams() const { return false; }
  // all_to_all_v in stream s's order on dev: after the work submitted to s before it,
  // before the work after it. Counts and displacements are read before it returns; the
  // buffers must stay valid until s has run it. Unavailable where enqueues_on_streams()
  // is false.
  virtual void all_to_all_v_on(Device& dev, Stream& s, const void* send,
                               std::span<const std::size_t> send_counts, std::span<const std::size_t> send_displs,
                               void* recv, std::span<const std::size_t> recv_counts,
                               std::span<const std::size_t> recv_displs, DType t);

  // Whether two threads may call collectives at once, each on its own communicator of
  // the group (MPI granted MPI_THREAD_MULTIPLE): a communication thread may then run a
  // blocking collective over a split of the group while the caller's thread computes
  // and calls others.
  virtual bool concurrent_threads() const { return false; }

  // Ranks with equal color form a sub-group, ordered by key (then by rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// The group of all launched processes: MPI's world under mpirun (or any launcher
// that sets the OpenMPI / PMI / PMIx rank variables), else a single rank. Throws
// Unavailable when launched with several ranks by a build without MPI.
std::unique_ptr<Communicator> world_communicator();

// Whether the process environment says it was started by an MPI launcher.
bool launched_by_mpi();

}  // namespace peakbound
