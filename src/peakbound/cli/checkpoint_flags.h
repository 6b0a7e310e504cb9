// The checkpoint commands' flags for the library's option names (CheckpointOptions):
// errors from the library name the option ("checkpoint link_gbps must be ..."), the
// commands show the user the flag they typed ("--link-gbps must be ...").
#pragma once

#include <cstring>
#include <string>
#include <utility>

#include "peakbound/core/error.h"

namespace peakbound::cli {

inline std::string checkpoint_option_as_flag(std::string m) {
  for (auto [opt, flag] : {std::pair<const char*, const char*>{"checkpoint prefetch_depth", "--prefetch"},
                           {"checkpoint resident_layers", "--resident-layers"},
                           {"checkpoint link_gbps", "--link-gbps"},
                           {"checkpoint_budget", "--checkpoint-budget"},
                           {"prefetch_depth", "--prefetch"},
                           {"leave it unset", "omit the flag"}})
    for (std::size_t at = m.find(opt); at != std::string::npos; at = m.find(opt, at + std::strlen(flag)))
      m.replace(at, std::strlen(opt), flag);
  return m;
}

// Runs fn, rethrowing its InvalidArgument / OutOfBudget with the options as flags.
template <class Fn>
decltype(auto) with_checkpoint_flags(Fn&& fn) {
  try {
    return fn();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(checkpoint_option_as_flag(e.what()));
  } catch (const OutOfBudget& e) {
    throw OutOfBudget(checkpoint_option_as_flag(e.what()));
  }
}

}  // namespace peakbound::cli
