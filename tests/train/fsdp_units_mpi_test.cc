// FsdpUnits under bf16: the parameter shard and every gather are bf16 and move the bits
// as they are (a bf16 gather is bitwise to_bf16 of the f32 gather of the same values, and
// both equal the values each rank wrote), while gradients stay f32: reduce_add into a bf16
// unit set is bitwise the f32 one's, accumulating across calls. The specs give the bf16
// parameters 2 bytes an element, everything else 4 (f32 unchanged), and the Arena
// measures exactly them. At every world size the mpi tests run (1-4 ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "peakbound/core/dtype.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/model/tensor_table.h"
#include "peakbound/ops/host_convert.h"
#include "peakbound/train/fsdp_units.h"
#include "tests/comm/world.h"
#include "tests/train/test_models.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t MiB = 1024 * 1024;

// A value for element i of unit u (as if written whole), not a bf16 value, so rounding shows.
float param_value(std::size_t u, std::uint64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(u)) * 0.71f + 1e-3f;
}
// Rank r's gradient for element i of unit u.
float grad_value(int r, std::size_t u, std::uint64_t i) {
  return std::cos(0.11f * static_cast<float>(i) + 0.7f * static_cast<float>(r) + static_cast<float>(u)) * 0.3f;
}

// Writes unit u's shard of param_value into the shard (f32 as is, bf16 rounded on the host).
void fill_shards(FsdpUnits& f) {
  const auto rank = static_cast<std::uint64_t>(f.group().rank());
  for (std::size_t u = 0; u < f.size(); ++u) {
    const std::uint64_t len = f.shard_len(u);
    std::vector<float> v(len);
    for (std::uint64_t i = 0; i < len; ++i) v[i] = param_value(u, rank * len + i);
    if (f.param_dtype() == DType::f32) {
      std::copy(v.begin(), v.end(), f.params_shard_as<float>() + f.shard_offset(u));
    } else {
      ops::host_to_bf16(f.params_shard_as<bf16>() + f.shard_offset(u), v.data(), static_cast<std::int64_t>(len));
    }
  }
}

template <class Fn> std::string internal_error(Fn&& fn) {
  try {
    fn();
  } catch (const InternalError& e) {
    return e.what();
  }
  return "no error";
}

TEST(FsdpUnitsBf16, GatherMovesBf16BitsAndSpecsHalveOnlyTheParameters) {
  Communicator& world = testing::world();
  const TensorTable table(testing::small_train_config("fsdp-bf16"));
  const FsdpBuffers b32 = fsdp_buffers(table, world.size());
  const FsdpBuffers b16 = fsdp_buffers(table, world.size(), Precision::bf16);
  const FsdpBuffers d32 = fsdp_buffers(table, world.size(), Precision::f32);
  using Specs = std::vector<std::tuple<BufferSpec, BufferSpec, BufferSpec>>;  // f32, bf16, f32 by Precision
  const Specs params = {{b32.params_shard, b16.params_shard, d32.params_shard},
                        {b32.layer_params, b16.layer_params, d32.layer_params},
                        {b32.embed_params, b16.embed_params, d32.embed_params},
                        {b32.norm_params, b16.norm_params, d32.norm_params}};
  const Specs grads = {{b32.grads_shard, b16.grads_shard, d32.grads_shard},
                       {b32.scratch, b16.scratch, d32.scratch},
                       {b32.layer_grads, b16.layer_grads, d32.layer_grads},
                       {b32.embed_grads, b16.embed_grads, d32.embed_grads},
                       {b32.norm_grads, b16.norm_grads, d32.norm_grads}};
  for (const auto& [s32, s16, sd] : params) {
    EXPECT_GT(s32.bytes, 0u);
    EXPECT_EQ(s16.bytes * 2, s32.bytes);
    EXPECT_EQ(s16.component, s32.component);
    EXPECT_EQ(sd.bytes, s32.bytes);
  }
  for (const auto& [s32, s16, sd] : grads) {
    EXPECT_EQ(s16.bytes, s32.bytes);
    EXPECT_EQ(sd.bytes, s32.bytes);
  }

  CpuDevice dev32(16 * MiB), dev16(16 * MiB);
  FsdpUnits f32(dev32, table, world);
  FsdpUnits f16(dev16, table, world, Precision::bf16);
  // Persistent allocations: exactly the specs.
  EXPECT_EQ(dev16.arena().peak(Component::params), b16.params_shard.reserved());
  EXPECT_EQ(dev16.arena().peak(Component::grads), b16.grads_shard.reserved());
  EXPECT_EQ(dev16.arena().peak(Component::comm), b16.scratch.reserved());
  EXPECT_EQ(dev32.arena().peak(Component::params), b32.params_shard.reserved());
  EXPECT_EQ(f16.param_dtype(), DType::bf16);
  EXPECT_EQ(f32.param_dtype(), DType::f32);
  const auto* zero = f16.params_shard_as<bf16>();
  for (std::uint64_t i = 0; i < f16.shard_elements(); ++i) ASSERT_EQ(zero[i].bits, 0u) << i;

  fill_shards(f32);
  fill_shards(f16);
  std::size_t rounded = 0;
  for (std::size_t u = 0; u < f32.size(); ++u) {
    const std::uint64_t n = f32.layout(u).elements;
    std::vector<float> g32(n);
    std::vector<bf16> g16(n);
    f32.gather(u, g32.data());
    f16.gather(u, static_cast<void*>(g16.data()));
    for (std::uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(float_bits(g32[i]), float_bits(param_value(u, i))) << "unit " << u << " element " << i;
      ASSERT_EQ(g16[i].bits, to_bf16(g32[i]).bits) << "unit " << u << " element " << i;
      rounded += to_f32(g16[i]) != g32[i];
    }
  }
  EXPECT_GT(rounded, 0u);

  // The f32 accessors refuse a bf16 shard, in one line; the bf16 ones an f32 shard.
  std::vector<float> slot(f16.layout(0).elements);
  for (const std::string& m : {internal_error([&] { f16.params_shard(); }),
                               internal_error([&] { f16.gather(0, slot.data()); })}) {
    EXPECT_NE(m.find("fsdp: asked for f32 parameters, but the shard holds bf16 ones"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_NE(internal_error([&] { f32.params_shard_as<bf16>(); }).find("asked for bf16 parameters"),
            std::string::npos);
  EXPECT_EQ(f32.params_shard_raw(), static_cast<void*>(f32.params_shard()));

  // The pending fp32 master: this rank's shard, shard_elements() long, taken once.
  EXPECT_FALSE(f16.has_pending_master());
  std::vector<float> master(f16.shard_elements(), 0.5f);
  f16.set_pending_master(master);
  EXPECT_EQ(f16.take_pending_master(), master);
  EXPECT_TRUE(f16.take_pending_master().empty());
  EXPECT_NE(internal_error([&] { f16.set_pending_master(std::vector<float>(f16.shard_elements() + 1)); })
                .find("fsdp: a pending master of"),
            std::string::npos);
}

// Gradients are f32 in both precisions: reduce_add (reduce-scatter in f32, then an f32 add
// into the shard) leaves bitwise the same shard and gathered gradients, twice in a row.
TEST(FsdpUnitsBf16, ReduceAddStaysF32AndMatchesTheF32UnitsBitwise) {
  Communicator& world = testing::world();
  const TensorTable table(testing::small_train_config("fsdp-bf16"));
  CpuDevice dev32(16 * MiB), dev16(16 * MiB);
  FsdpUnits f32(dev32, table, world);
  FsdpUnits f16(dev16, table, world, Precision::bf16);
  for (int round = 0; round < 2; ++round) {
    for (std::size_t u = 0; u < f32.size(); ++u) {
      std::vector<float> full(f32.layout(u).elements);
      for (std::uint64_t i = 0; i < full.size(); ++i) full[i] = grad_value(world.rank() + round, u, i);
      f32.reduce_add(u, full.data());
      f16.reduce_add(u, full.data());
    }
  }
  for (std::uint64_t i = 0; i < f32.shard_elements(); ++i)
    ASSERT_EQ(float_bits(f16.grads_shard()[i]), float_bits(f32.grads_shard()[i])) << i;
  const int G = world.size();
  double worst = 0;
  for (std::size_t u = 0; u < f32.size(); ++u) {
    const std::uint64_t n = f32.layout(u).elements;
    std::vector<float> a(n), b(n);
    f32.gather_grads(u, a.data());
    f16.gather_grads(u, b.data());
    for (std::uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(float_bits(a[i]), float_bits(b[i])) << "unit " << u << " element " << i;
      double want = 0;  // the sum over ranks and both rounds, in double
      for (int round = 0; round < 2; ++round)
        for (int r = 0; r < G; ++r) want += grad_value(r + round, u, i);
      worst = std::max(worst, std::fabs(static_cast<double>(b[i]) - want));
    }
  }
  EXPECT_LT(worst, 1e-5);  // f32 sums of 2G terms of magnitude <= 0.3 (a bf16 sum would miss by ~1e-3)
  f16.zero_grads();
  dev16.synchronize();
  for (std::uint64_t i = 0; i < f16.shard_elements(); ++i) ASSERT_EQ(f16.grads_shard()[i], 0.0f) << i;
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
