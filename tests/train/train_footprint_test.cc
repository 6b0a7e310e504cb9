// train_footprint on one rank: after one Trainer::step the Arena's (and HostMemory's)
// measured peaks equal the footprint per component and in total, schedules none and
// all, and SCO with boundaries offloaded to the host; the phases and the argument
// checks.
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/train_footprint.h"

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "tests/train/train_footprint_check.h"

namespace peakbound {
namespace {

using namespace train_footprint_check;

TEST(TrainFootprint, MeasuredEqualsFootprintNone) {
  SingleRankCommunicator world;
  check(world, kNone, tiny_model());
}

TEST(TrainFootprint, MeasuredEqualsFootprintAll) {
  SingleRankCommunicator world;
  check(world, kAll, tiny_model());
}

// Six layers, the last one resident: three ring slots and two boundaries on the host.
TEST(TrainFootprint, MeasuredEqualsFootprintScoOffloaded) {
  SingleRankCommunicator world;
  CheckpointOptions o;
  o.resident_layers = 1;
  check(world, kAll, tiny_model(6), &o);
  const Measured m = run_step(world, kAll, tiny_model(6), 2, 24, &o);
  EXPECT_GT(m.host[static_cast<std::size_t>(Component::checkpoints)], 0u);
}

TrainFootprintInputs inputs() {
  TrainFootprintInputs in;
  in.model = tiny_model();
  in.sequences = 2;
  in.seq_len = 24;
  return in;
}

TEST(TrainFootprint, PhasesAndEstimate) {
  const Footprint f = train_footprint(inputs());
  for (const char* p : {"optimizer load", "embedding forward", "forward attention", "forward dense mlp", "forward mlp",
                        "loss forward", "embedding backward",
                        "loss backward", "final norm backward", "backward mlp", "backward dense mlp",
                        "backward attention recompute", "backward attention", "optimizer"})
    EXPECT_TRUE(f.has_phase(p)) << p;
  // The persistent buffers are in every phase; under FSDP the embedding and the final
  // norm are gathered (parameters) only in their own phases.
  const std::uint64_t persistent = f.phase("optimizer").device[static_cast<std::size_t>(Component::params)];
  const FsdpBuffers fb = fsdp_buffers(TensorTable(inputs().model), inputs().world);
  for (const Footprint::Phase& p : f.phases()) {
    const std::uint64_t params = p.device[static_cast<std::size_t>(Component::params)];
    const std::uint64_t gathered = p.name == "embedding forward" ? fb.embed_params.reserved()
                                   : p.name.rfind("loss", 0) == 0 || p.name == "final norm backward"
                                       ? fb.norm_params.reserved()
                                       : 0;
    EXPECT_EQ(params, persistent + gathered) << p.name;
    EXPECT_EQ(p.device[static_cast<std::size_t>(Component::optimizer)], f.device_peak(Component::optimizer))
        << p.name;
  }
  // Unset dispatch: the estimate sizes the routed experts' buffers; more skew, more memory.
  TrainFootprintInputs skewed = inputs();
  skewed.skew = 4.0;
  EXPECT_GT(f.device_peak(Component::dispatch), 0u);
  EXPECT_GE(train_footprint(skewed).device_peak(Component::dispatch), f.device_peak(Component::dispatch));
  // No tokens: no stack, no activations, the persistent state only (and the dispatch's receive side).
  TrainFootprintInputs none = inputs();
  none.sequences = 0;
  const Footprint z = train_footprint(none);
  EXPECT_EQ(z.device_peak(Component::checkpoints), 0u);
  EXPECT_EQ(z.device_peak(Component::layer), 0u);
}

TEST(TrainFootprint, RejectsBadInputs) {
  TrainFootprintInputs in = inputs();
  in.seq_len = 0;
  EXPECT_THROW(train_footprint(in), InvalidArgument);
  in = inputs();
  in.world = 4;
  in.layout.ep = 3;
  EXPECT_THROW(train_footprint(in), InvalidArgument);
  in = inputs();
  in.rank = 1;
  EXPECT_THROW(train_footprint(in), InvalidArgument);
  in = inputs();
  in.optimizer = "nope";
  EXPECT_THROW(train_footprint(in), InvalidArgument);
}

}  // namespace
}  // namespace peakbound
