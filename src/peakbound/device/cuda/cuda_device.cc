#include "peakbound/device/cuda/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "peakbound/core/launcher.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

namespace {

// HostMemory's pages on a CUDA device: page-locked, visible to every device (portable).
class PinnedPages final : public HostPages {
 public:
  void* allocate(std::uint64_t bytes) noexcept override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;  // HostMemory reports the refusal with its ledger
    }
    return p;  // page-aligned
  }
  void release(void* p) noexcept override { cudaFreeHost(p); }
  const char* kind() const override { return "pinned"; }
};

// "cudaMemcpyAsync: invalid argument (cudaErrorInvalidValue)"
std::string cuda_message(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error("cuda device: " + cuda_message(what, e));
}

cudaMemcpyKind native_kind(CopyKind k) {
  switch (k) {
    case CopyKind::host_to_device: return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host: return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device: return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

// An Event over a CUDA event (created without timing: the cheap kind).
struct CudaEvent final : Event::Impl {
  cudaEvent_t e = nullptr;
  int ordinal = 0;
  explicit CudaEvent(int dev) : ordinal(dev) { check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() override { cudaEventDestroy(e); }
  bool query() override {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaEventQuery");
    return true;
  }
  void synchronize() override { check(cudaEventSynchronize(e), "cudaEventSynchronize"); }
};

// A host task on the driver's callback thread: runs fn, keeps what it throws.
struct HostTask {
  CudaDevice* dev;
  std::function<void()> fn;
};

void CUDART_CB run_host_task(void* p) {
  std::unique_ptr<HostTask> t(static_cast<HostTask*>(p));
  try {
    t->fn();
  } catch (...) {
    t->dev->keep_failure(std::current_exception());
  }
}

}  // namespace

class CudaStream final : public Stream {
 public:
  CudaStream(std::string name, int priority) : name_(std::move(name)) {
    check(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority), "cudaStreamCreate");
  }
  ~CudaStream() override { cudaStreamDestroy(s_); }
  const std::string& name() const override { return name_; }
  cudaStream_t native() const { return s_; }

 private:
  std::string name_;
  cudaStream_t s_ = nullptr;
};

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cuda_message("cudaGetDeviceCount", e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

CudaDevice::CudaDevice(std::uint64_t memory_budget, int ordinal) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw Unavailable("no CUDA device visible to this process (" + why + "); use --device cpu");
  ordinal_ = ordinal >= 0 ? ordinal : launcher_local_rank() % count;
  if (ordinal_ >= count)
    throw InvalidArgument("cuda device " + std::to_string(ordinal_) + " requested, " + std::to_string(count) + " visible");
  name_ = "cuda:" + std::to_string(ordinal_);
  check(cudaSetDevice(ordinal_), "cudaSetDevice");
  const std::uint64_t budget = memory_budget / Arena::kAlignment * Arena::kAlignment;
  const std::uint64_t reserve = budget > 0 ? Arena::kStaggerReserve : 0;
  if (budget + reserve > 0) {
    const cudaError_t e = cudaMalloc(&region_, budget + reserve);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      region_ = nullptr;
      throw OutOfBudget(name_ + ": cannot allocate the device memory budget of " +
                        format_bytes(static_cast<double>(budget + reserve)) + " (" +
                        format_bytes(static_cast<double>(free_bytes)) + " free of " +
                        format_bytes(static_cast<double>(total)) + "): " + cudaGetErrorString(e));
    }
  }
  arena_ = std::make_unique<Arena>(name_, budget, region_, Location::device, reserve);
  void* slot = nullptr;
  check(cudaHostAlloc(&slot, kResultSlotDoubles * sizeof(double), cudaHostAllocMapped), "cudaHostAlloc");
  result_slot_ = static_cast<double*>(slot);
  pinned_ = std::make_unique<PinnedPages>();
  int lo = 0, hi = 0;  // numerically lower is higher priority
  check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
  compute_ = std::make_unique<CudaStream>(name_ + "/compute", lo);
  copy_ = std::make_unique<CudaStream>(name_ + "/copy", hi);
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  cudaDeviceSynchronize();  // destruction must not throw; a failure was the caller's to collect
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    for (const PendingCopy& p : pending_) {
      cudaEventDestroy(static_cast<cudaEvent_t>(p.start));
      cudaEventDestroy(static_cast<cudaEvent_t>(p.stop));
    }
    pending_.clear();
  }
  if (blas_) cublasDestroy(static_cast<cublasHandle_t>(blas_));
  if (result_slot_) cudaFreeHost(result_slot_);
  extra_.clear();
  compute_.reset();
  copy_.reset();
  arena_.reset();
  if (region_) cudaFree(region_);
}

Stream& CudaDevice::compute_stream() { return *compute_; }
Stream& CudaDevice::copy_stream() { return *copy_; }

Stream& CudaDevice::create_stream(const std::string& name) {
  int lo = 0, hi = 0;
  check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
  std::lock_guard<std::mutex> lock(streams_mu_);
  extra_.push_back(std::make_unique<CudaStream>(name_ + "/" + name, hi));
  return *extra_.back();
}

CudaStream& CudaDevice::own(Stream& s) {
  if (&s == compute_.get() || &s == copy_.get()) return static_cast<CudaStream&>(s);
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (auto& e : extra_)
    if (e.get() == &s) return *e;
  throw InvalidArgument(name_ + ": stream '" + s.name() + "' belongs to another device");
}

void* CudaDevice::native_stream(Stream& s) { return own(s).native(); }

void* CudaDevice::blas_handle() {
  if (!blas_) {
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
    cublasHandle_t h = nullptr;
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) throw Error(name_ + ": cublasCreate: " + cublasGetStatusString(st));
    // f32 means f32: no TF32 inside the f32 GEMMs (the exactness tests compare at f32).
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    blas_ = h;
  }
  return blas_;
}

void CudaDevice::memcpy_async(void* dst, const void* src, std::uint64_t bytes, CopyKind kind, Stream& s) {
  if (bytes == 0) return;
  PB_CHECK_MSG(dst && src, "memcpy_async with a null pointer");
  cudaStream_t st = own(s).native();
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, st), "cudaEventRecord");
  check(cudaMemcpyAsync(dst, src, bytes, native_kind(kind), st), "cudaMemcpyAsync");
  check(cudaEventRecord(stop, st), "cudaEventRecord");
  std::lock_guard<std::mutex> lock(stats_mu_);
  const auto k = static_cast<std::size_t>(kind);
  stats_.bytes[k] += bytes;
  stats_.copies[k] += 1;
  pending_.push_back({start, stop, kind});
  if (pending_.size() >= 1024) settle_copy_timings();  // bounded, even if nobody asks for stats
}

void CudaDevice::host_task(Stream& s, std::function<void()> fn) {
  auto t = std::make_unique<HostTask>(HostTask{this, std::move(fn)});
  check(cudaLaunchHostFunc(own(s).native(), run_host_task, t.get()), "cudaLaunchHostFunc");
  t.release();  // run_host_task owns it now
}

Event CudaDevice::record(Stream& s) {
  auto e = std::make_shared<CudaEvent>(ordinal_);
  check(cudaEventRecord(e->e, own(s).native()), "cudaEventRecord");
  return Event(std::move(e));
}

void CudaDevice::wait(Stream& s, const Event& e) {
  if (!e.impl()) return;  // a default Event is complete
  auto* ce = dynamic_cast<CudaEvent*>(e.impl());
  if (!ce) throw InvalidArgument(name_ + ": waiting on an event of another device");
  check(cudaStreamWaitEvent(own(s).native(), ce->e, 0), "cudaStreamWaitEvent");
}

void CudaDevice::keep_failure(std::exception_ptr e) noexcept {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (!failure_) failure_ = std::move(e);
}

void CudaDevice::rethrow_failure() {
  std::exception_ptr f;
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    f = std::exchange(failure_, nullptr);
  }
  if (f) std::rethrow_exception(f);
}

void CudaDevice::synchronize(Stream& s) {
  check(cudaStreamSynchronize(own(s).native()), "cudaStreamSynchronize");
  rethrow_failure();
}

void CudaDevice::synchronize() {
  check(cudaSetDevice(ordinal_), "cudaSetDevice");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  rethrow_failure();
}

void CudaDevice::settle_copy_timings() const {
  std::vector<PendingCopy> still;
  for (const PendingCopy& p : pending_) {
    auto stop = static_cast<cudaEvent_t>(p.stop), start = static_cast<cudaEvent_t>(p.start);
    if (cudaEventQuery(stop) != cudaSuccess) {
      cudaGetLastError();  // cudaErrorNotReady is not a failure
      still.push_back(p);
      continue;
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start, stop) == cudaSuccess)
      stats_.seconds[static_cast<std::size_t>(p.kind)] += 1e-3 * ms;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  pending_ = std::move(still);
}

CopyStats CudaDevice::copy_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  settle_copy_timings();
  return stats_;
}

}  // namespace peakbound
