#include "peakbound/core/error.h"

namespace peakbound {

void throw_internal(const char* file, int line, const char* cond, const std::string& detail) {
  std::string msg = std::string("internal error at ") + file + ":" + std::to_string(line) +
                    ": check failed: " + cond;
  if (!detail.empty()) msg += " (" + detail + ")";
  throw InternalError(msg);
}

}  // namespace peakbound
