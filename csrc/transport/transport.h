// A message transport: tagged point-to-point byte messages between the ranks
// of one group, in the spirit of gloo's transport/pair.h. Implemented over
// TCP (tcp/transport.h) and over shared memory (shm/transport.h);
// tests/cpp/test_core_transport.cc checks this contract on both.
//
// Connecting. A group (rank, size) is connected by the implementation's
// factory (e.g. tcp::connect) through the rendezvous Store, which carries
// addresses only (Note [TCP authentication]). The factory returns when the
// transport can accept posts; it throws braid::Error (or TimeoutError) naming
// the op, the rank and the peer when the group cannot be connected.
//
// Messages. isend(dst, tag, data, n) and irecv(src, tag, data, n) post an op
// and return at once with a Request. Receives from one source are matched to
// that source's messages in the order the messages were sent, and a message
// goes to the first receive posted with its tag that is still unmatched (MPI's
// non-overtaking rule); a message whose receive is not posted yet waits in
// the transport (see the implementation for how much it buffers). The sizes
// of a matched send and receive must be equal: else the receive fails with an
// Error naming both sizes and the peer. A rank may send to itself.
//
// Liveness. When a peer disconnects, resets or fails a protocol check, every
// pending and later op with that peer fails with PeerLostError naming the
// peer's rank and address. abort() fails every pending and later op.
//
// Thread contract.
// - isend, irecv, abort, rank, size and peerName may be called from any
//   thread, concurrently. Posting order between threads is the order in which
//   their calls take the transport's lock.
// - Arguments are checked on the caller's thread (braid::Error thrown there);
//   everything else is reported through the Request.
// - The buffer of an op belongs to the transport from the post until the
//   Request is done (completed, failed, or the transport closed): the caller
//   must neither free it nor, for a receive, read it before then.
// - Completion callbacks run on the transport's progress thread, once, after
//   the Request is done. They must not block; they may post new ops. (A
//   posting thread that moves bytes itself, Note [Posting threads progress],
//   hands the callbacks of what it completed to the progress thread through
//   DeferredCallbacks.)
// - close() (and the destructor) must not run concurrently with posts, nor
//   inside a completion callback; it fails what is still pending and joins
//   the progress thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace braid {
namespace transport {

using Clock = std::chrono::steady_clock;

class Request;

// A transport that can move its bytes on a waiting thread (Note [Waiters
// drive the sockets] in tcp/transport.h).
class Driver {
 public:
  virtual ~Driver() = default;
  // Waits for `r` (one of this transport's requests) as Request::wait does;
  // on the thread that holds the transport's drive (Transport::beginDrive),
  // by moving the transport's bytes itself.
  virtual void drive(Request& r, Clock::time_point deadline) = 0;
  // One of this transport's requests completed, on the calling thread: a
  // driver polling on another thread must look at its request again (Note
  // [A completion wakes the driver] in tcp/transport.h).
  virtual void completed() {}
};

// One posted send or receive.
class Request : public std::enable_shared_from_this<Request> {
 public:
  using Callback = std::function<void(std::exception_ptr error)>;

  // `what` names the op in errors, e.g. "tcp send (rank 0): to rank 2, tag 7, 1024 bytes".
  Request(std::string what, Callback callback);

  // Waits until the op is done; rethrows its error. At the deadline throws
  // TimeoutError naming the op; the op stays posted (abort() ends it).
  void wait(Clock::time_point deadline);
  // Whether the op is done; rethrows its error when it failed.
  bool test();
  const std::string& what() const { return what_; }
  // wait(), through the transport that made the request when it can drive
  // (Note [Waiters drive the sockets] in tcp/transport.h).
  void waitDriven(Clock::time_point deadline) {
    if (driver_) return driver_->drive(*this, deadline);
    wait(deadline);
  }
  // For implementations: set before the request is returned; the driver
  // outlives every wait on it.
  void setDriver(Driver* d) { driver_ = d; }

  // For implementations: the first call wins; later calls are ignored.
  // Runs the callback on the calling thread after waking waiters.
  void complete(std::exception_ptr error);

 private:
  const std::string what_;
  Callback callback_;
  Driver* driver_ = nullptr;
  void throwError() const;

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  // The error as its kind and text, not as the exception_ptr: each waiter
  // throws its own copy, so no exception object is shared between the
  // completing thread and the waiters (whose last release TSan could not order).
  enum class ErrorKind { kNone, kError, kTimeout, kPeerLost } errorKind_ = ErrorKind::kNone;
  std::string errorText_;
};

// While one lives on a thread, Request::complete on that thread wakes the
// waiters as usual but queues the callback here instead of running it, so a
// thread that completes ops on a transport's behalf never runs user code
// while its caller holds locks of its own. Nests (the inner one collects).
class DeferredCallbacks {
 public:
  using Call = std::pair<Request::Callback, std::exception_ptr>;
  DeferredCallbacks();
  ~DeferredCallbacks();  // restores the outer one; the queued calls must have been taken
  DeferredCallbacks(const DeferredCallbacks&) = delete;
  DeferredCallbacks& operator=(const DeferredCallbacks&) = delete;

  std::vector<Call> take() { return std::move(calls_); }
  bool empty() const { return calls_.empty(); }
  // Request::complete's hook: queues on this thread's innermost one; false if none.
  static bool queue(Request::Callback& cb, std::exception_ptr error);

 private:
  std::vector<Call> calls_;
  DeferredCallbacks* outer_;
};

// While one lives on a thread, Request::complete on that thread records the
// completion instead of making it; run() (or the destructor) makes them, in
// order, with this one no longer collecting. A progress thread completes what
// a batch of events finished only after it released its lock: see Note
// [Completing after the lock] in tcp/transport.h. Nests (the inner one collects).
class DeferredCompletions {
 public:
  DeferredCompletions();
  ~DeferredCompletions();  // run()s what is left, then restores the outer one
  DeferredCompletions(const DeferredCompletions&) = delete;
  DeferredCompletions& operator=(const DeferredCompletions&) = delete;

  void run();
  // Request::complete's hook: records on this thread's innermost one; false
  // if none (or the Request is not owned by a shared_ptr).
  static bool defer(Request& r, std::exception_ptr& error);

 private:
  std::vector<std::pair<std::shared_ptr<Request>, std::exception_ptr>> calls_;
  DeferredCompletions* outer_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual std::shared_ptr<Request> isend(int dst, uint64_t tag, const void* data, size_t bytes,
                                         Request::Callback done = {}) = 0;
  virtual std::shared_ptr<Request> irecv(int src, uint64_t tag, void* data, size_t bytes,
                                         Request::Callback done = {}) = 0;

  // "rank 3 at 10.0.0.2:41234", for messages.
  virtual std::string peerName(int rank) const = 0;

  // Fails every pending and later op with an Error carrying `why`, and drops
  // the connections (peers see this rank leave). Any thread; idempotent.
  virtual void abort(const std::string& why) = 0;
  // Fails what is pending, closes every connection, joins the progress thread.
  virtual void close() = 0;

  // While a drive is held, Request::waitDriven on the holding thread moves
  // this transport's bytes itself instead of waiting for a progress thread
  // (Note [Waiters drive the sockets] in tcp/transport.h). Held by one thread
  // at a time: true if this call took it (then endDrive() gives it back on
  // the same thread). Not inside a completion callback. While it holds the
  // drive, the thread must not wait for anything that needs this transport
  // to move (another thread's request, a peer reached through it) other than
  // through waitDriven: nothing else moves its bytes until the drive ends.
  virtual bool beginDrive() { return false; }
  virtual void endDrive() {}
};

// Holds `t`'s drive for a scope when `want` and the drive is free.
class DriveScope {
 public:
  DriveScope(Transport& t, bool want) : t_(t), held_(want && t.beginDrive()) {}
  ~DriveScope() {
    if (held_) t_.endDrive();
  }
  DriveScope(const DriveScope&) = delete;
  DriveScope& operator=(const DriveScope&) = delete;

 private:
  Transport& t_;
  const bool held_;
};

}  // namespace transport
}  // namespace braid
