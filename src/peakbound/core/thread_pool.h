// ThreadPool: a fixed set of host CPU worker threads for data-parallel kernels: the
// CPU backend's device kernels and host compute on host memory (the offloaded
// optimizer's update, ops/host_adamw.h). A host resource, whatever the device. The
// caller's thread takes part, so a pool of size K runs K-1 workers. parallel_for
// hands out task indices dynamically (an atomic counter), so a thread that the OS
// deschedules (copy engines share the cores) delays only the tasks it holds, not a
// fixed share of the work. parallel_for returns as soon as every task has run: it
// waits for the tasks that were claimed, never for a worker that claimed none (one the
// OS has not yet woken costs the caller nothing; a step that calls parallel_for once
// per bucket would otherwise pay a scheduling delay per bucket on a loaded machine).
// A claim carries the call's generation, so a late worker cannot take a task of a
// later call with an earlier call's function. One parallel_for at a time; calls are
// serialised, so a task must not call parallel_for on its own pool.
// Idle workers sleep on a condition variable; waking one costs tens of microseconds on a
// loaded machine. A pool made with `spin` > 0 keeps its workers polling for the next
// call that long after each call before they sleep (the bf16 GEMM's pool: a product
// runs several parallel calls back to back, a few hundred microseconds each).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace peakbound {

class ThreadPool {
 public:
  // threads >= 1 counts the caller; throws InvalidArgument otherwise, and Unavailable
  // when the system cannot start that many threads (after joining those it started).
  explicit ThreadPool(int threads, std::chrono::microseconds spin = std::chrono::microseconds{0});
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, tasks) on the pool and the caller; returns when all
  // have run. The first exception thrown by any task is rethrown here.
  void parallel_for(std::int64_t tasks, const std::function<void(std::int64_t)>& fn);

 private:
  void worker_loop();
  void stop_workers() noexcept;
  // Runs tasks of call `generation` (fn over [0, tasks)) until none is left unclaimed.
  void run_tasks(std::uint32_t generation, std::int64_t tasks, const std::function<void(std::int64_t)>* fn);

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serialises parallel_for calls
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::uint32_t generation_ = 0;  // the current call's, under mu_
  std::atomic<std::uint32_t> published_{0};  // generation_, for workers polling without mu_
  std::chrono::microseconds spin_{0};
  bool stop_ = false;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t tasks_ = 0;
  // The next unclaimed task: generation in the high 32 bits, task index in the low 32.
  std::atomic<std::uint64_t> next_{0};
  std::atomic<std::int64_t> finished_{0};  // tasks of the current call run (or skipped)
  std::atomic<bool> failed_{false};        // a task threw: the rest are skipped
  std::exception_ptr failure_;
};

// A pool kept for the process (a function's static), remade when the size asked changes:
// the bf16 GEMM's (sized by the BLAS's threads) and the attention kernel's shares. Callers
// hold the returned pointer while they use it (a remake leaves an older one alive).
class KeptPool {
 public:
  explicit KeptPool(std::chrono::microseconds spin = std::chrono::microseconds{0}) : spin_(spin) {}
  std::shared_ptr<ThreadPool> sized(int threads);

 private:
  std::chrono::microseconds spin_;
  std::mutex mu_;
  std::shared_ptr<ThreadPool> pool_;
};

// The default thread count: the hardware's (at least 1).
int default_thread_count();

}  // namespace peakbound
