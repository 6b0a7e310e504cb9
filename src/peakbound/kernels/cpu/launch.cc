#include "peakbound/kernels/cpu/launch.h"

#include <string>

#include "peakbound/core/device_access.h"
#include "peakbound/core/error.h"
#include "peakbound/device/cpu/cpu_stream.h"

namespace peakbound::cpu {

namespace {

CpuStream& cpu_stream(Stream& s) {
  auto* cs = dynamic_cast<CpuStream*>(&s);
  if (!cs) throw InvalidArgument("a CPU kernel was launched on stream '" + s.name() + "' of another device");
  return *cs;
}

}  // namespace

void launch(Stream& s, std::function<void()> fn) {
  CpuStream& cs = cpu_stream(s);
  if (cs.mode() == CpuStream::Mode::inline_on_caller) {
    DeviceAccess open;  // a kernel touches device memory (strict mode)
    fn();
    return;
  }
  cs.submit(std::move(fn));
}

void launch_and_wait(Stream& s, std::function<void()> fn) {
  CpuStream& cs = cpu_stream(s);
  if (cs.mode() == CpuStream::Mode::inline_on_caller) {
    DeviceAccess open;  // a kernel touches device memory (strict mode)
    fn();
    return;
  }
  cs.submit(std::move(fn));
  cs.synchronize();
}

}  // namespace peakbound::cpu
