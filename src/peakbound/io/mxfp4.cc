#include "peakbound/io/mxfp4.h"

#include <algorithm>
#include <cmath>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
constexpr std::uint8_t kE8m0Nan = 255;
constexpr int kE8m0Bias = 127;

}  // namespace

float e2m1_value(std::uint8_t code) { return kE2m1[code & 0x0F]; }

void dequantize_mxfp4_rows(const std::uint8_t* blocks, const std::uint8_t* scales, std::int64_t rows,
                           std::int64_t groups, float* out, const std::string& what) {
  for (std::int64_t b = 0; b < rows * groups; ++b) {
    const std::uint8_t s = scales[b];
    if (s == kE8m0Nan)
      throw InvalidArgument(what + ": block " + std::to_string(b) +
                            " has scale 255, E8M0's NaN (the OCP MX format), not a weight");
    const int exponent = static_cast<int>(s) - kE8m0Bias;
    const std::uint8_t* in = blocks + b * kMxfp4BlockBytes;
    float* o = out + b * kMxfp4BlockElements;
    for (std::int64_t j = 0; j < kMxfp4BlockBytes; ++j) {
      o[2 * j] = std::ldexp(kE2m1[in[j] & 0x0F], exponent);  // exact: two significant bits
      o[2 * j + 1] = std::ldexp(kE2m1[in[j] >> 4], exponent);
      if (!std::isfinite(o[2 * j]) || !std::isfinite(o[2 * j + 1]))
        throw InvalidArgument(what + ": block " + std::to_string(b) + " (scale " + std::to_string(s) +
                              ") dequantizes past f32's range");
    }
  }
}

bool has_mxfp4(const SafeTensorsFile& file, std::string_view weight) {
  return file.contains(std::string(weight) + "_blocks") || file.contains(std::string(weight) + "_scales");
}

Mxfp4Weight read_mxfp4(const SafeTensorsFile& file, std::string_view weight, std::int64_t first, std::int64_t last) {
  const std::string bn = std::string(weight) + "_blocks", sn = std::string(weight) + "_scales";
  const std::string where = file.path() + ": " + std::string(weight);
  if (!file.contains(bn) || !file.contains(sn))
    throw InvalidArgument(where + ": an MXFP4 weight needs both " + bn + " and " + sn + "; " +
                          (file.contains(bn) ? sn : bn) + " is missing");
  const SafeTensorInfo &b = file.info(bn), &s = file.info(sn);
  if (b.dtype != "U8" || s.dtype != "U8")
    throw InvalidArgument(where + ": MXFP4 blocks and scales are U8, not " + b.dtype + " and " + s.dtype);
  const bool shaped = b.shape.size() == 4 && s.shape.size() == 3 && b.shape[3] == kMxfp4BlockBytes &&
                      std::equal(s.shape.begin(), s.shape.end(), b.shape.begin());
  if (!shaped)
    throw InvalidArgument(where + ": MXFP4 blocks " + shape_text(b.shape) + " and scales " + shape_text(s.shape) +
                          " do not match [E, N, G, 16] and [E, N, G]");
  const std::int64_t E = b.shape[0], N = b.shape[1], G = b.shape[2], K = G * kMxfp4BlockElements;
  if (last < 0) last = E;
  if (first < 0 || first > last || last > E)
    throw InvalidArgument(where + ": experts [" + std::to_string(first) + ", " + std::to_string(last) +
                          ") are not within its " + std::to_string(E));
  const auto* blocks = reinterpret_cast<const std::uint8_t*>(file.bytes(bn).data());
  const auto* scales = reinterpret_cast<const std::uint8_t*>(file.bytes(sn).data());
  Mxfp4Weight w;
  w.shape = {last - first, K, N};
  w.values.resize(static_cast<std::size_t>((last - first) * K * N));
  std::vector<float> rows(static_cast<std::size_t>(N * K));  // one expert's [N, K]
  for (std::int64_t e = first; e < last; ++e) {
    dequantize_mxfp4_rows(blocks + e * N * G * kMxfp4BlockBytes, scales + e * N * G, N, G, rows.data(),
                          where + " (expert " + std::to_string(e) + ")");
    float* dst = w.values.data() + (e - first) * K * N;  // [K, N]: the transpose
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) dst[k * N + n] = rows[static_cast<std::size_t>(n * K + k)];
  }
  return w;
}

}  // namespace peakbound
