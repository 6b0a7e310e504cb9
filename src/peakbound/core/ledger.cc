#include "peakbound/core/ledger.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound {

MemoryLedger::MemoryLedger(std::string name, std::uint64_t budget)
    : name_(std::move(name)), budget_(budget) {}

std::string MemoryLedger::breakdown_text(const ComponentBytes& b) {
  std::string out;
  for (Component c : kAllComponents) {
    std::uint64_t v = b[idx(c)];
    if (v == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(component_name(c)) + " " + format_bytes(static_cast<double>(v));
  }
  return out.empty() ? "nothing" : out;
}

std::string MemoryLedger::refusal(Component c, std::uint64_t bytes, const std::string& why) const {
  std::string msg = name_ + ": cannot allocate " + format_bytes(static_cast<double>(bytes)) +
                    " for '" + std::string(component_name(c)) + "': ";
  msg += format_bytes(static_cast<double>(live_total_)) + " of " +
         (unlimited() ? std::string("unlimited") : format_bytes(static_cast<double>(budget_))) +
         " budget in use (" + breakdown_text(live_) + ")";
  if (!why.empty()) msg += "; " + why;
  return msg;
}

void MemoryLedger::reserve(Component c, std::uint64_t bytes) {
  if (!unlimited() && (bytes > budget_ || live_total_ > budget_ - bytes))
    throw OutOfBudget(refusal(c, bytes, "raise the budget or lower this component's peak"));
  std::size_t i = idx(c);
  live_[i] += bytes;
  count_[i] += 1;
  live_total_ += bytes;
  if (live_[i] > peak_[i]) peak_[i] = live_[i];
  if (live_total_ > peak_total_) {
    peak_total_ = live_total_;
    at_peak_ = live_;
  }
}

void MemoryLedger::release(Component c, std::uint64_t bytes) {
  std::size_t i = idx(c);
  PB_CHECK_MSG(live_[i] >= bytes && count_[i] > 0, "release of memory that was not reserved");
  live_[i] -= bytes;
  count_[i] -= 1;
  live_total_ -= bytes;
}

void MemoryLedger::reset_peaks() {
  peak_ = live_;
  peak_total_ = live_total_;
  at_peak_ = live_;
}

nlohmann::json MemoryLedger::to_json() const {
  nlohmann::json j;
  j["name"] = name_;
  j["budget_bytes"] = unlimited() ? nlohmann::json(nullptr) : nlohmann::json(budget_);
  j["live_bytes"] = live_total_;
  j["peak_bytes"] = peak_total_;
  nlohmann::json comps = nlohmann::json::object();
  for (Component c : kAllComponents) {
    std::size_t i = idx(c);
    comps[std::string(component_name(c))] = {
        {"live_bytes", live_[i]}, {"peak_bytes", peak_[i]}, {"at_global_peak_bytes", at_peak_[i]}};
  }
  j["components"] = std::move(comps);
  return j;
}

std::string MemoryLedger::table() const {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-12s %14s %14s %16s\n", "component", "live", "peak",
                "at global peak");
  out += line;
  for (Component c : kAllComponents) {
    std::size_t i = idx(c);
    if (peak_[i] == 0 && live_[i] == 0) continue;
    std::snprintf(line, sizeof line, "%-12s %14s %14s %16s\n",
                  std::string(component_name(c)).c_str(),
                  format_bytes(static_cast<double>(live_[i])).c_str(),
                  format_bytes(static_cast<double>(peak_[i])).c_str(),
                  format_bytes(static_cast<double>(at_peak_[i])).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "%-12s %14s %14s %16s\n", "total",
                format_bytes(static_cast<double>(live_total_)).c_str(),
                format_bytes(static_cast<double>(peak_total_)).c_str(),
                format_bytes(static_cast<double>(peak_total_)).c_str());
  out += line;
  return out;
}

}  // namespace peakbound
