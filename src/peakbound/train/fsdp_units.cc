#include "peakbound/train/fsdp_units.h"

#include <algorithm>

#include "peakbound/core/error.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/ops/elementwise.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;

// Router buffers (e_score_correction_bias) are the model's f32 state, not FSDP parameters.
bool fsdp_kind(const TensorEntry& e) {
  return e.kind != TensorKind::expert && e.kind != TensorKind::head && !is_router_buffer(e);
}
// A unit holds each of its tensors whole.
RowRange whole(const TensorEntry& e) { return RowRange{0, e.shape.empty() ? 1 : e.shape[0]}; }

}  // namespace

std::optional<std::size_t> fsdp_unit_of(const TensorEntry& e, std::int64_t num_layers, bool with_embedding) {
  if (e.kind == TensorKind::embedding) return with_embedding ? std::optional<std::size_t>(0) : std::nullopt;
  if (e.layer < 0) {
    if (e.kind == TensorKind::norm) return static_cast<std::size_t>(num_layers) + 1;
    return std::nullopt;
  }
  if (fsdp_kind(e)) return static_cast<std::size_t>(e.layer) + 1;
  return std::nullopt;
}

ShardSelector fsdp_unit_selector(const TensorTable& table, std::size_t u, bool with_embedding) {
  const std::int64_t L = table.config().num_layers;
  if (u > static_cast<std::size_t>(L) + 1)
    throw InvalidArgument("fsdp: unit " + std::to_string(u) + " of " + std::to_string(L + 2));
  return [u, L, with_embedding](const TensorEntry& e) -> std::optional<RowRange> {
    if (fsdp_unit_of(e, L, with_embedding) != u) return std::nullopt;
    return whole(e);
  };
}

LayoutOptions fsdp_layout_options(int group_size) {
  if (group_size < 1) throw InvalidArgument("fsdp: the group size must be >= 1");
  return LayoutOptions{kViewAlignElements, kViewAlignElements * static_cast<u64>(group_size)};
}

std::vector<ParameterLayout> fsdp_unit_layouts(const TensorTable& table, int group_size, bool with_embedding) {
  // One pass over the table (a 235B model's has tens of thousands of expert entries),
  // each entry into its unit's layout in table order: what parameter_layout with
  // fsdp_unit_selector(u) builds for each u.
  const std::int64_t L = table.config().num_layers;
  std::vector<ParameterLayoutBuilder> units(static_cast<std::size_t>(L) + 2,
                                            ParameterLayoutBuilder(fsdp_layout_options(group_size)));
  table.for_each([&](const TensorEntry& e) {
    if (const std::optional<std::size_t> u = fsdp_unit_of(e, L, with_embedding))
      units[*u].add(e, whole(e));
  });
  std::vector<ParameterLayout> out;
  out.reserve(units.size());
  for (ParameterLayoutBuilder& b : units) out.push_back(std::move(b).finish());
  return out;
}

FsdpBuffers fsdp_buffers(const TensorTable& table, int group_size, Precision precision, u64 tail,
                         bool with_embedding) {
  return fsdp_buffers(fsdp_unit_layouts(table, group_size, with_embedding), group_size, precision, tail);
}

FsdpBuffers fsdp_buffers(const std::vector<ParameterLayout>& units, int group_size, Precision precision, u64 tail) {
  PB_CHECK_MSG(units.size() >= 2, "fsdp: the unit layouts hold the embedding and the final norm at least");
  const auto G = static_cast<u64>(group_size);
  u64 shard = 0, max_shard = 0, max_layer = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    shard = checked_add(shard, units[u].elements / G, "fsdp shard");
    max_shard = std::max(max_shard, units[u].elements / G);
    if (u > 0 && u + 1 < units.size()) max_layer = std::max(max_layer, units[u].elements);
  }
  const u64 f32 = sizeof(float), pb = dtype_size(param_dtype(precision));
  FsdpBuffers b;
  const u64 held = checked_add(shard, tail, "fsdp shard and the trainer's tail");
  b.params_shard = buffer_spec(Component::params, held, pb);
  b.grads_shard = buffer_spec(Component::grads, held, f32);
  b.scratch = buffer_spec(Component::comm, max_shard, f32);
  b.layer_params = buffer_spec(Component::params, max_layer, pb);
  b.layer_grads = buffer_spec(Component::grads, max_layer, f32);
  b.embed_params = buffer_spec(Component::params, units.front().elements, pb);
  b.embed_grads = buffer_spec(Component::grads, units.front().elements, f32);
  b.norm_params = buffer_spec(Component::params, units.back().elements, pb);
  b.norm_grads = buffer_spec(Component::grads, units.back().elements, f32);
  return b;
}

FsdpUnits::FsdpUnits(Device& dev, const TensorTable& table, Communicator& group, Precision precision, u64 tail,
                     bool reduce_thread, bool with_embedding)
    : dev_(dev), g_(group), precision_(precision), layouts_(fsdp_unit_layouts(table, group.size(), with_embedding)),
      tail_(tail), buffers_(fsdp_buffers(layouts_, group.size(), precision, tail)), with_embedding_(with_embedding) {
  for (std::size_t u = 0; u < layouts_.size(); ++u) {
    offsets_.push_back(shard_elements_);
    shard_elements_ += shard_len(u);
  }
  params_ = dev.allocate(buffers_.params_shard.component, buffers_.params_shard.bytes);
  grads_ = dev.allocate(buffers_.grads_shard.component, buffers_.grads_shard.bytes);
  scratch_ = dev.allocate(buffers_.scratch.component, buffers_.scratch.bytes);
  Stream& s = dev.compute_stream();
  const auto held = static_cast<std::int64_t>(shard_elements_ + tail_);
  if (param_dtype() == DType::bf16)
    ops::fill(dev, s, params_.as<bf16>(), held, 0.0f);
  else
    ops::fill(dev, s, params_.as<float>(), held, 0.0f);
  ops::fill(dev, s, grads_.as<float>(), held, 0.0f);
  dev.synchronize(s);
  // The reduce-scatter's own thread, on the CPU device only: a CUDA host thread would need
  // its own stream ordering (NCCL enqueues on streams instead).
  if (reduce_thread && group.size() > 1 && group.concurrent_threads() && dev.backend() == Backend::cpu)
    reducer_ = std::make_unique<CollectiveThread>(group);
}

FsdpUnits::~FsdpUnits() {
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; the failure was the step's to report.
  }
}

std::pair<std::size_t, const ParameterView*> FsdpUnits::find(const std::string& name) const {
  for (std::size_t u = 0; u < layouts_.size(); ++u)
    for (const ParameterView& v : layouts_[u].views)
      if (v.name() == name) return {u, &v};
  throw InvalidArgument("fsdp: no tensor '" + name + "' in the sharded parameters");
}

void FsdpUnits::check_param_dtype(DType want) const {
  if (param_dtype() != want)
    throw InternalError("fsdp: asked for " + std::string(dtype_name(want)) + " parameters, but the shard holds " +
                        std::string(dtype_name(param_dtype())) + " ones (precision " +
                        std::string(precision_name(precision_)) + "; use params_shard_as<T> / params_shard_raw)");
}

const std::byte* FsdpUnits::param_shard_of(std::size_t u) const {
  return params_.as<std::byte>() + offsets_[u] * dtype_size(param_dtype());
}

void FsdpUnits::gather(std::size_t u, void* dst) {
  const PhaseScope phase(StepPhase::fsdp);
  const bool prefetched = prefetch_ && prefetch_->unit == u && prefetch_->dst == dst;
  finish_prefetch();
  if (prefetched) return;
  dev_.synchronize();
  g_.all_gather(param_shard_of(u), dst, shard_len(u), param_dtype());
}

void FsdpUnits::prefetch(std::size_t u, void* dst) {
  const PhaseScope phase(StepPhase::fsdp);
  finish_prefetch();
  dev_.synchronize();  // nothing still reads dst
  prefetch_.emplace(Prefetch{u, dst, g_.iall_gather(param_shard_of(u), dst, shard_len(u), param_dtype())});
}

void FsdpUnits::finish_prefetch() {
  if (!prefetch_) return;
  Request r = std::move(prefetch_->request);
  prefetch_.reset();
  r.wait();
}

void FsdpUnits::gather(std::size_t u, float* dst) {
  check_param_dtype(DType::f32);
  gather(u, static_cast<void*>(dst));
}

void FsdpUnits::gather_grads(std::size_t u, float* dst) {
  const PhaseScope phase(StepPhase::fsdp);
  finish_reduce();
  dev_.synchronize();
  g_.all_gather(grads_shard() + offsets_[u], dst, shard_len(u), DType::f32);
}

void FsdpUnits::reduce_add(std::size_t u, const float* full) {
  const PhaseScope phase(StepPhase::fsdp);
  finish_reduce();  // the scratch is free and the earlier unit added
  dev_.synchronize();
  g_.reduce_scatter(full, scratch_.as<float>(), shard_len(u), DType::f32, ReduceOp::sum);
  add_scratch(u);
}

void FsdpUnits::add_scratch(std::size_t u) {
  Stream& s = dev_.compute_stream();
  ops::axpy(dev_, s, grads_shard() + offsets_[u], scratch_.as<float>(), static_cast<std::int64_t>(shard_len(u)),
            1.0f);
  dev_.synchronize(s);  // the scratch is reused by the next unit
}

void FsdpUnits::reduce_add_async(std::size_t u, const float* full) {
  if (!reducer_) {
    reduce_add(u, full);
    return;
  }
  const PhaseScope phase(StepPhase::fsdp);
  finish_reduce();
  dev_.synchronize();  // full is written
  const u64 n = shard_len(u);
  float* scratch = scratch_.as<float>();
  reducer_->start([full, scratch, n](Communicator& g) { g.reduce_scatter(full, scratch, n, DType::f32, ReduceOp::sum); });
  reducing_ = u;
}

void FsdpUnits::finish_reduce() {
  if (!reducing_) return;
  const std::size_t u = *reducing_;
  reducing_.reset();
  reducer_->wait();
  add_scratch(u);
}

void FsdpUnits::finish() {
  const PhaseScope phase(StepPhase::fsdp);
  finish_prefetch();
  finish_reduce();
}

void FsdpUnits::set_pending_master(std::vector<float> master) {
  if (master.size() != shard_elements_)
    throw InternalError("fsdp: a pending master of " + std::to_string(master.size()) + " values for a shard of " +
                        std::to_string(shard_elements_) + " elements");
  pending_master_ = std::move(master);
}

void FsdpUnits::zero_grads() {
  finish();
  ops::fill(dev_, dev_.compute_stream(), grads_shard(), static_cast<std::int64_t>(shard_elements_), 0.0f);
}

}  // namespace peakbound
