// A sampling profiler of the host's native code (MLX, the CUDA driver, our C API), for
// finding where a DFlash cycle's host time goes inside MLX's evaluation. Go's own CPU
// profile stops at the cgo boundary (a sample in C code is charged to the Go caller), and
// the lent GPU machines have no perf.
//
// A sampler thread sends SIGPROF every interval of wall time to the thread that last asked
// MLX to evaluate (the runtime's locked thread, where graphs are built and encoded), so time
// it spends blocked shows too (ITIMER_PROF would tick at the kernel's 4 ms). The handler
// records the interrupted thread's native stack: glibc's backtrace walks the signal frame
// into the interrupted code and stops at the first Go frame, which has no unwind table.
// Samples carry the label current when taken (0: not recording), so a caller can profile
// parts of a run apart. Diagnostic only: it replaces Go's SIGPROF handler while it runs (do
// not combine with DFLASH_CPUPROFILE).
#include "mlxc.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

namespace {
constexpr int kFrames = 48;

struct Sample {
  int tid;
  int label;
  int n;
  void* pc[kFrames];
};

Sample* g_samples = nullptr;
size_t g_cap = 0;
std::atomic<size_t> g_next{0};
std::atomic<int> g_label{0};
struct sigaction g_previous;
bool g_running = false;
std::atomic<bool> g_sampling{false};
std::atomic<int> g_target{0};
std::thread g_sampler;
// Handlers running now: stop waits for them before it reads and frees the samples (a
// signal sent just before the sampler stopped can still be in its handler).
std::atomic<int> g_inflight{0};

void on_sigprof(int, siginfo_t*, void*) {
  g_inflight.fetch_add(1);
  int label = g_label.load();
  if (label != 0) {
    int saved = errno;
    size_t i = g_next.fetch_add(1, std::memory_order_relaxed);
    if (i < g_cap) {
      Sample& s = g_samples[i];
      s.tid = static_cast<int>(syscall(SYS_gettid));
      s.label = label;
      s.n = backtrace(s.pc, kFrames);
    }
    errno = saved;
  }
  g_inflight.fetch_sub(1);
}

// where names a code address as module+offset, the form addr2line reads; the main
// executable (not position-independent) keeps absolute addresses.
void where(FILE* f, void* pc) {
  Dl_info info{};
  if (dladdr(pc, &info) == 0 || info.dli_fname == nullptr) {
    std::fprintf(f, " ?+%#lx", reinterpret_cast<unsigned long>(pc));
    return;
  }
  const char* base = std::strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  unsigned long off = reinterpret_cast<unsigned long>(pc) - reinterpret_cast<unsigned long>(info.dli_fbase);
  if (info.dli_fbase == reinterpret_cast<void*>(0x400000)) off = reinterpret_cast<unsigned long>(pc);
  std::fprintf(f, " %s+%#lx", *base ? base : "exe", off);
  // The nearest exported symbol: exact for the CUDA driver's entry points, only a hint
  // inside a library whose own symbol table the reader can use instead (libmlx).
  if (info.dli_sname) std::fprintf(f, ":%s", info.dli_sname);
}
}  // namespace

void mlxc_hostprof_note_thread(void) {
  if (!g_sampling.load(std::memory_order_relaxed)) return;
  thread_local int self = static_cast<int>(syscall(SYS_gettid));
  g_target.store(self, std::memory_order_relaxed);
}

int mlxc_hostprof_start(int interval_us, int max_samples) {
  if (g_running) return 1;
  if (interval_us < 100 || max_samples < 1) return 2;
  g_samples = new (std::nothrow) Sample[max_samples];
  if (!g_samples) return 3;
  g_cap = static_cast<size_t>(max_samples);
  g_next.store(0);
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_sigprof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, &g_previous) != 0) return 4;
  g_target.store(0);
  g_sampling.store(true);
  g_sampler = std::thread([interval_us] {
    const pid_t pid = getpid();
    timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (g_sampling.load(std::memory_order_relaxed)) {
      next.tv_nsec += static_cast<long>(interval_us) * 1000;
      while (next.tv_nsec >= 1000000000) {
        next.tv_nsec -= 1000000000;
        next.tv_sec++;
      }
      clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr);
      int tid = g_target.load(std::memory_order_relaxed);
      if (tid != 0 && g_label.load(std::memory_order_relaxed) != 0) syscall(SYS_tgkill, pid, tid, SIGPROF);
    }
  });
  g_running = true;
  return 0;
}

void mlxc_hostprof_label(int label) { g_label.store(label, std::memory_order_relaxed); }

int mlxc_hostprof_stop(const char* path) {
  if (!g_running) return 1;
  g_label.store(0);
  g_sampling.store(false);
  g_sampler.join();
  sigaction(SIGPROF, &g_previous, nullptr);
  while (g_inflight.load() != 0) std::this_thread::yield();
  g_running = false;
  size_t n = std::min(g_next.load(), g_cap);
  // One line per distinct stack: label, thread, count, then the frames leaf first.
  std::map<std::tuple<int, int, std::vector<void*>>, long> stacks;
  for (size_t i = 0; i < n; i++) {
    const Sample& s = g_samples[i];
    if (s.n <= 0) continue;
    stacks[{s.label, s.tid, std::vector<void*>(s.pc, s.pc + s.n)}]++;
  }
  int rc = 0;
  if (FILE* f = std::fopen(path, "w")) {
    std::fprintf(f, "# hostprof samples %zu dropped %zu\n", n, g_next.load() > g_cap ? g_next.load() - g_cap : 0);
    for (auto& [key, count] : stacks) {
      auto& [label, tid, pcs] = key;
      std::fprintf(f, "%d %d %ld", label, tid, count);
      for (void* pc : pcs) where(f, pc);
      std::fputc('\n', f);
    }
    if (std::fclose(f) != 0) rc = 6;
  } else {
    rc = 7;
  }
  delete[] g_samples;
  g_samples = nullptr;
  g_cap = 0;
  return rc;
}

#else

int mlxc_hostprof_start(int, int) { return 8; }
void mlxc_hostprof_label(int) {}
int mlxc_hostprof_stop(const char*) { return 8; }
void mlxc_hostprof_note_thread(void) {}

#endif
