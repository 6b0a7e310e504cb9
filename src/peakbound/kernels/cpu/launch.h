// How ops/ runs a CPU kernel on a stream of the CPU device: on the compute stream
// (inline) it runs now on the caller's thread; on a worker stream it is queued behind
// that stream's work. Only ops/ and the CPU backend include this.
#pragma once

#include <functional>
#include <string_view>

#include "peakbound/device/device.h"

namespace peakbound::cpu {

// Runs (or queues) fn on s, a stream of a CPU device.
void launch(Stream& s, std::function<void()> fn);

// Runs fn on s and returns once it has run (kernels whose result the caller reads).
void launch_and_wait(Stream& s, std::function<void()> fn);

}  // namespace peakbound::cpu
