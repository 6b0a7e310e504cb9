#include "peakbound/core/error.h"

namespace peakbound {

std::string one_line(const std::string& message) {
  std::string out;
  out.reserve(message.size());
  for (const char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

void throw_internal(const char* file, int line, const char* cond, const std::string& detail) {
  std::string msg = std::string("internal error at ") + file + ":" + std::to_string(line) +
                    ": check failed: " + cond;
  if (!detail.empty()) msg += " (" + detail + ")";
  throw InternalError(msg);
}

}  // namespace peakbound
