#include "peakbound/schedules/schedule_set.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

const std::array<ScheduleInfo, 4>& ScheduleSet::each() {
  static const std::array<ScheduleInfo, 4> kEach = {
      {{"llep", &ScheduleSet::llep, Component::dispatch, "routed-token buffers", false},
       {"dtp", &ScheduleSet::dtp, Component::vocab, "logits", false},
       {"sco", &ScheduleSet::sco, Component::checkpoints, "checkpoint boundaries", true},
       {"adam", &ScheduleSet::adam, Component::optimizer, "optimizer state", true}}};
  return kEach;
}

const ScheduleInfo* ScheduleSet::bounding(Component c) {
  for (const ScheduleInfo& i : each())
    if (i.bounds == c) return &i;
  return nullptr;
}

ScheduleSet ScheduleSet::parse(std::string_view text, std::string_view setting) {
  if (text == "none") return none();
  if (text == "all") return all();
  ScheduleSet s;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t sep = rest.find_first_of(",+");
    const std::string_view item = rest.substr(0, sep);
    const ScheduleInfo* found = nullptr;
    for (const ScheduleInfo& i : each())
      if (item == i.name) found = &i;
    if (found == nullptr)
      throw InvalidArgument(std::string(setting) + ": unknown schedule '" + std::string(item) +
                            "' (use none, all, or a comma list of llep, dtp, sco, adam)");
    s.*(found->on) = true;
    if (sep == std::string_view::npos) break;
    rest = rest.substr(sep + 1);
  }
  return s;
}

std::string ScheduleSet::str() const {
  if (!any()) return "none";
  if (every()) return "all";
  std::string s;
  for (const ScheduleInfo& i : each())
    if (this->*(i.on)) {
      if (!s.empty()) s += ',';
      s += i.name;
    }
  return s;
}

}  // namespace peakbound
