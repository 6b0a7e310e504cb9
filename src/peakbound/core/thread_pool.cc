#include "peakbound/core/thread_pool.h"

#include <string>
#include <system_error>
#include <utility>

#include "peakbound/core/error.h"

namespace peakbound {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1)
    throw InvalidArgument("thread count must be at least 1 (got " + std::to_string(threads) + ")");
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error& e) {
      // The destructor does not run for a constructor that throws: stop and join the
      // workers started so far here, or they would wait forever on a dead pool.
      const auto started = workers_.size();
      stop_workers();
      throw Unavailable("cannot start thread " + std::to_string(i + 1) + " of " + std::to_string(threads) +
                        " for the CPU thread pool (" + std::to_string(started + 1) +
                        " running): " + e.what() + "; use fewer threads");
    }
  }
}

void ThreadPool::stop_workers() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::run_tasks() {
  for (;;) {
    std::int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= tasks_) return;
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_) failure_ = std::current_exception();
      next_.store(tasks_, std::memory_order_relaxed);  // the others stop taking tasks
    }
  }
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
    }
    done_.notify_one();
  }
}

void ThreadPool::parallel_for(std::int64_t tasks, const std::function<void(std::int64_t)>& fn) {
  if (tasks <= 0) return;
  std::lock_guard<std::mutex> call(call_mu_);
  if (workers_.empty() || tasks == 1) {
    for (std::int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    failure_ = nullptr;
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_tasks();
  std::exception_ptr f;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    fn_ = nullptr;
    f = std::exchange(failure_, nullptr);
  }
  if (f) std::rethrow_exception(f);
}

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace peakbound
