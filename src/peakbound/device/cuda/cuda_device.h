// CudaDevice: the CUDA backend's device. The whole budget is taken with one cudaMalloc
// at launch (plus the Arena's stagger reserve) and every device allocation is placed
// in it by the Arena, so the budget binds exactly as on the CPU device and the CUDA
// caching allocator never holds memory the plan did not count. Streams are CUDA
// streams (non-blocking): a compute stream, a copy stream, and any created with
// create_stream (the optimizer's second copy engine, a communication stream); events
// are CUDA events without timing. host_task runs on the driver's callback thread in
// the stream's order (cudaLaunchHostFunc): it must not call the CUDA API, and a
// failure it throws is kept and rethrown by the next synchronize. The device ordinal
// is the launcher's local rank modulo the visible devices (one rank per GPU).
// Copy statistics count bytes and copies at submission and busy time from timing
// events, for the copies that have completed when copy_stats() is called.
#pragma once

#include <cstdint>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/device/device.h"

namespace peakbound {

class CudaStream;

class CudaDevice final : public Device {
 public:
  // Throws Unavailable when no CUDA device is visible (with the runtime's reason) and
  // OutOfBudget when the budget cannot be allocated (with the device's free memory).
  explicit CudaDevice(std::uint64_t memory_budget, int ordinal = -1);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return name_; }
  Backend backend() const override { return Backend::cuda; }
  Arena& arena() override { return *arena_; }
  int ordinal() const { return ordinal_; }

  Stream& compute_stream() override;
  Stream& copy_stream() override;
  Stream& create_stream(const std::string& name) override;

  void memcpy_async(void* dst, const void* src, std::uint64_t bytes, CopyKind kind, Stream& s) override;
  void host_task(Stream& s, std::function<void()> fn) override;
  Event record(Stream& s) override;
  void wait(Stream& s, const Event& e) override;
  void synchronize(Stream& s) override;
  void synchronize() override;
  CopyStats copy_stats() const override;
  // Page-locked host memory (cudaHostAlloc, portable): copies from and to it are DMA at
  // PCIe speed and run beside compute.
  HostPages* host_pages() override { return pinned_.get(); }

  // The raw CUDA stream behind s (a cudaStream_t), for kernels and libraries (cuBLAS,
  // NCCL); InvalidArgument when s belongs to another device.
  void* native_stream(Stream& s);

  // The device's cuBLAS handle (a cublasHandle_t), created on first use; the caller sets
  // its stream. One op at a time uses it (ops run on the thread that owns the compute).
  void* blas_handle();

  // kResultSlotDoubles of mapped pinned host memory a kernel may write a small result
  // into (a reduction's sum and its blocks' partials) and the host read after
  // synchronizing the kernel's stream. One op at a time uses it.
  static constexpr int kResultSlotDoubles = 512;
  double* result_slot() { return result_slot_; }

  // A failure thrown by a host task, kept for the next synchronize (called from the
  // driver's callback thread).
  void keep_failure(std::exception_ptr e) noexcept;

 private:
  CudaStream& own(Stream& s);
  void rethrow_failure();
  void settle_copy_timings() const;  // folds completed copies' busy time into stats_

  std::string name_;
  int ordinal_ = 0;
  void* region_ = nullptr;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<CudaStream> compute_, copy_;
  std::mutex streams_mu_;
  std::list<std::unique_ptr<CudaStream>> extra_;
  // A copy's timing events, until it has completed.
  struct PendingCopy {
    void* start;
    void* stop;
    CopyKind kind;
  };
  mutable std::mutex stats_mu_;
  mutable std::vector<PendingCopy> pending_;
  mutable CopyStats stats_;
  void* blas_ = nullptr;
  double* result_slot_ = nullptr;
  std::unique_ptr<HostPages> pinned_;
  std::mutex failure_mu_;
  std::exception_ptr failure_;
};

// The number of CUDA devices this process sees; 0 (and `why` set) when none or no driver.
int cuda_device_count(std::string* why = nullptr);

}  // namespace peakbound
