// The exactness harness of expert dispatch, shared by the tests, `verify dispatch` and
// `bench dispatch`: routing skews, a deterministic problem every rank can generate
// whole, a dense double-precision reference, and one run compared against it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/schedules/moe_dispatch.h"

namespace peakbound {

enum class Skew : std::uint8_t { uniform, zipf, hot, all_to_one_rank, one_expert, source };
std::string_view skew_name(Skew s);
Skew parse_skew(std::string_view s);  // uniform|zipf|hot|all-to-one-rank|one-expert|source

struct MoeProblemSpec {
  MoeShape shape;
  int ranks = 1;
  std::int64_t tokens = 0;  // per rank (source skew: rank 0 gets 8x, rank 1 none)
  Skew skew = Skew::uniform;
  double zipf_s = 1.2;       // zipf: P(expert e) ~ (e + 1)^-s, finite and >= 0
  double hot_share = 0.95;   // hot: share of tokens routed to rank 0's experts
  std::uint64_t seed = 1;
};

struct MoeProblem {
  MoeProblemSpec spec;
  std::vector<std::int64_t> tokens;   // per rank
  std::vector<float> x;               // [N, H]
  std::vector<std::int32_t> ids;      // [N, K], distinct experts per token
  std::vector<float> weights;         // [N, K]
  std::vector<float> dy;              // [N, H]
  std::vector<float> params;          // [E, 3FH]
  std::int64_t offset(int rank) const;
};
// Throws InvalidArgument for a non-finite or negative zipf_s.
MoeProblem make_moe_problem(const MoeProblemSpec& spec);

// The dispatch footprint of `rank` on this problem under `kind`: the routing plan every
// rank will derive, computed here from the whole problem (for budgets and tests).
Footprint moe_problem_footprint(const MoeProblem& p, int rank, DispatchKind kind, const DispatchOptions& options,
                                std::uint64_t elem_bytes);

struct MoeReference {
  std::vector<float> y, dx, dw, dparams;
};
MoeReference dense_moe_reference(const MoeProblem& p);

// One rank's slice of a problem in device memory, as a model holds it: x, the routing
// (expert ids and weights) and dy under Component::layer, its experts under params; the
// outputs y, dx, d weights (layer) and the experts' gradients (grads). forward and
// backward run a dispatch on them (backward zeroes the expert gradients it adds into
// first); the outputs come back with copies.
class MoeRankOnDevice {
 public:
  MoeRankOnDevice(Device& dev, const MoeProblem& p, int rank, int ranks);
  // The device bytes it allocates (each buffer as the Arena reserves it).
  static std::uint64_t bytes(const MoeProblem& p, int rank, int ranks);

  // kept: MoeDispatch's (the forward keeps its experts' intermediates there, the backward takes them).
  void forward(MoeDispatch& d, Buffer* kept = nullptr);
  void backward(MoeDispatch& d, Buffer* kept = nullptr);
  std::vector<float> y() const { return read(y_, T_ * H_); }
  std::vector<float> dx() const { return read(dx_, T_ * H_); }
  std::vector<float> dw() const { return read(dw_, T_ * K_); }
  std::vector<float> dparams() const { return read(dparams_, expert_floats_); }

 private:
  std::vector<float> read(const Buffer& b, std::int64_t n) const;
  Device& dev_;
  std::int64_t T_, H_, K_, expert_floats_;
  Buffer x_, ids_, w_, params_, dy_, y_, dx_, dw_, dparams_;
};

struct MoeCheck {
  double rel_err_y = 0, rel_err_dx = 0, rel_err_dw = 0, rel_err_dparams = 0;  // max over ranks
  double max() const;
};
// Forward + backward of `d` on this rank's slice (moved to d's device) against the reference.
MoeCheck check_moe_dispatch(MoeDispatch& d, Communicator& group, const MoeProblem& p, const MoeReference& ref);

}  // namespace peakbound
