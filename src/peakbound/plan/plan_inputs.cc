#include "peakbound/plan/plan_inputs.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/core/ledger.h"
#include "peakbound/core/values.h"
#include "peakbound/schedules/ulysses_attention.h"

namespace peakbound {

namespace {
void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}
}  // namespace

void PlanInputs::resolve_auto() {
  auto largest_divisor = [](std::int64_t n, std::int64_t cap, std::int64_t also) {
    std::int64_t best = 1;
    for (std::int64_t d = 1; d <= cap && d <= n; ++d)
      if (n % d == 0 && (also == 0 || also % d == 0)) best = d;
    return best;
  };
  if (devices <= 0) return;  // validate() names it
  if (ep == 0) ep = model.num_experts > 0 ? largest_divisor(devices, 64, model.num_experts) : 1;
  if (vocab_group == 0) vocab_group = largest_divisor(devices, 8, 0);
}

DispatchOptions PlanInputs::dispatch_options() const {
  DispatchOptions o;
  o.alpha = llep_alpha;
  o.lambda = llep_lambda;
  o.min_spill = llep_min_spill;
  o.cap = dispatch_cap;
  return o;
}

std::uint64_t PlanInputs::host_budget() const {
  if (host_memory == 0) return MemoryLedger::kUnlimited;
  return host_memory / static_cast<std::uint64_t>(std::max<std::int64_t>(1, std::min(devices_per_node, devices)));
}

void PlanInputs::validate() const {
  model.validate();
  check_int(context, "context", 1, kMaxContext);
  check_int(sequences, "sequences", 1, kMaxSequences);
  check_int(devices, "devices", 1, kMaxDevices);
  check_int(attention_threads, "attention_threads", 1, 1 << 16);
  require(ep > 0 && devices % ep == 0,
          "ep " + std::to_string(ep) + " must divide devices " + std::to_string(devices));
  if (model.num_experts > 0)
    require(model.num_experts % ep == 0, "ep " + std::to_string(ep) + " does not divide the " +
                                             std::to_string(model.num_experts) + " experts of " + model.name);
  else
    require(ep == 1, "ep " + std::to_string(ep) + " needs experts, but " + model.name + " is dense");
  require(cp > 0 && devices % cp == 0,
          "cp " + std::to_string(cp) + " must divide devices " + std::to_string(devices));
  require(vocab_group > 0 && devices % vocab_group == 0,
          "vocab_group " + std::to_string(vocab_group) + " must divide devices " + std::to_string(devices));
  require(fsdp >= 0 && (fsdp == 0 || devices % fsdp == 0),
          "fsdp " + std::to_string(fsdp) + " must divide devices " + std::to_string(devices));
  require(device_memory > 0, "device_memory must be positive");
  check_int(devices_per_node, "devices_per_node", 1, 1024);
  if (resident_layers)  // of the boundaries: one per checkpoint group
    check_int(*resident_layers, "resident_layers", 0,
              (model.num_layers + planned_checkpoint_group() - 1) / planned_checkpoint_group());
  check_int(dispatch_cap, "dispatch_cap", 1, kMaxRows);
  check_real(llep_alpha, "llep_alpha", 1.0, 1e6);
  check_real(llep_lambda, "llep_lambda", 1.0, 1e6);
  check_int(llep_min_spill, "llep_min_spill", 1, kMaxRows);
  check_int(vocab_chunk, "vocab_chunk", 1, kMaxRows);
  check_int(prefetch_depth, "prefetch_depth", -1, 1024);
  require(embedding == "auto" || embedding == "fsdp" || embedding == "vocab",
          "embedding must be auto, fsdp or vocab, got '" + embedding + "'");
  require(context_attention == "auto" || context_attention == "ring" || context_attention == "ulysses",
          "context_attention must be auto, ring or ulysses, got '" + context_attention + "'");
  if (context_attention == "ulysses" && cp > 1) {
    const std::string why = ulysses_refusal(model.num_heads, model.num_kv_heads, static_cast<int>(cp),
                                            model.attention == AttentionKind::mla);
    require(why.empty(), "context_attention ulysses: " + why);
  }
  require(checkpoint_group == -1 || (checkpoint_group >= 1 && checkpoint_group <= model.num_layers),
          "checkpoint_group must be -1 (the policy's) or a group of 1 to " + std::to_string(model.num_layers) +
              " layers, got " + std::to_string(checkpoint_group));
  require(adam_bucket > 0, "adam_bucket must be positive");
  require(skew == 0 || (std::isfinite(skew) && skew >= 1.0 && skew <= 1e6),
          "skew must be 1 (balanced), a finite factor in [1, 1e6], or 0 (worst)");
  for (auto [v, name] : {std::pair{param_bytes, "param"}, {activation_bytes, "activation"},
                         {grad_bytes, "gradient"}, {optimizer_state_bytes, "optimizer state"}})
    check_int(v, std::string(name) + " bytes", 1, 64);
}

}  // namespace peakbound
