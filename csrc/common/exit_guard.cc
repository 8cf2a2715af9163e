#include "common/exit_guard.h"

#include <thread>

namespace braid {

namespace exit_guard {
std::atomic<bool> exiting{false};
std::atomic<int> dropping{0};
}  // namespace exit_guard

void beginExit() {
  exit_guard::exiting.store(true);
  while (exit_guard::dropping.load() != 0) std::this_thread::yield();
}

}  // namespace braid
