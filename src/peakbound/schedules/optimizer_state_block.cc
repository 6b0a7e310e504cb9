#include "peakbound/schedules/optimizer_state_block.h"

#include "peakbound/core/error.h"

namespace peakbound {

StaggeredLayout staggered_layout(const std::vector<std::uint64_t>& sizes) {
  StaggeredLayout l;
  std::uint64_t end = 0, total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    total = checked_add(total, sizes[i], "a staggered block");
    const std::uint64_t at = checked_add(end, i == 0 ? 0 : StaggeredBlock::kStagger, "a staggered block");
    l.offsets.push_back(at);
    end = arena_reserved(checked_add(at, sizes[i], "a staggered block"));
  }
  l.bytes = total > 0 ? end : 0;
  return l;
}

StaggeredBlock::StaggeredBlock(Allocator& a, const BufferSpec& spec, const std::vector<std::uint64_t>& sizes) {
  const StaggeredLayout l = staggered_layout(sizes);
  PB_CHECK_MSG(l.bytes == spec.bytes, "a staggered block's spec does not match its arrays");
  block_ = a.allocate(spec.component, spec.bytes);
  for (std::size_t k = 0; k < sizes.size(); ++k)
    parts_.push_back(sizes[k] == 0 ? nullptr : block_.as<char>() + l.offsets[k]);
}

}  // namespace peakbound
