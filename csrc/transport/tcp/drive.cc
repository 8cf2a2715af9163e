// TcpTransport's drive: a waiting thread moves the bytes itself (Note
// [Waiters drive the sockets] in tcp/transport.h).
#include <sys/epoll.h>

#include <algorithm>
#include <chrono>

#include "transport/tcp/transport.h"

namespace braid {
namespace transport {
namespace tcp {

bool TcpTransport::beginDrive() {
  std::unique_lock<std::mutex> lock(mu_);
  if (driver_ != std::thread::id() || closing_ || aborted_ || !thread_.joinable() ||
      Progressing::current == this) {
    return false;
  }
  driver_ = std::this_thread::get_id();  // Note [A completion wakes the driver]
  if (polling_) {
    // Out of epoll_wait before this thread polls: else an event could wake
    // the progress thread, which would then wait for ioMu_ while the driver
    // sleeps in epoll_wait with it.
    wakeProgress();
    parkCv_.wait(lock, [&] { return !polling_; });
  }
  return true;
}

void TcpTransport::endDrive() {
  std::lock_guard<std::mutex> lock(mu_);
  driver_ = std::thread::id();
  parkCv_.notify_all();
}

// Note [A completion wakes the driver]
void TcpTransport::completed() {
  const std::thread::id d = driver_.load();
  if (d != std::thread::id() && d != std::this_thread::get_id()) wakeProgress();
}

uint64_t TcpTransport::drivenBatches() {
  std::lock_guard<std::mutex> io(ioMu_);
  return drivenBatches_;
}

void TcpTransport::drive(Request& r, Clock::time_point deadline) {
  // No lock: only this thread makes driver_ its own id, or clears it.
  if (driver_.load() != std::this_thread::get_id()) return r.wait(deadline);
  epoll_event evs[64];
  for (bool first = true;; first = false) {
    // A request already done still gets one poll that does not block: the
    // caller is about to compute, and the sends it posted should keep
    // moving meanwhile (a batch often receives several segments at once).
    const bool isDone = r.test();
    if (isDone && !first) return;
    const auto now = Clock::now();
    if (now >= deadline && !isDone) break;
    // At most a minute per poll: a far deadline would overflow the int.
    const auto left = std::min<Clock::duration>(deadline - now, std::chrono::minutes(1));
    int ms =
        isDone ? 0 : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
    DeferredCompletions done;  // Note [Completing after the lock]
    DeferredCallbacks callbacks;
    bool open;
    {
      std::lock_guard<std::mutex> io(ioMu_);
      Progressing mark(this);
      if (!pending_.empty()) ms = std::min(ms, 100);
      int n = epoll_wait(epollFd_, evs, 64, ms);
      // Note [A driver done leaves early data in the socket]
      shared_.driven = &r;
      shared_.drivenDone = isDone;
      open = handleBatch(evs, n, /*driver=*/true);
      shared_.driven = nullptr;
      shared_.drivenDone = false;
      ++drivenBatches_;
    }
    done.run();
    keepForProgress(callbacks);
    if (!open) break;  // closing: the progress thread takes over
    if (isDone) return;
  }
  r.wait(deadline);
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
