#include "peakbound/schedules/moe_footprint.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

DispatchSizes dispatch_sizes(const MoePlan& plan, int rank, std::int64_t tokens) { return plan.sizes(rank, tokens); }

MoePlan dispatch_plan(DispatchKind kind, const MoeShape& shape, int ep, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, std::uint64_t elem_bytes) {
  return make_moe_plan(kind, ep, shape.experts, counts, options,
                       [&](const DispatchSizes& z) { return dispatch_peak_bytes(shape, z, elem_bytes); });
}

DispatchSizes dispatch_sizes_estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens,
                                      double imbalance, const DispatchOptions& o, std::uint64_t elem_bytes) {
  check_dispatch_options(o);
  if (ep < 1 || tokens < 0 || !(imbalance >= 1.0) || !std::isfinite(imbalance))
    throw InvalidArgument("moe dispatch estimate: ep >= 1, tokens >= 0 and a finite imbalance >= 1 are required");
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); };
  auto ceil_d = [](double v) { return static_cast<std::int64_t>(std::ceil(v)); };
  const std::int64_t C = static_cast<std::int64_t>(checked_mul(static_cast<std::uint64_t>(tokens),
                                                               static_cast<std::uint64_t>(shape.top_k), "moe copies"));
  const std::int64_t local = shape.experts / ep;
  const bool spilled = kind != DispatchKind::standard_ep && ep > 1 && imbalance >= o.lambda;
  DispatchSizes s;
  s.tokens = tokens;
  const double busiest = std::min(imbalance, static_cast<double>(ep)) * static_cast<double>(C);
  const std::int64_t capacity = ceil_d(std::min(o.alpha, static_cast<double>(ep)) * static_cast<double>(C));
  // A reservation for every routing up to `imbalance`: one below lambda spills nothing
  // and receives its whole load (just under lambda x the mean), which past lambda can
  // exceed the spilled load of alpha x the mean plus a piece.
  const std::int64_t unspilled = ceil_d(std::min(o.lambda, static_cast<double>(ep)) * static_cast<double>(C));
  const std::int64_t load =
      spilled ? std::max(std::min(ceil_d(busiest), capacity + o.min_spill), std::min(ceil_d(busiest), unspilled))
              : ceil_d(busiest);
  if (spilled && C > 0) {
    // A helper takes pieces of at least min_spill copies, except the last piece of each
    // expert, which can be a single copy: only its load (at most capacity + min_spill
    // copies, one or more per lent expert) bounds how many experts it holds.
    s.foreign = std::min(shape.experts - local, capacity + o.min_spill);
    if (o.max_lent > 0) s.foreign = std::min(s.foreign, o.max_lent);
    const std::int64_t excess = std::max<std::int64_t>(0, ceil_d(busiest) - capacity);
    s.lent = std::min(local * (ep - 1), ceil_div(excess, o.min_spill) + local);
  }
  // Rows of R rounds of at most `per` copies a source: a destination receives its share
  // of the load, plus up to ep rows of rounding when there are several rounds.
  // (By cap the rounds are even, ceil(load / R); by round_bytes full but the last.)
  auto rows = [&](std::int64_t per) {
    const std::int64_t R = std::max<std::int64_t>(1, ceil_div(C, per));
    s.max_sent = R > 1 ? per : C;
    s.double_buffered = R > 1;
    const std::int64_t share =
        R == 1 ? load
        : o.round_bytes == 0
            ? ceil_div(load, R)
            : ceil_d(static_cast<double>(load) * static_cast<double>(per) / static_cast<double>(C));
    s.max_received = std::min(ep * s.max_sent, share + (R > 1 ? ep : 0));
  };
  if (kind != DispatchKind::pipelined_llep || C == 0) {
    rows(std::max<std::int64_t>(C, 1));
  } else if (o.round_bytes == 0) {
    const std::int64_t R = std::max<std::int64_t>(1, ceil_div(C, o.cap));
    rows(ceil_div(C, R));
  } else {
    // The largest per-source cap whose sizes fit round_bytes (bisection, as make_moe_plan).
    auto fits = [&](std::int64_t per) {
      rows(per);
      return dispatch_peak_bytes(shape, s, elem_bytes) <= o.round_bytes;
    };
    if (!fits(C)) {
      std::int64_t lo = 0, hi = C;
      while (hi - lo > 1) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      if (lo == 0)
        throw InvalidArgument("moe dispatch round_bytes " + std::to_string(o.round_bytes) +
                              " is too small for one copy per source per round");
      rows(lo);
    }
  }
  return s;
}

namespace {

BufferSpec rows(std::int64_t n, std::int64_t width, std::uint64_t elem_bytes) {
  PB_CHECK(n >= 0 && width >= 0);
  return buffer_spec(Component::dispatch, checked_mul(static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(width),
                                                      "moe dispatch buffer elements"),
                     elem_bytes);
}

}  // namespace

std::uint64_t DispatchBuffers::lend_bytes() const {
  std::uint64_t t = 0;
  for (const BufferSpec* b : {&foreign_weights, &foreign_grads, &lend_send, &lend_index})
    t = checked_add(t, b->reserved());
  return t;
}

std::uint64_t DispatchBuffers::rounds_bytes() const {
  std::uint64_t t = 0;
  for (const BufferSpec* b : {&send, &recv, &back, &out, &indices})
    t = checked_add(t, checked_mul(b->reserved(), static_cast<std::uint64_t>(exchange_copies)));
  for (const BufferSpec* b : {&foreign_weights, &foreign_grads, &x_grouped, &dy_grouped, &gate_weights, &gate, &up,
                              &act, &out_grouped, &grad_return})
    t = checked_add(t, b->reserved());
  return t;
}

DispatchBuffers dispatch_buffers(const MoeShape& shape, const DispatchSizes& sz, DispatchPass pass,
                                 std::uint64_t elem_bytes) {
  PB_CHECK(shape.hidden >= 1 && shape.ffn >= 1 && elem_bytes >= 1);
  const bool bwd = pass == DispatchPass::backward;
  const std::int64_t H = shape.hidden, F = shape.ffn, EF = shape.expert_floats();
  const std::int64_t win = bwd ? 2 * H + 1 : H;  // x [, dy, gate weight]
  const std::int64_t wout = bwd ? H + 1 : H;         // dx, d gate weight | out
  const std::int64_t ms = sz.max_sent, mr = sz.max_received;
  DispatchBuffers b;
  b.foreign_weights = rows(sz.foreign, EF, elem_bytes);
  b.foreign_grads = rows(bwd ? sz.foreign : 0, EF, elem_bytes);
  b.lend_send = rows(sz.lent, EF, elem_bytes);
  b.lend_index = rows(sz.lent, 1, sizeof(std::int64_t));
  b.exchange_copies = sz.double_buffered ? 2 : 1;
  b.send = rows(ms, win, elem_bytes);
  b.recv = rows(mr, win, elem_bytes);
  b.back = rows(ms, wout, elem_bytes);
  b.out = rows(mr, wout, elem_bytes);
  b.indices = rows(4 * ms + mr + 1, 1, sizeof(std::int64_t));
  b.gate_weights = rows(bwd ? 2 * mr : 0, 1, elem_bytes);
  b.x_grouped = rows(mr, H, elem_bytes);
  b.dy_grouped = rows(bwd ? mr : 0, H, elem_bytes);
  b.gate = rows(mr, F, elem_bytes);
  b.up = rows(mr, F, elem_bytes);
  b.act = rows(mr, F, elem_bytes);
  b.out_grouped = rows(mr, H, elem_bytes);
  b.grad_return = rows(bwd ? sz.lent : 0, EF, elem_bytes);
  return b;
}

std::uint64_t dispatch_peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, std::uint64_t elem_bytes) {
  std::uint64_t peak = 0;
  for (DispatchPass pass : {DispatchPass::forward, DispatchPass::backward}) {
    const DispatchBuffers b = dispatch_buffers(shape, sizes, pass, elem_bytes);
    peak = std::max({peak, b.lend_bytes(), b.rounds_bytes()});  // a phase is the larger live set
  }
  return peak;
}

Footprint dispatch_footprint(const MoeShape& shape, const DispatchSizes& sizes, std::uint64_t elem_bytes) {
  Footprint f("moe_dispatch");
  for (DispatchPass pass : {DispatchPass::forward, DispatchPass::backward}) {
    const char* phase = pass == DispatchPass::forward ? "forward" : "backward";
    const DispatchBuffers b = dispatch_buffers(shape, sizes, pass, elem_bytes);
    f.device(phase, b.foreign_weights).device(phase, b.foreign_grads);
    if (b.lend_bytes() > b.rounds_bytes()) {
      f.device(phase, b.lend_send).device(phase, b.lend_index);
      continue;
    }
    for (const BufferSpec* x : {&b.send, &b.recv, &b.back, &b.out, &b.indices})
      f.device(phase, *x, static_cast<std::uint64_t>(b.exchange_copies));
    for (const BufferSpec* x :
         {&b.x_grouped, &b.dy_grouped, &b.gate_weights, &b.gate, &b.up, &b.act, &b.out_grouped, &b.grad_return})
      f.device(phase, *x);
  }
  return f;
}

}  // namespace peakbound
