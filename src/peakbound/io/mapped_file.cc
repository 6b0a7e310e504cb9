#include "peakbound/io/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "peakbound/core/error.h"

namespace peakbound {

namespace {

// The live mappings, for the SIGBUS handler: [lo, hi) and the path (hi == 0: a free
// slot). Plain atomics and a C string allocated at registration, so the handler reads
// them without a lock or an allocation. A mapping opened when every slot is taken is not
// registered (its fault is the plain "Bus error" of before); 4096 covers a checkpoint of
// a few hundred shards and a token file with room to spare.
constexpr int kMaxMappings = 4096;
struct Slot {
  std::atomic<std::uintptr_t> lo{0}, hi{0};
  std::atomic<char*> path{nullptr};
};
Slot g_slots[kMaxMappings];
std::mutex g_mu;  // guards registration and release
struct sigaction g_previous;

void write_all(const char* s, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}
void write_str(const char* s) { write_all(s, std::strlen(s)); }

// Async-signal-safe: reads the atomics, write(2), _exit.
void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (int i = 0; i < kMaxMappings; ++i) {
    const std::uintptr_t hi = g_slots[i].hi.load(std::memory_order_acquire);
    if (hi == 0 || a < g_slots[i].lo.load(std::memory_order_relaxed) || a >= hi) continue;
    const char* path = g_slots[i].path.load(std::memory_order_acquire);
    write_str("peakbound: error: ");
    write_str(path != nullptr ? path : "a mapped input file");
    write_str(" was truncated or changed while it was read (reading its mapped bytes failed with SIGBUS); "
              "leave an input unchanged while a run reads it, and write new data to a new file\n");
    ::_exit(1);
  }
  // Not a mapped file's: the previous disposition decides (default: die with SIGBUS, as
  // the faulting access runs again on return).
  sigaction(sig, &g_previous, nullptr);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else if (info->si_code <= 0) {
    raise(sig);  // sent by kill(2), not a fault: nothing runs again, so deliver it now
  }
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

int register_mapping(const void* addr, std::size_t size, const std::string& path) {
  install_sigbus_handler();
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  const std::uintptr_t hi = lo + (size + page - 1) / page * page;  // a fault lands anywhere in the last page
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < kMaxMappings; ++i) {
    if (g_slots[i].hi.load(std::memory_order_relaxed) != 0) continue;
    g_slots[i].path.store(strdup(path.c_str()), std::memory_order_release);
    g_slots[i].lo.store(lo, std::memory_order_relaxed);
    g_slots[i].hi.store(hi, std::memory_order_release);
    return i;
  }
  return -1;
}

void release_mapping(int slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_slots[slot].hi.store(0, std::memory_order_release);
  g_slots[slot].lo.store(0, std::memory_order_relaxed);
  std::free(g_slots[slot].path.exchange(nullptr, std::memory_order_acq_rel));
}

}  // namespace

MappedFile::Mapping::~Mapping() {
  if (slot >= 0) release_mapping(slot);
  if (addr) munmap(addr, size);
}

MappedFile MappedFile::open(const std::string& path) {
  MappedFile f;
  f.path_ = path;
  f.map_ = std::make_shared<Mapping>();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
  if (fd < 0) throw InvalidArgument(path + ": cannot read: " + std::strerror(errno));
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    throw InvalidArgument(path + ": not a regular file");
  }
  const auto size = static_cast<std::size_t>(sb.st_size);
  if (size > 0) {
    void* a = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (a == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw InvalidArgument(path + ": cannot map: " + why);
    }
    f.map_->addr = a;
    f.map_->size = size;
    f.map_->slot = register_mapping(a, size, path);
  }
  ::close(fd);
  return f;
}

}  // namespace peakbound
