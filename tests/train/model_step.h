// One training forward_backward of a MoeTransformer on this rank's batch, as the trainer
// makes it: the cross-entropy scaled by 1 / the world's scored targets, the gradients
// zeroed first, and afterwards the stores' gradients summed over their groups (as the
// trainer's shard holds them). Returns the world's mean loss (cross-entropy + aux). For
// the multi-rank tests that compare two models' steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "peakbound/train/moe_transformer.h"
#include "tests/comm/world.h"

namespace peakbound::testing {

inline double world_step(MoeTransformer& m, const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& tgt,
                         std::int64_t sequences, std::int64_t seq_len) {
  Communicator& w = world();
  m.zero_grads();
  std::int64_t valid = std::count_if(tgt.begin(), tgt.end(), [](std::int32_t t) { return t != -100; });
  w.all_reduce(&valid, 1, DType::i64, ReduceOp::sum);
  const BatchSums s = m.forward_backward(ids.data(), tgt.data(), sequences, seq_len, 1.0f / float(valid), 1.0f);
  double ce = s.ce;
  w.all_reduce(&ce, 1, DType::f64, ReduceOp::sum);
  std::vector<ParameterStore*> st = m.stores();
  std::vector<Communicator*> g = m.store_groups();
  for (std::size_t i = 0; i < st.size(); ++i)
    g[i]->all_reduce(st[i]->grads_data(), st[i]->elements(), DType::f32, ReduceOp::sum);
  return ce / double(valid) + s.aux;
}

}  // namespace peakbound::testing
