// CollectiveThread: one collective at a time on a thread of its own, over a communicator
// of its own (a split of the group with the same ranks in the same order), so that the
// caller's thread computes, and calls the group's other collectives, while it runs.
// The job makes the same blocking call the caller would make (the same algorithm, so the
// same sums in the same order: the bits of the blocking call), which a non-blocking MPI
// collective does not promise (Open MPI's libnbc reduce-scatter sums in another order).
// Needs a group whose communicator allows concurrent threads
// (Communicator::concurrent_threads(); MPI_THREAD_MULTIPLE).
//
// start() hands over a job (waiting for the one before it first); wait() blocks until the
// job has run and rethrows what it threw. The wait counts as exposed communication
// (core/phase_clock.h): the job's own time is the thread's, not the caller's.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "peakbound/comm/communicator.h"

namespace peakbound {

class CollectiveThread {
 public:
  // Splits `group` (a collective over it) and starts the thread. InternalError unless
  // group.concurrent_threads().
  explicit CollectiveThread(Communicator& group);
  ~CollectiveThread();  // waits for a job in flight (its failure is dropped), joins
  CollectiveThread(const CollectiveThread&) = delete;
  CollectiveThread& operator=(const CollectiveThread&) = delete;

  // The thread's communicator: the jobs' collectives go over it.
  Communicator& group() { return *comm_; }
  // Runs job(group()) on the thread, after the previous job (waited for here, its failure
  // rethrown here). The job's buffers must stay untouched until wait() returns.
  void start(std::function<void(Communicator&)> job);
  // Blocks until no job is in flight; rethrows the failure of the last one.
  void wait();

 private:
  void loop();

  std::unique_ptr<Communicator> comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(Communicator&)> job_;  // the job in flight (empty: none)
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace peakbound
