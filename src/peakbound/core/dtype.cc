#include "peakbound/core/dtype.h"

#include <string>

#include "peakbound/core/error.h"

namespace peakbound {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::f64: return 8;
  }
  PB_CHECK_MSG(false, "unknown dtype");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::f64: return "f64";
  }
  PB_CHECK_MSG(false, "unknown dtype");
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64") return DType::i64;
  if (name == "u8" || name == "uint8") return DType::u8;
  if (name == "f64" || name == "fp64" || name == "float64") return DType::f64;
  throw InvalidArgument("unknown dtype '" + std::string(name) + "' (use f32, bf16, i32, i64, u8, f64)");
}

}  // namespace peakbound
