// `peakbound demo`: a small, real training step on the CPU device that shows the
// Arena's per-component report. A stack of L layers x <- relu(x W_l) runs forward
// and backward with activation checkpointing, twice on the same inputs: once with
// the checkpoint boundaries resident on the device, once offloaded to host memory
// through the copy engine and prefetched one layer ahead in backward. Both runs'
// gradients are compared bitwise (only data placement differs) and each run's
// Arena report is printed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "peakbound/cli/flags.h"
#include "peakbound/cli/command.h"
#include "peakbound/core/error.h"
#include "peakbound/core/host_memory.h"
#include "peakbound/core/units.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/ops/gemm.h"

namespace peakbound::cli {

namespace {

struct DemoOptions {
  std::string device_memory = "64MiB";
  std::int64_t layers = 8;
  std::int64_t tokens = 2048;
  std::int64_t hidden = 256;
  bool json = false;
};

struct DemoResult {
  double loss = 0;
  std::vector<float> grads;  // all dW_l, concatenated
  nlohmann::json arena;
  nlohmann::json host;
  std::string table;
};

// One forward+backward; `offload` moves checkpoint boundaries to host memory.
DemoResult run_step(const DemoOptions& o, std::uint64_t budget, bool offload) {
  const std::int64_t L = o.layers, T = o.tokens, H = o.hidden;
  CpuDevice dev(budget, offload ? "cpu:offload" : "cpu:resident");
  HostMemory host;
  Stream& copy = dev.copy_stream();
  const std::uint64_t act_bytes = static_cast<std::uint64_t>(T * H) * 4;

  // Parameters and inputs from a fixed seed, so both runs see the same numbers.
  std::mt19937 rng(1234);
  std::normal_distribution<float> init(0.0f, 1.0f / std::sqrt(static_cast<float>(H)));
  Buffer params = dev.allocate(Component::params, static_cast<std::uint64_t>(L * H * H) * 4);
  Buffer grads = dev.allocate(Component::grads, static_cast<std::uint64_t>(L * H * H) * 4);
  for (std::int64_t i = 0; i < L * H * H; ++i) params.as<float>()[i] = init(rng);
  std::memset(grads.data(), 0, grads.bytes());
  auto W = [&](std::int64_t l) { return params.as<float>() + l * H * H; };
  auto dW = [&](std::int64_t l) { return grads.as<float>() + l * H * H; };

  // Forward. ckpt[l] is layer l's input, kept until its backward (on device or host).
  std::vector<Buffer> ckpt(static_cast<std::size_t>(L));
  std::vector<Buffer> host_ckpt(static_cast<std::size_t>(L));
  std::vector<Event> d2h_done(static_cast<std::size_t>(L));
  Buffer x = dev.allocate(Component::checkpoints, act_bytes);
  for (std::int64_t i = 0; i < T * H; ++i) x.as<float>()[i] = init(rng) * std::sqrt(static_cast<float>(H));
  for (std::int64_t l = 0; l < L; ++l) {
    Buffer y = dev.allocate(Component::checkpoints, act_bytes);
    ops::gemm(dev, dev.compute_stream(), false, false, T, H, H, 1.0f, x.as<float>(), H, W(l), H, 0.0f, y.as<float>(), H);
    for (std::int64_t i = 0; i < T * H; ++i) y.as<float>()[i] = std::max(y.as<float>()[i], 0.0f);
    auto li = static_cast<std::size_t>(l);
    if (offload) {
      // The layer has consumed x: copy it out; the device copy is freed once the copy lands.
      host_ckpt[li] = host.allocate(Component::checkpoints, act_bytes);
      dev.memcpy_async(host_ckpt[li].data(), x.data(), act_bytes, CopyKind::device_to_host, copy);
      d2h_done[li] = dev.record(copy);
      if (l > 0) {
        d2h_done[li - 1].synchronize();
        ckpt[li - 1].reset();
      }
      ckpt[li] = std::move(x);
    } else {
      ckpt[li] = std::move(x);
    }
    x = std::move(y);
  }
  if (offload && L > 0) {
    d2h_done[static_cast<std::size_t>(L - 1)].synchronize();
    ckpt[static_cast<std::size_t>(L - 1)].reset();
  }

  // Loss 0.5 * sum(x^2) / T; its gradient is x / T.
  DemoResult r;
  double loss = 0;
  for (std::int64_t i = 0; i < T * H; ++i) loss += 0.5 * x.as<float>()[i] * x.as<float>()[i];
  r.loss = loss / static_cast<double>(T);
  Buffer dx = dev.allocate(Component::layer, act_bytes);
  for (std::int64_t i = 0; i < T * H; ++i) dx.as<float>()[i] = x.as<float>()[i] / static_cast<float>(T);
  x.reset();

  // Backward, recomputing each layer from its checkpoint. With offload the input of
  // layer l-1 is prefetched while layer l computes.
  std::vector<Event> h2d_done(static_cast<std::size_t>(L));
  auto prefetch = [&](std::int64_t l) {
    auto li = static_cast<std::size_t>(l);
    ckpt[li] = dev.allocate(Component::checkpoints, act_bytes);
    dev.memcpy_async(ckpt[li].data(), host_ckpt[li].data(), act_bytes, CopyKind::host_to_device, copy);
    h2d_done[li] = dev.record(copy);
  };
  if (offload && L > 0) prefetch(L - 1);
  Buffer z = dev.allocate(Component::layer, act_bytes);
  Buffer dprev = dev.allocate(Component::layer, act_bytes);
  for (std::int64_t l = L - 1; l >= 0; --l) {
    auto li = static_cast<std::size_t>(l);
    if (offload) {
      h2d_done[li].synchronize();
      host_ckpt[li].reset();
      if (l > 0) prefetch(l - 1);
    }
    const float* xin = ckpt[li].as<float>();
    ops::gemm(dev, dev.compute_stream(), false, false, T, H, H, 1.0f, xin, H, W(l), H, 0.0f, z.as<float>(), H);
    for (std::int64_t i = 0; i < T * H; ++i)
      if (z.as<float>()[i] <= 0.0f) dx.as<float>()[i] = 0.0f;
    ops::gemm(dev, dev.compute_stream(), true, false, H, H, T, 1.0f, xin, H, dx.as<float>(), H, 1.0f, dW(l), H);
    ops::gemm(dev, dev.compute_stream(), false, true, T, H, H, 1.0f, dx.as<float>(), H, W(l), H, 0.0f, dprev.as<float>(), H);
    std::swap(dx, dprev);
    ckpt[li].reset();
  }
  dev.synchronize();
  r.grads.assign(grads.as<float>(), grads.as<float>() + L * H * H);
  z.reset();
  dprev.reset();
  dx.reset();
  r.arena = dev.arena().report_json();
  r.host = host.report_json();
  r.table = dev.arena().report_table() + host.report_table();
  return r;
}

}  // namespace

namespace {

Command add_demo_command(CLI::App& root) {
  auto opts = std::make_shared<DemoOptions>();
  Command c;
  c.app = root.add_subcommand(
      "demo", "A small checkpointed training step on the CPU device, boundaries resident vs offloaded, "
              "with the Arena's per-component report");
  c.app->add_option("--device-memory", opts->device_memory, "Device memory budget (e.g. 64MiB)")
      ->capture_default_str();
  int_flag(c.app, "--layers", opts->layers, "Number of layers", 1, 4096);
  int_flag(c.app, "--tokens", opts->tokens, "Tokens in the batch", 1, 1 << 24);
  int_flag(c.app, "--hidden", opts->hidden, "Hidden size", 1, 1 << 16);
  c.app->add_flag("--json", opts->json, "Print one JSON object instead of tables");
  c.run = [opts] {
    std::uint64_t budget = parse_bytes(opts->device_memory, "--device-memory");
    DemoResult base = run_step(*opts, budget, false);
    DemoResult off = run_step(*opts, budget, true);
    bool equal = base.grads.size() == off.grads.size() &&
                 std::memcmp(base.grads.data(), off.grads.data(), base.grads.size() * 4) == 0 &&
                 base.loss == off.loss;
    auto ckpt_peak = [](const nlohmann::json& a) {
      return a["components"]["checkpoints"]["peak_bytes"].get<std::uint64_t>();
    };
    std::uint64_t cb = ckpt_peak(base.arena), co = ckpt_peak(off.arena);
    double cut = cb ? 1.0 - static_cast<double>(co) / static_cast<double>(cb) : 0.0;
    if (opts->json) {
      nlohmann::json j;
      j["layers"] = opts->layers;
      j["tokens"] = opts->tokens;
      j["hidden"] = opts->hidden;
      j["runs"] = nlohmann::json::array(
          {{{"name", "resident"}, {"loss", base.loss}, {"arena", base.arena}, {"host", base.host}},
           {{"name", "offload"}, {"loss", off.loss}, {"arena", off.arena}, {"host", off.host}}});
      j["checkpoint_peak_reduction"] = cut;
      j["grads_bitwise_equal"] = equal;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("demo: %lld layers, %lld tokens, hidden %lld, device budget %s\n\n",
                  static_cast<long long>(opts->layers), static_cast<long long>(opts->tokens),
                  static_cast<long long>(opts->hidden), format_bytes(static_cast<double>(budget)).c_str());
      std::printf("== boundaries resident on the device (loss %.6f)\n%s\n", base.loss, base.table.c_str());
      std::printf("== boundaries offloaded to host, prefetched one layer ahead (loss %.6f)\n%s\n",
                  off.loss, off.table.c_str());
      std::printf("checkpoint peak: %s -> %s (%.1f%% lower); gradients bitwise equal: %s\n",
                  format_bytes(static_cast<double>(cb)).c_str(), format_bytes(static_cast<double>(co)).c_str(),
                  100.0 * cut, equal ? "yes" : "NO");
    }
    if (!equal) throw InternalError("demo: offloaded gradients differ from the resident run");
    return 0;
  };
  return c;
}

const bool registered = register_command("", "demo", &add_demo_command);

}  // namespace

}  // namespace peakbound::cli
