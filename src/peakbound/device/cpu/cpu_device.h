// CpuDevice: the CPU backend. "Device memory" is RAM: one region of the budget's
// size is reserved at launch (an anonymous mapping, committed page by page as the
// Arena places into it) and every device allocation comes from its Arena, so the
// budget binds exactly as a GPU's memory would. Kernels run on the calling thread
// (the compute stream, inline); host<->device copies run on a copy-engine thread in
// submission order, overlapping compute.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "peakbound/device/cpu/cpu_stream.h"
#include "peakbound/device/device.h"

namespace peakbound {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(std::uint64_t memory_budget, std::string name = "cpu:0");
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  std::string name() const override { return name_; }
  Backend backend() const override { return Backend::cpu; }
  Arena& arena() override { return *arena_; }

  Stream& compute_stream() override { return compute_; }
  Stream& copy_stream() override { return copy_; }
  Stream& create_stream(const std::string& name) override;

  void memcpy_async(void* dst, const void* src, std::uint64_t bytes, CopyKind kind,
                    Stream& s) override;
  void host_task(Stream& s, std::function<void()> fn) override;
  Event record(Stream& s) override;
  void wait(Stream& s, const Event& e) override;
  void synchronize(Stream& s) override;
  void synchronize() override;
  CopyStats copy_stats() const override;

 private:
  CpuStream& own(Stream& s);

  std::string name_;
  void* region_ = nullptr;
  std::uint64_t region_bytes_ = 0;
  std::unique_ptr<Arena> arena_;
  CpuStream compute_;
  CpuStream copy_;
  std::mutex streams_mu_;
  std::list<std::unique_ptr<CpuStream>> extra_;
  mutable std::mutex stats_mu_;
  CopyStats stats_;
};

}  // namespace peakbound
