// A published counter in shared memory that waiters can sleep on.
//
// Note [Spin, then sleep]
// A waiter first spins, then sleeps on a process-shared futex. The publisher
// only makes the wake syscall when someone sleeps. How long it spins is the
// group's SpinPolicy (Note [How long to spin] in common/cpu_cores.h): long
// (1 ms) while its rank is blocked on the op and every rank has a core, short
// (20 us) otherwise: with more ranks than cores (4 ranks on 2 cores)
// spinning steals the core from the very peer being waited for, and a worker
// that spins beside the rank's own computation takes its core. It never
// calls sched_yield:
// on a loaded machine a yield can hand the core to an unrelated process for a
// whole scheduling period (milliseconds), while a futex wake is immediate.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/cpu_relax.h"

namespace braid {
namespace transport {
namespace shm {

struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
  // Written by the counter's owner before a publish and read by peers after
  // seeing it: bytes that travel in the counter's own cache line
  // (Window::lineBytes, Note [Bytes beside the step counter] in window.h).
  uint8_t beside[56];
  std::atomic<uint32_t> futexWord{0};  // bumped on every publish
  std::atomic<uint32_t> sleepers{0};
  char pad1[56];

  void publish(uint64_t v);
  // Wakes sleepers without changing the value (abort, close, channel activity).
  void poke();
};
static_assert(sizeof(Counter) == 128, "Counter must be two cache lines");

enum class WaitResult { kReached, kTimedOut };

// Waits until c.value >= target, for at most `slice`. Spins for `spin` first,
// or for `longSpin` while the calling thread's SpinBoost is active (read
// between spin rounds: Note [Spinning for a blocked rank]), then sleeps.
// `spunOut`, if given, is set when it spun the long budget out to no avail.
WaitResult waitAtLeast(Counter& c, uint64_t target, std::chrono::microseconds slice,
                       std::chrono::nanoseconds spin,
                       std::chrono::nanoseconds longSpin = std::chrono::nanoseconds(0),
                       bool* spunOut = nullptr);

// Sleeps until the futex word changes from `seen` or the slice passes.
void sleepOnWord(Counter& c, uint32_t seen, std::chrono::microseconds slice);

}  // namespace shm
}  // namespace transport
}  // namespace braid
