// MoePlan: where every routed token-copy of one MoE layer goes, computed identically
// on every rank of the expert-parallel group from the all-gathered per-source,
// per-expert counts (so no rank needs to ask another what it will receive).
//   standard_ep     every copy goes to its expert's owner, in one round
//   llep            least-loaded EP: beyond a capacity, an expert's copies are spilled
//                   (with a copy of its weights) to the least-loaded ranks
//   pipelined_llep  the llep assignment, each source's copies sliced over rounds so
//                   that a source sends at most `cap` copies per round; with a
//                   round_bytes budget the per-round copy cap is instead the largest
//                   whose rounds' device memory (as dispatch_buffers counts it, given by
//                   the caller's RoundBytes) fits the budget, so balanced routing runs
//                   in few large rounds and every routing's peak stays near the budget
// An expert's copies are ordered globally by (source rank, local order): the owner keeps
// the first ones, each spill takes the next range.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace peakbound {

enum class DispatchKind : std::uint8_t { standard_ep, llep, pipelined_llep };
std::string_view dispatch_kind_name(DispatchKind k);

// Every knob of the dispatch schedules and its one default: the library, the CLI flags
// and the planner read these.
struct DispatchOptions {
  double alpha = 1.0;           // llep capacity = alpha x (total copies / EP), >= 1
  double lambda = 1.3;          // below this imbalance (max rank load / mean) llep is standard EP
  std::int64_t min_spill = 64;  // llep: smallest spilled piece, token-copies
  std::int64_t cap = 1024;      // pipelined: copies a source rank sends per round
  // Pipelined: the device memory the dispatch may use (its footprint peak over both
  // passes, bytes). > 0: replaces `cap` by the largest per-source copies per round that
  // fits, with the lent weights held; 0: `cap` alone decides the rounds (the default, so
  // the planner's and trainer's reservations are unchanged unless asked).
  std::uint64_t round_bytes = 0;
  // LLEP: the most lent (foreign) experts a rank holds in a pass, 0 = no bound. A spill
  // goes to the least-loaded rank that already holds the expert or holds fewer; the
  // owner keeps what no such rank can take.
  std::int64_t max_lent = 0;
};
// Throws InvalidArgument naming the option ("moe dispatch cap must be positive").
void check_dispatch_options(const DispatchOptions& o);

struct DispatchSizes {
  // Every rank sizes its exchange for the group's largest round (the plan is the same
  // on all ranks), so these are maxima over ranks and rounds.
  std::int64_t max_sent = 0;      // rows a source sends in one round
  std::int64_t max_received = 0;  // rows a destination receives in one round
  bool double_buffered = false;   // pipelined with > 1 round: exchange buffers x2
  std::int64_t foreign = 0;       // lent experts whose weights this rank holds
  std::int64_t lent = 0;          // (expert, helper) lendings by this rank: weight copies sent
  std::int64_t tokens = 0;        // this rank's tokens (host scratch only)
  // Rows this rank's experts compute over the whole pass (every round): what keeping the
  // experts' intermediates from the forward to the backward holds (dispatch_kept_buffer).
  // The planner's estimate: the busiest rank's load.
  std::int64_t computed = 0;
};

// The device bytes one rank's dispatch holds at its peak with these sizes (both passes);
// moe_footprint.h's dispatch_plan supplies it from dispatch_buffers, so plan and run agree.
using RoundBytes = std::function<std::uint64_t(const DispatchSizes&)>;

struct MoePlan {
  struct Piece {
    int dest;
    std::int64_t begin, end;  // range in the expert's global copy order
  };
  struct Spill {
    std::int64_t expert;
    int owner, helper;
    std::int64_t copies;
  };

  DispatchKind kind = DispatchKind::standard_ep;
  int ep = 1;
  std::int64_t experts = 0, local = 0;  // local = experts per rank
  std::vector<std::int64_t> counts;     // [ep][experts]: copies from source s to expert e
  std::vector<std::int64_t> load;       // [experts]
  double imbalance = 1.0;               // max rank load / mean, before spilling
  bool spilled = false;                 // false: standard EP assignment
  std::vector<std::vector<Piece>> pieces;  // per expert, covering [0, load)
  std::vector<Spill> spills;            // one per (expert, helper)
  std::vector<std::int64_t> block;      // [ep][ep]: copies from source s to destination d
  int rounds = 1;
  std::int64_t round_cap = 0;           // pipelined: most copies a source sends per round
  std::vector<std::int64_t> bounds;     // [ep][ep][rounds + 1]: slice starts, see slice_begin

  int owner(std::int64_t e) const { return static_cast<int>(e / local); }
  std::int64_t count(int s, std::int64_t e) const { return counts[static_cast<std::size_t>(s * experts + e)]; }
  std::int64_t block_size(int s, int d) const { return block[static_cast<std::size_t>(s * ep + d)]; }
  // Copies of block (s, d) in round i: [slice_begin(s,d,i), slice_begin(s,d,i+1)).
  // Source s sends floor(N (i+1) / R) - floor(N i / R) <= cap copies in round i (N its
  // copies, R rounds), shared among destinations in proportion to the blocks; under
  // round_bytes it sends min(c, what is left) (c = round_cap), so every round but the
  // last is full and the round buffers stay near the budget whatever the tokens.
  std::int64_t slice_begin(int s, int d, int i) const {
    return bounds[(static_cast<std::size_t>(s) * static_cast<std::size_t>(ep) + static_cast<std::size_t>(d)) *
                      (static_cast<std::size_t>(rounds) + 1) +
                  static_cast<std::size_t>(i)];
  }
  std::int64_t slice(int s, int d, int i) const { return slice_begin(s, d, i + 1) - slice_begin(s, d, i); }
  // Destination of the j-th copy (in source s's local order) of expert e.
  int dest_of(int s, std::int64_t e, std::int64_t j) const;
  // Rows rank d receives in round i, and the largest such count over all rounds and ranks.
  std::int64_t received(int d, int i) const;
  std::int64_t sent(int s, int i) const;
  std::int64_t max_received() const;
  std::int64_t max_sent() const;
  // Experts whose weights rank r holds without owning them (ascending).
  std::vector<std::int64_t> foreign_experts(int r) const;
  // Rank r's sizes under this plan (the runtime allocates from these).
  DispatchSizes sizes(int r, std::int64_t tokens) const;
};

// counts: [ep][experts] copies from each source to each expert (all ranks pass the same).
// `bytes` is required when options.round_bytes > 0 for pipelined_llep (the rounds are the
// fewest whose every rank's bytes(sizes) <= round_bytes); throws InvalidArgument when
// even one copy per source per round does not fit.
MoePlan make_moe_plan(DispatchKind kind, int ep, std::int64_t experts, const std::vector<std::int64_t>& counts,
                      const DispatchOptions& options, const RoundBytes& bytes = {});

}  // namespace peakbound
