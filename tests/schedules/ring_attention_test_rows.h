// Helpers of the context-parallel attention tests (ring and Ulysses): a rank's zigzag rows
// of a whole-sequence tensor, a device buffer holding a host vector, a test shape and its
// name, bf16 rounding, and the single-rank bf16 kernel's five results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/attention.h"
#include "peakbound/ops/elementwise.h"
#include "peakbound/schedules/context_layout.h"
#include "peakbound/verify/attention_reference.h"
#include "tests/comm/world.h"

namespace peakbound::testing {

// Rows of a [S, w] tensor at this rank's shard positions, in shard order.
template <class T>
std::vector<T> shard_rows(const std::vector<T>& x, std::int64_t w, const CpShard& sh) {
  std::vector<T> y(static_cast<std::size_t>(sh.tokens() * w));
  for (std::int64_t t = 0; t < sh.tokens(); ++t) std::copy_n(x.begin() + sh.position(t) * w, w, y.begin() + t * w);
  return y;
}

// Device buffer holding v (the CPU device's memory is the host's), under component layer.
template <class T>
Buffer upload(Device& dev, const std::vector<T>& v) {
  Buffer b = dev.allocate(Component::layer, std::max<std::size_t>(v.size() * sizeof(T), 4));
  std::copy(v.begin(), v.end(), b.as<T>());
  return b;
}

// One attention problem's shape: S tokens, heads, dims, window and tiles.
struct AttentionShape {
  std::int64_t S, hq, hkv, d, dv, window, bq, bk;
  AttentionDims dims() const {
    AttentionDims a;
    a.tokens = S;
    a.q_heads = hq;
    a.kv_heads = hkv;
    a.qk_dim = d;
    a.v_dim = dv;
    a.window = window;
    a.block_q = bq;
    a.block_k = bk;
    return a;
  }
};
inline std::string shape_name(const AttentionShape& s, int cp) {
  return "CP=" + std::to_string(cp) + " S=" + std::to_string(s.S) + " Hq=" + std::to_string(s.hq) +
         " Hkv=" + std::to_string(s.hkv) + " D=" + std::to_string(s.d) + " Dv=" + std::to_string(s.dv) +
         " W=" + std::to_string(s.window) + " Bq=" + std::to_string(s.bq) + " Bk=" + std::to_string(s.bk);
}

inline std::vector<bf16> narrow(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
inline std::vector<float> host(const Buffer& b, std::int64_t n) { return {b.as<float>(), b.as<float>() + n}; }

// The five results (out, lse, dq, dk, dv) of the whole sequence on one rank in bf16 (the
// forward's fp32 out narrowed once for the backward, as the attention layer does).
inline std::vector<std::vector<float>> single_rank_bf16(const AttentionDims& a, const std::vector<bf16>& q,
                                                        const std::vector<bf16>& k, const std::vector<bf16>& v,
                                                        const std::vector<bf16>& dout) {
  CpuDevice dev(64ull << 20);
  Stream& s = dev.compute_stream();
  const std::int64_t S = a.tokens;
  Buffer bq = upload(dev, q), bk = upload(dev, k), bv = upload(dev, v), bd = upload(dev, dout);
  std::vector<float> zeros(static_cast<std::size_t>(S * std::max<std::int64_t>(a.q_heads * std::max(a.qk_dim, a.v_dim), 1)), 0.0f);
  Buffer out = upload(dev, zeros), lse = upload(dev, zeros), dq = upload(dev, zeros), dk = upload(dev, zeros),
         dv = upload(dev, zeros);
  Buffer ws = upload(dev, std::vector<float>(static_cast<std::size_t>(attention_workspace_floats(a, DType::bf16))));
  ops::attention_forward(dev, s, out.as<float>(), lse.as<float>(), bq.as<bf16>(), bk.as<bf16>(), bv.as<bf16>(), a,
                         ws.as<float>());
  Buffer out16 = upload(dev, std::vector<bf16>(static_cast<std::size_t>(S * a.q_heads * a.v_dim)));
  ops::convert(dev, s, out16.as<bf16>(), out.as<float>(), S * a.q_heads * a.v_dim);
  ops::attention_backward(dev, s, dq.as<float>(), dk.as<float>(), dv.as<float>(), bd.as<bf16>(), bq.as<bf16>(),
                          bk.as<bf16>(), bv.as<bf16>(), out16.as<bf16>(), lse.as<float>(), a, ws.as<float>());
  dev.synchronize();
  return {host(out, S * a.q_heads * a.v_dim), host(lse, S * a.q_heads), host(dq, S * a.q_heads * a.qk_dim),
          host(dk, S * a.kv_heads * a.qk_dim), host(dv, S * a.kv_heads * a.v_dim)};
}

// Every CP dividing the world, as groups of consecutive ranks (from `first` up): f(group).
template <class F>
void each_group(F&& f, int first = 1) {
  Communicator& w = world();
  for (int cp = first; cp <= w.size(); ++cp) {
    if (w.size() % cp != 0) continue;
    std::unique_ptr<Communicator> g = w.split(w.rank() / cp, w.rank());
    ASSERT_EQ(g->size(), cp);
    f(*g);
  }
}

// One verify_ring_attention check: every field within 1e-5 of the naive reference and of
// the single-rank kernel, the calls' attention peaks those of the footprint, nothing live.
inline void expect_exact_and_footprint(const RingAttentionCheck& c, const Footprint& fp, Device& dev) {
  for (int f = 0; f < 5; ++f) {
    EXPECT_LT(c.naive[f], 1e-5) << kAttentionFields[f] << " vs naive double";
    EXPECT_LT(c.kernel[f], 1e-5) << kAttentionFields[f] << " vs the single-rank kernel";
  }
  EXPECT_EQ(c.forward_peak, fp.phase("forward").device[static_cast<std::size_t>(Component::attention)]);
  EXPECT_EQ(c.backward_peak, fp.phase("backward").device[static_cast<std::size_t>(Component::attention)]);
  EXPECT_EQ(dev.arena().live(), 0u) << "every buffer released";
}

}  // namespace peakbound::testing
