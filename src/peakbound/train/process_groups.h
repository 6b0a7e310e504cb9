// The process groups of a training run, split from the world by the layout flags.
// Every rank holds whole sequences (data parallel over the world); on top of that:
//   ep              expert parallel: E/ep experts per rank, tokens dispatched over the
//                   group (consecutive ranks: rank / ep is the group)
//   ep_replicas     the ranks holding the same experts (rank % ep): their expert
//                   gradients are summed (reduce-scattered) over it
//   vocab           the LM head's vocabulary group: V/vocab rows per rank, each rank's
//                   tokens projected against every shard (consecutive ranks)
//   vocab_replicas  the ranks holding the same head rows (rank % vocab)
// Everything else (embedding, attention, norms, routers, shared and dense MLPs) is held
// whole on every rank and its gradient summed over the world. ep and vocab must divide
// the world size.
#pragma once

#include <cstdint>
#include <memory>

#include "peakbound/comm/communicator.h"

namespace peakbound {

struct ParallelLayout {
  std::int64_t ep = 1;
  std::int64_t vocab = 1;
};

struct ProcessGroups {
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> ep, ep_replicas, vocab, vocab_replicas;

  // Collective over world. Throws InvalidArgument (the same on every rank, before any
  // communication) when ep or vocab is < 1 or does not divide the world size.
  static ProcessGroups split(Communicator& world, const ParallelLayout& layout);
};

// The check split() makes, for validation before any collective.
void validate_layout(const ParallelLayout& layout, std::int64_t world_size);

}  // namespace peakbound
