#include "peakbound/bench/reach_search.h"

#include <algorithm>
#include <string>

#include "peakbound/core/error.h"

namespace peakbound::bench {

ReachSearch search_reach(const std::function<bool(std::int64_t)>& fits, const ReachSearchOptions& o) {
  if (o.multiple < 1) throw InvalidArgument("reach search: the context multiple must be >= 1");
  if (o.start < o.multiple)
    throw InvalidArgument("reach search: the start context " + std::to_string(o.start) + " is below the multiple " +
                          std::to_string(o.multiple));
  if (o.max_context < o.start)
    throw InvalidArgument("reach search: the largest context " + std::to_string(o.max_context) +
                          " is below the start " + std::to_string(o.start));
  if (!(o.resolution > 0 && o.resolution < 1))
    throw InvalidArgument("reach search: the resolution must be in (0, 1)");
  ReachSearch r;
  auto round = [&](std::int64_t c) { return c / o.multiple * o.multiple; };
  auto test = [&](std::int64_t c) {
    const bool ok = fits(c);
    r.trials.push_back({c, ok});
    return ok;
  };
  std::int64_t lo = 0, hi = 0;  // lo fits (0: none known), hi fails (0: none known)
  std::int64_t c = round(o.start);
  if (test(c)) {
    lo = c;
    // Doubling until a failure or the cap.
    while (true) {
      if (lo >= o.max_context) {
        r.capped = true;
        break;
      }
      const std::int64_t next = std::min(round(lo * 2), round(o.max_context));
      if (next <= lo) {
        r.capped = true;
        break;
      }
      if (test(next)) {
        lo = next;
      } else {
        hi = next;
        break;
      }
    }
  } else {
    hi = c;
    // Halving until a context fits or none is left.
    while (true) {
      const std::int64_t next = round(hi / 2);
      if (next < o.multiple || next >= hi) break;
      if (test(next)) {
        lo = next;
        break;
      }
      hi = next;
    }
  }
  // Bisection between lo (fits) and hi (fails); from 0 when nothing fitted is left alone.
  if (lo > 0 && hi > 0) {
    while (hi - lo > std::max<std::int64_t>(o.multiple, static_cast<std::int64_t>(o.resolution * double(lo)))) {
      const std::int64_t mid = round(lo + (hi - lo) / 2);
      if (mid <= lo || mid >= hi) break;
      if (test(mid)) lo = mid;
      else hi = mid;
    }
  }
  r.reach = lo;
  r.first_failure = hi;
  return r;
}

}  // namespace peakbound::bench
