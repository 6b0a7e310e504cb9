#include "peakbound/comm/communicator.h"

#include <cstdlib>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#ifdef PEAKBOUND_HAVE_MPI
#include "peakbound/comm/mpi/mpi_communicator.h"
#endif

namespace peakbound {

Request::~Request() {
  if (impl_) {
    try {
      impl_->wait();
    } catch (...) {
      // Destructors must not throw; the error was the caller's to collect with wait().
    }
  }
}

void Request::wait() {
  if (impl_) {
    auto impl = std::move(impl_);
    impl->wait();
  }
}

bool Request::test() {
  if (!impl_) return true;
  if (impl_->test()) {
    impl_.reset();
    return true;
  }
  return false;
}

Request Communicator::iall_gather(const void* send, void* recv, std::size_t count, DType t) {
  all_gather(send, recv, count, t);
  return Request();
}

void Communicator::all_to_all_v_on(Device&, Stream&, const void*, std::span<const std::size_t>,
                                   std::span<const std::size_t>, void*, std::span<const std::size_t>,
                                   std::span<const std::size_t>, DType) {
  throw Unavailable("communicator '" + backend() + "' cannot enqueue a collective on a device stream");
}

void Communicator::ring_shift(const void* sendbuf, void* recvbuf, std::size_t count, DType t,
                              int step) {
  int n = size();
  int s = ((step % n) + n) % n;
  sendrecv(sendbuf, count, (rank() + s) % n, recvbuf, count, (rank() - s + n) % n, t);
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var)) return true;
  return false;
}

std::unique_ptr<Communicator> world_communicator() {
  if (!launched_by_mpi()) return std::make_unique<SingleRankCommunicator>();
#ifdef PEAKBOUND_HAVE_MPI
  return MpiCommunicator::world();
#else
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (n && std::string(n) != "1")
    throw Unavailable("launched by mpirun with " + std::string(n) +
                      " ranks, but this peakbound was built without MPI (PEAKBOUND_WITH_MPI=OFF)");
  return std::make_unique<SingleRankCommunicator>();
#endif
}

}  // namespace peakbound
