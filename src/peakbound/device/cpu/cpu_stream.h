// CpuStream: a stream of the CPU device. An inline stream (the compute stream) runs
// work on the calling thread at submission; a worker stream (a copy engine) runs it
// on its own thread, strictly in submission order, so copies overlap compute for
// real. A failure in queued work is kept and rethrown by synchronize().
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "peakbound/device/device.h"

namespace peakbound {

class CpuStream final : public Stream {
 public:
  enum class Mode { inline_on_caller, worker_thread };

  CpuStream(std::string name, Mode mode);
  ~CpuStream() override;
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  const std::string& name() const override { return name_; }
  Mode mode() const { return mode_; }

  void submit(std::function<void()> work);
  Event record();
  void wait(const Event& e);
  void synchronize();
  // Rethrows (once) a failure of work that has already run, without waiting for the rest.
  void rethrow_failure();

 private:
  void run();

  std::string name_;
  Mode mode_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::size_t in_flight_ = 0;  // queued + running
  bool stop_ = false;
  std::exception_ptr failure_;
  std::thread worker_;
};

}  // namespace peakbound
