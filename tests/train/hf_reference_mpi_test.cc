// The model against Hugging Face transformers' own Qwen3-MoE and Mixtral: the fixtures
// (scripts/hf_reference/make_fixtures.py) hold a tiny random model of each family as
// save_pretrained wrote it, a batch of input ids, and transformers' loss, cross-entropy,
// aux loss and every parameter gradient (fp32, eager attention, labels = input_ids).
// peakbound loads the directory through the users' path (config.json + safetensors),
// runs forward and backward with every combination of schedules, and must match the
// loss terms and every gradient to 1e-4 relative. At N ranks the batch's sequences are
// spread over the ranks (ranks past the batch hold none), experts over the largest EP
// that divides both N and E, the head over all N ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "peakbound/core/host_memory.h"
#include "peakbound/core/thread_pool.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/io/safetensors.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/train/fsdp_units.h"
#include "peakbound/train/moe_transformer.h"
#include "tests/comm/world.h"

namespace peakbound {
namespace {

const std::string kFixtures = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/";
constexpr double kTol = 1e-4;

struct Variant {
  const char* name;
  DispatchKind dispatch;
  bool ring_dtp;
  CheckpointSchedule checkpoint;
};

void check_family(const std::string& family, const Variant& v) {
  SCOPED_TRACE(family + " " + v.name);
  Communicator& world = testing::world();
  const int W = world.size(), r = world.rank();
  const std::string dir = kFixtures + family;
  const ModelConfig config = load_hf_config(dir);
  const SafeTensorsFile ref = SafeTensorsFile::open(dir + "/reference.safetensors");
  const std::vector<std::int64_t> ids64 = ref.read_i64("input_ids");
  const std::int64_t B = ref.info("input_ids").shape[0], S = ref.info("input_ids").shape[1];

  ParallelLayout layout;
  layout.ep = W;
  while (config.num_experts % layout.ep != 0 || W % layout.ep != 0) --layout.ep;
  layout.vocab = W;
  ProcessGroups groups = ProcessGroups::split(world, layout);

  CpuDevice dev(256 << 20);
  HostMemory host;
  ModelSchedules sched;
  sched.dispatch = v.dispatch;
  sched.ring_dtp = v.ring_dtp;
  sched.checkpoint.schedule = v.checkpoint;
  MoeTransformer model(dev, host, groups, config, sched);
  model.load_hf(dir);

  // This rank's sequences: a contiguous block, the first B % W ranks one more.
  const std::int64_t base = B / W, extra = B % W;
  const std::int64_t mine = base + (r < extra ? 1 : 0), first = r * base + std::min<std::int64_t>(r, extra);
  std::vector<std::int32_t> ids, targets;
  for (std::int64_t b = first; b < first + mine; ++b)
    for (std::int64_t t = 0; t < S; ++t) {
      ids.push_back(static_cast<std::int32_t>(ids64[b * S + t]));
      targets.push_back(t + 1 < S ? static_cast<std::int32_t>(ids64[b * S + t + 1]) : -100);
    }
  const float ce_scale = 1.0f / static_cast<float>(B * (S - 1));
  model.zero_grads();
  const BatchSums sums = model.forward_backward(ids.data(), targets.data(), mine, S, ce_scale, 1.0f);
  double ce[2] = {sums.ce, static_cast<double>(sums.tokens)};
  world.all_reduce(ce, 2, DType::f64, ReduceOp::sum);
  ASSERT_EQ(ce[1], static_cast<double>(B * (S - 1)));

  const double want_ce = ref.read_f32("ce_loss")[0];
  const double want_aux = config.router_aux_loss_coef * ref.read_f32("aux_loss")[0];
  const double got_ce = ce[0] / ce[1];
  EXPECT_LT(std::abs(got_ce - want_ce) / std::abs(want_ce), kTol) << "ce " << got_ce << " vs " << want_ce;
  EXPECT_LT(std::abs(sums.aux - want_aux) / std::abs(want_aux), kTol) << "aux " << sums.aux << " vs " << want_aux;
  const double want_loss = ref.read_f32("loss")[0];
  EXPECT_LT(std::abs(got_ce + sums.aux - want_loss) / std::abs(want_loss), kTol);

  // Gradients: each store summed over its replica group, then every tensor this rank
  // holds against transformers' (the rows it holds).
  std::vector<ParameterStore*> stores = model.stores();
  std::vector<Communicator*> sgroups = model.store_groups();
  std::int64_t checked = 0;
  double worst = 0;
  for (std::size_t i = 0; i < stores.size(); ++i) {
    ParameterStore& s = *stores[i];
    sgroups[i]->all_reduce(s.grads_data(), s.elements(), DType::f32, ReduceOp::sum);
    for (const ParameterView& pv : s) {
      const std::vector<float> full = ref.read_f32("grad." + pv.name());
      std::int64_t row = 1;
      for (std::size_t d = 1; d < pv.entry.shape.size(); ++d) row *= pv.entry.shape[d];
      const float* got = s.grad(pv);
      double num = 0, den = 0;
      for (std::int64_t k = 0; k < pv.numel(); ++k) {
        const double want = full[static_cast<std::size_t>(pv.rows.begin * row + k)];
        num = std::max(num, std::abs(static_cast<double>(got[k]) - want));
        den = std::max(den, std::abs(want));
      }
      const double e = den > 0 ? num / den : num;
      worst = std::max(worst, e);
      EXPECT_LT(e, kTol) << "grad " << pv.name();
      ++checked;
    }
  }
  // The FSDP units: each unit's gradient gathered whole, every tensor in it compared.
  FsdpUnits& fsdp = model.fsdp();
  for (std::size_t u = 0; u < fsdp.size(); ++u) {
    std::vector<float> unit(fsdp.layout(u).elements);
    fsdp.gather_grads(u, unit.data());
    for (const ParameterView& pv : fsdp.layout(u).views) {
      const std::vector<float> full = ref.read_f32("grad." + pv.name());
      double num = 0, den = 0;
      for (std::int64_t k = 0; k < pv.numel(); ++k) {
        const double want = full[static_cast<std::size_t>(k)];
        num = std::max(num, std::abs(static_cast<double>(unit[pv.offset + static_cast<std::size_t>(k)]) - want));
        den = std::max(den, std::abs(want));
      }
      const double e = den > 0 ? num / den : num;
      worst = std::max(worst, e);
      EXPECT_LT(e, kTol) << "grad " << pv.name();
      ++checked;
    }
  }
  std::int64_t all = checked;
  world.all_reduce(&all, 1, DType::i64, ReduceOp::sum);
  EXPECT_GT(all, 0);
  if (r == 0)
    std::printf("%s %s at %d ranks (ep %lld): ce %.7f (ref %.7f), aux %.7f (ref %.7f), worst grad rel err %.3g\n",
                family.c_str(), v.name, W, static_cast<long long>(layout.ep), got_ce, want_ce, sums.aux, want_aux,
                worst);
}

const Variant kNone{"none", DispatchKind::standard_ep, false, CheckpointSchedule::resident};
const Variant kAll{"all", DispatchKind::pipelined_llep, true, CheckpointSchedule::sco};
const Variant kLlep{"llep", DispatchKind::llep, false, CheckpointSchedule::resident};

TEST(HfReference, Qwen3MoeMatchesTransformers) {
  for (const Variant& v : {kNone, kAll, kLlep}) check_family("qwen3_moe", v);
}

TEST(HfReference, MixtralMatchesTransformers) {
  for (const Variant& v : {kNone, kAll, kLlep}) check_family("mixtral", v);
}

}  // namespace
}  // namespace peakbound
