#include "peakbound/comm/collective_thread.h"

#include <utility>

#include "peakbound/core/error.h"
#include "peakbound/core/phase_clock.h"

namespace peakbound {

CollectiveThread::CollectiveThread(Communicator& group) {
  if (!group.concurrent_threads())
    throw InternalError("collective thread: the '" + group.backend() +
                        "' communicator does not allow collectives from two threads at once");
  comm_ = group.split(0, group.rank());
  thread_ = std::thread([this] { loop(); });
}

CollectiveThread::~CollectiveThread() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !job_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CollectiveThread::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_; });
    if (!job_) return;  // stopping, nothing in flight
    std::function<void(Communicator&)> job = job_;
    lock.unlock();
    std::exception_ptr failure;
    try {
      job(*comm_);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    failure_ = failure;
    job_ = nullptr;
    cv_.notify_all();
  }
}

void CollectiveThread::start(std::function<void(Communicator&)> job) {
  wait();
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
  }
  cv_.notify_all();
}

void CollectiveThread::wait() {
  std::exception_ptr failure;
  {
    const CommunicationScope exposed;  // what the overlap did not hide
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !job_; });
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace peakbound
