// Tagged sends and receives with per-op deadlines and receives from any
// source: what the backend's send/recv need. Implemented by the shared-memory
// P2PEngine (transport/shm/p2p_engine.h) and, across hosts, by NetP2P over a
// message Transport (collectives/net/net_p2p.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>

namespace braid {
namespace transport {

using Clock = std::chrono::steady_clock;

// Tagged sends and receives, progressed by a thread of the implementation.
class PointToPoint {
 public:
  // Called once, from the progress thread, when the op finished or failed.
  // source is the sender's rank for receives.
  using Done = std::function<void(std::exception_ptr error, int source)>;
  static constexpr int kAnySource = -1;
  // Since when (steady_clock ticks; 0: not now) the progress thread has run a
  // Done callback. Shared, because Works that read it may outlive the group.
  // See Note [A stalled progress thread] (shm/p2p_engine.h).
  using CallbackClock = std::shared_ptr<std::atomic<int64_t>>;

  // Runs `done` (unless empty) with the clock set while it runs, then drops
  // it (Note [Dropping Python objects at exit]); rethrows what it throws.
  static void runDone(const CallbackClock& since, Done& done, std::exception_ptr error,
                      int source);

  virtual ~PointToPoint() = default;
  virtual void postSend(int dst, int tag, const void* data, size_t bytes,
                        Clock::time_point deadline, std::chrono::milliseconds timeout,
                        Done done) = 0;
  // src == kAnySource matches any sender (where the implementation can).
  virtual void postRecv(int src, int tag, void* data, size_t bytes,
                        Clock::time_point deadline, std::chrono::milliseconds timeout,
                        Done done) = 0;
  virtual const CallbackClock& inCallbackSince() const = 0;
  virtual void shutdown() = 0;
};

}  // namespace transport
}  // namespace braid
