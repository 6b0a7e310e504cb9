#include "peakbound/plan/plan.h"

#include <algorithm>
#include <optional>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/model/describe.h"
#include "peakbound/schedules/ulysses_attention.h"

namespace peakbound {

namespace {

std::string bytes(std::uint64_t b) { return format_bytes(static_cast<double>(b)); }

// Ways to make a plan fit that does not, each checked by re-planning (with the
// selective checkpoint policy, as the plan itself is).
std::vector<std::string> find_fixes(const PlanInputs& in, const ParamCount& pc, const PeakEstimate& cur) {
  std::vector<std::string> out;
  auto fits_with = [&](const PlanInputs& x, const ScheduleSet& s, PeakEstimate* e = nullptr) {
    PeakEstimate est = estimate_with_policy(x, pc, s);
    if (e) *e = est;
    return fits_memory(x, est);
  };
  const ScheduleSet& s = in.schedules;
  PeakEstimate e;
  for (const ScheduleInfo& i : ScheduleSet::each()) {
    if (s.*(i.on)) continue;
    ScheduleSet t = s;
    t.*(i.on) = true;
    if (fits_with(in, t, &e))
      out.push_back("add " + std::string(i.name) + " (--schedules " + t.str() + "): peak " + bytes(e.peak));
  }
  if (out.empty() && s.str() != "all" && fits_with(in, ScheduleSet::all(), &e))
    out.push_back("enable all four schedules (--schedules all): peak " + bytes(e.peak));
  // When the host binds, a schedule that moves state to the host may be the one to drop.
  if (cur.host_bytes > in.host_budget())
    for (const ScheduleInfo& i : ScheduleSet::each()) {
      if (!i.offloads || !(s.*(i.on))) continue;
      ScheduleSet t = s;
      t.*(i.on) = false;
      if (fits_with(in, t, &e))
        out.push_back("keep the " + std::string(i.state) +
                      " on the device (--schedules " + t.str() + "): peak " + bytes(e.peak) + ", host " +
                      bytes(e.host_bytes) + " per device");
    }
  // Context parallelism shrinks every per-token term, on the device and on the host.
  for (std::int64_t cp = in.cp * 2; cp <= in.devices && cp > 0; cp *= 2) {
    if (in.devices % cp) continue;
    PlanInputs x = in;
    x.cp = cp;
    if (fits_with(x, s, &e)) {
      out.push_back("split each sequence over more devices (--cp " + std::to_string(cp) + "): peak " + bytes(e.peak) +
                    ", host " + bytes(e.host_bytes) + " per device");
      break;
    }
  }
  if (in.sequences > 1) {
    PlanInputs x = in;
    x.sequences = 1;
    if (fits_with(x, s, &e)) out.push_back("one sequence per step (--sequences 1): peak " + bytes(e.peak));
  }
  if (s.llep && in.dispatch_cap > 256) {
    PlanInputs x = in;
    x.dispatch_cap = in.dispatch_cap / 4;
    if (fits_with(x, s, &e))
      out.push_back("smaller dispatch rounds (--dispatch-cap " + std::to_string(x.dispatch_cap) + "): peak " + bytes(e.peak));
  }
  if (s.dtp && in.vocab_chunk > 64) {
    PlanInputs x = in;
    x.vocab_chunk = in.vocab_chunk / 4;
    if (fits_with(x, s, &e))
      out.push_back("smaller vocabulary blocks (--vocab-chunk " + std::to_string(x.vocab_chunk) + "): peak " + bytes(e.peak));
  }
  if (out.empty()) {
    const bool host = cur.host_bytes > in.host_budget();
    if (host)
      out.push_back("no single change found: host memory needs " + bytes(cur.host_bytes) + " per device (binding: " +
                    std::string(component_name(cur.host_binding_component)) + ") against a share of " +
                    bytes(in.host_budget()) + "; add host memory (--host-memory per node) or devices");
    else
      out.push_back("no single change found: the peak is " + bytes(cur.peak) + " (binding: " +
                    std::string(component_name(cur.binding_component)) + " in " +
                    std::string(phase_name(cur.binding_phase)) + ") against " + bytes(in.device_memory) +
                    " per device; add devices or memory, or shorten the context");
  }
  return out;
}

nlohmann::json estimate_json(const PeakEstimate& e) {
  nlohmann::json phases = nlohmann::json::object();
  for (const PhaseBytes& ph : e.phases) {
    nlohmann::json c = nlohmann::json::object();
    for (Component comp : kAllComponents) c[std::string(component_name(comp))] = ph.bytes[static_cast<std::size_t>(comp)];
    phases[std::string(phase_name(ph.phase))] = {{"total_bytes", ph.total()}, {"components", c}};
  }
  return {{"peak_bytes", e.peak},
          {"binding_phase", phase_name(e.binding_phase)},
          {"binding_component", component_name(e.binding_component)},
          {"host_bytes", e.host_bytes},
          {"phases", phases}};
}

}  // namespace

bool fits_memory(const PlanInputs& in, const PeakEstimate& e) {
  return e.peak <= in.device_memory && e.host_bytes <= in.host_budget();
}

namespace {

// The host side of the policy, at in's (resolved) prefetch depth and checkpoint group.
PeakEstimate estimate_resident_policy(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& s,
                                      std::optional<std::int64_t>* resident_layers) {
  if (resident_layers) resident_layers->reset();
  PeakEstimate e = estimate_peak(in, pc, s);
  if (!s.sco || in.resident_layers || e.host_bytes <= in.host_budget()) return e;
  // Host memory binds: each resident boundary moves one from the host to the device.
  // The fewest that make the host fit (host bytes fall as K grows), if the device holds them.
  const std::int64_t L = checkpoint_group_count(in.model.num_layers, in.planned_checkpoint_group());
  auto with_k = [&](std::int64_t k) {
    PlanInputs x = in;
    x.resident_layers = k;
    return estimate_peak(x, pc, s);
  };
  if (with_k(L).host_bytes > in.host_budget()) return e;  // the boundaries are not what binds
  std::int64_t lo = 0, hi = L;  // host does not fit at lo, fits at hi
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (with_k(mid).host_bytes <= in.host_budget() ? hi : lo) = mid;
  }
  PeakEstimate k = with_k(hi);
  if (k.peak > in.device_memory) return e;
  if (resident_layers) *resident_layers = hi;
  return k;
}

// The resident policy, then the device side: a ring of one slot when two do not fit (the
// copies then wait).
PeakEstimate estimate_depth_policy(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& s,
                                   std::optional<std::int64_t>* resident_layers, std::int64_t* prefetch_depth) {
  PlanInputs x = in;
  x.prefetch_depth = in.planned_prefetch_depth();
  // The attention kept by the budget (train without --keep-attention): at one boundary per
  // layer, while the device holds it; dropped before the ring.
  if (in.keep_attention_by_budget) x.keep_attention = in.planned_checkpoint_group() == 1;
  // The logits kept by the budget (train without --keep-logits): dropped before the attention, as train does.
  if (in.keep_logits_by_budget) x.keep_logits = true;
  // The experts kept by the budget (train without --keep-experts): dropped first, as train does.
  if (in.keep_experts_by_budget) x.keep_experts = true;
  // Train's --device-memory auto: the experts, then the logits, kept only where they leave
  // the peak where it is (each compared with the plan without it, as train decides).
  if (in.device_memory_auto) {
    std::uint64_t peak = estimate_resident_policy(x, pc, s, nullptr).peak;  // x's, as it stands
    const auto drop_if_lower = [&](auto drop) {
      PlanInputs y = x;
      drop(y);
      const std::uint64_t lean = estimate_resident_policy(y, pc, s, nullptr).peak;
      if (lean < peak) x = y, peak = lean;
    };
    if (in.keep_experts_by_budget) drop_if_lower([](PlanInputs& y) { y.keep_experts = false; });
    if (in.keep_logits_by_budget) drop_if_lower([](PlanInputs& y) { y.keep_logits = false; });
  }
  PeakEstimate e = estimate_resident_policy(x, pc, s, resident_layers);
  if (in.keep_experts_by_budget && x.keep_experts && e.peak > in.device_memory) {
    x.keep_experts = false;
    e = estimate_resident_policy(x, pc, s, resident_layers);
  }
  if (in.keep_logits_by_budget && x.keep_logits && e.peak > in.device_memory) {
    x.keep_logits = false;
    e = estimate_resident_policy(x, pc, s, resident_layers);
  }
  if (in.keep_attention_by_budget && x.keep_attention && e.peak > in.device_memory) {
    x.keep_attention = false;
    e = estimate_resident_policy(x, pc, s, resident_layers);
  }
  if (in.prefetch_depth < 0 && s.sco && x.prefetch_depth > 0 && e.peak > in.device_memory) {
    x.prefetch_depth = 0;
    e = estimate_resident_policy(x, pc, s, resident_layers);
  }
  if (prefetch_depth) *prefetch_depth = x.prefetch_depth;
  return e;
}

// The policy's estimate (estimate_with_policy), its checkpoint groups tried from `first`
// layers on: a caller that knows fewer do not fit (the fewest a smaller context needed: the
// host's and the device's bytes only grow with the context) starts there and skips G = 1.
// Where nothing fits it returns the last estimate tried (G = 1's when first is 1).
PeakEstimate estimate_from_group(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& s,
                                 std::int64_t first, std::optional<std::int64_t>* resident_layers,
                                 std::int64_t* prefetch_depth, std::int64_t* checkpoint_group) {
  PlanInputs x = in;
  x.checkpoint_group = in.planned_checkpoint_group();
  if (checkpoint_group) *checkpoint_group = x.checkpoint_group;
  // Checkpoint groups where the host memory does not hold the plan: a group of G layers keeps
  // one boundary for G (the host's share falls) and holds up to G - 1 recomputed inputs on
  // the device in its backward (the device's rises), so the fewest layers a group that fits;
  // none where the host fits already or the device is over already (groups only add to it),
  // where even one boundary for the whole stack leaves the host short, or once the device
  // overflows.
  // keep_attention does not combine with groups (check_model_schedules).
  const std::int64_t L = in.model.num_layers;
  const bool policy = in.checkpoint_group < 1 && s.sco && !in.resident_layers &&
                      (in.keep_attention_by_budget || !in.keep_attention) && L >= 2;
  PeakEstimate e;
  if (!policy || first <= 1) {
    e = estimate_depth_policy(x, pc, s, resident_layers, prefetch_depth);
    // A device over its memory here holds no resident boundary (the policy keeps one only
    // where the device has room), and a group only adds recomputed inputs to it.
    if (!policy || e.host_bytes <= in.host_budget() || e.peak > in.device_memory) return e;
  }
  x.checkpoint_group = L;
  const PeakEstimate one = estimate_depth_policy(x, pc, s, nullptr, nullptr);
  if (one.host_bytes > in.host_budget()) return first <= 1 ? e : one;
  for (std::int64_t G = std::max<std::int64_t>(2, first); G <= L; ++G) {
    x.checkpoint_group = G;
    std::optional<std::int64_t> k;
    std::int64_t depth = 0;
    const PeakEstimate g = estimate_depth_policy(x, pc, s, &k, &depth);
    const bool ok = fits_memory(in, g);
    if (ok || first > 1) {  // what it is at (from `first` on, the last tried where nothing fits)
      if (resident_layers) *resident_layers = k;
      if (prefetch_depth) *prefetch_depth = depth;
      if (checkpoint_group) *checkpoint_group = G;
      e = g;
    }
    if (ok) return g;
    if (g.peak > in.device_memory) break;
  }
  return e;
}

bool fits(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& s, std::int64_t context, std::int64_t first,
          std::int64_t* group) {
  PlanInputs x = in;
  x.context = context;
  return fits_memory(x, estimate_from_group(x, pc, s, first, nullptr, nullptr, group));
}

}  // namespace

PeakEstimate estimate_with_policy(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& s,
                                  std::optional<std::int64_t>* resident_layers, std::int64_t* prefetch_depth,
                                  std::int64_t* checkpoint_group) {
  return estimate_from_group(in, pc, s, 1, resident_layers, prefetch_depth, checkpoint_group);
}

std::int64_t context_reach(const PlanInputs& in, const ParamCount& pc, const ScheduleSet& s) {
  constexpr std::int64_t kMax = std::int64_t{1} << 31;
  // The group policy's fewest at the largest context known to fit: a larger one needs at
  // least as many (estimate_from_group).
  std::int64_t first = 1, group = 1;
  const auto fits_at = [&](std::int64_t context) {
    const bool ok = fits(in, pc, s, context, first, &group);
    if (ok) first = group;
    return ok;
  };
  if (!fits_at(1)) return 0;
  std::int64_t lo = 1, hi = 1024;  // lo fits; hi is the next candidate
  while (hi <= kMax && fits_at(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > kMax) return lo;
  while (hi - lo > 1) {  // invariant: lo fits, hi does not
    std::int64_t mid = lo + (hi - lo) / 2;
    (fits_at(mid) ? lo : hi) = mid;
  }
  return lo;
}

Plan make_plan(const PlanInputs& given, bool with_reach) {
  PlanInputs in = given;
  in.resolve_auto();
  in.validate();
  Plan p;
  p.params = count_params(in.model);
  // The embedding by the budget (train's --embedding auto): the vocabulary-parallel one
  // wherever the plan fits with it (a row per token to move, not the whole table twice a
  // step); where neither fits, the smaller peak.
  if (in.embedding == "auto") {
    PlanInputs f = in, v = in;
    f.embedding = "fsdp";
    v.embedding = "vocab";
    const PeakEstimate ef = estimate_with_policy(f, p.params, in.schedules);
    in.embedding = "fsdp";
    if (ef.trainer_footprint && in.schedules.any()) {
      const PeakEstimate ev = estimate_with_policy(v, p.params, in.schedules);
      p.embedding_peaks = {ef.peak, ev.peak};
      if (fits_memory(in, ev) || (!fits_memory(in, ef) && ev.peak < ef.peak)) in.embedding = "vocab";
    }
  }
  // Under cp > 1 the attention by the footprint: Ulysses where the trainer's footprint with
  // it has the smaller scheduled peak at this context (or fits where the ring's does not).
  const bool ulysses_auto = in.context_attention == "auto" && in.cp > 1 && in.schedules.any() &&
                            ulysses_refusal(in.model.num_heads, in.model.num_kv_heads, static_cast<int>(in.cp),
                                            in.model.attention == AttentionKind::mla)
                                .empty();
  if (in.context_attention == "auto") {
    in.context_attention = "ring";
    if (ulysses_auto && in.context >= 2 * in.cp) {
      PlanInputs r = in, u = in;
      u.context_attention = "ulysses";
      const PeakEstimate er = estimate_with_policy(r, p.params, in.schedules);
      if (er.trainer_footprint) {
        const PeakEstimate eu = estimate_with_policy(u, p.params, in.schedules);
        p.context_attention_peaks = {er.peak, eu.peak};
        if (fits_memory(in, eu) && (!fits_memory(in, er) || eu.peak < er.peak)) in.context_attention = "ulysses";
      }
    }
  }
  p.inputs = in;
  p.shapes = plan_shapes(in, p.params);
  // The baseline through the policy too (only the attention kept by the budget applies
  // without SCO).
  p.baseline = estimate_with_policy(in, p.params, ScheduleSet::none());
  p.scheduled = estimate_with_policy(in, p.params, in.schedules, &p.policy_resident_layers, &p.prefetch_depth,
                                     &p.checkpoint_group);
  p.fits_host_baseline = p.baseline.host_bytes <= in.host_budget();
  p.fits_host_scheduled = p.scheduled.host_bytes <= in.host_budget();
  p.fits_baseline = fits_memory(in, p.baseline);
  p.fits_scheduled = fits_memory(in, p.scheduled);
  if (with_reach) {
    Reach r;
    r.baseline = context_reach(in, p.params, ScheduleSet::none());
    r.scheduled = context_reach(in, p.params, in.schedules);
    // The attention and the embedding chosen at each context: the largest of the reaches.
    std::vector<PlanInputs> ways{in};
    if (ulysses_auto) {
      PlanInputs other = in;
      other.context_attention = in.context_attention == "ulysses" ? "ring" : "ulysses";
      ways.push_back(other);
    }
    if (p.embedding_peaks)  // auto, where the trainer's footprint plans both
      for (std::size_t i = 0, n = ways.size(); i < n; ++i) {
        PlanInputs other = ways[i];
        other.embedding = in.embedding == "vocab" ? "fsdp" : "vocab";
        ways.push_back(other);
      }
    // Fitting only gets harder with the context, so another way reaches further only if it
    // fits one token past the best so far: one estimate where it does not, a search where it
    // does.
    for (std::size_t i = 1; i < ways.size(); ++i)
      if (fits(ways[i], p.params, in.schedules, r.scheduled + 1, 1, nullptr))
        r.scheduled = context_reach(ways[i], p.params, in.schedules);
    if (r.baseline > 0) r.ratio = static_cast<double>(r.scheduled) / static_cast<double>(r.baseline);
    p.reach = r;
  }
  if (!p.fits_scheduled) p.fixes = find_fixes(in, p.params, p.scheduled);
  return p;
}

nlohmann::json plan_json(const Plan& p) {
  const PlanInputs& in = p.inputs;
  nlohmann::json j;
  j["model"] = in.model.name;
  j["params_total"] = p.params.total;
  j["params_active"] = p.params.active;
  j["params"] = to_json(p.params);
  j["run"] = {{"context", in.context},
              {"sequences", in.sequences},
              {"tokens_per_device", p.shapes.tokens_per_device}};
  j["layout"] = {{"devices", in.devices},         {"ep", in.ep},
                 {"cp", in.cp},                   {"vocab_group", in.vocab_group},
                 {"fsdp", in.fsdp_size()},        {"device_memory_bytes", in.device_memory},
                 {"host_memory_bytes_per_node", in.host_memory == 0 ? nlohmann::json(nullptr) : nlohmann::json(in.host_memory)},
                 {"devices_per_node", in.devices_per_node},
                 {"host_budget_bytes_per_device",
                  in.host_memory == 0 ? nlohmann::json(nullptr) : nlohmann::json(in.host_budget())}};
  j["schedules"] = in.schedules.str();
  j["knobs"] = {{"dispatch_cap", in.dispatch_cap}, {"llep_alpha", in.llep_alpha}, {"llep_lambda", in.llep_lambda},
                {"llep_min_spill", in.llep_min_spill}, {"vocab_chunk", in.vocab_chunk},
                {"prefetch_depth", p.prefetch_depth}, {"checkpoint_group", p.checkpoint_group},
                {"keep_attention", p.scheduled.keep_attention},
                {"keep_logits", p.scheduled.keep_logits},
                {"keep_experts", p.scheduled.keep_experts},
                {"embedding", in.embedding},
                {"context_attention", in.context_attention},
                {"adam_bucket_bytes", in.adam_bucket},
                {"skew", in.skew == 0 ? nlohmann::json("worst") : nlohmann::json(in.skew)}};
  j["dispatch_copies"] = {{"balanced", p.shapes.routed_copies_balanced},
                          {"worst", p.shapes.routed_copies_worst},
                          {"at_skew", p.shapes.routed_copies},
                          {"per_round", p.shapes.round_copies}};
  nlohmann::json comps = nlohmann::json::object();
  for (Component c : kAllComponents) {
    auto i = static_cast<std::size_t>(c);
    comps[std::string(component_name(c))] = {{"baseline_bytes", p.baseline.component_peak[i]},
                                             {"scheduled_bytes", p.scheduled.component_peak[i]}};
  }
  j["components"] = comps;
  j["peak_bytes"] = {{"baseline", p.baseline.peak}, {"scheduled", p.scheduled.peak}};
  j["binding_component"] = {{"baseline", component_name(p.baseline.binding_component)},
                            {"scheduled", component_name(p.scheduled.binding_component)}};
  j["binding_phase"] = {{"baseline", phase_name(p.baseline.binding_phase)},
                        {"scheduled", phase_name(p.scheduled.binding_phase)}};
  j["fits"] = {{"baseline", p.fits_baseline}, {"scheduled", p.fits_scheduled}};
  // Where the numbers come from: "trainer_footprint" (what `peakbound train` allocates,
  // plan/trainer_plan.h) or "estimate" (the analytic model), with the reason.
  auto source = [](const PeakEstimate& e) {
    return e.trainer_footprint ? nlohmann::json("trainer_footprint") : nlohmann::json("estimate");
  };
  j["source"] = {{"baseline", source(p.baseline)}, {"scheduled", source(p.scheduled)}};
  j["estimate_reason"] = p.scheduled.trainer_footprint ? nlohmann::json(nullptr) : nlohmann::json(p.scheduled.estimate_reason);
  j["host_bytes"] = {{"baseline", p.baseline.host_bytes}, {"scheduled", p.scheduled.host_bytes}};
  j["fits_host"] = {{"baseline", p.fits_host_baseline}, {"scheduled", p.fits_host_scheduled}};
  j["host_binding_component"] = {{"baseline", component_name(p.baseline.host_binding_component)},
                                 {"scheduled", component_name(p.scheduled.host_binding_component)}};
  j["resident_layers"] = in.resident_layers ? nlohmann::json(*in.resident_layers)
                         : p.policy_resident_layers ? nlohmann::json(*p.policy_resident_layers)
                                                    : nlohmann::json(nullptr);
  j["phases"] = {{"baseline", estimate_json(p.baseline)}, {"scheduled", estimate_json(p.scheduled)}};
  if (p.reach) {
    j["reach_tokens"] = {{"baseline", p.reach->baseline}, {"scheduled", p.reach->scheduled}};
    j["reach_ratio"] = p.reach->ratio ? nlohmann::json(*p.reach->ratio) : nlohmann::json(nullptr);
  }
  if (!p.fixes.empty()) j["fixes"] = p.fixes;
  return j;
}

std::string plan_table(const Plan& p) {
  const PlanInputs& in = p.inputs;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "model     %s: %s parameters, %s active\n", in.model.name.c_str(),
                format_params(p.params.total).c_str(), format_params(p.params.active).c_str());
  out += line;
  std::snprintf(line, sizeof line,
                "run       context %s x %lld sequence(s); %lld device(s): ep %lld, cp %lld, vocab group %lld, fsdp %lld; %s each\n",
                format_count(static_cast<std::uint64_t>(in.context)).c_str(), static_cast<long long>(in.sequences),
                static_cast<long long>(in.devices), static_cast<long long>(in.ep), static_cast<long long>(in.cp),
                static_cast<long long>(in.vocab_group), static_cast<long long>(in.fsdp_size()),
                bytes(in.device_memory).c_str());
  out += line;
  std::snprintf(line, sizeof line, "          %lld tokens per device; schedules: %s\n\n",
                static_cast<long long>(p.shapes.tokens_per_device), in.schedules.str().c_str());
  out += line;
  std::snprintf(line, sizeof line, "%-12s %14s %14s %9s\n", "component", "baseline", "scheduled", "of device");
  out += line;
  for (Component c : kAllComponents) {
    auto i = static_cast<std::size_t>(c);
    std::uint64_t b = p.baseline.component_peak[i], s = p.scheduled.component_peak[i];
    if (b == 0 && s == 0) continue;
    std::snprintf(line, sizeof line, "%-12s %14s %14s %8.1f%%\n", std::string(component_name(c)).c_str(),
                  bytes(b).c_str(), bytes(s).c_str(), 100.0 * static_cast<double>(s) / static_cast<double>(in.device_memory));
    out += line;
  }
  std::snprintf(line, sizeof line, "%-12s %14s %14s %8.1f%%\n", "peak", bytes(p.baseline.peak).c_str(),
                bytes(p.scheduled.peak).c_str(),
                100.0 * static_cast<double>(p.scheduled.peak) / static_cast<double>(in.device_memory));
  out += line;
  auto bind = [](const PeakEstimate& e) {
    return std::string(component_name(e.binding_component)) + " @ " + std::string(phase_name(e.binding_phase));
  };
  out += "binding      baseline: " + bind(p.baseline) + "; scheduled: " + bind(p.scheduled) + "\n";
  out += std::string("fits         baseline: ") + (p.fits_baseline ? "yes" : "NO") +
         "; scheduled: " + (p.fits_scheduled ? "yes" : "NO") + "\n";
  if (p.scheduled.trainer_footprint)
    out += std::string("source       the trainer's footprint: what `peakbound train` allocates for this run") +
           (in.comm_reserve > 0 || in.workspace_reserve > 0 ? ", plus the fixed reserves in comm and workspace\n" : "\n");
  else
    out += "source       an estimate: " + p.scheduled.estimate_reason + "\n";
  if (p.scheduled.host_bytes > 0 || p.baseline.host_bytes > 0) {
    out += "host memory  baseline: " + bytes(p.baseline.host_bytes) + "; scheduled: " + bytes(p.scheduled.host_bytes) +
           " per device";
    out += in.host_memory == 0 ? std::string(" (unlimited)")
                               : " of a " + bytes(in.host_budget()) + " share (" + bytes(in.host_memory) + " per node of " +
                                     std::to_string(std::min(in.devices_per_node, in.devices)) + " devices)";
    out += std::string("; fits: ") + (p.fits_host_scheduled ? "yes" : "NO, binding " +
                                      std::string(component_name(p.scheduled.host_binding_component))) + "\n";
  }
  if (p.policy_resident_layers)
    out += "selective    SCO keeps the last " + std::to_string(*p.policy_resident_layers) +
           " boundaries on the device so that the host memory fits\n";
  if (p.embedding_peaks && in.embedding == "vocab")
    out += "embedding    sharded over the vocabulary group (--embedding vocab): peak " + bytes(p.embedding_peaks->second) +
           " against " + bytes(p.embedding_peaks->first) + " with the FSDP embedding\n";
  if (p.context_attention_peaks) {
    const auto [ring, ulysses] = *p.context_attention_peaks;
    out += in.context_attention == "ulysses"
               ? "attention    Ulysses (--context-attention ulysses: the heads split over the cp group): peak " +
                     bytes(ulysses) + " against " + bytes(ring) + " with the ring\n"
               : "attention    the ring (--context-attention ring): peak " + bytes(ring) + " against " + bytes(ulysses) +
                     " with Ulysses\n";
  }
  if (in.checkpoint_group < 1 && p.checkpoint_group > 1)
    out += "groups       SCO keeps one boundary per " + std::to_string(p.checkpoint_group) +
           " layers (--checkpoint-group " + std::to_string(p.checkpoint_group) +
           ", their other inputs recomputed in the group's backward): with one per layer the plan does not fit\n";
  if (in.keep_attention_by_budget && !p.scheduled.keep_attention && p.checkpoint_group == 1)
    out += "attention    the backward recomputes each layer's attention: keeping it (train's --keep-attention) the "
           "plan does not fit\n";
  if (in.keep_experts_by_budget && !p.scheduled.keep_experts && in.model.num_experts > 0)
    out += "experts      the backward computes the experts' forward again: keeping it (train's --keep-experts) the "
           "plan does not fit\n";
  if (in.keep_logits_by_budget && !p.scheduled.keep_logits && in.schedules.dtp && in.vocab_group > 1)
    out += "vocabulary   the loss computes its logits again in the backward: keeping them (train's --keep-logits) "
           "the plan does not fit\n";
  if (in.prefetch_depth < 0 && in.schedules.sco && p.prefetch_depth == 0)
    out += "ring         SCO holds one boundary on the device (prefetch depth 0, its copies waited for): the plan "
           "does not fit with two\n";
  if (p.reach) {
    out += "reach        baseline: " + std::to_string(p.reach->baseline) + " tokens; scheduled: " +
           std::to_string(p.reach->scheduled) + " tokens";
    if (p.reach->ratio) {
      std::snprintf(line, sizeof line, " (%.2fx)", *p.reach->ratio);
      out += line;
    }
    out += "\n";
  }
  for (const std::string& f : p.fixes) out += "to fit:      " + f + "\n";
  return out;
}

}  // namespace peakbound
