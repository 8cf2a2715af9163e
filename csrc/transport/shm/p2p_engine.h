// Point-to-point messages with tags over the Window's byte channels.
//
// Note [Point-to-point progress]
// Sends and receives are posted and then progressed by one thread per group,
// never by the collective worker: a blocking send on the worker would
// deadlock two ranks that send to each other before receiving. The thread
// moves every pending message as far as ring space allows, drains incoming
// messages into matching posted receives (in posting order, by source and
// tag) or, when none matches yet, into a buffer of unexpected messages, so a
// send completes as soon as its bytes are in the ring or that buffer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/p2p.h"
#include "transport/window.h"

namespace braid {
namespace transport {
namespace shm {

// Note [A stalled progress thread]
// Done callbacks run on the progress thread, and they complete Futures whose
// callbacks are user code: one that never returns stops every send and
// receive of the group, including the expiry of their deadlines, which this
// thread enforces (failExpired). A caller waiting on a Work without a timeout
// would then wait for ever, so WorkBraid::wait gives its op up when the op's
// deadline has passed while this thread was stuck in a callback
// (inCallbackSince). The op stays posted: a receive that has passed its
// deadline no longer matches a message (progressIncoming), and failExpired
// fails it, and a send not yet started, once the thread returns; its second
// completion is ignored (WorkBraid::markDone). The peers see a sender that is
// alive but silent: a receive attached to its message (which has no deadline
// while bytes come, Note [Started messages]) times out once no byte came for
// a whole timeout past its deadline.
class P2PEngine : public PointToPoint {
 public:
  explicit P2PEngine(transport::Window& window);
  ~P2PEngine() override;  // fails pending ops, joins the thread

  void postSend(int dst, int tag, const void* data, size_t bytes, Clock::time_point deadline,
                std::chrono::milliseconds timeout, Done done) override {
    postSend(dst, int64_t{tag}, data, bytes, deadline, timeout, std::move(done));
  }
  // src == kAnySource matches any sender.
  void postRecv(int src, int tag, void* data, size_t bytes, Clock::time_point deadline,
                std::chrono::milliseconds timeout, Done done) override {
    postRecv(src, int64_t{tag}, data, bytes, deadline, timeout, std::move(done));
  }
  // The same with 64-bit tags (ShmTransport's; a group's p2p uses the int ones).
  void postSend(int dst, int64_t tag, const void* data, size_t bytes, Clock::time_point deadline,
                std::chrono::milliseconds timeout, Done done);
  void postRecv(int src, int64_t tag, void* data, size_t bytes, Clock::time_point deadline,
                std::chrono::milliseconds timeout, Done done);
  const CallbackClock& inCallbackSince() const override { return inCallback_; }
  void shutdown() override;

 private:
  struct Send;
  struct Recv;
  struct Incoming;
  void loop();
  bool progressSends();
  bool progressIncoming(int src);
  bool matchUnexpected(Recv& r);
  void failExpired();
  // Removes receive `r` from the posted list (it is done).
  void forget(Recv* r);
  void complete(Send& s, std::exception_ptr e);
  void complete(Recv& r, std::exception_ptr e, int source);

  transport::Window& w_;
  const int rank_;
  std::mutex mu_;  // guards the posted lists handed over by callers
  std::vector<std::unique_ptr<Send>> newSends_;
  std::vector<std::unique_ptr<Recv>> newRecvs_;
  bool stop_ = false;

  // Owned by the progress thread.
  std::vector<std::deque<std::unique_ptr<Send>>> sends_;  // by destination
  std::list<std::unique_ptr<Recv>> recvs_;               // posting order
  std::vector<std::unique_ptr<Incoming>> incoming_;      // by source
  std::list<std::unique_ptr<Incoming>> unexpected_;
  std::vector<uint8_t> scratch_;  // where a dropped message's rest is read
  CallbackClock inCallback_ = std::make_shared<std::atomic<int64_t>>(0);
  std::thread thread_;
};

}  // namespace shm
}  // namespace transport
}  // namespace braid
