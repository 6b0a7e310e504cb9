#include "peakbound/bench/gemm_rate.h"

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

}  // namespace

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
  if (path == "native") {
    ops::set_bf16_gemm_path("convert");
    try {
      out.push_back(bf16_rate("convert"));
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
