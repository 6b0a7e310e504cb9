#include "peakbound/schedules/moe_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "peakbound/core/error.h"

namespace peakbound {

std::string_view dispatch_kind_name(DispatchKind k) {
  switch (k) {
    case DispatchKind::standard_ep: return "standard_ep";
    case DispatchKind::llep: return "llep";
    case DispatchKind::pipelined_llep: return "pipelined_llep";
  }
  return "?";
}

std::int64_t MoePlan::slice_begin(int s, int d, int i) const {
  // Proportional slicing: each round takes its share of every (s, d) block, so the
  // first round does not send all of a source's copies to the same destination.
  const std::int64_t n = block_size(s, d);
  return n * i / rounds;
}

int MoePlan::dest_of(int s, std::int64_t e, std::int64_t j) const {
  std::int64_t g = j;
  for (int q = 0; q < s; ++q) g += count(q, e);
  for (const Piece& p : pieces[static_cast<std::size_t>(e)])
    if (g >= p.begin && g < p.end) return p.dest;
  PB_CHECK_MSG(false, "copy outside its expert's pieces");
}

std::int64_t MoePlan::received(int d, int i) const {
  std::int64_t n = 0;
  for (int s = 0; s < ep; ++s) n += slice(s, d, i);
  return n;
}

std::int64_t MoePlan::sent(int s, int i) const {
  std::int64_t n = 0;
  for (int d = 0; d < ep; ++d) n += slice(s, d, i);
  return n;
}

std::int64_t MoePlan::max_received() const {
  std::int64_t m = 0;
  for (int i = 0; i < rounds; ++i)
    for (int d = 0; d < ep; ++d) m = std::max(m, received(d, i));
  return m;
}

std::int64_t MoePlan::max_sent() const {
  std::int64_t m = 0;
  for (int i = 0; i < rounds; ++i)
    for (int s = 0; s < ep; ++s) m = std::max(m, sent(s, i));
  return m;
}

std::vector<std::int64_t> MoePlan::foreign_experts(int r) const {
  std::vector<std::int64_t> out;
  for (const Spill& sp : spills)
    if (sp.helper == r && (out.empty() || out.back() != sp.expert)) out.push_back(sp.expert);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

// The least-loaded expert parallelism assignment (largest experts first).
void assign_llep(MoePlan& p, const LlepKnobs& k) {
  const double total = static_cast<double>(std::accumulate(p.load.begin(), p.load.end(), std::int64_t{0}));
  const double mean = total / p.ep;
  const auto capacity = static_cast<std::int64_t>(std::ceil(k.alpha * mean));
  std::vector<std::int64_t> assigned(static_cast<std::size_t>(p.ep), 0);
  std::vector<std::int64_t> unplaced(static_cast<std::size_t>(p.ep), 0);  // owners' loads still to place
  for (std::int64_t e = 0; e < p.experts; ++e) unplaced[static_cast<std::size_t>(p.owner(e))] += p.load[static_cast<std::size_t>(e)];
  std::vector<std::int64_t> order(static_cast<std::size_t>(p.experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return p.load[static_cast<std::size_t>(a)] > p.load[static_cast<std::size_t>(b)];
  });
  for (std::int64_t e : order) {
    const std::int64_t load = p.load[static_cast<std::size_t>(e)];
    const int o = p.owner(e);
    auto& pcs = p.pieces[static_cast<std::size_t>(e)];
    unplaced[static_cast<std::size_t>(o)] -= load;
    // The owner keeps up to capacity, leaving room for its experts not yet placed.
    std::int64_t room = capacity - assigned[static_cast<std::size_t>(o)] - unplaced[static_cast<std::size_t>(o)];
    std::int64_t keep = std::clamp<std::int64_t>(room, 0, load);
    if (keep > 0) pcs.push_back({o, 0, keep});
    assigned[static_cast<std::size_t>(o)] += keep;
    std::int64_t pos = keep;
    while (pos < load) {
      // The currently least-loaded rank (lowest index on ties) takes the next piece.
      int h = static_cast<int>(std::min_element(assigned.begin(), assigned.end()) - assigned.begin());
      std::int64_t rest = load - pos;
      std::int64_t fit = capacity - assigned[static_cast<std::size_t>(h)];
      std::int64_t piece = std::min(rest, std::max(fit, std::min(k.min_spill, rest)));
      piece = std::max<std::int64_t>(piece, 1);
      if (!pcs.empty() && pcs.back().dest == h) pcs.back().end += piece;
      else pcs.push_back({h, pos, pos + piece});
      if (h != o) {
        auto it = std::find_if(p.spills.begin(), p.spills.end(),
                               [&](const MoePlan::Spill& s) { return s.expert == e && s.helper == h; });
        if (it == p.spills.end()) p.spills.push_back({e, o, h, piece});
        else it->copies += piece;
      }
      assigned[static_cast<std::size_t>(h)] += piece;
      pos += piece;
    }
  }
  std::sort(p.spills.begin(), p.spills.end(), [](const MoePlan::Spill& a, const MoePlan::Spill& b) {
    return a.expert != b.expert ? a.expert < b.expert : a.helper < b.helper;
  });
}

}  // namespace

MoePlan make_moe_plan(DispatchKind kind, int ep, std::int64_t experts, const std::vector<std::int64_t>& counts,
                      const LlepKnobs& knobs) {
  PB_CHECK(ep >= 1 && experts >= 1 && experts % ep == 0);
  PB_CHECK(counts.size() == static_cast<std::size_t>(ep * experts));
  MoePlan p;
  p.kind = kind;
  p.ep = ep;
  p.experts = experts;
  p.local = experts / ep;
  p.counts = counts;
  p.load.assign(static_cast<std::size_t>(experts), 0);
  for (int s = 0; s < ep; ++s)
    for (std::int64_t e = 0; e < experts; ++e) p.load[static_cast<std::size_t>(e)] += p.count(s, e);
  p.pieces.assign(static_cast<std::size_t>(experts), {});

  const std::int64_t total = std::accumulate(p.load.begin(), p.load.end(), std::int64_t{0});
  std::vector<std::int64_t> rank_load(static_cast<std::size_t>(ep), 0);
  for (std::int64_t e = 0; e < experts; ++e) rank_load[static_cast<std::size_t>(p.owner(e))] += p.load[static_cast<std::size_t>(e)];
  const double mean = static_cast<double>(total) / ep;
  p.imbalance = mean > 0 ? static_cast<double>(*std::max_element(rank_load.begin(), rank_load.end())) / mean : 1.0;

  p.spilled = kind != DispatchKind::standard_ep && p.imbalance >= knobs.lambda && ep > 1;
  if (p.spilled) {
    assign_llep(p, knobs);
  } else {
    for (std::int64_t e = 0; e < experts; ++e)
      if (p.load[static_cast<std::size_t>(e)] > 0) p.pieces[static_cast<std::size_t>(e)].push_back({p.owner(e), 0, p.load[static_cast<std::size_t>(e)]});
  }

  // Block sizes: walk each source's copies of each expert through the pieces.
  p.block.assign(static_cast<std::size_t>(ep * ep), 0);
  for (std::int64_t e = 0; e < experts; ++e) {
    std::int64_t g = 0;  // global index of source s's first copy of e
    for (int s = 0; s < ep; ++s) {
      const std::int64_t n = p.count(s, e);
      for (const MoePlan::Piece& pc : p.pieces[static_cast<std::size_t>(e)]) {
        std::int64_t lo = std::max(g, pc.begin), hi = std::min(g + n, pc.end);
        if (hi > lo) p.block[static_cast<std::size_t>(s * ep + pc.dest)] += hi - lo;
      }
      g += n;
    }
  }

  // Rounds: the fewest with every source sending at most `cap` copies per round.
  p.rounds = 1;
  if (kind == DispatchKind::pipelined_llep) {
    PB_CHECK(knobs.cap >= 1);
    std::int64_t most = 0;
    for (int s = 0; s < ep; ++s) {
      std::int64_t n = 0;
      for (int d = 0; d < ep; ++d) n += p.block_size(s, d);
      most = std::max(most, n);
    }
    p.rounds = static_cast<int>(std::max<std::int64_t>(1, (most + knobs.cap - 1) / knobs.cap));
    while (p.max_sent() > knobs.cap) ++p.rounds;  // rounding of the slices can overshoot by < ep
  }
  return p;
}

}  // namespace peakbound
