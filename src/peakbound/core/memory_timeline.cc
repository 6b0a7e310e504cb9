#include "peakbound/core/memory_timeline.h"

#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

#include "peakbound/core/arena.h"
#include "peakbound/core/error.h"

namespace peakbound {

namespace {

// Times in the JSON: to 0.1 microsecond (shorter text, same order).
double round_t(double t) { return std::round(t * 1e7) / 1e7; }

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("memory timeline: " + what); }

const nlohmann::json& field(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) bad(std::string("missing field '") + name + "'");
  return *it;
}

std::uint64_t to_u64(const nlohmann::json& v, const std::string& name) {
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0) bad("'" + name + "' must be a non-negative integer");
  return v.get<std::uint64_t>();
}

// Times read: within +-kMaxSeconds (about 31 years), so a step's span and its ticks stay
// finite (1e308 - -1e308 is inf, and a tick loop over an infinite axis never ends).
constexpr double kMaxSeconds = 1e9;
// Live bytes read: each component's and their total at most 2^62 (4 EiB), so the sums in
// int64/uint64 that replay the events (here and in the plot) cannot overflow.
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 62;

double to_time(const nlohmann::json& v, const std::string& name) {
  if (!v.is_number() || !(std::fabs(v.get<double>()) <= kMaxSeconds))
    bad("'" + name + "' must be a number of seconds within +-1e9");
  return v.get<double>();
}

int to_int(const nlohmann::json& v, const std::string& name) {
  const std::uint64_t x = to_u64(v, name);
  if (x > static_cast<std::uint64_t>(INT_MAX)) bad("'" + name + "' is too large");
  return static_cast<int>(x);
}

}  // namespace

std::uint32_t MemoryTimeline::intern(std::string_view name) {
  for (std::size_t i = 0; i < phases.size(); ++i)
    if (phases[i] == name) return static_cast<std::uint32_t>(i);
  phases.emplace_back(name);
  return static_cast<std::uint32_t>(phases.size() - 1);
}

nlohmann::json MemoryTimeline::to_json() const {
  nlohmann::json j;
  j["rank"] = rank;
  j["world"] = world;
  j["budget_bytes"] = budget_bytes;
  nlohmann::json comps = nlohmann::json::array();
  for (Component c : kAllComponents) comps.push_back(std::string(component_name(c)));
  j["components"] = comps;
  j["phases"] = phases;
  j["initial_live_bytes"] = initial;
  nlohmann::json ev = nlohmann::json::array();
  ev.get_ref<nlohmann::json::array_t&>().reserve(events.size());
  for (const MemoryEvent& e : events) ev.push_back({round_t(e.t), e.component, e.delta, e.phase});
  j["events"] = std::move(ev);
  nlohmann::json marks = nlohmann::json::array();
  for (const MemoryPhaseMark& m : phase_marks) marks.push_back({round_t(m.t), m.phase, m.event_index});
  j["phase_marks"] = std::move(marks);
  nlohmann::json st = nlohmann::json::array();
  for (const MemoryStepMark& s : steps)
    st.push_back({{"step", s.step},
                  {"t_begin", round_t(s.t_begin)},
                  {"t_end", round_t(s.t_end)},
                  {"event_begin", s.event_begin},
                  {"event_end", s.event_end}});
  j["steps"] = std::move(st);
  j["truncated"] = truncated;
  if (!title.empty()) j["title"] = title;
  if (!meta.empty()) j["meta"] = nlohmann::json::parse(meta);
  return j;
}

MemoryTimeline MemoryTimeline::from_json(const nlohmann::json& j) {
  if (!j.is_object()) bad("not a JSON object");
  MemoryTimeline t;
  t.rank = to_int(field(j, "rank"), "rank");
  t.world = to_int(field(j, "world"), "world");
  if (t.world < 1 || t.rank >= t.world) bad("'rank' must be below 'world' (>= 1)");
  t.budget_bytes = to_u64(field(j, "budget_bytes"), "budget_bytes");
  const nlohmann::json& comps = field(j, "components");
  if (!comps.is_array() || comps.size() != kNumComponents) bad("'components' must list the " +
                                                               std::to_string(kNumComponents) + " component names");
  for (std::size_t i = 0; i < kNumComponents; ++i)
    if (!comps[i].is_string() || comps[i].get<std::string>() != component_name(kAllComponents[i]))
      bad("components[" + std::to_string(i) + "] must be '" + std::string(component_name(kAllComponents[i])) + "'");
  const nlohmann::json& ph = field(j, "phases");
  if (!ph.is_array() || ph.empty()) bad("'phases' must be a non-empty array of names");
  t.phases.clear();
  for (std::size_t i = 0; i < ph.size(); ++i) {
    if (!ph[i].is_string()) bad("phases[" + std::to_string(i) + "] must be a string");
    t.phases.push_back(ph[i].get<std::string>());
  }
  const nlohmann::json& init = field(j, "initial_live_bytes");
  if (!init.is_array() || init.size() != kNumComponents) bad("'initial_live_bytes' must have one entry per component");
  std::uint64_t total = 0;  // live bytes of all components, at most kMaxBytes
  for (std::size_t i = 0; i < kNumComponents; ++i) {
    t.initial[i] = to_u64(init[i], "initial_live_bytes[" + std::to_string(i) + "]");
    if (t.initial[i] > kMaxBytes - total) bad("'initial_live_bytes' add up to more than 2^62 bytes");
    total += t.initial[i];
  }
  const nlohmann::json& ev = field(j, "events");
  if (!ev.is_array()) bad("'events' must be an array");
  t.events.reserve(ev.size());
  ComponentBytes live = t.initial;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const std::string name = "events[" + std::to_string(i) + "]";
    const nlohmann::json& e = ev[i];
    if (!e.is_array() || e.size() != 4 || !e[1].is_number_integer() || !e[2].is_number_integer() ||
        !e[3].is_number_integer())
      bad(name + " must be [t, component, delta_bytes, phase]");
    MemoryEvent m;
    m.t = to_time(e[0], name + "[0]");
    const std::int64_t c = e[1].get<std::int64_t>(), p = e[3].get<std::int64_t>();
    if (c < 0 || c >= static_cast<std::int64_t>(kNumComponents)) bad(name + ": component index out of range");
    if (p < 0 || p >= static_cast<std::int64_t>(t.phases.size())) bad(name + ": phase index out of range");
    m.component = static_cast<std::uint8_t>(c);
    m.phase = static_cast<std::uint32_t>(p);
    m.delta = e[2].get<std::int64_t>();
    // |delta| <= kMaxBytes first: -INT64_MIN is not an int64.
    const bool release = m.delta < 0;
    const std::uint64_t size = m.delta < -static_cast<std::int64_t>(kMaxBytes) || m.delta > static_cast<std::int64_t>(kMaxBytes)
                                   ? kMaxBytes + 1
                                   : static_cast<std::uint64_t>(release ? -m.delta : m.delta);
    if (release && size > live[m.component])
      bad(name + " releases more " + std::string(component_name(kAllComponents[m.component])) + " bytes than are live");
    if (!release && size > kMaxBytes - total) bad(name + " brings the live bytes past 2^62");
    live[m.component] = release ? live[m.component] - size : live[m.component] + size;
    total = release ? total - size : total + size;
    t.events.push_back(m);
  }
  if (j.contains("phase_marks")) {
    const nlohmann::json& pm = j["phase_marks"];
    if (!pm.is_array()) bad("'phase_marks' must be an array");
    for (std::size_t i = 0; i < pm.size(); ++i) {
      const std::string name = "phase_marks[" + std::to_string(i) + "]";
      if (!pm[i].is_array() || pm[i].size() != 3) bad(name + " must be [t, phase, event_index]");
      MemoryPhaseMark m;
      m.t = to_time(pm[i][0], name + "[0]");
      const std::uint64_t p = to_u64(pm[i][1], name + "[1]");
      if (p >= t.phases.size()) bad(name + ": phase index out of range");
      m.phase = static_cast<std::uint32_t>(p);
      m.event_index = to_u64(pm[i][2], name + "[2]");
      if (m.event_index > t.events.size()) bad(name + ": event index past the events");
      t.phase_marks.push_back(m);
    }
  }
  const nlohmann::json& st = field(j, "steps");
  if (!st.is_array()) bad("'steps' must be an array");
  for (std::size_t i = 0; i < st.size(); ++i) {
    const std::string name = "steps[" + std::to_string(i) + "]";
    if (!st[i].is_object()) bad(name + " must be an object");
    MemoryStepMark s;
    const nlohmann::json& n = field(st[i], "step");
    if (!n.is_number_integer()) bad(name + ".step must be an integer");
    s.step = n.get<std::int64_t>();
    s.t_begin = to_time(field(st[i], "t_begin"), name + ".t_begin");
    s.t_end = to_time(field(st[i], "t_end"), name + ".t_end");
    s.event_begin = to_u64(field(st[i], "event_begin"), name + ".event_begin");
    s.event_end = to_u64(field(st[i], "event_end"), name + ".event_end");
    if (s.event_begin > s.event_end || s.event_end > t.events.size())
      bad(name + ": event_begin <= event_end <= the number of events is required");
    t.steps.push_back(s);
  }
  const nlohmann::json& tr = field(j, "truncated");
  if (!tr.is_boolean()) bad("'truncated' must be true or false");
  t.truncated = tr.get<bool>();
  if (j.contains("title")) {
    if (!j["title"].is_string()) bad("'title' must be a string");
    t.title = j["title"].get<std::string>();
  }
  if (j.contains("meta")) {
    if (!j["meta"].is_object()) bad("'meta' must be an object");
    t.meta = j["meta"].dump();
  }
  return t;
}

void mark_phase(Arena& arena, const char* name, std::int64_t index) {
  if (!arena.recording()) return;
  if (index >= 0) arena.set_phase(std::string(name) + " " + std::to_string(index));
  else arena.set_phase(name);
}

MemoryPhase::MemoryPhase(Arena& arena, const char* name, std::int64_t index) {
  if (!arena.recording()) return;
  arena_ = &arena;
  previous_ = index >= 0 ? arena.set_phase(std::string(name) + " " + std::to_string(index)) : arena.set_phase(name);
}

MemoryPhase::~MemoryPhase() {
  if (arena_) arena_->restore_phase(previous_);
}

}  // namespace peakbound
