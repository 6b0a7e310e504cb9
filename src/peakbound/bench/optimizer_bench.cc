#include "peakbound/bench/optimizer_bench.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "peakbound/bench/harness.h"
#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/core/splitmix.h"
#include "peakbound/bench/optimizer_bandwidth.h"
#include "peakbound/schedules/optimizer_offload.h"
#include "peakbound/schedules/optimizer_footprint.h"

namespace peakbound {

namespace {

using nlohmann::json;

// A cheap, reproducible pseudo-random value in [-1, 1) for element i (splitmix64):
// tens of millions of inputs in well under a second, filled in parallel.
float noise(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t z = mix64(seed * kSplitmixGamma + i + 1);
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

template <typename F>
void parallel_range(ThreadPool& pool, std::int64_t n, F&& f) {
  const std::int64_t chunk = 1 << 20, tasks = (n + chunk - 1) / chunk;
  pool.parallel_for(tasks, [&](std::int64_t t) {
    for (std::int64_t i = t * chunk, end = std::min(n, (t + 1) * chunk); i < end; ++i) f(i);
  });
}

std::uint64_t fnv1a(const void* p, std::uint64_t bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::uint64_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

struct Inputs {
  HostMemory host;  // declared first: outlives the buffers below
  Buffer master0;  // host f32 [n]
  Buffer grads;    // host, grad dtype [n]
};

// One schedule on its own device (so its Arena measures only its own peaks), with its
// own copy of the parameters and gradients, and its host memory on the device's pages
// (pinned on a GPU).
struct Case {
  std::string name;
  std::unique_ptr<Device> dev;
  std::unique_ptr<HostMemory> host_memory;  // after dev: released before it
  HostMemory& host() { return *host_memory; }
  SingleRankCommunicator comm;
  Buffer params, grads;
  std::unique_ptr<OptimizerSchedule> sched;
  std::vector<OptimizerStepTimes> timed;
  OptimizerStepTimes best;       // the fastest step
  double fastest_update = 0;     // the fastest update stage of any step
  std::uint64_t state_hash = 0;
};

std::unique_ptr<Case> make_case(const std::string& name, const OptimizerBenchOptions& o, const Inputs& in,
                                ThreadPool& pool) {
  auto c = std::make_unique<Case>();
  c->name = name;
  const auto n = static_cast<std::uint64_t>(o.params);
  const std::uint64_t pbytes = n * dtype_size(o.param_dtype), gbytes = n * dtype_size(o.grad_dtype);
  // The device holds the shard's parameters and gradients plus the schedule's own
  // footprint (the device adds the Arena's stagger reserve on top).
  const OptimizerShape shape{n, dtype_size(o.param_dtype), dtype_size(o.grad_dtype), 4, 4, 4};
  OptimizerOptions so;
  so.adam.max_grad_norm = o.max_grad_norm;
  so.bucket_bytes = o.bucket_bytes;
  so.simd = o.simd;
  const Footprint fp = optimizer_footprint(name, shape, so);
  const std::uint64_t budget = arena_reserved(pbytes) + arena_reserved(gbytes) + fp.device_peak_total();
  c->dev = make_device(o.device, budget, "cpu:" + name);
  c->host_memory = std::make_unique<HostMemory>(MemoryLedger::kUnlimited, "host", c->dev->host_pages());
  c->params = c->dev->allocate(Component::params, pbytes);
  c->grads = c->dev->allocate(Component::grads, gbytes);
  copy_to_device(*c->dev, c->grads.data(), in.grads.data(), gbytes);
  c->sched = make_optimizer_schedule(name, {*c->dev, c->host(), pool, c->comm},
                                     {c->params.data(), o.param_dtype, c->grads.data(), o.grad_dtype, o.params}, so);
  c->sched->load(in.master0.as<float>());
  return c;
}

OptimizerStepTimes step(Case& c) {
  const LrSchedule lr{c.sched->options().adam.lr, 0.0f, 0, 0};
  return c.sched->step(lr.lr(c.sched->steps_taken() + 1));
}

// The run's JSON entry; hashes the final state so the schedules' bits can be
// compared without keeping copies.
json finish(Case& c) {
  const auto& sh = c.sched->shard();
  const auto n = static_cast<std::uint64_t>(sh.n);
  c.best = *std::min_element(c.timed.begin(), c.timed.end(),
                             [](const auto& a, const auto& b) { return a.step_seconds < b.step_seconds; });
  std::vector<double> secs;
  c.fastest_update = c.timed.front().update_seconds;
  for (const auto& t : c.timed) {
    secs.push_back(t.step_seconds);
    c.fastest_update = std::min(c.fastest_update, t.update_seconds);
  }
  std::sort(secs.begin(), secs.end());
  {
    const std::uint64_t pbytes = n * dtype_size(sh.param_dtype);
    Buffer master = c.host().allocate(Component::workspace, n * 4), m = c.host().allocate(Component::workspace, n * 4),
           v = c.host().allocate(Component::workspace, n * 4), params = c.host().allocate(Component::workspace, pbytes);
    c.sched->read_state(master.as<float>(), m.as<float>(), v.as<float>());
    copy_to_host(*c.dev, params.data(), c.params.data(), pbytes);
    c.state_hash = fnv1a(params.data(), pbytes,
                         fnv1a(v.data(), n * 4, fnv1a(m.data(), n * 4, fnv1a(master.data(), n * 4))));
  }
  json j = {{"name", c.name},
            {"optimizer_device_bytes", c.dev->arena().peak(Component::optimizer)},
            {"device_peak_bytes", c.dev->arena().peak()},
            {"host_optimizer_bytes", c.host().peak(Component::optimizer)},
            {"host_staging_bytes", c.host().peak(Component::comm)},
            {"host_pages", c.host().pages_kind()},
            {"step_seconds", c.best.step_seconds},
            {"step_seconds_median", secs[secs.size() / 2]},
            {"clip_seconds", c.best.clip_seconds},
            {"buckets", c.best.buckets},
            {"grad_norm", c.best.clip.norm},
            {"state_hash", c.state_hash}};
  if (c.name != "device") {
    j["d2h_seconds"] = c.best.d2h_seconds;
    j["h2d_seconds"] = c.best.h2d_seconds;
  }
  j["update_seconds"] = c.best.update_seconds;
  return j;
}

void check(const OptimizerBenchOptions& o) {
  if (o.params < 1) throw InvalidArgument("optimizer bench params must be at least 1");
  if (o.threads < 1 || o.threads > OptimizerBenchOptions::kMaxThreads)
    throw InvalidArgument("optimizer bench threads must be between 1 and " +
                          std::to_string(OptimizerBenchOptions::kMaxThreads) + ", got " + std::to_string(o.threads));
  if (o.warmup < 0 || o.steps < 1) throw InvalidArgument("optimizer bench warmup must be >= 0 and steps >= 1");
  if (o.bandwidth_bytes < (1u << 20)) throw InvalidArgument("optimizer bench bandwidth_bytes must be at least 1MiB");
  for (DType t : {o.param_dtype, o.grad_dtype})
    if (t != DType::f32 && t != DType::bf16)
      throw InvalidArgument("optimizer bench param_dtype and grad_dtype must be bf16 or f32");
  if (o.schedules.empty()) throw InvalidArgument("optimizer bench schedules names no schedule");
  for (const auto& s : o.schedules)
    if (std::find(optimizer_schedule_names().begin(), optimizer_schedule_names().end(), s) ==
        optimizer_schedule_names().end())
      throw InvalidArgument("optimizer bench schedules: unknown schedule '" + s +
                            "' (use device, offload_serial, offload_stream)");
}

}  // namespace

json run_optimizer_bench(const OptimizerBenchOptions& o) {
  check(o);
  if (!simd_level_supported(o.simd))
    throw Unavailable("optimizer simd " + std::string(simd_level_name(o.simd)) + " is not supported by this CPU");
  ThreadPool pool(o.threads);
  const auto n = static_cast<std::uint64_t>(o.params);
  const double g = static_cast<double>(dtype_size(o.grad_dtype)), p = static_cast<double>(dtype_size(o.param_dtype));

  json out;
  out["benchmark"] = "optimizer";
  out["config"] = {{"params", o.params},
                   {"param_dtype", dtype_name(o.param_dtype)},
                   {"grad_dtype", dtype_name(o.grad_dtype)},
                   {"bucket_bytes", o.bucket_bytes},
                   {"threads", o.threads},
                   {"simd", simd_level_name(o.simd)},
                   {"max_grad_norm", o.max_grad_norm},
                   {"warmup_steps", o.warmup},
                   {"timed_steps", o.steps},
                   {"device", o.device}};
  out["machine"] = bench::machine_info();
  out["machine"]["simd_best"] = simd_level_name(best_simd_level());

  Inputs in;
  in.master0 = in.host.allocate(Component::workspace, n * 4);
  in.grads = in.host.allocate(Component::workspace, n * dtype_size(o.grad_dtype));
  float* master = in.master0.as<float>();
  parallel_range(pool, o.params, [&](std::int64_t i) {
    master[i] = noise(1, static_cast<std::uint64_t>(i));
    const float gi = 1e-3f * noise(2, static_cast<std::uint64_t>(i));
    if (o.grad_dtype == DType::bf16) in.grads.as<bf16>()[i] = to_bf16(gi);
    else in.grads.as<float>()[i] = gi;
  });

  // Every schedule and the bandwidth kernels live side by side and take turns, one
  // step each per round: on a shared machine a disturbance then hits all of them
  // alike, and the fastest round of each is kept. The bandwidth is the machine's:
  // measured with every hardware thread, whatever --threads says.
  ThreadPool bw_pool(default_thread_count());
  MemoryBandwidth bw(bw_pool, o.bandwidth_bytes);
  std::vector<std::unique_ptr<Case>> cases;
  for (const auto& name : o.schedules) cases.push_back(make_case(name, o, in, pool));
  for (int r = 0; r < o.warmup + o.steps; ++r) {
    // Two bandwidth passes a round: it is the roofline's denominator, and a maximum
    // over more samples is less likely to be caught by a disturbance.
    bw.run_once();
    bw.run_once();
    for (auto& c : cases) {
      OptimizerStepTimes t = step(*c);
      if (r >= o.warmup) c->timed.push_back(t);
    }
  }
  const double bandwidth = bw.best_gbps();
  out["memory_bandwidth_gbps"] = bandwidth;
  out["bandwidth_kernels"] = bw.to_json();
  out["bandwidth_kernels"]["threads"] = bw_pool.size();

  out["runs"] = json::array();
  bool equal = true;
  for (auto& c : cases) {
    out["runs"].push_back(finish(*c));
    equal = equal && c->state_hash == cases.front()->state_hash;
  }
  out["bitwise_equal"] = equal;

  auto find = [&](const std::string& name) -> const Case* {
    for (const auto& c : cases)
      if (c->name == name) return c.get();
    return nullptr;
  };
  // Logical bytes per parameter: the update reads master, m, v and the gradient and
  // writes master, m, v and the parameter; the step adds both copies (each read and
  // written once) and, with clipping, the norm's read of the gradients.
  const double update_bytes = 24 + g + p;
  const double step_bytes = update_bytes + 2 * g + 2 * p + (o.max_grad_norm > 0 ? g : 0);
  const double bw_bytes = bandwidth * 1e9;
  const Case* serial = find("offload_serial");
  const Case* stream = find("offload_stream");
  const Case* device = find("device");
  // The update alone: the whole-array CPU update of the serial step (or the device
  // baseline's). offload_serial's f32 parameters are its master weights, so its
  // update writes no parameter copy: 4 bytes fewer.
  const Case* whole = serial ? serial : device;
  const double whole_bytes = whole == serial && o.param_dtype == DType::f32 ? 24 + g : update_bytes;
  out["bytes_per_param"] = {{"update", whole_bytes}, {"stream_update", update_bytes}, {"step", step_bytes}};
  if (whole) {
    const double rate = static_cast<double>(n) / whole->fastest_update;
    out["adam_params_per_second"] = rate;
    out["roofline_fraction"] = rate / (bw_bytes / whole_bytes);
    out["roofline_fraction_source"] = whole == serial ? "offload_serial update stage" : "device update";
  }
  if (stream) {
    const auto& t = stream->best;
    const double longest = std::max({t.d2h_seconds, t.update_seconds, t.h2d_seconds});
    out["pipeline_efficiency"] = longest / t.step_seconds;
    const double step_rate = static_cast<double>(n) / t.step_seconds;
    out["step_params_per_second"] = step_rate;
    out["step_roofline_fraction"] = step_rate / (bw_bytes / step_bytes);
    out["stream_update_roofline_fraction"] = (static_cast<double>(n) / t.update_seconds) / (bw_bytes / update_bytes);
  }
  if (serial && stream) out["speedup_stream_vs_serial"] = serial->best.step_seconds / stream->best.step_seconds;
  if (device && stream) out["stream_step_vs_device_step"] = stream->best.step_seconds / device->best.step_seconds;
  json targets = json::object();
  if (out.contains("speedup_stream_vs_serial"))
    targets["stream_not_slower_than_serial"] = out["speedup_stream_vs_serial"].get<double>() >= 1.0;
  if (out.contains("roofline_fraction")) targets["roofline_fraction_ge_0.7"] = out["roofline_fraction"].get<double>() >= 0.7;
  if (out.contains("step_roofline_fraction"))
    targets["step_roofline_fraction_ge_0.6"] = out["step_roofline_fraction"].get<double>() >= 0.6;
  out["targets_met"] = targets;
  return out;
}

}  // namespace peakbound
