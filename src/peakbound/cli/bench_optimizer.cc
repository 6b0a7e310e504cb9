// `peakbound bench optimizer`: the AdamW step under its three schedules (device,
// offload_serial, offload_stream) on the same state and gradients, with the memory
// bandwidth measured in the same run; prints one JSON object (see
// schedules/optimizer_bench.h and docs/offload_stream_adamw.md for the fields).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "peakbound/cli/command.h"
#include "peakbound/cli/flags.h"
#include "peakbound/core/error.h"
#include "peakbound/core/units.h"
#include "peakbound/bench/optimizer_bench.h"

namespace peakbound::cli {

namespace {

// Defaults: the optimizer's knobs from OptimizerOptions{} (through
// OptimizerBenchOptions); params, warmup, steps and the bandwidth working set are the
// bench's own sizes (--help says so).
struct Flags {
  std::string params = "64M";
  std::string bucket_bytes = std::to_string(OptimizerBenchOptions{}.bucket_bytes);
  int threads = OptimizerBenchOptions{}.threads;
  std::string param_dtype = "bf16", grad_dtype = "bf16";
  std::string simd = "auto";
  float max_grad_norm = OptimizerBenchOptions{}.max_grad_norm;
  int warmup = 2, steps = 10;
  std::string schedules = "all";
  std::string bandwidth_bytes = "512MiB";
  std::string device = OptimizerBenchOptions{}.device;
  bool json = false;
};

OptimizerBenchOptions to_options(const Flags& f) {
  OptimizerBenchOptions o;
  o.params = static_cast<std::int64_t>(parse_count(f.params, "--params"));
  o.bucket_bytes = parse_bytes(f.bucket_bytes, "--bucket-bytes");
  o.threads = f.threads;
  o.param_dtype = shard_dtype(f.param_dtype, "--param-dtype");
  o.grad_dtype = shard_dtype(f.grad_dtype, "--grad-dtype");
  o.simd = f.simd == "auto" ? best_simd_level() : parse_simd_level(f.simd);
  o.max_grad_norm = f.max_grad_norm;
  o.warmup = f.warmup;
  o.steps = f.steps;
  if (f.schedules != "all") {
    o.schedules.clear();
    std::stringstream ss(f.schedules);
    for (std::string item; std::getline(ss, item, ',');) o.schedules.push_back(item);
  }
  o.bandwidth_bytes = parse_bytes(f.bandwidth_bytes, "--bandwidth-bytes");
  o.device = f.device;
  return o;
}

std::string summary(const nlohmann::json& j) {
  std::string s;
  char line[256];
  for (const auto& r : j["runs"]) {
    std::snprintf(line, sizeof line, "%-15s step %8.2f ms   optimizer on device %s\n",
                  r["name"].get<std::string>().c_str(), 1e3 * r["step_seconds"].get<double>(),
                  format_bytes(r["optimizer_device_bytes"].get<double>()).c_str());
    s += line;
  }
  for (const char* k : {"memory_bandwidth_gbps", "speedup_stream_vs_serial", "pipeline_efficiency",
                        "roofline_fraction", "step_roofline_fraction"})
    if (j.contains(k)) {
      std::snprintf(line, sizeof line, "%-26s %.3f\n", k, j[k].get<double>());
      s += line;
    }
  s += std::string("bitwise equal across schedules: ") + (j["bitwise_equal"].get<bool>() ? "yes" : "NO") + "\n";
  return s;
}

Command add_bench_optimizer(CLI::App& parent) {
  auto f = std::make_shared<Flags>();
  Command c;
  c.app = parent.add_subcommand("optimizer", "AdamW step: device vs offload_serial vs offload_stream (OffloadStreamAdamW)");
  auto* a = c.app;
  a->add_option("--params", f->params, "Parameters in the shard (a bench size): 67108864, 64M")->capture_default_str();
  a->add_option("--bucket-bytes", f->bucket_bytes, "offload_stream: gradient bytes per bucket (optimizer bucket_bytes)")->capture_default_str();
  int_flag(a, "--threads", f->threads, "CPU threads of the update (the caller included)", 1,
           OptimizerBenchOptions::kMaxThreads);
  a->add_option("--param-dtype", f->param_dtype, "Device parameter dtype (bf16, f32)")->capture_default_str();
  a->add_option("--grad-dtype", f->grad_dtype, "Gradient dtype (bf16, f32)")->capture_default_str();
  a->add_option("--simd", f->simd, "auto, scalar, avx2, avx512")->capture_default_str();
  real_flag(a, "--max-grad-norm", f->max_grad_norm, "Global gradient-norm clip (0 = off)", 0.0, 1e30);
  int_flag(a, "--warmup", f->warmup, "Untimed steps per schedule (a bench size)", 0, 1000);
  int_flag(a, "--steps", f->steps, "Timed steps per schedule, the fastest reported (a bench size)", 1, 1000);
  a->add_option("--schedules", f->schedules, "all, or a comma list of device, offload_serial, offload_stream")->capture_default_str();
  a->add_option("--bandwidth-bytes", f->bandwidth_bytes, "Working set of the bandwidth kernels, far above the last-level cache (a bench size)")->capture_default_str();
  device_flag(a, f->device);
  a->add_flag("--json", f->json, "Print one JSON object");
  c.run = [f] {
    nlohmann::json j = run_optimizer_bench(to_options(*f));
    if (f->json) std::printf("%s\n", j.dump(2).c_str());
    else std::printf("%s", summary(j).c_str());
    return 0;
  };
  return c;
}

const bool registered = register_command("bench", "optimizer", &add_bench_optimizer);

}  // namespace

}  // namespace peakbound::cli
