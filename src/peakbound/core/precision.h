// Precision: the run's numeric mode (docs/precision.md). Under bf16 the activations and
// the parameters the model computes with are bf16; parameter gradients, the fp32 master
// weights, AdamW's m and v and the statistics (RMSNorm's rstd, log-sum-exp, router
// probabilities, the loss) are f32 in both modes.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "peakbound/core/dtype.h"

namespace peakbound {

enum class Precision : std::uint8_t { f32, bf16 };

std::string_view precision_name(Precision p);  // "f32" | "bf16"
// "f32" or "bf16" (also "fp32", "float32", "bfloat16"); anything else is a one-line
// InvalidArgument naming `setting` and the choices.
Precision parse_precision(std::string_view text, std::string_view setting = "precision");

// The dtype of activations and activation gradients under p.
DType activation_dtype(Precision p);
// The dtype of the parameters the model computes with under p (the master stays f32).
DType param_dtype(Precision p);

// The precision whose activations are A (float: f32, bf16: bf16).
template <class A>
constexpr Precision precision_of() {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, bf16>, "activations are float or bf16");
  return std::is_same_v<A, float> ? Precision::f32 : Precision::bf16;
}

// A call's tensors (of precision `given`) against the precision `have` that the object or
// config `who` runs in: when they differ, the one-line InvalidArgument
// "<who> runs in <have> but was given <given> <what>".
void check_precision(Precision have, Precision given, std::string_view who, std::string_view what = "tensors");

}  // namespace peakbound
