// The process groups of a training run, split from the world by the layout flags.
//   cp              context parallel: the ranks of a group (consecutive: rank / cp) hold
//                   the same sequences, each its zigzag shard of every one
//                   (schedules/context_layout.h); attention runs as ring attention over
//                   the group and everything else sees only the rank's tokens. The
//                   world's data-parallel rank is rank / cp, of world / cp.
// Every rank holds its own tokens (data parallel over the world / cp groups); on top of that:
//   ep              expert parallel: E/ep experts per rank, tokens dispatched over the
//                   group (consecutive ranks: rank / ep is the group)
//   ep_replicas     the ranks holding the same experts (rank % ep): their expert
//                   gradients are summed (reduce-scattered) over it
//   vocab           the LM head's vocabulary group: V/vocab rows per rank, each rank's
//                   tokens projected against every shard (consecutive ranks)
//   vocab_replicas  the ranks holding the same head rows (rank % vocab)
// Everything else (embedding, attention, norms, routers, shared and dense MLPs) is held
// FSDP-sharded over the world and its gradient summed over the world (= DP x CP: every
// rank's tokens are distinct). cp, ep and vocab must divide the world size.
#pragma once

#include <cstdint>
#include <memory>

#include "peakbound/comm/communicator.h"

namespace peakbound {

struct ParallelLayout {
  std::int64_t ep = 1;
  std::int64_t vocab = 1;
  std::int64_t cp = 1;
};

struct ProcessGroups {
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> ep, ep_replicas, vocab, vocab_replicas, cp;

  // Collective over world. Throws InvalidArgument (the same on every rank, before any
  // communication) when cp, ep or vocab is < 1 or does not divide the world size.
  static ProcessGroups split(Communicator& world, const ParallelLayout& layout);
};

// The check split() makes, for validation before any collective.
void validate_layout(const ParallelLayout& layout, std::int64_t world_size);

}  // namespace peakbound
