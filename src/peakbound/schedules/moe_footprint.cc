#include "peakbound/schedules/moe_footprint.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "peakbound/core/error.h"
#include "peakbound/nn/swiglu_ffn.h"

namespace peakbound {

namespace {

// The element sizes of one pass's buffers: rows and lent weights (act), the routing
// weight's slots at a row's end, the fp32-kept statistics and gradients (f32), and the
// precision of the experts' tile.
struct Layout {
  std::uint64_t act = sizeof(float);
  std::int64_t slots = 1;
  std::uint64_t f32 = sizeof(float);
  Precision tile = Precision::f32;
};

// The planner's form: every element elem_bytes wide, as before precisions existed.
Layout layout_of(std::uint64_t elem_bytes) { return {elem_bytes, 1, elem_bytes, Precision::f32}; }
Layout layout_of(Precision p) {
  if (p == Precision::f32) return {};
  return {dtype_size(activation_dtype(p)), 2, sizeof(float), p};
}

DispatchBuffers buffers(const MoeShape& shape, const DispatchSizes& sz, DispatchPass pass, const Layout& l);
std::uint64_t peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, const Layout& l);
Footprint footprint(const MoeShape& shape, const DispatchSizes& sizes, const Layout& l);

MoePlan plan_of(DispatchKind kind, const MoeShape& shape, int ep, const std::vector<std::int64_t>& counts,
                const DispatchOptions& options, const Layout& l) {
  return make_moe_plan(kind, ep, shape.experts, counts, options,
                       [&](const DispatchSizes& z) { return peak_bytes(shape, z, l); });
}

DispatchSizes estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens, double imbalance,
                       const DispatchOptions& o, const Layout& l);

}  // namespace

DispatchSizes dispatch_sizes(const MoePlan& plan, int rank, std::int64_t tokens) { return plan.sizes(rank, tokens); }

MoePlan dispatch_plan(DispatchKind kind, const MoeShape& shape, int ep, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, std::uint64_t elem_bytes) {
  return plan_of(kind, shape, ep, counts, options, layout_of(elem_bytes));
}
MoePlan dispatch_plan(DispatchKind kind, const MoeShape& shape, int ep, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, Precision precision) {
  return plan_of(kind, shape, ep, counts, options, layout_of(precision));
}

DispatchSizes dispatch_sizes_estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens,
                                      double imbalance, const DispatchOptions& o, std::uint64_t elem_bytes) {
  return estimate(kind, shape, ep, tokens, imbalance, o, layout_of(elem_bytes));
}
DispatchSizes dispatch_sizes_estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens,
                                      double imbalance, const DispatchOptions& o, Precision precision) {
  return estimate(kind, shape, ep, tokens, imbalance, o, layout_of(precision));
}

namespace {

DispatchSizes estimate(DispatchKind kind, const MoeShape& shape, int ep, std::int64_t tokens, double imbalance,
                       const DispatchOptions& o, const Layout& l) {
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
  s.computed = load;
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
      return peak_bytes(shape, s, l) <= o.round_bytes;
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
                              &act, &expert_tile, &out_grouped, &grad_return})
    t = checked_add(t, b->reserved());
  return t;
}

namespace {

DispatchBuffers buffers(const MoeShape& shape, const DispatchSizes& sz, DispatchPass pass, const Layout& l) {
  PB_CHECK(shape.hidden >= 1 && shape.ffn >= 1 && l.act >= 1);
  const bool bwd = pass == DispatchPass::backward;
  const std::int64_t H = shape.hidden, F = shape.ffn, EF = shape.expert_floats();
  const std::int64_t win = bwd ? 2 * H + l.slots : H;  // x [, dy, gate weight]
  const std::int64_t wout = bwd ? H + l.slots : H;     // dx, d gate weight | out
  const std::int64_t ms = sz.max_sent, mr = sz.max_received;
  DispatchBuffers b;
  b.foreign_weights = rows(sz.foreign, EF, l.act);
  b.foreign_grads = rows(bwd ? sz.foreign : 0, EF, l.f32);
  b.lend_send = rows(sz.lent, EF, l.act);
  b.lend_index = rows(sz.lent, 1, sizeof(std::int64_t));
  b.exchange_copies = sz.double_buffered ? 2 : 1;
  b.send = rows(ms, win, l.act);
  b.recv = rows(mr, win, l.act);
  b.back = rows(ms, wout, l.act);
  b.out = rows(mr, wout, l.act);
  b.indices = rows(4 * ms + mr + 1, 1, sizeof(std::int64_t));
  b.gate_weights = rows(bwd ? 2 * mr : 0, 1, l.f32);
  b.x_grouped = rows(mr, H, l.act);
  b.dy_grouped = rows(bwd ? mr : 0, H, l.act);
  const SwigluFfnBuffers ffn = l.tile == Precision::f32 ? swiglu_ffn_buffers(mr, F, l.act, Component::dispatch)
                                                        : swiglu_ffn_buffers(mr, H, F, l.tile, Component::dispatch);
  b.gate = ffn.gate;
  b.up = ffn.up;
  b.act = ffn.act;
  b.expert_tile = ffn.tile;
  b.out_grouped = rows(mr, H, l.act);
  b.grad_return = rows(bwd ? sz.lent : 0, EF, l.f32);
  return b;
}

std::uint64_t peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, const Layout& l) {
  std::uint64_t peak = 0;
  for (DispatchPass pass : {DispatchPass::forward, DispatchPass::backward}) {
    const DispatchBuffers b = buffers(shape, sizes, pass, l);
    peak = std::max({peak, b.lend_bytes(), b.rounds_bytes()});  // a phase is the larger live set
  }
  return peak;
}

Footprint footprint(const MoeShape& shape, const DispatchSizes& sizes, const Layout& l) {
  Footprint f("moe_dispatch");
  for (DispatchPass pass : {DispatchPass::forward, DispatchPass::backward}) {
    const char* phase = pass == DispatchPass::forward ? "forward" : "backward";
    const DispatchBuffers b = buffers(shape, sizes, pass, l);
    f.device(phase, b.foreign_weights).device(phase, b.foreign_grads);
    if (b.lend_bytes() > b.rounds_bytes()) {
      f.device(phase, b.lend_send).device(phase, b.lend_index);
      continue;
    }
    for (const BufferSpec* x : {&b.send, &b.recv, &b.back, &b.out, &b.indices})
      f.device(phase, *x, static_cast<std::uint64_t>(b.exchange_copies));
    for (const BufferSpec* x : {&b.x_grouped, &b.dy_grouped, &b.gate_weights, &b.gate, &b.up, &b.act, &b.expert_tile,
                                &b.out_grouped, &b.grad_return})
      f.device(phase, *x);
  }
  return f;
}

}  // namespace

DispatchBuffers dispatch_buffers(const MoeShape& shape, const DispatchSizes& sizes, DispatchPass pass,
                                 std::uint64_t elem_bytes) {
  return buffers(shape, sizes, pass, layout_of(elem_bytes));
}
DispatchBuffers dispatch_buffers(const MoeShape& shape, const DispatchSizes& sizes, DispatchPass pass,
                                 Precision precision) {
  return buffers(shape, sizes, pass, layout_of(precision));
}

namespace {

std::int64_t kept_rows(const MoeShape& shape, std::int64_t rows, const Layout& l) {
  PB_CHECK(rows >= 0);
  const std::uint64_t row = static_cast<std::uint64_t>(3 * shape.ffn + shape.hidden) * l.act;
  const std::int64_t granule = static_cast<std::int64_t>(arena_reserved(1) / std::gcd(arena_reserved(1), row));
  return (rows + granule - 1) / granule * granule;
}

BufferSpec kept_buffer(const MoeShape& shape, std::int64_t rows, const Layout& l) {
  return peakbound::rows(kept_rows(shape, rows, l), 3 * shape.ffn + shape.hidden, l.act);
}

}  // namespace

std::int64_t dispatch_kept_rows(const MoeShape& shape, std::int64_t rows, Precision precision) {
  return kept_rows(shape, rows, layout_of(precision));
}
BufferSpec dispatch_kept_buffer(const MoeShape& shape, std::int64_t rows, Precision precision) {
  return kept_buffer(shape, rows, layout_of(precision));
}
BufferSpec dispatch_kept_buffer(const MoeShape& shape, std::int64_t rows, std::uint64_t elem_bytes) {
  return kept_buffer(shape, rows, layout_of(elem_bytes));
}

std::uint64_t dispatch_peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, std::uint64_t elem_bytes) {
  return peak_bytes(shape, sizes, layout_of(elem_bytes));
}
std::uint64_t dispatch_peak_bytes(const MoeShape& shape, const DispatchSizes& sizes, Precision precision) {
  return peak_bytes(shape, sizes, layout_of(precision));
}

Footprint dispatch_footprint(const MoeShape& shape, const DispatchSizes& sizes, std::uint64_t elem_bytes) {
  return footprint(shape, sizes, layout_of(elem_bytes));
}
Footprint dispatch_footprint(const MoeShape& shape, const DispatchSizes& sizes, Precision precision) {
  return footprint(shape, sizes, layout_of(precision));
}

}  // namespace peakbound
