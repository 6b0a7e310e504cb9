// RoPE's frequencies beyond the plain base: YaRN (transformers' rope_type "yarn",
// modeling_rope_utils._compute_yarn_parameters), which Qwen3 configs use past their 32K
// pretraining length and gpt-oss and DeepSeek-V3 use always.
//
//   extrapolation[i] = theta^(-2i / d)              (plain RoPE's inv_freq), i < d/2
//   interpolation[i] = extrapolation[i] / factor
//   dim(r) = d log(original_max_position / (2 pi r)) / (2 log theta)   (the dimension
//            whose wavelength turns r times over the original length)
//   low = dim(beta_fast), high = dim(beta_slow); with truncate floor(low), ceil(high);
//   then low = max(low, 0), high = min(high, d - 1), and high += 0.001 if they are equal
//   ramp[i] = clamp((i - low) / (high - low), 0, 1)
//   inv_freq[i] = interpolation[i] ramp[i] + extrapolation[i] (1 - ramp[i])
// and cos and sin are multiplied by attention_factor (resolved from the config once:
// given, or get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are
// given, or get_mscale(factor); get_mscale(s, m) = 0.1 m ln s + 1 for s > 1, else 1).
//
// Plain data with one inline function, usable by every backend's kernel (the CUDA one
// computes its tables on the device), so it is a model-level type the kernels read.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PB_ROPE_HOST_DEVICE __host__ __device__
#else
#define PB_ROPE_HOST_DEVICE
#endif

namespace peakbound {

struct RopeScaling {
  bool yarn = false;  // false: plain RoPE (the other fields unused)
  double factor = 1.0;
  double attention_factor = 1.0;  // resolved: cos and sin are multiplied by it
  double beta_fast = 32.0, beta_slow = 1.0;
  std::int64_t original_max_position = 0;
  bool truncate = true;

  // Written out (not defaulted): the CUDA kernels' translation units include this header.
  bool operator==(const RopeScaling& o) const {
    return yarn == o.yarn && factor == o.factor && attention_factor == o.attention_factor &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow && original_max_position == o.original_max_position &&
           truncate == o.truncate;
  }
};

// transformers' get_mscale.
inline double yarn_get_mscale(double scale, double mscale = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// What cos and sin are multiplied by: YaRN's attention_factor, else 1.
PB_ROPE_HOST_DEVICE inline double rope_table_factor(const RopeScaling& s) { return s.yarn ? s.attention_factor : 1.0; }

// inv_freq[i] for the rotary dimension d (even), in double.
PB_ROPE_HOST_DEVICE inline double rope_inv_freq(double theta, const RopeScaling& s, std::int64_t i, std::int64_t d) {
  const double extrapolation = pow(theta, -static_cast<double>(2 * i) / static_cast<double>(d));
  if (!s.yarn) return extrapolation;
  const double two_pi = 6.283185307179586476925286766559;
  const double dd = static_cast<double>(d), lt = 2.0 * log(theta), L = static_cast<double>(s.original_max_position);
  double low = dd * log(L / (s.beta_fast * two_pi)) / lt, high = dd * log(L / (s.beta_slow * two_pi)) / lt;
  if (s.truncate) {
    low = floor(low);
    high = ceil(high);
  }
  low = low > 0.0 ? low : 0.0;
  high = high < dd - 1.0 ? high : dd - 1.0;
  if (low == high) high += 0.001;
  double ramp = (static_cast<double>(i) - low) / (high - low);
  ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
  return extrapolation / s.factor * ramp + extrapolation * (1.0 - ramp);
}

}  // namespace peakbound
