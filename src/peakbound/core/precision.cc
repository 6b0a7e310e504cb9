#include "peakbound/core/precision.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::f32: return "f32";
    case Precision::bf16: return "bf16";
  }
  PB_CHECK_MSG(false, "unknown precision");
}

Precision parse_precision(std::string_view text, std::string_view setting) {
  if (text == "f32" || text == "fp32" || text == "float32") return Precision::f32;
  if (text == "bf16" || text == "bfloat16") return Precision::bf16;
  throw InvalidArgument(std::string(setting) + ": unknown precision '" + std::string(text) + "' (use bf16 or f32)");
}

DType activation_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

DType param_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

void check_precision(Precision have, Precision given, std::string_view who, std::string_view what) {
  if (have != given)
    throw InvalidArgument(std::string(who) + " runs in " + std::string(precision_name(have)) + " but was given " +
                          std::string(precision_name(given)) + " " + std::string(what));
}

}  // namespace peakbound
