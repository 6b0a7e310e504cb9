// ParameterStore: one params and one grads allocation laid out from the TensorTable,
// measured Arena peaks equal to the footprint, aligned views in checkpoint order,
// expert-parallel selection (per-expert and fused), and one-line errors.
#include "peakbound/train/parameter_store.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/model/hf_config.h"
#include "peakbound/model/presets.h"
#include "peakbound/train/fsdp_units.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;
const std::string kFixtures = std::string(PEAKBOUND_SOURCE_DIR) + "/tests/fixtures/hf/";

// gpt-oss shrunk to test size: its experts are fused, one [E, ...] tensor per layer.
ModelConfig tiny_gpt_oss() {
  ModelConfig c = preset_config("gpt-oss-120b");
  c.name = "tiny-gpt-oss";
  c.vocab_size = 50;
  c.hidden_size = 12;
  c.num_layers = 2;
  c.num_experts = 8;
  c.top_k = 2;
  c.moe_intermediate_size = 6;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 3;
  c.set_sliding_layers([](std::int64_t i) { return i == 0; });
  return c;
}

TEST(ParameterStore, MeasuredPeaksEqualTheFootprintAndViewsFollowTheTable) {
  for (const char* family : {"qwen3_moe", "mixtral"}) {
    const TensorTable table(load_hf_config(kFixtures + family));
    for (std::int64_t ep : {1, 4}) {
      for (std::int64_t r = 0; r < ep; ++r) {
        const ShardSelector sel = expert_parallel(table, ep, r);
        const Footprint fp = parameter_store_footprint(table, sel, sizeof(float));
        CpuDevice dev(16 * MiB);
        {
          ParameterStore store(dev, table, sel);
          EXPECT_EQ(dev.arena().peak(Component::params), fp.device_peak(Component::params)) << family;
          EXPECT_EQ(dev.arena().peak(Component::grads), fp.device_peak(Component::grads)) << family;
          EXPECT_EQ(dev.arena().peak(), fp.device_peak_total()) << family;

          // Views: checkpoint order, aligned, disjoint, inside the buffers.
          std::size_t i = 0;
          std::uint64_t next = 0;
          std::int64_t numel = 0;
          std::set<std::int64_t> experts;
          table.for_each([&](const TensorEntry& e) {
            if (e.expert >= 0 && e.expert / (8 / ep) != r) return;
            ASSERT_LT(i, store.size());
            const ParameterView& v = store.views()[i++];
            EXPECT_EQ(v.name(), e.name);
            EXPECT_EQ(v.shape, e.shape);
            EXPECT_EQ(v.offset % kViewAlignElements, 0u);
            EXPECT_GE(v.offset, next);
            next = v.offset + static_cast<std::uint64_t>(v.numel());
            numel += v.numel();
            if (e.expert >= 0) experts.insert(e.expert);
            EXPECT_EQ(store.param(e.name), store.params_data() + v.offset);
            EXPECT_EQ(store.grad(e.name), store.grads_data() + v.offset);
            EXPECT_EQ(store.shape(e.name), e.shape);
          });
          EXPECT_EQ(i, store.size());
          EXPECT_LE(next, store.elements());
          EXPECT_EQ(store.numel(), numel);
          const std::set<std::int64_t> want =
              ep == 1 ? std::set<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7} : std::set<std::int64_t>{2 * r, 2 * r + 1};
          EXPECT_EQ(experts, want);
          if (ep == 1) {
            EXPECT_EQ(store.numel(), table.total_numel());
          }
        }
        EXPECT_EQ(dev.arena().live(), 0u);
      }
    }
  }
}

void expect_same_layout(const ParameterLayout& a, const ParameterLayout& b, const std::string& what) {
  ASSERT_EQ(a.elements, b.elements) << what;
  ASSERT_EQ(a.numel, b.numel) << what;
  ASSERT_EQ(a.views.size(), b.views.size()) << what;
  for (std::size_t i = 0; i < a.views.size(); ++i) {
    EXPECT_EQ(a.views[i].entry.name, b.views[i].entry.name) << what;
    EXPECT_EQ(a.views[i].offset, b.views[i].offset) << what << " " << a.views[i].entry.name;
    EXPECT_EQ(a.views[i].shape, b.views[i].shape) << what << " " << a.views[i].entry.name;
    EXPECT_EQ(a.views[i].rows.begin, b.views[i].rows.begin) << what;
    EXPECT_EQ(a.views[i].rows.end, b.views[i].rows.end) << what;
  }
}

// fsdp_unit_layouts builds every unit in one pass over the table, and train_footprint
// lays stores out over the materialized entries: both must be the layouts the model's
// own stores get (parameter_layout over the table with the unit's selector).
TEST(ParameterStore, OnePassAndEntryLayoutsEqualTheSelectorLayouts) {
  ModelConfig tiny = preset_config("tiny-moe");
  tiny.num_layers = 3;  // one dense layer, then MoE layers
  for (const ModelConfig& c : {tiny, tiny_gpt_oss()}) {
    const TensorTable table(c);
    const std::vector<TensorEntry> entries = table.entries();
    for (int G : {1, 3, 4}) {
      const std::vector<ParameterLayout> units = fsdp_unit_layouts(table, G);
      ASSERT_EQ(units.size(), static_cast<std::size_t>(c.num_layers) + 2);
      std::int64_t covered = 0;
      for (std::size_t u = 0; u < units.size(); ++u) {
        const std::string what = c.name + " G " + std::to_string(G) + " unit " + std::to_string(u);
        const ParameterLayout want = parameter_layout(table, fsdp_unit_selector(table, u), fsdp_layout_options(G));
        expect_same_layout(units[u], want, what);
        expect_same_layout(parameter_layout(entries, fsdp_unit_selector(table, u), fsdp_layout_options(G)), want,
                           what + " (entries)");
        EXPECT_GT(units[u].numel, 0) << what;
        for (const ParameterView& v : units[u].views) {  // 0 the embedding, 1 + l layer l, L + 1 the final norm
          if (u == 0) EXPECT_EQ(v.entry.kind, TensorKind::embedding) << what;
          else if (u == units.size() - 1) EXPECT_TRUE(v.entry.layer < 0 && v.entry.kind == TensorKind::norm) << what;
          else EXPECT_EQ(v.entry.layer, static_cast<std::int64_t>(u) - 1) << what << " " << v.entry.name;
        }
        covered += units[u].numel;
      }
      std::int64_t fsdp_numel = 0;  // every tensor but the experts and the head is in exactly one unit
      for (const TensorEntry& e : entries)
        if (e.kind != TensorKind::expert && e.kind != TensorKind::head) {
          std::int64_t n = 1;
          for (std::int64_t d : e.shape) n *= d;
          fsdp_numel += n;
        }
      EXPECT_EQ(covered, fsdp_numel) << c.name;
    }
    const ShardSelector experts = [](const TensorEntry& e) -> std::optional<RowRange> {
      if (e.kind != TensorKind::expert) return std::nullopt;
      return RowRange{0, e.shape[0]};
    };
    expect_same_layout(parameter_layout(entries, experts, LayoutOptions{1, 64}),
                       parameter_layout(table, experts, LayoutOptions{1, 64}), c.name + " experts");
  }
}

TEST(ParameterStore, ZeroGradsClearsTheWholeBufferAndPaddingStartsZero) {
  const TensorTable table(load_hf_config(kFixtures + std::string("mixtral")));
  CpuDevice dev(16 * MiB);
  ParameterStore store(dev, table);
  for (std::uint64_t i = 0; i < store.elements(); ++i) {
    ASSERT_EQ(store.params_data()[i], 0.0f);
    ASSERT_EQ(store.grads_data()[i], 0.0f);
  }
  for (std::uint64_t i = 0; i < store.elements(); ++i) store.grads_data()[i] = 1.0f + static_cast<float>(i);
  store.zero_grads();
  dev.synchronize();
  for (std::uint64_t i = 0; i < store.elements(); ++i) ASSERT_EQ(store.grads_data()[i], 0.0f) << i;
}

TEST(ParameterStore, FusedExpertsAreSlicedOnTheExpertDimension) {
  const TensorTable table(tiny_gpt_oss());
  ASSERT_TRUE(table.experts_fused());
  const ParameterLayout whole = parameter_layout(table, replicate_all());
  for (std::int64_t r = 0; r < 4; ++r) {
    const ParameterLayout part = parameter_layout(table, expert_parallel(table, 4, r));
    ASSERT_EQ(part.views.size(), whole.views.size());
    for (std::size_t i = 0; i < whole.views.size(); ++i) {
      const ParameterView& v = part.views[i];
      if (v.entry.kind == TensorKind::expert) {
        EXPECT_EQ(v.rows.begin, 2 * r) << v.name();
        EXPECT_EQ(v.rows.end, 2 * r + 2) << v.name();
        EXPECT_EQ(v.shape[0], 2) << v.name();
        EXPECT_EQ(v.numel() * 4, whole.views[i].numel()) << v.name();
      } else {
        EXPECT_EQ(v.shape, whole.views[i].shape) << v.name();
      }
    }
  }
}

TEST(ParameterStore, ErrorsAreOneLineAndNameTheProblem) {
  const TensorTable table(load_hf_config(kFixtures + std::string("qwen3_moe")));
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { expert_parallel(table, 3, 0); }).find("8 experts do not split evenly over ep 3"),
            std::string::npos);
  EXPECT_NE(message([&] { expert_parallel(table, 4, 4); }).find("ep_rank 4 is outside [0, 4)"), std::string::npos);
  EXPECT_NE(message([&] { expert_parallel(table, 0, 0); }).find("ep must be at least 1"), std::string::npos);
  const ShardSelector bad = [](const TensorEntry& e) -> std::optional<RowRange> {
    return RowRange{0, e.shape.empty() ? 2 : e.shape[0] + 1};
  };
  EXPECT_NE(message([&] { parameter_layout(table, bad); }).find("of 'model.embed_tokens.weight' are outside its 256 rows"),
            std::string::npos);
  CpuDevice dev(16 * MiB);
  ParameterStore store(dev, table, expert_parallel(table, 4, 1));
  const std::string m = message([&] { store.param("model.layers.0.mlp.experts.0.up_proj.weight"); });
  EXPECT_NE(m.find("no tensor 'model.layers.0.mlp.experts.0.up_proj.weight' on this rank"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos);
  EXPECT_FALSE(store.contains("model.layers.0.mlp.experts.0.up_proj.weight"));
  EXPECT_TRUE(store.contains("model.layers.0.mlp.experts.2.up_proj.weight"));
  // Too small a device: the params allocation fails with OutOfBudget naming it.
  CpuDevice small(64 * KiB);
  EXPECT_THROW(ParameterStore(small, table), OutOfBudget);
}

// The one-line InternalError a wrong-dtype parameter access throws ("no error" if none).
template <class Fn> std::string internal_error(Fn&& fn) {
  try {
    fn();
  } catch (const InternalError& e) {
    return e.what();
  }
  return "no error";
}

// Under bf16 the parameters are bf16 (2 bytes an element) and the gradients f32 (4): the
// specs say so, the Arena measures exactly them, both buffers start zero (padding too),
// the dtype-aware accessors address the same views, and the f32 accessors refuse.
TEST(ParameterStore, Bf16StoreHoldsBf16ParamsAndF32Grads) {
  const TensorTable table(load_hf_config(kFixtures + std::string("qwen3_moe")));
  for (std::int64_t ep : {1, 4}) {
    const ShardSelector sel = expert_parallel(table, ep, ep - 1);
    const ParameterLayout lay = parameter_layout(table, sel);
    const ParameterStoreBuffers b16 = parameter_store_buffers(lay, Precision::bf16);
    EXPECT_EQ(b16.params.bytes, lay.elements * 2);
    EXPECT_EQ(b16.grads.bytes, lay.elements * 4);
    EXPECT_EQ(b16.params.component, Component::params);
    EXPECT_EQ(b16.grads.component, Component::grads);
    const ParameterStoreBuffers split = parameter_store_buffers(lay, 2, 4);
    EXPECT_EQ(split.params.bytes, b16.params.bytes);
    EXPECT_EQ(split.grads.bytes, b16.grads.bytes);
    // f32 through the Precision form is the elem_bytes form, byte for byte.
    const ParameterStoreBuffers f32 = parameter_store_buffers(table, sel, Precision::f32);
    const ParameterStoreBuffers old = parameter_store_buffers(table, sel, sizeof(float));
    EXPECT_EQ(f32.params.bytes, old.params.bytes);
    EXPECT_EQ(f32.grads.bytes, old.grads.bytes);

    const Footprint fp = parameter_store_footprint(table, sel, Precision::bf16);
    CpuDevice dev(16 * MiB);
    {
      ParameterStore store(dev, table, sel, {}, Precision::bf16);
      EXPECT_EQ(store.precision(), Precision::bf16);
      EXPECT_EQ(store.param_dtype(), DType::bf16);
      EXPECT_EQ(dev.arena().peak(Component::params), fp.device_peak(Component::params));
      EXPECT_EQ(dev.arena().peak(Component::grads), fp.device_peak(Component::grads));
      EXPECT_EQ(dev.arena().peak(), fp.device_peak_total());
      EXPECT_EQ(fp.device_peak(Component::params), b16.params.reserved());

      const auto* p = static_cast<const bf16*>(store.params_raw());
      for (std::uint64_t i = 0; i < store.elements(); ++i) {
        ASSERT_EQ(p[i].bits, 0u) << i;
        ASSERT_EQ(store.grads_data()[i], 0.0f) << i;
      }
      for (const ParameterView& v : store) {
        EXPECT_EQ(store.param_as<bf16>(v), p + v.offset) << v.name();
        EXPECT_EQ(store.param_as<bf16>(v.name()), p + v.offset) << v.name();
        EXPECT_EQ(store.param_raw(v), static_cast<const void*>(p + v.offset)) << v.name();
        EXPECT_EQ(store.grad(v), store.grads_data() + v.offset) << v.name();
      }
      const ParameterView& v = store.views().back();
      for (const std::string& m : {internal_error([&] { store.param(v); }),
                                   internal_error([&] { store.param(v.name()); }),
                                   internal_error([&] { store.params_data(); }),
                                   internal_error([&] { store.param_as<float>(v); })}) {
        EXPECT_NE(m.find("asked for f32 parameters, but it holds bf16 ones"), std::string::npos) << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      }
    }
    EXPECT_EQ(dev.arena().live(), 0u);
  }
  // An f32 store: param_as<float> is param(); param_as<bf16> refuses.
  CpuDevice dev(16 * MiB);
  ParameterStore store(dev, table);
  EXPECT_EQ(store.param_dtype(), DType::f32);
  const ParameterView& v = store.views()[1];
  EXPECT_EQ(store.param_as<float>(v), store.param(v));
  EXPECT_EQ(store.param_raw(v), static_cast<void*>(store.param(v)));
  EXPECT_NE(internal_error([&] { store.param_as<bf16>(v); }).find("asked for bf16 parameters, but it holds f32 ones"),
            std::string::npos);
}

// The pending fp32 master: elements() values, taken once.
TEST(ParameterStore, PendingMasterIsTakenOnceAndMustCoverTheBuffer) {
  const TensorTable table(load_hf_config(kFixtures + std::string("mixtral")));
  CpuDevice dev(16 * MiB);
  ParameterStore store(dev, table, replicate_all(), {}, Precision::bf16);
  EXPECT_FALSE(store.has_pending_master());
  EXPECT_TRUE(store.take_pending_master().empty());
  std::vector<float> m(store.elements());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = 0.25f * static_cast<float>(i);
  store.set_pending_master(m);
  EXPECT_TRUE(store.has_pending_master());
  EXPECT_EQ(store.take_pending_master(), m);
  EXPECT_FALSE(store.has_pending_master());
  EXPECT_TRUE(store.take_pending_master().empty());
  const std::string e = internal_error([&] { store.set_pending_master(std::vector<float>(3)); });
  EXPECT_NE(e.find("a pending master of 3 values for a store of " + std::to_string(store.elements()) + " elements"),
            std::string::npos) << e;
  EXPECT_FALSE(store.has_pending_master());
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
