#include "peakbound/core/thread_pool.h"

#include <string>
#include <system_error>
#include <utility>

#include "peakbound/core/error.h"

namespace peakbound {

ThreadPool::ThreadPool(int threads, std::chrono::microseconds spin) : spin_(spin) {
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

namespace {
constexpr std::int64_t kMaxTasks = 0xffffffffll;  // the task index has 32 bits
std::uint64_t claim_word(std::uint32_t generation, std::int64_t index) {
  return (static_cast<std::uint64_t>(generation) << 32) | static_cast<std::uint64_t>(index);
}
}  // namespace

void ThreadPool::run_tasks(std::uint32_t generation, std::int64_t tasks,
                           const std::function<void(std::int64_t)>* fn) {
  std::uint64_t word = next_.load(std::memory_order_relaxed);
  for (;;) {
    // A claim is valid only in its own call: a worker that wakes after the call it was
    // woken for has finished finds a different generation here and takes nothing.
    if (static_cast<std::uint32_t>(word >> 32) != generation) return;
    const auto i = static_cast<std::int64_t>(word & 0xffffffffull);
    if (i >= tasks) return;
    if (!next_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_relaxed))
      continue;  // `word` now holds the current value
    if (!failed_.load(std::memory_order_relaxed)) {
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!failure_) failure_ = std::current_exception();
        failed_.store(true, std::memory_order_relaxed);  // the others skip what is left
      }
    }
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) {
      std::lock_guard<std::mutex> lock(mu_);  // the caller checks under mu_: no lost wake-up
      done_.notify_one();
    }
    word = next_.load(std::memory_order_relaxed);
  }
}

void ThreadPool::worker_loop() {
  std::uint32_t seen = 0;
  for (;;) {
    if (spin_.count() > 0) {  // poll for the next call before sleeping (see the header)
      const auto until = std::chrono::steady_clock::now() + spin_;
      while (published_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    }
    std::int64_t tasks = 0;
    const std::function<void(std::int64_t)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      tasks = tasks_;
      fn = fn_;
    }
    run_tasks(seen, tasks, fn);
  }
}

void ThreadPool::parallel_for(std::int64_t tasks, const std::function<void(std::int64_t)>& fn) {
  if (tasks <= 0) return;
  std::lock_guard<std::mutex> call(call_mu_);
  if (workers_.empty() || tasks == 1) {
    for (std::int64_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  if (tasks > kMaxTasks)
    throw InvalidArgument("thread pool: " + std::to_string(tasks) + " tasks in one call, at most " +
                          std::to_string(kMaxTasks));
  std::uint32_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = ++generation_;
    published_.store(generation, std::memory_order_release);
    fn_ = &fn;
    tasks_ = tasks;
    failure_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    next_.store(claim_word(generation, 0), std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks(generation, tasks, &fn);
  std::exception_ptr f;
  {
    // Only claimed tasks are waited for: every task is claimed by now, so this waits
    // for the ones still running on workers, never for a worker still asleep.
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return finished_.load(std::memory_order_acquire) == tasks; });
    fn_ = nullptr;
    f = std::exchange(failure_, nullptr);
  }
  if (f) std::rethrow_exception(f);
}

std::shared_ptr<ThreadPool> KeptPool::sized(int threads) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pool_ || pool_->size() != threads) pool_ = std::make_shared<ThreadPool>(threads, spin_);
  return pool_;
}

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace peakbound
