#include "peakbound/schedules/schedule_set.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

ScheduleSet ScheduleSet::parse(std::string_view text, std::string_view setting) {
  if (text == "none") return none();
  if (text == "all") return all();
  ScheduleSet s;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t sep = rest.find_first_of(",+");
    const std::string_view item = rest.substr(0, sep);
    if (item == "llep") s.llep = true;
    else if (item == "dtp") s.dtp = true;
    else if (item == "sco") s.sco = true;
    else if (item == "adam") s.adam = true;
    else
      throw InvalidArgument(std::string(setting) + ": unknown schedule '" + std::string(item) +
                            "' (use none, all, or a comma list of llep, dtp, sco, adam)");
    if (sep == std::string_view::npos) break;
    rest = rest.substr(sep + 1);
  }
  return s;
}

std::string ScheduleSet::str() const {
  if (!any()) return "none";
  if (every()) return "all";
  std::string s;
  for (auto [on, name] : {std::pair{llep, "llep"}, {dtp, "dtp"}, {sco, "sco"}, {adam, "adam"}})
    if (on) {
      if (!s.empty()) s += ',';
      s += name;
    }
  return s;
}

}  // namespace peakbound
