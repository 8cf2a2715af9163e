#include "transport/p2p.h"

#include "common/exit_guard.h"

namespace braid {
namespace transport {

// Tells waiters that the thread is in a callback (Note [A stalled progress
// thread]).
void PointToPoint::runDone(const CallbackClock& since, Done& done, std::exception_ptr e,
                           int source) {
  if (!done) return;
  since->store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  try {
    done(e, source);
  } catch (...) {
    since->store(0, std::memory_order_relaxed);
    dropOrLeak(done);
    throw;
  }
  since->store(0, std::memory_order_relaxed);
  dropOrLeak(done);  // Note [Dropping Python objects at exit]
}

}  // namespace transport
}  // namespace braid
