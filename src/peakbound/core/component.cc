#include "peakbound/core/component.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

std::string_view component_name(Component c) {
  switch (c) {
    case Component::params: return "params";
    case Component::grads: return "grads";
    case Component::optimizer: return "optimizer";
    case Component::checkpoints: return "checkpoints";
    case Component::dispatch: return "dispatch";
    case Component::vocab: return "vocab";
    case Component::attention: return "attention";
    case Component::layer: return "layer";
    case Component::comm: return "comm";
    case Component::workspace: return "workspace";
  }
  PB_CHECK_MSG(false, "unknown component");
}

Component parse_component(std::string_view name) {
  for (Component c : kAllComponents)
    if (component_name(c) == name) return c;
  std::string valid;
  for (Component c : kAllComponents) valid += (valid.empty() ? "" : ", ") + std::string(component_name(c));
  throw InvalidArgument("unknown memory component '" + std::string(name) + "' (valid: " + valid + ")");
}

}  // namespace peakbound
