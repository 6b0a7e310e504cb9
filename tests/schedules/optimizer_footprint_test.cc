// optimizer_footprint against what the schedules really hold: for every schedule, a
// grid of shard sizes (1, 7, 333, 1000, 100003: odd, not multiples of any bucket, below
// and above the bucket and the Arena's stagger threshold), dtype pairs and bucket
// sizes, the device Arena's measured peak of Component::optimizer and the host's
// measured peaks per component (state, staging, load workspace) and in total equal the
// footprint exactly, after load() and two steps. Also the footprint's own arithmetic
// at model scale and the errors it names.
#include "peakbound/schedules/optimizer_footprint.h"

#include <gtest/gtest.h>

#include <vector>

#include "peakbound/comm/single_rank.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_device.h"
#include "peakbound/schedules/optimizer_schedule.h"

namespace peakbound {
namespace {
namespace PB_TEST_FILE {  // this file's own, also in a unity build (tests/CMakeLists.txt)

struct Measured {
  std::uint64_t device_optimizer = 0, device_total = 0;
  ComponentBytes host{};
  std::uint64_t host_total = 0;
};

Measured run(const std::string& name, std::int64_t n, DType pd, DType gd, std::uint64_t bucket_bytes,
             bool in_place) {
  const auto un = static_cast<std::uint64_t>(n);
  // Exactly the parameters, gradients and the footprint's device bytes: the budget binds.
  CpuDevice dev(arena_reserved(un * dtype_size(pd)) + arena_reserved(un * dtype_size(gd)) +
                optimizer_footprint(name, OptimizerShape{un, dtype_size(pd), dtype_size(gd), 4, 4, 4}, [&] {
                  OptimizerOptions o;
                  o.bucket_bytes = bucket_bytes;
                  o.in_place = in_place;
                  return o;
                }())
                    .device_peak_total());
  HostMemory host;
  ThreadPool pool(2);
  SingleRankCommunicator comm;
  Buffer params = dev.allocate(Component::params, un * dtype_size(pd));
  Buffer grads = dev.allocate(Component::grads, un * dtype_size(gd));
  std::vector<float> master(un);
  for (std::uint64_t i = 0; i < un; ++i) master[i] = 0.001f * static_cast<float>(i % 97);
  dev.arena().reset_peaks();
  OptimizerOptions o;
  o.bucket_bytes = bucket_bytes;
  o.in_place = in_place;
  {
    auto s = make_optimizer_schedule(name, {dev, host, pool, comm}, {params.data(), pd, grads.data(), gd, n}, o);
    s->load(master.data());
    s->step(1e-3f);
    s->step(1e-3f);
  }
  Measured m;
  m.device_optimizer = dev.arena().peak(Component::optimizer);
  m.device_total = dev.arena().peak();
  for (Component c : kAllComponents) m.host[static_cast<std::size_t>(c)] = host.peak(c);
  m.host_total = host.peak();
  EXPECT_EQ(dev.arena().live(Component::optimizer), 0u) << "the schedule frees what it holds";
  return m;
}

TEST(OptimizerFootprint, MeasuredPeaksEqualTheFootprintOverAGrid) {
  struct Dt { DType p, g; };
  int cases = 0;
  for (const std::string name : {"device", "offload_serial", "offload_stream"})
    for (std::int64_t n : {1, 7, 333, 1000, 100003})
      for (Dt d : {Dt{DType::bf16, DType::bf16}, Dt{DType::f32, DType::f32}, Dt{DType::bf16, DType::f32}})
        for (std::uint64_t bucket : {4ull, 1000ull, 4096ull, 1ull << 20})
          for (bool in_place : {false, true}) {
            if (name != "offload_stream" && bucket != 4) continue;  // only the stream has buckets
            if (in_place && (name == "device" || bucket == 1000)) continue;  // only the offload schedules stage
            SCOPED_TRACE(name + " n=" + std::to_string(n) + " " + std::string(dtype_name(d.p)) + "/" +
                         std::string(dtype_name(d.g)) + " bucket=" + std::to_string(bucket) +
                         (in_place ? " in place" : ""));
            OptimizerOptions o;
            o.bucket_bytes = bucket;
            o.in_place = in_place;
            const OptimizerShape shape{static_cast<std::uint64_t>(n), dtype_size(d.p), dtype_size(d.g), 4, 4, 4};
            const Footprint f = optimizer_footprint(name, shape, o);
            if (in_place) {
              EXPECT_EQ(f.host_peak(Component::comm), 0u);
            }
            const Measured m = run(name, n, d.p, d.g, bucket, in_place);
            EXPECT_EQ(m.device_optimizer, f.device_peak(Component::optimizer));
            EXPECT_EQ(m.device_total, arena_reserved(shape.n * shape.param_bytes) +
                                          arena_reserved(shape.n * shape.grad_bytes) + f.device_peak_total());
            for (Component c : kAllComponents)
              EXPECT_EQ(m.host[static_cast<std::size_t>(c)], f.host_peak(c)) << component_name(c);
            EXPECT_EQ(m.host_total, f.host_peak_total());
            ++cases;
          }
  // device and serial: no bucket axis; serial and stream (three buckets) in place too
  EXPECT_EQ(cases, 2 * 5 * 3 + 5 * 3 * 4 + 5 * 3 + 5 * 3 * 3);
}

TEST(OptimizerFootprint, WhereEachScheduleHoldsItsMemory) {
  const OptimizerShape s{100003, 2, 2, 4, 4, 4};
  OptimizerOptions o;
  o.bucket_bytes = 8192;
  const Footprint dev = optimizer_footprint("device", s, o);
  EXPECT_EQ(dev.device_peak(Component::optimizer), 3 * arena_reserved(100003 * 4));
  EXPECT_EQ(dev.host_peak(Component::optimizer), 0u);
  EXPECT_EQ(dev.host_peak(Component::comm), 0u);
  EXPECT_EQ(dev.host_peak(Component::workspace), arena_reserved(100003 * 2));  // load() only
  EXPECT_EQ(dev.phase("step").host_total(), 0u);

  const Footprint serial = optimizer_footprint("offload_serial", s, o);
  const Footprint stream = optimizer_footprint("offload_stream", s, o);
  for (const Footprint* f : {&serial, &stream}) {
    EXPECT_EQ(f->device_peak_total(), 0u);
    // master, m, v in one staggered host allocation: the arrays plus two staggers.
    EXPECT_GE(f->host_peak(Component::optimizer), 3 * 100003ull * 4);
    EXPECT_LT(f->host_peak(Component::optimizer), 3 * 100003ull * 4 + 3 * 4352 + 256);
  }
  // Serial stages every gradient and parameter; the stream two slots of a bucket each way.
  EXPECT_GE(serial.host_peak(Component::comm), 100003ull * 4);
  EXPECT_GE(stream.host_peak(Component::comm), 4 * 8192ull);
  EXPECT_LT(stream.host_peak(Component::comm), 4 * 8192ull + 4 * 4352 + 256);
  EXPECT_EQ(optimizer_buffers("offload_stream", s, o).bucket_elements, 4096u);
}

TEST(OptimizerFootprint, ModelScaleAsThePlannerCallsIt) {
  // One rank's shard of 7e9 parameters: bf16 parameters, fp32 gradients, fp32 state.
  const OptimizerShape s{7'000'000'000ull, 2, 4, 4, 4, 4};
  const OptimizerOptions o;
  EXPECT_EQ(optimizer_footprint("device", s, o).device_peak(Component::optimizer), 3 * arena_reserved(28'000'000'000ull));
  const Footprint stream = optimizer_footprint("offload_stream", s, o);
  EXPECT_EQ(stream.device_peak_total(), 0u);
  EXPECT_GE(stream.host_peak(Component::optimizer), 84'000'000'000ull);
  // Two gradient slots of bucket_bytes and two parameter slots of half that (bf16
  // parameters, fp32 gradients): 3 x bucket_bytes, plus alignment.
  EXPECT_GE(stream.host_peak(Component::comm), 3 * o.bucket_bytes);
  EXPECT_LT(stream.host_peak(Component::comm), 3 * o.bucket_bytes + 3 * 4352 + 256);
}

TEST(OptimizerFootprint, ErrorsNameTheOption) {
  OptimizerOptions o;
  o.bucket_bytes = 2;
  try {
    optimizer_buffers("offload_stream", OptimizerShape{10, 2, 4, 4, 4, 4}, o);
    FAIL() << "a bucket smaller than one gradient was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer bucket_bytes must hold at least one gradient"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(optimizer_buffers("device", OptimizerShape{10, 2, 4, 4, 4, 4}, o));  // no buckets there
  EXPECT_THROW(optimizer_buffers("nvme", OptimizerShape{}, o), InvalidArgument);
  EXPECT_THROW(optimizer_buffers("device", OptimizerShape{~0ull, 2, 4, 4, 4, 4}, OptimizerOptions{}), InvalidArgument);
}

}  // namespace PB_TEST_FILE
}  // namespace
}  // namespace peakbound
