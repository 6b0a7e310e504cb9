#include "peakbound/plan/plan_inputs.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

ScheduleSet ScheduleSet::parse(std::string_view text) {
  if (text == "none") return none();
  if (text == "all") return all();
  ScheduleSet s;
  std::string_view rest = text;
  while (!rest.empty()) {
    std::size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    if (item == "llep") s.llep = true;
    else if (item == "dtp") s.dtp = true;
    else if (item == "sco") s.sco = true;
    else if (item == "adam") s.adam = true;
    else
      throw InvalidArgument("--schedules: unknown schedule '" + std::string(item) +
                            "' (use none, all, or a comma list of llep, dtp, sco, adam)");
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return s;
}

std::string ScheduleSet::str() const {
  if (!any()) return "none";
  if (llep && dtp && sco && adam) return "all";
  std::string s;
  for (auto [on, name] : {std::pair{llep, "llep"}, {dtp, "dtp"}, {sco, "sco"}, {adam, "adam"}})
    if (on) {
      if (!s.empty()) s += ',';
      s += name;
    }
  return s;
}

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

void PlanInputs::validate() const {
  model.validate();
  require(context > 0, "--context must be positive");
  require(sequences > 0, "--sequences must be positive");
  require(devices > 0, "--devices must be positive");
  require(ep > 0 && devices % ep == 0,
          "--ep " + std::to_string(ep) + " must divide --devices " + std::to_string(devices));
  if (model.num_experts > 0)
    require(model.num_experts % ep == 0, "--ep " + std::to_string(ep) + " does not divide the " +
                                             std::to_string(model.num_experts) + " experts of " + model.name);
  else
    require(ep == 1, "--ep " + std::to_string(ep) + " needs experts, but " + model.name + " is dense");
  require(cp > 0 && devices % cp == 0,
          "--cp " + std::to_string(cp) + " must divide --devices " + std::to_string(devices));
  require(vocab_group > 0 && devices % vocab_group == 0,
          "--vocab-group " + std::to_string(vocab_group) + " must divide --devices " + std::to_string(devices));
  require(fsdp >= 0 && (fsdp == 0 || devices % fsdp == 0),
          "--fsdp " + std::to_string(fsdp) + " must divide --devices " + std::to_string(devices));
  require(device_memory > 0, "--device-memory must be positive");
  require(dispatch_cap > 0, "--dispatch-cap must be positive");
  require(llep_alpha >= 1.0, "--llep-alpha must be at least 1");
  require(llep_min_spill > 0, "--llep-min-spill must be positive");
  require(vocab_chunk > 0, "--vocab-chunk must be positive");
  require(prefetch_depth >= 1, "--prefetch-depth must be at least 1");
  require(adam_bucket > 0, "--adam-bucket must be positive");
  require(skew == 0 || skew >= 1.0, "--skew must be 'balanced' (1), a factor >= 1, or 'worst'");
  for (auto [v, name] : {std::pair{param_bytes, "param"}, {activation_bytes, "activation"},
                         {grad_bytes, "gradient"}, {optimizer_bytes, "optimizer"}})
    require(v > 0, std::string(name) + " bytes must be positive");
}

}  // namespace peakbound
