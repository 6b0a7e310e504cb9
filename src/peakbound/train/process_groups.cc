#include "peakbound/train/process_groups.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

void validate_layout(const ParallelLayout& layout, std::int64_t world) {
  auto check = [&](const char* flag, std::int64_t v) {
    if (v < 1 || world % v != 0)
      throw InvalidArgument(std::string(flag) + " " + std::to_string(v) + " must be >= 1 and divide the " +
                            std::to_string(world) + " ranks");
  };
  check("--ep", layout.ep);
  check("--vocab-group", layout.vocab);
  check("--cp", layout.cp);
}

ProcessGroups ProcessGroups::split(Communicator& world, const ParallelLayout& layout) {
  validate_layout(layout, world.size());
  const int r = world.rank();
  const int ep = static_cast<int>(layout.ep), vg = static_cast<int>(layout.vocab);
  ProcessGroups g;
  g.world = &world;
  g.ep = world.split(r / ep, r);
  g.ep_replicas = world.split(r % ep, r);
  g.vocab = world.split(r / vg, r);
  g.vocab_replicas = world.split(r % vg, r);
  const int cp = static_cast<int>(layout.cp);
  g.cp = world.split(r / cp, r);
  return g;
}

}  // namespace peakbound
