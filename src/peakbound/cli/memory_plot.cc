#include "peakbound/cli/memory_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "peakbound/core/error.h"
#include "peakbound/core/units.h"

namespace peakbound::cli {

namespace {


// Tableau 10, in the order of kAllComponents.
constexpr std::array<const char*, kNumComponents> kColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                                              "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string esc(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '&') o += "&amp;";
    else if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '"') o += "&quot;";
    else o += ch;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}


// "forward layer 3" -> "F3", "backward layer 3" -> "B3".
std::string short_name(const std::string& n) {
  struct P {
    const char *prefix, *abbr;
  };
  for (P p : {P{"forward layer ", "F"}, P{"backward layer ", "B"}})
    if (n.rfind(p.prefix, 0) == 0) return p.abbr + n.substr(std::char_traits<char>::length(p.prefix));
  if (n == "embedding") return "emb";
  if (n == "embedding backward") return "embB";
  if (n == "optimizer") return "opt";
  if (n == "reduce") return "red";
  if (n == "step start") return "";
  return n.substr(0, 4);
}

// A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks over `range`.
double nice_step(double range, int want) {
  const double raw = range / want;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

constexpr double kPanelW = 820, kPanelH = 540;
constexpr double kLeft = 78, kRight = 24, kTop = 80, kBottom = 96;

void draw_panel(std::ostringstream& o, const StepView& v, double x0, double ymax) {
  const double pw = kPanelW - kLeft - kRight, ph = kPanelH - kTop - kBottom;
  const double L = x0 + kLeft, T = kTop, B = kTop + ph;
  auto X = [&](double t) { return L + t / v.duration * pw; };
  auto Y = [&](double bytes) { return B - bytes / ymax * ph; };
  o << "<text x=\"" << num(x0 + kPanelW / 2) << "\" y=\"20\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">"
    << esc(v.title) << "</text>\n";
  o << "<text x=\"" << num(x0 + kPanelW / 2) << "\" y=\"38\" text-anchor=\"middle\" font-size=\"12\" fill=\"#444\">step "
    << v.step << ", " << num(v.duration * 1e3) << " ms; device bytes live by component"
    << (v.truncated ? " (TRUNCATED: event cap reached)" : "") << "</text>\n";
  // Phase bands; their names in two staggered rows above the plot (abbreviated where a
  // band is narrow), or turned upright inside it where even the abbreviation is too wide.
  for (std::size_t i = 0; i < v.bands.size(); ++i) {
    const Band& b = v.bands[i];
    const double bx = X(b.t0), bw = std::max(X(b.t1) - bx, 0.3);
    o << "<rect x=\"" << num(bx) << "\" y=\"" << num(T) << "\" width=\"" << num(bw) << "\" height=\"" << num(ph)
      << "\" fill=\"" << (i % 2 ? "#e4e4ee" : "#f8f8fc") << "\"><title>" << esc(b.name) << "</title></rect>\n";
    const double room = 2 * bw - 4;  // a label may reach into its neighbours' (the other row's) room
    std::string label = b.name;
    if (label.size() * 6.0 > room) label = short_name(b.name);
    if (label.empty()) continue;
    if (label.size() * 6.0 <= room) {
      const double half = static_cast<double>(label.size()) * 3.0;  // kept inside the plot's width
      const double cx = std::clamp(bx + bw / 2, L + half, std::max(L + half, L + pw - half));
      o << "<text x=\"" << num(cx) << "\" y=\"" << num(T - (i % 2 ? 4 : 16)) << "\" text-anchor=\"middle\" font-size=\"10\" fill=\"#444\">"
        << esc(label) << "</text>\n";
    } else if (bw >= 9) {
      o << "<text transform=\"translate(" << num(bx + bw / 2 - 3.5) << "," << num(T + 4) << ") rotate(90)\" font-size=\"10\" fill=\"#444\">"
        << esc(label) << "</text>\n";
    }
  }
  // The stacked areas: per pixel column the state at its highest total.
  std::vector<Sample> pts;
  const std::size_t columns = static_cast<std::size_t>(pw);
  if (v.samples.size() <= 2 * columns) {
    pts = v.samples;
  } else {
    std::vector<int> have(columns + 1, 0);
    std::vector<Sample> col(columns + 1);
    for (const Sample& s : v.samples) {
      const std::size_t k = std::min(columns, static_cast<std::size_t>(s.t / v.duration * static_cast<double>(columns)));
      if (!have[k] || s.total() > col[k].total()) {
        col[k] = s;
        col[k].t = static_cast<double>(k) / static_cast<double>(columns) * v.duration;
      }
      have[k] = 1;
    }
    for (std::size_t k = 0; k <= columns; ++k)
      if (have[k]) pts.push_back(col[k]);
  }
  std::vector<double> below(pts.size(), 0.0);
  for (std::size_t c = 0; c < kNumComponents; ++c) {
    if (!v.used[c]) continue;
    std::vector<double> top(pts.size());
    for (std::size_t i = 0; i < pts.size(); ++i) top[i] = below[i] + static_cast<double>(pts[i].live[c]);
    // A step function: each state holds until the next sample's time; a corner only
    // where the edge's height changes (in pixels, as drawn).
    std::ostringstream d;
    auto edge = [&](const std::vector<double>& h, bool forward) {
      const std::size_t n = pts.size();
      std::string last_y;
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = forward ? k : n - 1 - k;
        const std::string y = num(Y(h[i]));
        if (y == last_y) continue;  // the same height: the horizontal run goes on
        const double x = forward ? X(pts[i].t) : X(i + 1 < n ? pts[i + 1].t : v.duration);
        if (!last_y.empty()) d << "L" << num(x) << "," << last_y;
        d << (d.tellp() == 0 ? "M" : "L") << num(x) << "," << y;
        last_y = y;
      }
      d << "L" << num(forward ? X(v.duration) : X(pts.front().t)) << "," << last_y;
    };
    edge(top, true);
    edge(below, false);
    o << "<path d=\"" << d.str() << "Z\" fill=\"" << kColours[c] << "\" stroke=\"none\"><title>"
      << component_name(kAllComponents[c]) << "</title></path>\n";
    below = top;
  }
  // Axes and ticks: bytes in MiB or GiB, time in ms.
  const double unit = ymax >= 4.0 * (1u << 30) ? double(1u << 30) : double(1u << 20);
  const char* uname = unit > double(1u << 20) ? "GiB" : "MiB";
  const double ys = nice_step(ymax / unit, 6);
  for (double y = 0; y <= ymax / unit + 1e-9; y += ys) {
    const double py = Y(y * unit);
    char lab[32];
    std::snprintf(lab, sizeof lab, ys < 1 ? "%.1f %s" : "%.0f %s", y, uname);
    o << "<line x1=\"" << num(L) << "\" x2=\"" << num(L + pw) << "\" y1=\"" << num(py) << "\" y2=\"" << num(py)
      << "\" stroke=\"#000\" stroke-opacity=\"0.08\"/>\n";
    o << "<text x=\"" << num(L - 6) << "\" y=\"" << num(py + 4) << "\" text-anchor=\"end\" font-size=\"11\">" << lab << "</text>\n";
  }
  const double ms = v.duration * 1e3, xs = nice_step(ms, 8);
  for (double t = 0; t <= ms + 1e-9; t += xs) {
    const double px = X(t / 1e3);
    char lab[32];
    std::snprintf(lab, sizeof lab, xs < 1 ? "%.2f" : "%.0f", t);
    o << "<line x1=\"" << num(px) << "\" x2=\"" << num(px) << "\" y1=\"" << num(B) << "\" y2=\"" << num(B + 5)
      << "\" stroke=\"#000\"/>\n";
    o << "<text x=\"" << num(px) << "\" y=\"" << num(B + 18) << "\" text-anchor=\"middle\" font-size=\"11\">" << lab << "</text>\n";
  }
  o << "<text x=\"" << num(L + pw / 2) << "\" y=\"" << num(B + 34) << "\" text-anchor=\"middle\" font-size=\"12\">time in the step (ms)</text>\n";
  o << "<rect x=\"" << num(L) << "\" y=\"" << num(T) << "\" width=\"" << num(pw) << "\" height=\"" << num(ph)
    << "\" fill=\"none\" stroke=\"#333\"/>\n";
  // The budget.
  if (v.budget > 0 && static_cast<double>(v.budget) <= ymax) {
    const double by = Y(static_cast<double>(v.budget));
    o << "<line x1=\"" << num(L) << "\" x2=\"" << num(L + pw) << "\" y1=\"" << num(by) << "\" y2=\"" << num(by)
      << "\" stroke=\"#c00\" stroke-width=\"1.5\" stroke-dasharray=\"7,4\"/>\n";
    o << "<text x=\"" << num(L + pw - 4) << "\" y=\"" << num(by - 5) << "\" text-anchor=\"end\" font-size=\"12\" fill=\"#c00\">budget "
      << format_bytes(static_cast<double>(v.budget)) << "</text>\n";
  }
  // The peak and its binding component.
  const double pk = static_cast<double>(v.peak.total());
  const double px = X(v.peak.t), py = Y(pk);
  const double share = pk > 0 ? 100.0 * static_cast<double>(v.peak.live[v.binding]) / pk : 0;
  char plab[128];
  std::snprintf(plab, sizeof plab, "peak %s: %s %.0f%%", format_bytes(pk).c_str(),
                std::string(component_name(kAllComponents[v.binding])).c_str(), share);
  o << "<circle cx=\"" << num(px) << "\" cy=\"" << num(py) << "\" r=\"5\" fill=\"#000\" stroke=\"#fff\" stroke-width=\"1.5\"/>\n";
  const bool left = px > L + pw * 0.6;
  const double ly = std::max(py - 12, T + 30);
  o << "<line x1=\"" << num(px) << "\" y1=\"" << num(py) << "\" x2=\"" << num(px + (left ? -14 : 14)) << "\" y2=\"" << num(ly + 4)
    << "\" stroke=\"#000\"/>\n";
  o << "<text x=\"" << num(px + (left ? -16 : 16)) << "\" y=\"" << num(ly + 4) << "\" text-anchor=\"" << (left ? "end" : "start")
    << "\" font-size=\"13\" font-weight=\"bold\" fill=\"#000\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">"
    << esc(plab) << "</text>\n";
  // The legend: the components this step uses.
  double lx = L, lyy = B + 56;
  for (std::size_t c = 0; c < kNumComponents; ++c) {
    if (!v.used[c]) continue;
    const std::string name(component_name(kAllComponents[c]));
    const double w = 26 + 7.0 * static_cast<double>(name.size());
    if (lx + w > L + pw) {
      lx = L;
      lyy += 18;
    }
    o << "<rect x=\"" << num(lx) << "\" y=\"" << num(lyy - 10) << "\" width=\"12\" height=\"12\" fill=\"" << kColours[c] << "\"/>\n";
    o << "<text x=\"" << num(lx + 16) << "\" y=\"" << num(lyy) << "\" font-size=\"11\">" << esc(name) << "</text>\n";
    lx += w;
  }
}
}  // namespace

StepView cut_step(const MemoryTimeline& tl, std::int64_t want, const std::string& path) {
  if (tl.steps.empty()) throw InvalidArgument(path + ": the timeline has no step recorded");
  const MemoryStepMark* st = &tl.steps.back();
  if (want >= 0) {
    st = nullptr;
    for (const MemoryStepMark& s : tl.steps)
      if (s.step == want) st = &s;
    if (!st)
      throw InvalidArgument("--step " + std::to_string(want) + ": " + path + " has steps " +
                            std::to_string(tl.steps.front().step) + " to " + std::to_string(tl.steps.back().step));
  }
  StepView v;
  v.step = st->step;
  v.budget = tl.budget_bytes;
  v.truncated = tl.truncated;
  v.title = tl.title.empty() ? path : tl.title;
  const std::uint64_t end = st->t_end >= 0 ? st->event_end : tl.events.size();
  const double t_end = st->t_end >= 0 ? st->t_end : (tl.events.empty() ? st->t_begin : tl.events.back().t);
  v.duration = std::max(t_end - st->t_begin, 1e-9);
  Sample cur;
  cur.live = tl.initial;
  for (std::uint64_t i = 0; i < st->event_begin; ++i)
    cur.live[tl.events[i].component] =
        static_cast<std::uint64_t>(static_cast<std::int64_t>(cur.live[tl.events[i].component]) + tl.events[i].delta);
  cur.t = 0;
  v.samples.push_back(cur);
  for (std::uint64_t i = st->event_begin; i < end; ++i) {
    const MemoryEvent& e = tl.events[i];
    cur.live[e.component] = static_cast<std::uint64_t>(static_cast<std::int64_t>(cur.live[e.component]) + e.delta);
    cur.t = std::clamp(e.t - st->t_begin, 0.0, v.duration);
    v.samples.push_back(cur);
  }
  v.peak = v.samples.front();
  for (const Sample& s : v.samples) {
    if (s.total() > v.peak.total()) v.peak = s;
    for (std::size_t c = 0; c < kNumComponents; ++c) v.used[c] = v.used[c] || s.live[c] > 0;
  }
  for (std::size_t c = 0; c < kNumComponents; ++c)
    if (v.peak.live[c] > v.peak.live[v.binding]) v.binding = c;
  // Phase bands: each mark's phase runs to the next mark, clipped to the step.
  std::uint32_t phase = 0;
  double from = 0;
  auto close = [&](double to) {
    if (to > from && phase != 0) {
      const std::string& name = tl.phases[phase];
      if (!v.bands.empty() && v.bands.back().name == name && v.bands.back().t1 >= from - 1e-12) v.bands.back().t1 = to;
      else v.bands.push_back({from, to, name});
    }
  };
  for (const MemoryPhaseMark& m : tl.phase_marks) {
    const double t = m.t - st->t_begin;
    if (t <= 0) {
      phase = m.phase;
      continue;
    }
    if (t >= v.duration) break;
    close(t);
    phase = m.phase;
    from = t;
  }
  close(v.duration);
  return v;
}

double y_top(const StepView& v) {
  return std::max(static_cast<double>(v.peak.total()), static_cast<double>(v.budget)) * 1.06 + 1;
}

std::string memory_svg(const std::vector<StepView>& views) {
  double ymax = 0;
  for (const StepView& v : views) ymax = std::max(ymax, y_top(v));
  const double W = kPanelW * static_cast<double>(views.size());
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(W) << "\" height=\"" << num(kPanelH)
    << "\" viewBox=\"0 0 " << num(W) << " " << num(kPanelH) << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  for (std::size_t i = 0; i < views.size(); ++i) draw_panel(o, views[i], kPanelW * static_cast<double>(i), ymax);
  o << "</svg>\n";
  return o.str();
}

}  // namespace peakbound::cli
