#include "peakbound/core/device_access.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

std::atomic<bool> g_any{false};  // a strict region exists
std::mutex g_mu;                 // guards g_open and changes to the regions
int g_open = 0;                  // live DeviceAccess scopes
// The regions [g_lo[i], g_hi[i]) (g_hi[i] == 0: a free slot). Plain atomics, so the
// fault handler reads them without a lock or an allocation.
constexpr int kMaxRegions = 64;
std::atomic<std::uintptr_t> g_lo[kMaxRegions], g_hi[kMaxRegions];
struct sigaction g_previous;

void protect(int i, int prot) {
  if (mprotect(reinterpret_cast<void*>(g_lo[i].load()), g_hi[i].load() - g_lo[i].load(), prot) != 0)
    PB_CHECK_MSG(false, "strict device memory: mprotect failed");
}

void protect_all(int prot) {
  for (int i = 0; i < kMaxRegions; ++i)
    if (g_hi[i].load() != 0) protect(i, prot);
}

void write_str(const char* s) { (void)!write(2, s, std::strlen(s)); }

void on_fault(int sig, siginfo_t* info, void* ctx) {
  const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (int i = 0; i < kMaxRegions; ++i)
    if (a >= g_lo[i].load() && a < g_hi[i].load()) {
      char line[96];
      const char* hex = "0123456789abcdef";
      std::size_t n = 0;
      for (const char* s = "peakbound: host code touched device memory at 0x"; *s;) line[n++] = *s++;
      for (int shift = 60; shift >= 0; shift -= 4) line[n++] = hex[(a >> shift) & 0xf];
      line[n++] = '\n';
      line[n] = 0;
      write_str(line);
      write_str("  (PEAKBOUND_STRICT_DEVICE=1: copy it with Device::memcpy_async or run it as an op); backtrace:\n");
      void* frames[64];
      backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
      break;
    }
  // Not ours, or reported: the previous disposition decides (default: die with SIGSEGV).
  sigaction(sig, &g_previous, nullptr);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* frames[1];
    backtrace(frames, 1);  // loads libgcc now, not inside the handler
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous);
  });
}

}  // namespace

bool strict_device_memory() {
  static const bool on = [] {
    const char* v = std::getenv("PEAKBOUND_STRICT_DEVICE");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void strict_region_add(void* p, std::size_t bytes) {
  if (!strict_device_memory() || !p || bytes == 0) return;
  install_handler();
  std::lock_guard<std::mutex> lock(g_mu);
  int i = 0;
  while (i < kMaxRegions && g_hi[i].load() != 0) ++i;
  PB_CHECK_MSG(i < kMaxRegions, "strict device memory: too many devices");
  g_lo[i] = reinterpret_cast<std::uintptr_t>(p);
  g_hi[i] = reinterpret_cast<std::uintptr_t>(p) + bytes;
  if (g_open == 0) protect(i, PROT_NONE);
  g_any = true;
}

void strict_region_remove(void* p) {
  if (!strict_device_memory() || !p) return;
  std::lock_guard<std::mutex> lock(g_mu);
  bool any = false;
  for (int i = 0; i < kMaxRegions; ++i) {
    if (g_hi[i].load() != 0 && g_lo[i].load() == reinterpret_cast<std::uintptr_t>(p)) {
      protect(i, PROT_READ | PROT_WRITE);
      g_hi[i] = 0, g_lo[i] = 0;
    }
    any = any || g_hi[i].load() != 0;
  }
  g_any = any;
}

DeviceAccess::DeviceAccess() {
  if (!g_any.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  active_ = true;
  if (g_open++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

DeviceAccess::~DeviceAccess() {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_open == 0) protect_all(PROT_NONE);
}

}  // namespace peakbound
