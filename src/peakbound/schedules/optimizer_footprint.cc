#include "peakbound/schedules/optimizer_footprint.h"

#include <algorithm>

#include "peakbound/core/error.h"
#include "peakbound/schedules/optimizer_state_block.h"

namespace peakbound {

namespace {

BufferSpec block_spec(Component c, const std::vector<std::uint64_t>& parts) {
  return BufferSpec{c, staggered_layout(parts).bytes};
}

}  // namespace

OptimizerBuffers optimizer_buffers(std::string_view schedule, const OptimizerShape& s,
                                   const OptimizerOptions& options) {
  if (schedule != "device" && schedule != "offload_serial" && schedule != "offload_stream")
    throw InvalidArgument("unknown optimizer schedule '" + std::string(schedule) +
                          "' (use device, offload_serial, offload_stream)");
  for (std::uint64_t e : {s.param_bytes, s.grad_bytes, s.master_bytes, s.m_bytes, s.v_bytes})
    if (e == 0) throw InvalidArgument("optimizer element sizes must be at least 1 byte");
  OptimizerBuffers b;
  b.schedule = std::string(schedule);
  b.state_on_device = schedule == "device";
  b.master = buffer_spec(Component::optimizer, s.n, s.master_bytes);
  b.m = buffer_spec(Component::optimizer, s.n, s.m_bytes);
  b.v = buffer_spec(Component::optimizer, s.n, s.v_bytes);
  b.load_staging = buffer_spec(Component::workspace, s.n, s.param_bytes);
  b.bucket_elements = s.n;
  if (b.state_on_device) return b;

  b.host_state_parts = {b.master.bytes, b.m.bytes, b.v.bytes};
  b.host_state = block_spec(Component::optimizer, b.host_state_parts);
  if (options.in_place) {
    b.host_staging = BufferSpec{Component::comm, 0};  // the update reads and writes the device's shard
    return b;
  }
  if (schedule == "offload_serial") {
    b.host_staging_parts = {checked_mul(s.n, s.grad_bytes, "optimizer gradient staging"),
                            checked_mul(s.n, s.param_bytes, "optimizer parameter staging")};
  } else {
    if (options.bucket_bytes < s.grad_bytes)
      throw InvalidArgument("optimizer bucket_bytes must hold at least one gradient (" +
                            std::to_string(s.grad_bytes) + " bytes), got " + std::to_string(options.bucket_bytes));
    // A bucket larger than the shard is the shard: staging never exceeds what is there.
    b.bucket_elements = s.n == 0 ? 0 : std::max<std::uint64_t>(1, std::min(options.bucket_bytes / s.grad_bytes, s.n));
    const std::uint64_t g = checked_mul(b.bucket_elements, s.grad_bytes, "optimizer gradient staging");
    const std::uint64_t p = checked_mul(b.bucket_elements, s.param_bytes, "optimizer parameter staging");
    b.host_staging_parts = {g, g, p, p};
  }
  b.host_staging = block_spec(Component::comm, b.host_staging_parts);
  return b;
}

Footprint optimizer_footprint(const OptimizerBuffers& b) {
  Footprint f("optimizer " + b.schedule);
  for (const char* phase : {"load", "step"}) {
    if (b.state_on_device) {
      f.device(phase, b.master).device(phase, b.m).device(phase, b.v);
    } else {
      f.host(phase, b.host_state).host(phase, b.host_staging);
    }
  }
  f.host("load", b.load_staging);
  return f;
}

Footprint optimizer_footprint(std::string_view schedule, const OptimizerShape& shape,
                              const OptimizerOptions& options) {
  return optimizer_footprint(optimizer_buffers(schedule, shape, options));
}

}  // namespace peakbound
