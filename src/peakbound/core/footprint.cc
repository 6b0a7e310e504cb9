#include "peakbound/core/footprint.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"

namespace peakbound {

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, std::string_view what) {
  std::uint64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw InvalidArgument(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " + " +
                          std::to_string(b) + ")");
  return r;
}

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, std::string_view what) {
  std::uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw InvalidArgument(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " x " +
                          std::to_string(b) + ")");
  return r;
}

std::uint64_t arena_reserved(std::uint64_t bytes) {
  constexpr std::uint64_t A = Arena::kAlignment;
  if (bytes == 0) return 0;
  return checked_add(bytes, A - 1, "a buffer size") / A * A;
}

BufferSpec buffer_spec(Component c, std::uint64_t count, std::uint64_t elem_bytes) {
  return BufferSpec{c, checked_mul(count, elem_bytes, std::string(component_name(c)) + " buffer size")};
}

namespace {

std::uint64_t sum(const ComponentBytes& b) {
  std::uint64_t t = 0;
  for (std::uint64_t v : b) t = checked_add(t, v, "a phase total");
  return t;
}

nlohmann::json bytes_json(const ComponentBytes& b) {
  nlohmann::json j = nlohmann::json::object();
  for (Component c : kAllComponents)
    if (b[static_cast<std::size_t>(c)]) j[std::string(component_name(c))] = b[static_cast<std::size_t>(c)];
  return j;
}

}  // namespace

std::uint64_t Footprint::Phase::device_total() const { return sum(device); }
std::uint64_t Footprint::Phase::host_total() const { return sum(host); }

Footprint::Phase& Footprint::at(std::string_view phase) {
  for (Phase& p : phases_)
    if (p.name == phase) return p;
  phases_.push_back(Phase{std::string(phase), {}, {}});
  return phases_.back();
}

Footprint& Footprint::device(std::string_view phase, const BufferSpec& spec, std::uint64_t count) {
  auto& slot = at(phase).device[static_cast<std::size_t>(spec.component)];
  slot = checked_add(slot, checked_mul(spec.reserved(), count, "a footprint"), "a footprint");
  return *this;
}

Footprint& Footprint::host(std::string_view phase, const BufferSpec& spec, std::uint64_t count) {
  auto& slot = at(phase).host[static_cast<std::size_t>(spec.component)];
  slot = checked_add(slot, checked_mul(spec.reserved(), count, "a footprint"), "a footprint");
  return *this;
}

Footprint& Footprint::merge(const Footprint& other) {
  for (const Phase& p : other.phases_) {
    Phase& mine = at(p.name);
    for (std::size_t i = 0; i < kNumComponents; ++i) {
      mine.device[i] = checked_add(mine.device[i], p.device[i], "a footprint");
      mine.host[i] = checked_add(mine.host[i], p.host[i], "a footprint");
    }
  }
  return *this;
}

bool Footprint::has_phase(std::string_view phase) const {
  return std::any_of(phases_.begin(), phases_.end(), [&](const Phase& p) { return p.name == phase; });
}

const Footprint::Phase& Footprint::phase(std::string_view phase) const {
  for (const Phase& p : phases_)
    if (p.name == phase) return p;
  PB_CHECK_MSG(false, "footprint '" + name_ + "' has no phase '" + std::string(phase) + "'");
}

ComponentBytes Footprint::device_peak() const {
  ComponentBytes b{};
  for (const Phase& p : phases_)
    for (std::size_t i = 0; i < kNumComponents; ++i) b[i] = std::max(b[i], p.device[i]);
  return b;
}

ComponentBytes Footprint::host_peak() const {
  ComponentBytes b{};
  for (const Phase& p : phases_)
    for (std::size_t i = 0; i < kNumComponents; ++i) b[i] = std::max(b[i], p.host[i]);
  return b;
}

std::uint64_t Footprint::device_peak(Component c) const { return device_peak()[static_cast<std::size_t>(c)]; }
std::uint64_t Footprint::host_peak(Component c) const { return host_peak()[static_cast<std::size_t>(c)]; }

std::uint64_t Footprint::device_peak_total() const {
  std::uint64_t m = 0;
  for (const Phase& p : phases_) m = std::max(m, p.device_total());
  return m;
}

std::uint64_t Footprint::host_peak_total() const {
  std::uint64_t m = 0;
  for (const Phase& p : phases_) m = std::max(m, p.host_total());
  return m;
}

nlohmann::json Footprint::to_json() const {
  nlohmann::json j;
  j["name"] = name_;
  j["phases"] = nlohmann::json::array();
  for (const Phase& p : phases_)
    j["phases"].push_back({{"name", p.name}, {"device", bytes_json(p.device)}, {"host", bytes_json(p.host)}});
  j["device_peak_bytes"] = device_peak_total();
  j["host_peak_bytes"] = host_peak_total();
  return j;
}

std::uint64_t auto_device_budget(std::uint64_t planned_peak, std::uint64_t unplanned) {
  const std::uint64_t need = checked_add(planned_peak, unplanned, "the automatic device budget");
  return checked_add(checked_add(need, need / 16, "the automatic device budget"), std::uint64_t{8} << 20,
                     "the automatic device budget");
}

}  // namespace peakbound
