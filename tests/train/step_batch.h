// Shared by the trainer's multi-rank tests that compare two ways of running the same steps
// (checkpoint groups, the vocabulary-parallel embedding): the layout (ep the largest divisor
// of the world and the 8 experts) and each rank's batch of a step.
#pragma once

#include <cstdint>
#include <vector>

#include "peakbound/train/process_groups.h"

namespace peakbound::testing {

// ep the largest divisor of world and 8 experts, the given cp, the vocabulary group `vocab`
// ranks (0: the world).
inline ParallelLayout step_layout(int world, int cp, int vocab = 0) {
  ParallelLayout layout;
  layout.cp = cp;
  layout.ep = world;
  while (8 % layout.ep != 0 || world % layout.ep != 0) --layout.ep;
  layout.vocab = vocab > 0 ? vocab : world;
  return layout;
}

// Rank r's `sequences` x S tokens of step `step`: ids in [0, id_span), targets in [0, 300)
// with every ninth ignored; the ranks of a cp group bring the same sequences.
inline void step_batch(std::int64_t step, int r, int cp, std::int64_t sequences, std::int64_t S, std::int64_t id_span,
                       std::vector<std::int32_t>& ids, std::vector<std::int32_t>& targets) {
  ids.clear();
  targets.clear();
  for (std::int64_t t = 0; t < sequences * S; ++t) {
    const std::uint64_t key =
        (static_cast<std::uint64_t>(step) * 131 + static_cast<std::uint64_t>(r / cp)) * 7919 + static_cast<std::uint64_t>(t);
    ids.push_back(static_cast<std::int32_t>((key * 2654435761u) % static_cast<std::uint64_t>(id_span)));
    targets.push_back(t % 9 == 4 ? -100 : static_cast<std::int32_t>((key * 40503u + 17) % 300));
  }
}

}  // namespace peakbound::testing
