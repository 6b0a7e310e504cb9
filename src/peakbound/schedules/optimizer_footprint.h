// The memory each optimizer schedule holds, as a pure function of the shard's shape
// and the options: optimizer_buffers() returns every buffer the schedule allocates
// (the runtime allocates exactly these specs), optimizer_footprint() puts them into
// phases. Each spec is one allocation; where one allocation holds several arrays (a
// StaggeredBlock on the host) the spec is that allocation and `*_parts` lists the
// arrays in it.
//
//   device          master, m, v: three device Arena allocations (Component::optimizer)
//   offload_serial  master, m, v: one host allocation (Component::optimizer); host
//                   staging (Component::comm): every gradient and every parameter
//   offload_stream  the same host state; host staging: two gradient slots and two
//                   parameter slots of one bucket each (double buffering)
// With OptimizerOptions::in_place (a device whose memory the host addresses) the offload
// schedules hold no staging: the update reads and writes the device's shard itself.
// Every schedule also stages the parameters on the host (Component::workspace) while
// load() writes them from the master weights.
//
// Phases: "load" (the state and staging, plus the load workspace) and "step" (the
// state and staging). The state and staging are allocated when the schedule is made
// and held for its life, so both phases hold them.
//
// At model scale the planner passes one rank's shard: n its parameter count,
// param_bytes 2 and grad_bytes 4 for bf16 parameters with fp32 gradients, master/m/v
// 4 bytes each, and OptimizerOptions{}.bucket_bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "peakbound/core/footprint.h"
#include "peakbound/schedules/optimizer_options.h"

namespace peakbound {

// One rank's shard as the footprint sees it: element sizes, not dtypes, so the planner
// can predict other precisions than the runtime's.
struct OptimizerShape {
  std::uint64_t n = 0;            // parameters in the shard
  std::uint64_t param_bytes = 2;  // device parameter element (bf16 2, f32 4)
  std::uint64_t grad_bytes = 2;   // device gradient element
  std::uint64_t master_bytes = 4;  // the optimizer state per parameter: master weight,
  std::uint64_t m_bytes = 4;       // first and second moments (fp32 each in the runtime)
  std::uint64_t v_bytes = 4;
};

struct OptimizerBuffers {
  std::string schedule;
  bool state_on_device = false;
  // The state arrays (Component::optimizer). On the device, each its own Arena
  // allocation; on the host, the parts of host_state.
  BufferSpec master, m, v;
  BufferSpec host_state;                         // offload: one allocation of master, m, v
  std::vector<std::uint64_t> host_state_parts;   // their sizes, in that order
  BufferSpec host_staging;                       // Component::comm, one allocation
  std::vector<std::uint64_t> host_staging_parts;  // serial: grads, params; stream: g0, g1, p0, p1
  BufferSpec load_staging;                       // host workspace of load(): n parameters
  std::uint64_t bucket_elements = 0;             // parameters per bucket (n for the unbucketed)
};

// Throws InvalidArgument for an unknown schedule, a zero element size, sizes that
// overflow, or (offload_stream) a bucket_bytes smaller than one gradient.
OptimizerBuffers optimizer_buffers(std::string_view schedule, const OptimizerShape& shape,
                                   const OptimizerOptions& options);

// Phases "load" and "step" of the buffers above.
Footprint optimizer_footprint(const OptimizerBuffers& b);
Footprint optimizer_footprint(std::string_view schedule, const OptimizerShape& shape,
                              const OptimizerOptions& options);

}  // namespace peakbound
