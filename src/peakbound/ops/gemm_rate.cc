#include "peakbound/ops/gemm_rate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "peakbound/core/buffer.h"
#include "peakbound/core/component.h"
#include "peakbound/core/dtype.h"
#include "peakbound/core/stopwatch.h"
#include "peakbound/device/device.h"
#include "peakbound/ops/gemm.h"

namespace peakbound {

namespace {

// Median, min and max of `repeats` timed calls of fn (after one untimed), as flop rates.
GemmRate time_rate(Device& dev, const std::function<void()>& fn, double flops, int repeats) {
  fn();
  dev.synchronize(dev.compute_stream());
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    fn();
    dev.synchronize(dev.compute_stream());
    rates.push_back(flops / std::max(sw.seconds(), 1e-9));
  }
  std::sort(rates.begin(), rates.end());
  GemmRate g;
  g.flops_per_second = rates[rates.size() / 2];
  g.min_flops_per_second = rates.front();
  g.max_flops_per_second = rates.back();
  return g;
}

// The median rate of `repeats` runs of fn, each repeating it until about 5 ms have passed.
double median_rate(Device& dev, const std::function<void()>& fn, double flops, int repeats) {
  fn();
  dev.synchronize(dev.compute_stream());
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    Stopwatch sw;
    std::int64_t calls = 0;
    do {
      fn();
      ++calls;
      if (calls % 8 == 0 || flops * static_cast<double>(calls) > 1e8) dev.synchronize(dev.compute_stream());
    } while (sw.seconds() < 5e-3);
    dev.synchronize(dev.compute_stream());
    rates.push_back(flops * static_cast<double>(calls) / std::max(sw.seconds(), 1e-9));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

std::vector<GemmShape> trainer_gemm_shapes() {
  return {
      {"attn QK^T 64x64 D32", false, true, 64, 64, 32},
      {"attn QK^T 128x128 D32", false, true, 128, 128, 32},
      {"attn PV 128x128 D32", false, false, 128, 32, 128},
      {"expert up m32", false, true, 32, 512, 256},
      {"expert up m128", false, true, 128, 512, 256},
      {"expert down m128", false, true, 128, 256, 512},
      {"expert dX m128", false, false, 128, 256, 512},
      {"proj T128 256x256", false, true, 128, 256, 256},
      {"proj T512 qkv 256x384", false, true, 512, 384, 256},
      {"proj T512 256x1024", false, true, 512, 1024, 256},
      {"proj dX T512 1024->256", false, false, 512, 256, 1024},
      {"proj dW 256x256 over T512", true, false, 256, 256, 512},
      {"vocab 256x2048 (P 8)", false, true, 256, 2048, 256},
      {"vocab 256x16384 (P 1)", false, true, 256, 16384, 256},
  };
}

std::vector<GemmShapeRate> measure_gemm_shape_rates(std::string_view device_kind, const std::vector<GemmShape>& shapes,
                                                    int repeats) {
  std::uint64_t most = 1;
  for (const GemmShape& g : shapes)
    most = std::max({most, static_cast<std::uint64_t>(g.m * g.k), static_cast<std::uint64_t>(g.k * g.n),
                     static_cast<std::uint64_t>(g.m * g.n)});
  auto dev = make_device(device_kind, 3 * most * sizeof(float) + 2 * most * sizeof(bf16) + (1u << 20));
  Buffer a = dev->allocate(Component::workspace, most * sizeof(float));
  Buffer b = dev->allocate(Component::workspace, most * sizeof(float));
  Buffer c = dev->allocate(Component::workspace, most * sizeof(float));
  Buffer ah = dev->allocate(Component::workspace, most * sizeof(bf16));
  Buffer bh = dev->allocate(Component::workspace, most * sizeof(bf16));
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> d;
    std::vector<float> host(most);
    std::vector<bf16> half(most);
    for (float& x : host) x = d(rng);
    for (std::size_t i = 0; i < host.size(); ++i) half[i] = to_bf16(host[i]);
    for (Buffer* buf : {&a, &b}) copy_to_device(*dev, buf->data(), host.data(), most * sizeof(float));
    for (Buffer* buf : {&ah, &bh}) copy_to_device(*dev, buf->data(), half.data(), most * sizeof(bf16));
  }
  Stream& s = dev->compute_stream();
  const auto* af = static_cast<const float*>(a.data());
  const auto* bf = static_cast<const float*>(b.data());
  const auto* ab = static_cast<const bf16*>(ah.data());
  const auto* bb = static_cast<const bf16*>(bh.data());
  auto* cf = static_cast<float*>(c.data());
  const std::string before = ops::bf16_gemm_path();
  std::vector<GemmShapeRate> out;
  for (const GemmShape& g : shapes) {
    const std::int64_t lda = g.trans_a ? g.m : g.k, ldb = g.trans_b ? g.k : g.n;
    const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
    GemmShapeRate r{g};
    auto bf16_rate = [&](const char* path) {
      ops::set_bf16_gemm_path(path);
      return median_rate(*dev, [&] {
        ops::gemm_bf16(*dev, s, g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, ab, lda, bb, ldb, 0.0f, cf, g.n);
      }, flops, repeats);
    };
    // native first, after OpenBLAS's spinning workers (see measure_gemm_rates) have slept.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    try {
      // The tiled paths where the process runs one (as measure_gemm_rates: the op layer
      // chose it): amx and native where it runs amx, native where it runs native.
      if (dev->backend() == Backend::cpu && before == "amx") r.amx = bf16_rate("amx");
      if (dev->backend() == Backend::cpu && (before == "amx" || before == "native")) r.native = bf16_rate("native");
      r.convert = bf16_rate("convert");
    } catch (...) {
      ops::set_bf16_gemm_path(before);
      throw;
    }
    ops::set_bf16_gemm_path(before);
    r.f32 = median_rate(*dev, [&] {
      ops::gemm(*dev, s, g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, af, lda, bf, ldb, 0.0f, cf, g.n);
    }, flops, repeats);
    out.push_back(r);
  }
  return out;
}

nlohmann::json gemm_shape_rates_json(const std::vector<GemmShapeRate>& rates) {
  nlohmann::json j = nlohmann::json::array();
  for (const GemmShapeRate& r : rates)
    j.push_back({{"name", r.shape.name}, {"trans_a", r.shape.trans_a}, {"trans_b", r.shape.trans_b},
                 {"m", r.shape.m}, {"n", r.shape.n}, {"k", r.shape.k}, {"f32_flops_per_second", r.f32},
                 {"native_flops_per_second", r.native}, {"convert_flops_per_second", r.convert},
                 {"amx_flops_per_second", r.amx}});
  return j;
}

std::vector<GemmRate> measure_gemm_rates(std::string_view device_kind, std::int64_t size, int repeats) {
  const auto n = static_cast<std::uint64_t>(size);
  const std::uint64_t f32_bytes = n * n * sizeof(float), bf16_bytes = n * n * sizeof(bf16);
  auto dev = make_device(device_kind, 3 * f32_bytes + 2 * bf16_bytes + (1u << 20));
  Buffer a = dev->allocate(Component::workspace, f32_bytes), b = dev->allocate(Component::workspace, f32_bytes);
  Buffer c = dev->allocate(Component::workspace, f32_bytes);
  Buffer ah = dev->allocate(Component::workspace, bf16_bytes), bh = dev->allocate(Component::workspace, bf16_bytes);
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> d;
    std::vector<float> host(n * n);
    std::vector<bf16> half(n * n);
    for (float& x : host) x = d(rng);
    for (std::size_t i = 0; i < host.size(); ++i) half[i] = to_bf16(host[i]);
    for (Buffer* buf : {&a, &b}) copy_to_device(*dev, buf->data(), host.data(), f32_bytes);
    for (Buffer* buf : {&ah, &bh}) copy_to_device(*dev, buf->data(), half.data(), bf16_bytes);
  }
  Stream& s = dev->compute_stream();
  const double flops = 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size);
  const bool cpu = dev->backend() == Backend::cpu;
  std::vector<GemmRate> out;
  GemmRate f = time_rate(*dev, [&] {
    ops::gemm(*dev, s, false, false, size, size, size, 1.0f, static_cast<const float*>(a.data()), size,
              static_cast<const float*>(b.data()), size, 0.0f, static_cast<float*>(c.data()), size);
  }, flops, repeats);
  f.precision = "f32", f.path = cpu ? "openblas sgemm" : "cublas";
  out.push_back(f);
  auto bf16_rate = [&](const std::string& path) {
    GemmRate g = time_rate(*dev, [&] {
      ops::gemm_bf16(*dev, s, false, false, size, size, size, 1.0f, static_cast<const bf16*>(ah.data()), size,
                     static_cast<const bf16*>(bh.data()), size, 0.0f, static_cast<float*>(c.data()), size);
    }, flops, repeats);
    g.precision = "bf16", g.path = path;
    return g;
  };
  if (!cpu) {
    out.push_back(bf16_rate("cublas"));
    return out;
  }
  // OpenBLAS's idle workers spin (sched_yield) for ~2^28 cycles after an sgemm before
  // they sleep; on a machine with as many cores as BLAS threads they would share the
  // cores with the bf16 GEMM's threads. Each precision is measured on its own cores.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string path = ops::bf16_gemm_path();
  out.push_back(bf16_rate(path));
  // The CPU paths after the process's own: native and convert where it runs amx, convert
  // where it runs native.
  const std::vector<const char*> others = path == "amx"      ? std::vector<const char*>{"native", "convert"}
                                          : path == "native" ? std::vector<const char*>{"convert"}
                                                             : std::vector<const char*>{};
  for (const char* other : others) {
    ops::set_bf16_gemm_path(other);
    try {
      out.push_back(bf16_rate(other));
    } catch (...) {
      ops::set_bf16_gemm_path(path);
      throw;
    }
    ops::set_bf16_gemm_path(path);
  }
  return out;
}

nlohmann::json gemm_rates_json(const std::vector<GemmRate>& rates, std::int64_t size, int repeats) {
  nlohmann::json j = {{"size", size}, {"repeats", repeats}, {"rates", nlohmann::json::array()}};
  double peak = 0;
  for (std::size_t i = 0; i < rates.size(); ++i) {
    const GemmRate& r = rates[i];
    j["rates"].push_back({{"precision", r.precision}, {"path", r.path}, {"flops_per_second", r.flops_per_second},
                          {"min_flops_per_second", r.min_flops_per_second},
                          {"max_flops_per_second", r.max_flops_per_second}});
    peak = std::max(peak, r.flops_per_second);
  }
  // The first rate of each precision is the one runs use (the process's path).
  for (const char* p : {"f32", "bf16"}) {
    auto it = std::find_if(rates.begin(), rates.end(), [&](const GemmRate& r) { return r.precision == p; });
    if (it == rates.end()) continue;
    j[std::string(p) + "_flops_per_second"] = it->flops_per_second;
    if (std::string(p) == "bf16") j["bf16_path"] = it->path;
  }
  j["gemm_peak_flops_per_second"] = peak;
  return j;
}

std::string gemm_rates_line(const std::vector<GemmRate>& rates) {
  std::string line;
  std::string last;
  for (const GemmRate& r : rates) {
    char buf[96];
    if (r.precision == last) {
      std::snprintf(buf, sizeof buf, ", %.1f (%s)", r.flops_per_second / 1e9, r.path.c_str());
    } else {
      std::snprintf(buf, sizeof buf, "%s%s %.1f GFLOP/s (%s)", line.empty() ? "" : "; ", r.precision.c_str(),
                    r.flops_per_second / 1e9, r.path.c_str());
    }
    line += buf;
    last = r.precision;
  }
  return line;
}

}  // namespace peakbound
