// MemoryBandwidth: the memory bandwidth the optimizer's rooflines are measured
// against, taken in the same run as the steps. Four kernels over a working set far
// larger than the last-level cache, split over the pool, each kept at its fastest
// pass; the bandwidth is the best of them, so a roofline fraction is never flattered
// by one weak kernel:
//   memcpy        the C library's copy                         2 bytes per byte copied
//   stream_copy   a copy with non-temporal stores (no read for ownership)
//   read_modify   x = x * 0.5 + y, in place                    12 bytes per element
//   adam_pattern  the AdamW update's streams without its arithmetic: three fp32 arrays
//                 read and written in place, a bf16 array read, one written (with
//                 non-temporal stores, as the large update writes its parameter): 28 bytes
// The arrays are staggered (StaggeredBlock) as the optimizer's own are.
#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/schedules/optimizer_state_block.h"

namespace peakbound {

class MemoryBandwidth {
 public:
  // working_set_bytes >= 1 MiB: the memory all kernels share.
  MemoryBandwidth(ThreadPool& pool, std::uint64_t working_set_bytes);

  // One timed pass of every kernel.
  void run_once();
  // The best kernel's GB/s (1e9 bytes per second) so far.
  double best_gbps() const;
  // {"memcpy_gbps", "stream_copy_gbps", "read_modify_write_gbps", "adam_pattern_gbps",
  //  "working_set_bytes"}
  nlohmann::json to_json() const;

 private:
  ThreadPool& pool_;
  HostMemory host_;
  std::uint64_t n_;  // elements per array
  StaggeredBlock block_;  // fp32 a, b, c; bf16 d, e: 16 bytes per element in all
  double memcpy_ = 0, stream_ = 0, rmw_ = 0, adam_ = 0;
};

}  // namespace peakbound
