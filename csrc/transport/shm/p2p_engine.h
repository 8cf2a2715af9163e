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
#include <map>
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
//
// Note [Messages read in place]
// Through the ring a message costs two copies (the sender's engine into the
// ring, the receiver's out of it) and, once it outgrows the ring, a round of
// wake-ups per ring's worth. A send of at least `directMin` bytes (when the
// window can read peers' memory) sends only its address instead (a kDirect
// frame); the receiver's engine, once a receive matches it, copies the bytes
// straight from the sender's memory into the receive buffer (one copy,
// process_vm_readv) and answers with a kDone frame, on which the send
// completes: until then the buffer must stay as it is, so such a send waits
// for its receive. Only sends without a deadline go this way (ShmTransport's):
// a send that timed out would hand its buffer back while the receiver may
// still read it. The sender's buffer can go away without a kDone only when
// the sender leaves the group, and it marks itself gone first (the window's
// markClosed, before its engine fails what is pending): a receiver checks
// that the sender is still there after its read, and fails the receive if
// not, so it never delivers bytes read from a buffer already handed back.
class P2PEngine : public PointToPoint {
 public:
  // Sends of at least `directMin` bytes without a deadline are read in place
  // (Note [Messages read in place]); 0: none. The window must be able to
  // read peers' memory (Window::canReadPeers) when it is not 0.
  explicit P2PEngine(transport::Window& window, size_t directMin = 0);
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
  // `completeHere`: the send may be written and completed on the calling
  // thread (Note [Sends from the posting thread]).
  void postSend(int dst, int64_t tag, const void* data, size_t bytes, Clock::time_point deadline,
                std::chrono::milliseconds timeout, Done done, bool completeHere = false);
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
  // Note [Sends from the posting thread]: true when it wrote `s` (all of
  // it, or part and queued the rest, leaving `s` empty).
  bool sendHere(std::unique_ptr<Send>& s);
  // Writes what fits of `s` into its ring (ringMu_ held); true when all did.
  bool writeSome(Send& s);
  bool progressIncoming(int src);
  bool matchUnexpected(Recv& r);
  // Reads what is there of `m`'s frame; true once all of it is (throws on a corrupt one).
  bool readFrame(ByteChannel& ch, Incoming& m);
  // Note [Messages read in place]: copies message `m` (a kDirect frame) into
  // `r`'s buffer, answers kDone, completes `r`.
  void readInPlace(const Incoming& m, Recv& r, std::exception_ptr error);
  void answerDone(int src, uint64_t id);
  void finishDirect(int dst, uint64_t id);
  void failExpired();
  // Removes receive `r` from the posted list (it is done).
  void forget(Recv* r);
  void complete(Send& s, std::exception_ptr e);
  void complete(Recv& r, std::exception_ptr e, int source);

  transport::Window& w_;
  const int rank_;
  const size_t directMin_;
  std::mutex mu_;  // guards the posted lists handed over by callers
  std::vector<std::unique_ptr<Send>> newSends_;
  // Sends a posting thread wrote whole, for the engine to complete (Note
  // [Sends from the posting thread]).
  std::vector<std::unique_ptr<Send>> writtenHere_;
  std::vector<std::unique_ptr<Recv>> newRecvs_;
  bool stop_ = false;
  uint64_t nextId_ = 0;  // of sends read in place, under mu_

  // By destination: the writer's end of its ring and sends_[dst], shared by
  // the progress thread and posting threads (Note [Sends from the posting
  // thread]). Taken after mu_, never while completing.
  std::vector<std::unique_ptr<std::mutex>> ringMu_;
  std::vector<std::deque<std::unique_ptr<Send>>> sends_;  // by destination
  // Owned by the progress thread.
  std::list<std::unique_ptr<Recv>> recvs_;               // posting order
  std::vector<std::unique_ptr<Incoming>> incoming_;      // by source
  std::list<std::unique_ptr<Incoming>> unexpected_;
  // Sends read in place whose kDone has not come, by id.
  std::map<uint64_t, std::unique_ptr<Send>> awaiting_;
  std::vector<uint8_t> scratch_;  // where a dropped message's rest is read
  CallbackClock inCallback_ = std::make_shared<std::atomic<int64_t>>(0);
  std::thread thread_;
};

}  // namespace shm
}  // namespace transport
}  // namespace braid
