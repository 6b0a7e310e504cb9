// Global gradient-norm clipping for a sharded optimizer: each rank holds a shard of
// the gradients; the norm is taken over all of them before any update. Every rank
// must scale by the same factor, bit for bit, or the shards drift apart, so the
// squared norm is combined deterministically (see global_sum_squares).
#pragma once

#include "peakbound/comm/communicator.h"

namespace peakbound {

struct GradClip {
  double norm = 0;         // the global gradient norm
  float scale = 1.0f;      // what every gradient is multiplied by
};

// The sum over ranks of each rank's local sum of squares. The all-reduce of the
// squared norm is done as an all-gather of the doubles (as bytes: the communicator
// has no f64) summed in rank order, so every rank gets the same bits in double
// precision whatever reduction order the transport would have used.
double global_sum_squares(Communicator& comm, double local_sum_squares);

// torch.nn.utils.clip_grad_norm_: scale = min(1, max_norm / (norm + 1e-6)).
// max_norm <= 0 turns clipping off (scale 1, norm still reported).
GradClip clip_factor(double global_sum_squares, float max_norm);

}  // namespace peakbound
