#include "transport/shm/futex.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

#include "common/cpu_cores.h"

namespace braid {
namespace transport {
namespace shm {

namespace {

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const struct timespec* ts) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// Note [A preempted spinner sleeps]
// A long spin is only worth it while the spinner has its core to itself. The
// policy counts cores, not what else runs on them (a compiler, another job,
// braid's own worker waking): when the kernel preempts this thread in the
// middle of the spin, somebody else wanted its core, maybe the very peer it
// waits for, so it stops spinning and sleeps (and the window spins less next
// time: Note [Spin less when spinning fails] in window.cc). RUSAGE_THREAD
// counts this thread's involuntary context switches.
long involuntarySwitches() {
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  return ru.ru_nivcsw;
}

}  // namespace

void Counter::publish(uint64_t v) {
  value.store(v, std::memory_order_release);
  poke();
}

void Counter::poke() {
  // seq_cst on both sides: either the sleeper sees the new word, or we see it
  // registered as a sleeper (see sleepOnWord).
  futexWord.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) {
    futex(&futexWord, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void sleepOnWord(Counter& c, uint32_t seen, std::chrono::microseconds slice) {
  struct timespec ts;
  ts.tv_sec = slice.count() / 1000000;
  ts.tv_nsec = (slice.count() % 1000000) * 1000;
  c.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (c.futexWord.load(std::memory_order_seq_cst) == seen) {
    futex(&c.futexWord, FUTEX_WAIT, seen, &ts);
  }
  c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

WaitResult waitAtLeast(Counter& c, uint64_t target, std::chrono::microseconds slice,
                       std::chrono::nanoseconds spin, std::chrono::nanoseconds longSpin,
                       bool* spunOut) {
  if (c.value.load(std::memory_order_acquire) >= target) return WaitResult::kReached;
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int64_t budget = spin.count();
  long switchesBefore = 0;  // at the start of the long spin
  for (int i = 1;; ++i) {
    cpuRelax();
    if (c.value.load(std::memory_order_acquire) >= target) return WaitResult::kReached;
    if ((i & 63) == 0) {
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      int64_t elapsed = (t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec);
      if (elapsed <= budget) {
        // Note [A preempted spinner sleeps]: in the long spin, every 256
        // rounds (tens of us), a getrusage of half a microsecond.
        if (budget > spin.count() && (i & 255) == 0 && involuntarySwitches() != switchesBefore) {
          break;
        }
        continue;
      }
      // Note [Spinning for a blocked rank]: a caller may have started to
      // wait for the op since the last round.
      if (longSpin.count() > budget && SpinBoost::active() && coresToSpare()) {
        budget = longSpin.count();
        switchesBefore = involuntarySwitches();
        continue;
      }
      break;
    }
  }
  if (spunOut && budget > spin.count()) *spunOut = true;
  uint32_t seen = c.futexWord.load(std::memory_order_seq_cst);
  if (c.value.load(std::memory_order_acquire) >= target) return WaitResult::kReached;
  sleepOnWord(c, seen, slice);
  return c.value.load(std::memory_order_acquire) >= target ? WaitResult::kReached
                                                            : WaitResult::kTimedOut;
}

}  // namespace shm
}  // namespace transport
}  // namespace braid
