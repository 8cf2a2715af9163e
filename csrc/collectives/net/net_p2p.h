// Point-to-point messages over a message Transport (groups across hosts).
//
// Note [Point-to-point across hosts]
// Sends and receives map one to one onto the transport's tagged messages, so
// the transport's per-source, in-order matching is c10d's. The transport is
// the group's own for p2p, not the collectives' (HierGroup connects it pair by
// pair on first use): a large send whose receive is posted late fills the
// receiver's unexpected-message budget and then waits in its sockets (TCP flow
// control), and on shared sockets the collectives' messages would queue behind
// it, so a collective issued meanwhile would wait for that receive. The tags
// still have a space of their own (bit 63 set; the collectives' never reach
// it, Note [Collectives over messages]). Two things differ from shared memory
// (transport/shm/p2p_engine.h):
//  - a receive from any source is refused: the transport matches per source;
//  - a transport cannot take back a posted receive, so an op that passes its
//    deadline cannot just be dropped (its late message would land in the next
//    receive with that tag, or in a buffer the caller owns again). It aborts
//    the transport instead: every op of the group fails, naming the op that
//    timed out, as a collective's timeout does (the ranks are out of step).
// A thread of its own (braid-p2p, started with the first op) enforces the
// deadlines; completions run on the transport's progress thread.
#pragma once

#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "collectives/group.h"
#include "transport/transport.h"

namespace braid {
namespace collectives {
namespace net {

class NetP2P : public PointToPoint {
 public:
  explicit NetP2P(transport::Transport& t);
  ~NetP2P() override;

  void postSend(int dst, int tag, const void* data, size_t bytes,
                transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
                Done done) override;
  void postRecv(int src, int tag, void* data, size_t bytes, transport::Clock::time_point deadline,
                std::chrono::milliseconds timeout, Done done) override;
  const CallbackClock& inCallbackSince() const override { return inCallback_; }
  void shutdown() override;

  static uint64_t tagOf(int tag) { return (uint64_t{1} << 63) | static_cast<uint32_t>(tag); }

 private:
  struct Watched {
    std::weak_ptr<transport::Request> req;
    transport::Clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };
  transport::Request::Callback wrap(Done done, int source);
  void watch(const std::shared_ptr<transport::Request>& req, transport::Clock::time_point deadline,
             std::chrono::milliseconds timeout);
  void loop();

  transport::Transport& t_;
  const int rank_;
  CallbackClock inCallback_ = std::make_shared<std::atomic<int64_t>>(0);
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Watched> watched_;
  // When loop() wakes next by itself (min: it is not asleep); a post wakes it
  // only for an earlier deadline.
  transport::Clock::time_point sleepsUntil_ = transport::Clock::time_point::min();
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace net
}  // namespace collectives
}  // namespace braid
