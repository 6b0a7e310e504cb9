// StaggeredBlock: several host arrays carved from one allocation, the i-th starting
// i * kStagger bytes past a 256-byte boundary, so arrays streamed side by side
// (master, m, v; the staging slots) never sit at the same offset within a 4 KiB page.
// Allocated one by one, large host allocations come from mmap at the same offset in
// their pages: every load and store of one element then collides in the same cache
// sets and trips the CPU's 4K-aliasing check; the AdamW update ran 3-4x slower that
// way on this machine (0.28 s against 0.07 s for 64M parameters). The device Arena
// staggers its own large placements (core/arena.h), so only the host state and
// staging of the offload schedules are grouped this way: HostMemory has no say in
// where the system allocator puts each array.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/core/buffer.h"
#include "peakbound/core/footprint.h"

namespace peakbound {

// Where arrays of the given sizes sit in one block, and the block's bytes (0 when
// every size is 0; a multiple of 256 otherwise). Pure: the footprint sizes the block
// with it and the block places its arrays with it.
struct StaggeredLayout {
  std::vector<std::uint64_t> offsets;
  std::uint64_t bytes = 0;
};
StaggeredLayout staggered_layout(const std::vector<std::uint64_t>& sizes);

class StaggeredBlock {
 public:
  static constexpr std::uint64_t kStagger = 4096 + 256;

  StaggeredBlock() = default;
  // One allocation of spec (its bytes must be staggered_layout(sizes).bytes) from `a`
  // holding arrays of the given sizes.
  StaggeredBlock(Allocator& a, const BufferSpec& spec, const std::vector<std::uint64_t>& sizes);

  // Array i (null when its size is 0).
  void* part(std::size_t i) const { return parts_.at(i); }
  template <typename T> T* as(std::size_t i) const { return static_cast<T*>(part(i)); }
  std::uint64_t bytes() const { return block_.bytes(); }

 private:
  Buffer block_;
  std::vector<void*> parts_;
};

}  // namespace peakbound
