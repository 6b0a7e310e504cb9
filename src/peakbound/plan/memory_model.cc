#include "peakbound/plan/memory_model.h"

#include <algorithm>
#include <cmath>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

using u64 = std::uint64_t;
using i64 = std::int64_t;

u64 U(i64 v) { return static_cast<u64>(std::max<i64>(v, 0)); }
i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }
std::size_t C(Component c) { return static_cast<std::size_t>(c); }

// Parameters one rank holds unsharded while computing a layer: the layer's non-expert
// parameters plus its E/EP local experts (the largest such layer).
i64 gathered_layer_params(const PlanInputs& in, const ParamCount& pc) {
  i64 moe = pc.num_moe_layers > 0 ? pc.moe_layer_non_expert + (in.model.num_experts / in.ep) * pc.routed_expert : 0;
  i64 dense = pc.num_dense_layers > 0 ? pc.dense_layer : 0;
  return std::max(moe, dense);
}

}  // namespace

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::forward_attention: return "forward_attention";
    case Phase::forward_mlp: return "forward_mlp";
    case Phase::loss: return "loss";
    case Phase::backward_attention: return "backward_attention";
    case Phase::backward_mlp: return "backward_mlp";
    case Phase::optimizer: return "optimizer";
  }
  PB_CHECK_MSG(false, "unknown phase");
}

std::uint64_t PhaseBytes::total() const {
  u64 t = 0;
  for (u64 b : bytes) t += b;
  return t;
}

PlanShapes plan_shapes(const PlanInputs& in, const ParamCount& pc) {
  (void)pc;
  const ModelConfig& m = in.model;
  PlanShapes s;
  s.tokens_per_device = ceil_div(in.sequences * in.context, in.cp);
  const i64 T = s.tokens_per_device;
  if (m.num_experts > 0) {
    const i64 k = m.top_k, local = m.num_experts / in.ep;
    s.routed_copies_balanced = T * k;
    // All EP sources route every token to this rank's experts, at most `local` copies each.
    s.routed_copies_worst = in.ep * T * std::min(k, local);
    double want = in.skew <= 0 ? static_cast<double>(s.routed_copies_worst)
                               : in.skew * static_cast<double>(s.routed_copies_balanced);
    s.routed_copies = std::min<i64>(static_cast<i64>(std::ceil(want)), s.routed_copies_worst);
    // A round carries at most `cap` copies per source; LLEP caps each rank's share at
    // alpha x the round's mean (cap), and one spilled piece may overshoot by < m.
    i64 cap = std::min<i64>(in.dispatch_cap, T * k);
    s.round_copies = static_cast<i64>(std::ceil(in.llep_alpha * static_cast<double>(cap)));
    if (in.ep > 1) s.round_copies += std::min<i64>(in.llep_min_spill, cap);
    s.round_copies = std::min(s.round_copies, s.routed_copies_worst);
    s.spilled_experts = in.ep > 1 ? std::min<i64>(m.num_experts - local, ceil_div(s.round_copies, in.llep_min_spill)) : 0;
  }
  s.vocab_shard = ceil_div(m.vocab_size, in.vocab_group);
  s.boundary_bytes = U(T) * U(m.hidden_size) * U(in.activation_bytes);
  return s;
}

PeakEstimate estimate_peak(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& sched) {
  const ModelConfig& m = in.model;
  const PlanShapes s = plan_shapes(in, pc);
  const u64 T = U(s.tokens_per_device), H = U(m.hidden_size), L = U(m.num_layers);
  const u64 a = U(in.activation_bytes), pb = U(in.param_bytes), gb = U(in.grad_bytes),
            ob = U(in.optimizer_bytes);
  const bool has_moe = pc.num_moe_layers > 0;

  // ---- persistent state: shards of params, grads and optimizer --------------------
  // Routed experts: EP-sharded, then FSDP over the devices/EP replicas (so / devices);
  // everything else FSDP over the fsdp group.
  const u64 routed = U(pc.routed_experts), rest = U(pc.total) - routed;
  const u64 fs = U(in.fsdp_size()), dv = U(in.devices);
  auto shard = [&](u64 bytes_per_param) {
    return ceil_div(static_cast<i64>(rest * bytes_per_param), static_cast<i64>(fs)) +
           ceil_div(static_cast<i64>(routed * bytes_per_param), static_cast<i64>(dv));
  };
  const u64 params_shard = U(shard(pb)), grads_shard = U(shard(gb)), opt_shard = U(shard(ob));
  // FSDP gathers a layer's parameters (and prefetches the next); backward holds the
  // layer's unsharded gradient until its reduce-scatter.
  const bool sharded = fs > 1 || dv / U(in.ep) > 1;
  const u64 layer_params = sharded ? U(gathered_layer_params(in, pc)) : 0;
  const u64 gathered = 2 * layer_params * pb, layer_grads = layer_params * gb;
  const u64 head_params = sharded ? U(s.vocab_shard) * H : 0;

  // ---- checkpoint boundaries ---------------------------------------------------------
  const u64 bnd = s.boundary_bytes;
  const u64 ckpt = sched.sco ? std::min<u64>(L, U(in.prefetch_depth) + 1) * bnd : L * bnd;

  // ---- attention working set (flash-style: no T x T term) ----------------------------
  const u64 nh = U(m.num_heads), nkv = U(m.num_kv_heads), dqk = U(m.qk_head_dim()),
            dvh = U(m.value_head_dim());
  const u64 q = T * nh * dqk, kv = T * nkv * (dqk + dvh), o = T * nh * dvh;
  const u64 latent = m.attention == AttentionKind::mla
                         ? T * (U(m.q_lora_rank) + U(m.kv_lora_rank) + U(m.qk_rope_head_dim))
                         : 0;
  u64 attn_fwd = a * (T * H + q + kv + o + latent + T * H) + 4 * T * nh;
  if (in.cp > 1) attn_fwd += 2 * a * kv;  // peers' K/V blocks, double-buffered ring
  const u64 attn_bwd = 2 * attn_fwd;       // recomputed activations and their gradients

  // ---- residual stream and the non-dispatch MLP activations --------------------------
  const u64 residual = 2 * T * H * a;
  u64 mlp_fwd = 0;
  if (pc.num_dense_layers > 0) mlp_fwd = std::max(mlp_fwd, T * U(m.dense_intermediate_size) * 3 * a);
  if (has_moe) {
    u64 moe = T * U(m.num_experts) * 4 + T * U(m.top_k) * 8;  // fp32 router logits, top-k ids+weights
    moe += T * U(m.shared_expert_width()) * U(m.num_shared_experts) * 3 * a;
    mlp_fwd = std::max(mlp_fwd, moe);
  }
  const u64 mlp_bwd = 2 * mlp_fwd;

  // ---- expert dispatch ---------------------------------------------------------------
  u64 disp_fwd = 0, disp_bwd = 0;
  if (has_moe) {
    const u64 k = U(m.top_k), Fe = U(m.moe_intermediate_size);
    if (sched.llep) {
      const u64 cap = std::min<u64>(U(in.dispatch_cap), T * k), R = U(s.round_copies);
      const u64 spill = U(s.spilled_experts) * 3 * H * Fe;
      // Double-buffered send, receive and combine buffers; one round's intermediates.
      disp_fwd = a * (2 * cap * H + 2 * R * H + R * 3 * Fe + R * H + 2 * cap * H) + spill * pb;
      disp_bwd = disp_fwd + a * R * (2 * H + 2 * Fe) + spill * gb;
    } else {
      const u64 R = U(s.routed_copies);
      disp_fwd = a * (T * k * H + R * H + R * 3 * Fe + R * H + T * k * H);
      disp_bwd = disp_fwd + a * R * (2 * H + 2 * Fe);
    }
  }

  // ---- vocabulary projection and loss ------------------------------------------------
  const u64 Vp = U(s.vocab_shard), P = U(in.vocab_group);
  u64 vocab = 0;
  if (sched.dtp) {
    const u64 chunk = std::min<u64>(U(in.vocab_chunk), T);
    // Logits block and its exp/gradient (fp32), the two ring buffers (the smaller of
    // activations and weight shard travels), per-token running max/sum/target, fp32 dX.
    vocab = 2 * chunk * Vp * 4 + 2 * std::min(T * H, Vp * H) * a + 12 * T + 4 * T * H;
  } else {
    // Megatron vocab-parallel CE: gathered hidden, bf16 logits and their fp32 copy
    // (softmax and gradient in place), gathered dHidden.
    vocab = a * P * T * H + P * T * Vp * (a + 4) + a * P * T * H;
  }

  // ---- assemble the phases -------------------------------------------------------------
  PeakEstimate e;
  auto base = [&](Phase p) {
    PhaseBytes ph{p, {}};
    ph.bytes[C(Component::params)] = params_shard;
    ph.bytes[C(Component::grads)] = grads_shard;
    ph.bytes[C(Component::optimizer)] = sched.adam ? 0 : opt_shard;
    ph.bytes[C(Component::comm)] = in.comm_reserve;
    ph.bytes[C(Component::workspace)] = in.workspace_reserve;
    return ph;
  };
  PhaseBytes fa = base(Phase::forward_attention);
  fa.bytes[C(Component::params)] += gathered;
  fa.bytes[C(Component::checkpoints)] = ckpt;
  fa.bytes[C(Component::attention)] = attn_fwd;
  fa.bytes[C(Component::layer)] = residual;

  PhaseBytes fm = base(Phase::forward_mlp);
  fm.bytes[C(Component::params)] += gathered;
  fm.bytes[C(Component::checkpoints)] = ckpt;
  fm.bytes[C(Component::layer)] = residual + mlp_fwd;
  fm.bytes[C(Component::dispatch)] = disp_fwd;

  PhaseBytes lo = base(Phase::loss);
  lo.bytes[C(Component::params)] += head_params * pb;
  lo.bytes[C(Component::grads)] += head_params * gb;
  lo.bytes[C(Component::checkpoints)] = ckpt;
  lo.bytes[C(Component::layer)] = residual;
  lo.bytes[C(Component::vocab)] = vocab;

  PhaseBytes ba = base(Phase::backward_attention);
  ba.bytes[C(Component::params)] += gathered;
  ba.bytes[C(Component::grads)] += layer_grads;
  ba.bytes[C(Component::checkpoints)] = ckpt;
  ba.bytes[C(Component::attention)] = attn_bwd;
  ba.bytes[C(Component::layer)] = residual + T * H * a;  // + the incoming gradient

  PhaseBytes bm = base(Phase::backward_mlp);
  bm.bytes[C(Component::params)] += gathered;
  bm.bytes[C(Component::grads)] += layer_grads;
  bm.bytes[C(Component::checkpoints)] = ckpt;
  bm.bytes[C(Component::layer)] = residual + T * H * a + mlp_bwd;
  bm.bytes[C(Component::dispatch)] = disp_bwd;

  PhaseBytes op = base(Phase::optimizer);

  e.phases = {fa, fm, lo, ba, bm, op};
  for (const PhaseBytes& ph : e.phases) {
    for (std::size_t i = 0; i < kNumComponents; ++i) e.component_peak[i] = std::max(e.component_peak[i], ph.bytes[i]);
    if (ph.total() > e.peak) {
      e.peak = ph.total();
      e.binding_phase = ph.phase;
    }
  }
  const PhaseBytes& bind = e.phases[static_cast<std::size_t>(e.binding_phase)];
  std::size_t best = 0;
  for (std::size_t i = 1; i < kNumComponents; ++i)
    if (bind.bytes[i] > bind.bytes[best]) best = i;
  e.binding_component = kAllComponents[best];

  // Host memory: offloaded optimizer state with its pinned staging buckets, and the
  // offloaded checkpoint boundaries.
  if (sched.adam) e.host_bytes += opt_shard + 3 * in.adam_bucket;
  if (sched.sco) e.host_bytes += L * bnd;
  return e;
}

}  // namespace peakbound
