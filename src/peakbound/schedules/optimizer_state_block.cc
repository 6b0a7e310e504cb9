#include "peakbound/schedules/optimizer_state_block.h"

#include "peakbound/core/arena.h"

namespace peakbound {

namespace {
std::uint64_t round_up(std::uint64_t x) { return (x + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment; }
}  // namespace

StaggeredBlock::StaggeredBlock(Allocator& a, Component c, std::initializer_list<std::uint64_t> sizes) {
  std::vector<std::uint64_t> offsets;
  std::uint64_t end = 0, i = 0, total = 0;
  for (std::uint64_t s : sizes) {
    total += s;
    const std::uint64_t at = end + (i++ == 0 ? 0 : kStagger);
    offsets.push_back(at);
    end = round_up(at + s);
  }
  if (total > 0) block_ = a.allocate(c, end);
  for (std::size_t k = 0; k < offsets.size(); ++k) {
    const std::uint64_t size = *(sizes.begin() + k);
    parts_.push_back(size == 0 ? nullptr : block_.as<char>() + offsets[k]);
  }
}

}  // namespace peakbound
