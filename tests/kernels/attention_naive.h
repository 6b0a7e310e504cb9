// The textbook causal GQA attention in double, the reference of the CPU attention's
// tests (attention_test.cc for f32, attention_bf16_test.cc for bf16 on widened inputs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "peakbound/kernels/attention_dims.h"

namespace peakbound::testing {

struct NaiveAttention {
  std::vector<float> out, lse, dq, dk, dv;
};

// The first of two runs' five outputs (out, lse, dq, dk, dv: fields of R, each a
// std::vector<float>) whose bits differ, or "" when all five are the same bits: the
// bitwise checks of attention_test.cc and attention_bf16_test.cc.
template <class R>
std::string first_differing_output(const R& x, const R& y) {
  const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>> fields[] = {
      {"out", {&x.out, &y.out}}, {"lse", {&x.lse, &y.lse}}, {"dq", {&x.dq, &y.dq}},
      {"dk", {&x.dk, &y.dk}},    {"dv", {&x.dv, &y.dv}}};
  for (const auto& [name, pair] : fields) {
    const std::vector<float>&a = *pair.first, &b = *pair.second;
    if (a.size() != b.size() || (!a.empty() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0))
      return name;
  }
  return "";
}

// The textbook attention in double: full score rows with the causal (and window) mask
// at the global positions (q_offset + i, k_offset + j), a two-pass softmax, then the
// gradients through P. A row that sees no key: out 0, lse -inf, no gradient.
inline NaiveAttention naive_attention(const AttentionDims& a, const std::vector<float>& q,
                                      const std::vector<float>& k, const std::vector<float>& v,
                                      const std::vector<float>& dout) {
  const std::int64_t T = a.tokens, Tk = a.key_tokens(), Hq = a.q_heads, Hkv = a.kv_heads, D = a.qk_dim, Dv = a.v_dim;
  const double scale = a.effective_scale();
  std::vector<double> out(T * Hq * Dv, 0.0), lse(T * Hq), dq(T * Hq * D, 0.0), dk(Tk * Hkv * D, 0.0),
      dv(Tk * Hkv * Dv, 0.0);
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t g = h / (Hq / Hkv);
    for (std::int64_t i = 0; i < T; ++i) {
      std::vector<double> s(Tk, 0.0), p(Tk, 0.0), dp(Tk, 0.0);
      double m = -1e300;
      auto vis = [&](std::int64_t j) {
        const std::int64_t qi = a.q_offset + i, kj = a.k_offset + j;
        return kj <= qi && (a.window == 0 || kj > qi - a.window);
      };
      bool any = false;
      for (std::int64_t j = 0; j < Tk; ++j) any = any || vis(j);
      if (!any) {
        lse[i * Hq + h] = -std::numeric_limits<double>::infinity();
        continue;
      }
      for (std::int64_t j = 0; j < Tk; ++j) {
        if (!vis(j)) continue;
        double x = 0;
        for (std::int64_t d = 0; d < D; ++d) x += double(q[(i * Hq + h) * D + d]) * k[(j * Hkv + g) * D + d];
        s[j] = scale * x;
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (std::int64_t j = 0; j < Tk; ++j)
        if (vis(j)) sum += std::exp(s[j] - m);
      lse[i * Hq + h] = m + std::log(sum);
      double di = 0;
      for (std::int64_t j = 0; j < Tk; ++j) {
        if (!vis(j)) continue;
        p[j] = std::exp(s[j] - lse[i * Hq + h]);
        for (std::int64_t d = 0; d < Dv; ++d) {
          out[(i * Hq + h) * Dv + d] += p[j] * v[(j * Hkv + g) * Dv + d];
          dp[j] += double(dout[(i * Hq + h) * Dv + d]) * v[(j * Hkv + g) * Dv + d];
          dv[(j * Hkv + g) * Dv + d] += p[j] * dout[(i * Hq + h) * Dv + d];
        }
        di += p[j] * dp[j];
      }
      for (std::int64_t j = 0; j < Tk; ++j) {
        if (!vis(j)) continue;
        const double ds = p[j] * (dp[j] - di) * scale;
        for (std::int64_t d = 0; d < D; ++d) {
          dq[(i * Hq + h) * D + d] += ds * k[(j * Hkv + g) * D + d];
          dk[(j * Hkv + g) * D + d] += ds * q[(i * Hq + h) * D + d];
        }
      }
    }
  }
  auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  return {f(out), f(lse), f(dq), f(dk), f(dv)};
}

}  // namespace peakbound::testing
