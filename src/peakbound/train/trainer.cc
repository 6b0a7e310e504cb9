#include "peakbound/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>

#include "peakbound/core/error.h"
#include "peakbound/core/memory_timeline.h"
#include "peakbound/core/phase_clock.h"
#include "peakbound/train/fsdp_units.h"

namespace peakbound {

namespace {

std::int64_t valid_targets(const MicroBatch& b, std::int32_t ignore) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < b.sequences * b.seq_len; ++i) n += b.targets[i] != ignore;
  return n;
}

std::string first_nonfinite_in(const std::vector<float>& g, const std::vector<ShardSegment>& segments,
                               Communicator& world);
std::string first_nonfinite_bf16(Device& dev, const void* shard, std::uint64_t n,
                                 const std::vector<ShardSegment>& segments, Communicator& world);

}  // namespace

Trainer::Trainer(MoeTransformer& model, HostMemory& host, ThreadPool& pool, const TrainerOptions& options)
    : model_(model), options_(options) {
  if (!(options_.router_bias_speed >= 0.0f && options_.router_bias_speed < 1e3f))
    throw InvalidArgument("trainer: the router bias update speed must be >= 0 and finite, got " +
                          std::to_string(options_.router_bias_speed));
  Device& dev = model.experts().device();
  // The FSDP units' shard first (already this rank's slice, reduced layer by layer in the
  // backward), then the slices of the stores held whole.
  fsdp_len_ = model.fsdp().shard_elements();
  shard_elems_ = fsdp_len_;
  std::vector<ParameterStore*> stores = model.stores();
  std::vector<Communicator*> groups = model.store_groups();
  for (std::size_t i = 0; i < stores.size(); ++i) {
    const auto G = static_cast<std::uint64_t>(groups[i]->size());
    if (stores[i]->elements() % G != 0)
      throw InternalError("trainer: a parameter store is not padded to its group's size");
    slices_.push_back({stores[i], groups[i], stores[i]->elements() / G, shard_elems_});
    shard_elems_ += stores[i]->elements() / G;
  }
  // The optimizer's shard is the FSDP units' own buffers, the stores' slices in their tail.
  if (model.fsdp().tail_elements() != shard_elems_ - fsdp_len_)
    throw InternalError("trainer: the FSDP shard's tail holds " + std::to_string(model.fsdp().tail_elements()) +
                        " elements, the stores' slices " + std::to_string(shard_elems_ - fsdp_len_));
  param_shard_ = model.fsdp().params_shard_raw();
  grad_shard_ = model.fsdp().grads_shard();
  const Precision prec = model.schedules().precision;
  for (Slice& s : slices_) {
    const bool params_there = s.store->params_raw() == static_cast<std::byte*>(param_shard_) +
                                                           s.offset * dtype_size(param_dtype(prec));
    const bool grads_there = s.store->grads_data() == grad_shard_ + s.offset;
    if (params_there != grads_there || (params_there && s.group->size() != 1))
      throw InternalError("trainer: a parameter store is in the FSDP shard's tail only in part");
    s.in_shard = params_there;
  }
  ParamShard shard{param_shard_, param_dtype(prec), grad_shard_, DType::f32, static_cast<std::int64_t>(shard_elems_)};
  if (prec == Precision::bf16) {
    // The model holds only bf16 copies: the master comes from what init / load left.
    std::vector<float> master = take_pending_masters();
    opt_ = make_optimizer_schedule(options_.optimizer, OptimizerContext{dev, host, pool, *model.groups().world},
                                   shard, options_.optimizer_options);
    opt_->load(master.data());  // writes the shard = to_bf16(master)
    publish();
    return;
  }
  opt_ = make_optimizer_schedule(options_.optimizer, OptimizerContext{dev, host, pool, *model.groups().world}, shard,
                                 options_.optimizer_options);
  // The master weights: this rank's slice of every store.
  std::vector<float> master(shard_elems_);
  dev.synchronize();
  dev.memcpy_async(master.data(), model.fsdp().params_shard(), fsdp_len_ * sizeof(float), CopyKind::device_to_host,
                   dev.copy_stream());
  for (const Slice& s : slices_) {
    const float* src = s.store->params_data() + s.len * static_cast<std::uint64_t>(s.group->rank());
    dev.memcpy_async(master.data() + s.offset, src, s.len * sizeof(float), CopyKind::device_to_host,
                     dev.copy_stream());
  }
  dev.synchronize(dev.copy_stream());
  opt_->load(master.data());
}

Trainer::~Trainer() = default;

std::vector<float> Trainer::take_pending_masters() {
  FsdpUnits& fsdp = model_.fsdp();
  bool missing = !fsdp.has_pending_master();
  for (const Slice& s : slices_) missing = missing || !s.store->has_pending_master();
  if (missing) throw InvalidArgument("trainer: a bf16 model needs init_parameters or load_hf before its Trainer");
  std::vector<float> master(shard_elems_);
  const std::vector<float> f = fsdp.take_pending_master();
  std::copy(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(fsdp_len_), master.begin());
  for (const Slice& s : slices_) {
    const std::vector<float> m = s.store->take_pending_master();
    const auto from = static_cast<std::ptrdiff_t>(s.len * static_cast<std::uint64_t>(s.group->rank()));
    std::copy(m.begin() + from, m.begin() + from + static_cast<std::ptrdiff_t>(s.len),
              master.begin() + static_cast<std::ptrdiff_t>(s.offset));
  }
  return master;
}

void Trainer::publish() {
  const PhaseScope phase(StepPhase::fsdp);
  Device& dev = model_.experts().device();
  const DType t = model_.fsdp().param_dtype();
  const std::uint64_t es = dtype_size(t);
  dev.synchronize();  // the optimizer's writes are done (the FSDP shard is already the model's)
  for (const Slice& s : slices_)
    if (!s.in_shard)
      s.group->all_gather(static_cast<std::byte*>(param_shard_) + s.offset * es, s.store->params_raw(), s.len, t);
}

StepStats Trainer::step(std::span<const MicroBatch> micro, const StopCheck& stop) {
  const auto t0 = std::chrono::steady_clock::now();
  take_phase_seconds();  // from here on the phases are this step's
  take_communication_seconds();
  Communicator& world = *model_.groups().world;
  Device& dev = model_.experts().device();
  // The memory timeline's step marks (nothing when the Arena is not recording).
  struct StepMark {
    Arena& arena;
    ~StepMark() { arena.end_step(); }
  } step_mark{dev.arena()};
  dev.arena().begin_step(step_ + 1);
  mark_phase(dev.arena(), "step start");
  const std::int32_t ignore = model_.schedules().vocab.ignore_index;
  // Every rank must run the same number of micro-batches (the layers are collective).
  std::int64_t counts[3] = {0, 0, static_cast<std::int64_t>(micro.size())};
  for (const MicroBatch& b : micro) {
    counts[0] += valid_targets(b, ignore);
    counts[1] += b.sequences * b.seq_len;
  }
  std::int64_t max_micro = counts[2];
  world.all_reduce(counts, 2, DType::i64, ReduceOp::sum);
  world.all_reduce(&max_micro, 1, DType::i64, ReduceOp::max);
  // The ranks of a context-parallel group hold the same sequences (the model checks it):
  // the world's sums count each cp times.
  const std::int64_t cp = model_.groups().cp->size();
  counts[0] /= cp;
  counts[1] /= cp;
  if (max_micro != static_cast<std::int64_t>(micro.size()) || micro.empty())
    throw InvalidArgument("trainer: every rank must bring the same number (>= 1) of micro-batches");
  const std::int64_t total = counts[0];
  const float ce_scale = total > 0 ? 1.0f / static_cast<float>(total) : 0.0f;
  const float aux_scale = 1.0f / static_cast<float>(micro.size());

  model_.zero_grads();
  double sums[2] = {0, 0};  // ce, aux
  for (std::size_t i = 0; i < micro.size(); ++i) {
    const MicroBatch& b = micro[i];
    const BatchSums s = model_.forward_backward(b.ids, b.targets, b.sequences, b.seq_len, ce_scale, aux_scale);
    sums[0] += s.ce;
    sums[1] += s.aux;  // the same on every rank
    // Stop between micro-batches: every rank must agree (the next micro-batch's layers
    // are collective), so the flag is all-reduced. The gradients so far are abandoned
    // (the next step zeroes them); nothing else has changed.
    if (stop && i + 1 < micro.size()) {
      std::int64_t flag = stop();
      world.all_reduce(&flag, 1, DType::i64, ReduceOp::max);
      if (flag != 0) {
        dev.synchronize();
        model_.update_router_bias(0.0f);  // the abandoned micro-batches' loads are dropped too
        StepStats st;
        st.step = step_ + 1;
        st.stopped = flag;
        st.micro_batches_done = static_cast<std::int64_t>(i + 1);
        st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return st;
      }
    }
  }
  world.all_reduce(sums, 1, DType::f64, ReduceOp::sum);

  // Gradients: the FSDP shard as it is; each store's slice summed over its group.
  mark_phase(dev.arena(), "reduce");
  {
    // The FSDP shard's gradients are in place; the stores' are reduce-scattered after them.
    const PhaseScope phase(StepPhase::fsdp);
    dev.synchronize();
    for (const Slice& s : slices_)
      if (!s.in_shard)
        s.group->reduce_scatter(s.store->grads_data(), grad_shard_ + s.offset, s.len, DType::f32, ReduceOp::sum);
  }
  ++step_;
  const float lr = options_.lr.lr(step_);
  // The norm first: a non-finite loss or gradient stops (or skips) before any update.
  const GradClip clip = [&] {
    const PhaseScope phase(StepPhase::optimizer);
    return opt_->clip();
  }();
  const double ce_mean = total > 0 ? sums[0] / static_cast<double>(total) : 0.0;
  if (!std::isfinite(clip.norm) || !std::isfinite(ce_mean) || !std::isfinite(sums[1])) {
    char what[160];
    std::snprintf(what, sizeof what, "step %lld: the loss is %g (aux %g), the gradient norm %g",
                  static_cast<long long>(step_), ce_mean, sums[1] / static_cast<double>(micro.size()), clip.norm);
    const std::string first = first_nonfinite_gradient();
    std::string message =
        std::string(what) + (first.empty() ? "; every gradient is finite" : "; first non-finite gradient: " + first);
    // Under bf16 the compute copy can hold an inf the fp32 master does not: name it too.
    if (model_.schedules().precision == Precision::bf16) {
      const std::string p = first_nonfinite_bf16(dev, param_shard_, shard_elems_, shard_segments(), world);
      if (!p.empty()) message += "; first non-finite bf16 parameter: " + p;
    }
    if (!options_.skip_nonfinite) {
      --step_;
      throw NonFinite(message);
    }
    ++skipped_;
    model_.zero_grads();  // nothing of this step reaches the next one
    model_.update_router_bias(0.0f);  // nor its routing loads
    StepStats st;
    st.step = step_;
    st.ce = ce_mean;
    st.aux = sums[1] / static_cast<double>(micro.size());
    st.loss = st.ce + st.aux;
    st.tokens = total;
    st.inputs = counts[1];
    st.grad_norm = clip.norm;
    st.lr = lr;
    st.skipped = true;
    st.nonfinite = message;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }
  mark_phase(dev.arena(), "optimizer");
  const OptimizerStepTimes t = [&] {
    const PhaseScope phase(StepPhase::optimizer);
    return opt_->step(lr, clip);
  }();
  publish();
  model_.update_router_bias(options_.router_bias_speed);

  StepStats st;
  st.step = step_;
  st.ce = total > 0 ? sums[0] / static_cast<double>(total) : 0.0;
  st.aux = sums[1] / static_cast<double>(micro.size());
  st.loss = st.ce + st.aux;
  st.tokens = total;
  st.inputs = counts[1];
  st.grad_norm = t.clip.norm;
  st.lr = lr;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.phases = take_phase_seconds();
  st.communication_seconds = take_communication_seconds();
  double named = 0;
  for (std::size_t i = 0; i + 1 < kNumStepPhases; ++i) named += st.phases[i];
  st.phases[static_cast<std::size_t>(StepPhase::other)] += std::max(0.0, st.seconds - named);
  return st;
}

namespace {

// The pieces of a layout's views inside [lo, lo + len) of its flat buffer, placed at
// shard_offset + (element - lo). A view of rows [r0, r1) of its tensor starts at flat
// element r0 x (numel / dim 0) of the whole tensor.
void add_segments(const ParameterLayout& layout, std::uint64_t lo, std::uint64_t len, std::uint64_t shard_offset,
                  std::vector<ShardSegment>& out) {
  for (const ParameterView& v : layout.views) {
    const auto n = static_cast<std::uint64_t>(v.numel());
    const std::uint64_t a = std::max(v.offset, lo), b = std::min(v.offset + n, lo + len);
    if (a >= b) continue;
    const std::vector<std::int64_t>& full = v.entry.shape;
    std::uint64_t row = 1;
    for (std::size_t d = 1; d < full.size(); ++d) row *= static_cast<std::uint64_t>(full[d]);
    const std::uint64_t first = full.empty() ? 0 : static_cast<std::uint64_t>(v.rows.begin) * row;
    out.push_back({v.name(), full, first + (a - v.offset), b - a, shard_offset + (a - lo)});
  }
}

}  // namespace

std::vector<ShardSegment> Trainer::shard_segments() const {
  std::vector<ShardSegment> out;
  const FsdpUnits& fsdp = model_.fsdp();
  const auto r = static_cast<std::uint64_t>(fsdp.group().rank());
  for (std::size_t u = 0; u < fsdp.size(); ++u) {
    const std::uint64_t len = fsdp.shard_len(u);
    add_segments(fsdp.layout(u), r * len, len, fsdp.shard_offset(u), out);
  }
  for (const Slice& sl : slices_)
    add_segments(sl.store->layout(), static_cast<std::uint64_t>(sl.group->rank()) * sl.len, sl.len, sl.offset, out);
  return out;
}

namespace {

// The first element of `g` (this rank's shard, on the host) that is not finite, in shard
// order on the lowest rank that holds one: "NAME element I (VALUE) on rank R", or "" when
// every element is finite. Collective over the world.
std::string first_nonfinite_in(const std::vector<float>& g, const std::vector<ShardSegment>& segments,
                               Communicator& world) {
  std::string found;
  for (const ShardSegment& s : segments) {
    for (std::uint64_t i = 0; i < s.count && found.empty(); ++i)
      if (!std::isfinite(g[s.shard_offset + i]))
        found = s.name + " element " + std::to_string(s.begin + i) + " (" + std::to_string(g[s.shard_offset + i]) + ")";
    if (!found.empty()) break;
  }
  // The lowest rank with a finding (max of W - rank), which then broadcasts it.
  std::int64_t lowest = found.empty() ? 0 : world.size() - world.rank();
  world.all_reduce(&lowest, 1, DType::i64, ReduceOp::max);
  if (lowest == 0) return "";
  const int root = world.size() - static_cast<int>(lowest);
  char text[256] = {};
  if (world.rank() == root) std::snprintf(text, sizeof text, "%s on rank %d", found.c_str(), root);
  world.broadcast(text, sizeof text, DType::u8, root);
  return text;
}

// Under bf16, the same for the compute copy in the shard buffer (`shard`, n bf16 values):
// a master beyond bf16's range (about 3.39e38) rounds to inf there while it is finite.
std::string first_nonfinite_bf16(Device& dev, const void* shard, std::uint64_t n,
                                 const std::vector<ShardSegment>& segments, Communicator& world) {
  std::vector<bf16> h(n);
  dev.synchronize();
  dev.memcpy_async(h.data(), shard, n * sizeof(bf16), CopyKind::device_to_host, dev.copy_stream());
  dev.synchronize(dev.copy_stream());
  std::vector<float> w(n);
  for (std::uint64_t i = 0; i < n; ++i) w[i] = to_f32(h[i]);
  return first_nonfinite_in(w, segments, world);
}

}  // namespace

// The first gradient element that is not finite (first_nonfinite_in). Collective.
std::string Trainer::first_nonfinite_gradient() const {
  Device& dev = model_.experts().device();
  std::vector<float> g(shard_elems_);
  dev.synchronize();
  dev.memcpy_async(g.data(), grad_shard_, shard_elems_ * sizeof(float), CopyKind::device_to_host,
                   dev.copy_stream());
  dev.synchronize(dev.copy_stream());
  return first_nonfinite_in(g, shard_segments(), *model_.groups().world);
}

void Trainer::read_shard(float* master, float* m, float* v) const { opt_->read_state(master, m, v); }

void Trainer::restore(const float* master, const float* m, const float* v, std::int64_t optimizer_steps,
                      std::int64_t step) {
  if (step < optimizer_steps)
    throw InvalidArgument("trainer: a restored step (" + std::to_string(step) + ") must be >= the optimizer's updates (" +
                          std::to_string(optimizer_steps) + ")");
  // The optimizer writes the parameter shard from the master weights; from there the
  // FSDP shard and the stores are written as at the end of a step.
  opt_->restore(master, m, v, optimizer_steps);  // bf16: narrowed with AdamW's rounding
  publish();
  step_ = step;
}

double Trainer::evaluate(std::span<const MicroBatch> batches, std::int64_t* tokens) {
  Communicator& world = *model_.groups().world;
  std::int64_t n = static_cast<std::int64_t>(batches.size()), max_n = n;
  world.all_reduce(&max_n, 1, DType::i64, ReduceOp::max);
  if (max_n != n) throw InvalidArgument("evaluate: every rank must bring the same number of batches");
  double sums[1] = {0};
  std::int64_t count = 0;
  for (const MicroBatch& b : batches) {
    const BatchSums s = model_.forward(b.ids, b.targets, b.sequences, b.seq_len);
    sums[0] += s.ce;
    count += s.tokens;
  }
  world.all_reduce(sums, 1, DType::f64, ReduceOp::sum);
  world.all_reduce(&count, 1, DType::i64, ReduceOp::sum);
  if (tokens) *tokens = count;
  return count > 0 ? sums[0] / static_cast<double>(count) : 0.0;
}

}  // namespace peakbound
