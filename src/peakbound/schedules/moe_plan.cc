#include "peakbound/schedules/moe_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

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

void check_dispatch_options(const DispatchOptions& o) {
  if (o.cap < 1) throw InvalidArgument("moe dispatch cap must be positive (got " + std::to_string(o.cap) + ")");
  if (!std::isfinite(o.alpha) || o.alpha < 1.0)
    throw InvalidArgument("moe dispatch alpha must be a finite number >= 1 (got " + std::to_string(o.alpha) + ")");
  if (!std::isfinite(o.lambda) || o.lambda < 0.0)
    throw InvalidArgument("moe dispatch lambda must be a finite number >= 0 (got " + std::to_string(o.lambda) + ")");
  if (o.min_spill < 1)
    throw InvalidArgument("moe dispatch min_spill must be positive (got " + std::to_string(o.min_spill) + ")");
  if (o.max_lent < 0)
    throw InvalidArgument("moe dispatch max_lent must be >= 0, 0 for no bound (got " + std::to_string(o.max_lent) + ")");
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

DispatchSizes MoePlan::sizes(int r, std::int64_t tokens) const {
  DispatchSizes s;
  s.max_sent = max_sent();
  s.max_received = max_received();
  s.double_buffered = kind == DispatchKind::pipelined_llep && rounds > 1;
  s.foreign = static_cast<std::int64_t>(foreign_experts(r).size());
  for (const Spill& sp : spills) s.lent += sp.owner == r;
  s.tokens = tokens;
  for (int i = 0; i < rounds; ++i) s.computed += received(r, i);
  return s;
}

namespace {

__extension__ typedef __int128 i128;

std::int64_t ceil_div_pos(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

// The least-loaded expert parallelism assignment (largest experts first).
void assign_llep(MoePlan& p, const DispatchOptions& k) {
  const std::int64_t total = std::accumulate(p.load.begin(), p.load.end(), std::int64_t{0});
  const double mean = static_cast<double>(total) / p.ep;
  // No rank ever needs more than every copy: this also keeps a huge alpha representable.
  const double want = std::ceil(k.alpha * mean);
  const std::int64_t capacity = want >= static_cast<double>(total) ? total : static_cast<std::int64_t>(want);
  std::vector<std::int64_t> assigned(static_cast<std::size_t>(p.ep), 0);
  std::vector<std::int64_t> unplaced(static_cast<std::size_t>(p.ep), 0);  // owners' loads still to place
  for (std::int64_t e = 0; e < p.experts; ++e) unplaced[static_cast<std::size_t>(p.owner(e))] += p.load[static_cast<std::size_t>(e)];
  std::vector<std::int64_t> order(static_cast<std::size_t>(p.experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return p.load[static_cast<std::size_t>(a)] > p.load[static_cast<std::size_t>(b)];
  });
  std::vector<std::int64_t> held(static_cast<std::size_t>(p.ep), 0);  // lent experts each rank holds
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
      // The currently least-loaded rank (lowest index on ties) that may hold e takes the
      // next piece: its owner, a rank already holding it, or one under max_lent.
      int h = -1;
      for (int q = 0; q < p.ep; ++q) {
        const bool may = q == o || k.max_lent == 0 || held[static_cast<std::size_t>(q)] < k.max_lent ||
                         std::any_of(pcs.begin(), pcs.end(), [&](const MoePlan::Piece& x) { return x.dest == q; });
        if (may && (h < 0 || assigned[static_cast<std::size_t>(q)] < assigned[static_cast<std::size_t>(h)])) h = q;
      }
      std::int64_t rest = load - pos;
      std::int64_t fit = capacity - assigned[static_cast<std::size_t>(h)];
      std::int64_t piece = std::min(rest, std::max(fit, std::min(k.min_spill, rest)));
      piece = std::max<std::int64_t>(piece, 1);
      if (!pcs.empty() && pcs.back().dest == h) pcs.back().end += piece;
      else pcs.push_back({h, pos, pos + piece});
      if (h != o) {
        auto it = std::find_if(p.spills.begin(), p.spills.end(),
                               [&](const MoePlan::Spill& s) { return s.expert == e && s.helper == h; });
        if (it == p.spills.end()) {
          p.spills.push_back({e, o, h, piece});
          ++held[static_cast<std::size_t>(h)];
        } else {
          it->copies += piece;
        }
      }
      assigned[static_cast<std::size_t>(h)] += piece;
      pos += piece;
    }
  }
  std::sort(p.spills.begin(), p.spills.end(), [](const MoePlan::Spill& a, const MoePlan::Spill& b) {
    return a.expert != b.expert ? a.expert < b.expert : a.helper < b.helper;
  });
}

// How many of each block's copies are among the first `b` of a source's copies, when
// its copies are merged in one order: the j-th copy of block d at key (j + 1/2) / n_d
// (ties: lower d first). Any prefix of that order is near-proportional (Sainte-Lague),
// and growing b only adds copies, so consecutive prefixes slice the blocks exactly.
void prefix_counts(const std::vector<std::int64_t>& n, std::int64_t N, std::int64_t b, std::vector<std::int64_t>& c) {
  const std::size_t P = n.size();
  std::int64_t have = 0;
  for (std::size_t d = 0; d < P; ++d) {
    // Copies with key <= b / N: j <= (2 b n_d - N) / 2N.
    i128 v = N ? (2 * static_cast<i128>(b) * n[d] + N) / (2 * static_cast<i128>(N)) : 0;
    c[d] = static_cast<std::int64_t>(std::min<i128>(v, n[d]));
    have += c[d];
  }
  // key(d, j) < key(e, i) in the merged order, comparing (2j+1)/(2n_d) exactly.
  auto before = [&](std::size_t d, std::int64_t j, std::size_t e, std::int64_t i) {
    const i128 l = static_cast<i128>(2 * j + 1) * n[e], r = static_cast<i128>(2 * i + 1) * n[d];
    return l != r ? l < r : d < e;
  };
  while (have < b) {  // add the next copy in the order
    std::size_t best = P;
    for (std::size_t d = 0; d < P; ++d)
      if (c[d] < n[d] && (best == P || before(d, c[d], best, c[best]))) best = d;
    PB_CHECK(best < P);
    ++c[best], ++have;
  }
  while (have > b) {  // drop the last copy taken
    std::size_t last = P;
    for (std::size_t d = 0; d < P; ++d)
      if (c[d] > 0 && (last == P || before(last, c[last] - 1, d, c[d] - 1))) last = d;
    PB_CHECK(last < P);
    --c[last], --have;
  }
}

// Slices every (s, d) block over `rounds` rounds into p.bounds: proportional
// (floor(N i / R) of a source's N copies by round i) when fill == 0, else min(N, fill i).
void slice_rounds(MoePlan& p, std::int64_t rounds, std::int64_t fill) {
  const int ep = p.ep;
  p.rounds = static_cast<int>(rounds);
  std::int64_t most = 0;
  const std::size_t R1 = static_cast<std::size_t>(rounds) + 1;
  p.bounds.assign(static_cast<std::size_t>(ep) * static_cast<std::size_t>(ep) * R1, 0);
  std::vector<std::int64_t> n(static_cast<std::size_t>(ep)), c(static_cast<std::size_t>(ep));
  for (int s = 0; s < ep; ++s) {
    std::int64_t N = 0;
    for (int d = 0; d < ep; ++d) N += n[static_cast<std::size_t>(d)] = p.block_size(s, d);
    most = std::max(most, N);
    for (std::int64_t i = 0; i <= rounds; ++i) {
      const auto b = fill ? static_cast<std::int64_t>(std::min<i128>(N, static_cast<i128>(fill) * i))
                          : static_cast<std::int64_t>(static_cast<i128>(N) * i / rounds);
      prefix_counts(n, N, b, c);
      for (int d = 0; d < ep; ++d)
        p.bounds[(static_cast<std::size_t>(s) * static_cast<std::size_t>(ep) + static_cast<std::size_t>(d)) * R1 +
                 static_cast<std::size_t>(i)] = c[static_cast<std::size_t>(d)];
    }
  }
  p.round_cap = fill ? std::min(fill, most) : ceil_div_pos(most, rounds);
}

}  // namespace

MoePlan make_moe_plan(DispatchKind kind, int ep, std::int64_t experts, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, const RoundBytes& bytes) {
  check_dispatch_options(options);
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

  p.spilled = kind != DispatchKind::standard_ep && p.imbalance >= options.lambda && ep > 1;
  if (p.spilled) {
    assign_llep(p, options);
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

  // Rounds. By cap: the fewest with every source sending at most `cap` copies per round;
  // round i of a source with N copies carries floor(N (i+1) / R) - floor(N i / R) <=
  // ceil(N / R) <= cap of them, however they split among destinations. By round_bytes:
  // the largest per-source cap c whose rounds (each source sending min(c, what is left))
  // fit the budget on every rank, found by bisection over c (the sizes grow with c up
  // to a few rows of rounding; every c tried is checked exactly, so the plan fits).
  std::int64_t most = 0;
  for (int s = 0; s < ep; ++s) {
    std::int64_t n = 0;
    for (int d = 0; d < ep; ++d) n += p.block_size(s, d);
    most = std::max(most, n);
  }
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); };
  auto too_many = [&](std::int64_t rounds, const std::string& what) {
    if (rounds > (std::int64_t{1} << 30))
      throw InvalidArgument("moe dispatch " + what + " would need " + std::to_string(rounds) + " rounds; raise it");
  };
  if (kind != DispatchKind::pipelined_llep || most == 0) {
    slice_rounds(p, 1, 0);
  } else if (options.round_bytes == 0) {
    const std::int64_t rounds = std::max<std::int64_t>(1, ceil_div(most, options.cap));
    too_many(rounds, "cap " + std::to_string(options.cap));
    slice_rounds(p, rounds, 0);
  } else {
    PB_CHECK_MSG(static_cast<bool>(bytes), "round_bytes needs the rounds' byte cost (see dispatch_plan)");
    std::uint64_t need = 0;  // the largest rank's bytes at the last c tried
    auto fits = [&](std::int64_t c) {
      const std::int64_t rounds = ceil_div(most, c);
      too_many(rounds, "round_bytes " + std::to_string(options.round_bytes));
      slice_rounds(p, rounds, c);
      need = 0;
      DispatchSizes z = p.sizes(0, 0);  // the round sizes are the group's; foreign and lent per rank
      for (int r = 0; r < ep; ++r) {
        z.foreign = static_cast<std::int64_t>(p.foreign_experts(r).size());
        z.lent = 0;
        for (const MoePlan::Spill& sp : p.spills) z.lent += sp.owner == r;
        need = std::max(need, bytes(z));
      }
      return need <= options.round_bytes;
    };
    if (!fits(most)) {
      std::int64_t lo = 0, hi = most;  // fits(lo) (0: none tried yet), !fits(hi)
      while (hi - lo > 1) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      if (lo == 0)  // the last c tried was 1
        throw InvalidArgument("moe dispatch round_bytes " + std::to_string(options.round_bytes) +
                              " is too small: one copy per source per round needs " + std::to_string(need) + " bytes");
      fits(lo);
    }
  }
  return p;
}

}  // namespace peakbound
