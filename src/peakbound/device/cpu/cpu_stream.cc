#include "peakbound/device/cpu/cpu_stream.h"

#include "peakbound/core/device_access.h"

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

// An event of the CPU device: a flag set when the stream reaches it.
struct CpuEvent final : Event::Impl {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;

  void complete() {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
  }
  bool query() override {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  void synchronize() override {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

}  // namespace

CpuStream::CpuStream(std::string name, Mode mode) : name_(std::move(name)), mode_(mode) {
  if (mode_ == Mode::worker_thread) worker_ = std::thread([this] { run(); });
}

CpuStream::~CpuStream() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

void CpuStream::submit(std::function<void()> work) {
  if (mode_ == Mode::inline_on_caller) {
    DeviceAccess open;  // device work may touch device memory (strict mode)
    work();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
    ++in_flight_;
  }
  cv_.notify_all();
}

void CpuStream::run() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      DeviceAccess open;  // device work may touch device memory (strict mode)
      work();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_) failure_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    cv_.notify_all();
  }
}

Event CpuStream::record() {
  if (mode_ == Mode::inline_on_caller) return Event();  // inline work is already done
  auto ev = std::make_shared<CpuEvent>();
  submit([ev] { ev->complete(); });
  return Event(ev);
}

void CpuStream::wait(const Event& e) {
  if (mode_ == Mode::inline_on_caller) {
    e.synchronize();
    return;
  }
  submit([e] { e.synchronize(); });
}

void CpuStream::synchronize() {
  if (mode_ == Mode::worker_thread) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
  }
  rethrow_failure();
}

void CpuStream::rethrow_failure() {
  std::exception_ptr f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    f = std::exchange(failure_, nullptr);
  }
  if (f) std::rethrow_exception(f);
}

}  // namespace peakbound
