// The TCP implementation of transport::Transport: one listening socket per
// rank, TcpOptions::socketsPerPeer authenticated sockets per peer pair, and
// one progress thread per group ("braid-tcp", epoll) that owns every socket.
// See Note [TCP framing] (tcp/frame.h), Note [TCP authentication]
// (tcp/auth.h) and Note [TCP matching and buffering] (tcp/pair.h).
//
// Who dials: eagerly, each rank dials every lower rank when the group is
// created, and connect() returns once every socket of every pair is
// authenticated. Lazily, a rank dials a peer when it first posts an op to it;
// when both dial the same socket at once, the dial of the lower rank wins
// (each acceptor applies that rule when the dialer has proved the secret, so
// a stranger cannot take a socket away from a peer).
//
// Ownership and threads: callers touch inbox_ and the flags under mu_;
// everything else belongs to whichever thread holds ioMu_: the progress
// thread while it handles a batch of events, a posting thread that found
// it idle (Note [Posting threads progress]), or a waiter that holds the drive
// (Note [Waiters drive the sockets]). A socket (Conn) is owned by
// pending_ while it connects and authenticates, then by its Pair; a closed one
// waits in graveyard_ until the current epoll batch is handled, since later
// events of the same batch may still point at it (they see fd == -1).
// A stranger's connection costs one fd and one fixed-size Handshake until its
// deadline (TcpOptions::timeout); at most 1024 are kept, later ones are
// closed at once.
//
// Note [Posting threads progress]
// A small op's latency is mostly thread hand-offs: the poster queues the op,
// wakes the progress thread, and that thread writes the socket. So a poster
// that finds the progress thread idle (ioMu_ free: it sleeps in epoll_wait)
// adopts the posts itself, on its own thread: a send is written before
// isend returns, and a receive whose message is buffered completes there.
// While it holds ioMu_ it is the progress thread in all but name, with two
// limits. It runs no completion callback (DeferredCallbacks queues them for
// the progress thread, since its caller may hold locks that a callback
// takes), and it never frees a socket (graveyard_ is the progress thread's to
// clear, as events of its current batch may point there). When it leaves
// work behind for the progress thread (callbacks, a closed socket, a
// handshake whose deadline the epoll timeout must cover), it wakes it. A
// poster that finds ioMu_ held, or that posts from a callback on the
// progress thread, queues and wakes as before. Halves the thread hand-offs of
// a small allreduce across hosts (measured in benchmarks/results/).
//
// Note [Completing after the lock]
// Whoever holds ioMu_ completes the requests it finished only after releasing
// it (DeferredCompletions, transport/transport.h). A waiter woken by a
// completion usually posts its next op at once; while ioMu_ was still held
// its post could not progress itself, so it queued and woke the progress
// thread again: one more wake-up per small op, the posts behind it, and a
// futex round trip on ioMu_. Likewise a released message buffer wakes the
// progress thread only when a socket waits for budget (PairShared::
// memoryWaiting). With threads as ranks, 2 ranks, 2000 4-byte allreduces:
// 42,869 futex calls and 7,053 eventfd writes before, 6,193 and 25 after
// (strace -c; benchmarks/results/hosts-inline.txt).
//
// Note [Waiters drive the sockets]
// A large op across hosts has each rank's calling thread waiting for
// segments that the progress thread receives: every segment is handed
// from one thread to the other, and the two run in turn, each woken by the
// other. On few cores with several ranks a host, the woken thread is often
// queued behind a busy one while another core idles (perf sched: 13-25%
// idle on 2 cores, 2 hosts x 1 rank, 64 MiB allreduce). So a thread that
// holds the drive (Transport::beginDrive; NetComm::drive for ops of at least
// BRAID_NET_DRIVE_MIN_BYTES) waits by moving the bytes itself: it polls the
// epoll set under ioMu_ and handles each batch as the progress thread
// would, until its request is done. Meanwhile the progress thread is parked
// outside epoll_wait (parkWhileDriven): had it stayed there, an event could
// wake it only to block on ioMu_ while the driver sleeps in epoll_wait with
// it. So beginDrive kicks it out (the wake eventfd) and waits until it has
// left epoll_wait: one round trip per op, which is why small ops do not
// drive. While parked it cannot run callbacks or free closed sockets, so a
// driver's batch leaves both (as a poster's does), and the first poll after
// the park returns at once to take them. Everything that wakes the progress
// thread (posts from other threads, abort(), a freed buffer) writes the
// eventfd, which the driver polls too; close() also unparks it. A driver
// between waits (reducing a segment) moves nothing: only the op's own thread
// posts on a collective's transport, and its next wait moves what arrived.
// A thread waiting on any other request of the transport waits as before.
//
// Note [A completion wakes the driver]
// A driver tests its request, then polls. Another thread can complete that
// request in between without touching a socket the driver polls: the
// progress thread still handling the batch it woke with when beginDrive
// kicked it (it adopts the driver's new receive and matches a message that
// had already arrived), or a poster that took ioMu_ in that gap. The driver
// then slept in epoll_wait until its deadline: a 3 x 1 allreduce across
// simulated hosts stalled for its whole 60 s timeout in CI, and
// TcpTransport.ADriverWakesWhenAnotherThreadCompletesItsRequest stalled in
// its first rounds. So every completion of a request of a driven transport on
// a thread other than the driver's writes the wake eventfd, which the driver
// polls. The completion sets the request done before it reads the driving
// thread, and beginDrive sets that before the driver tests: either the driver
// sees the request done, or the completer sees the driver and wakes it.
//
// Note [A driver done leaves early data in the socket]
// A driver's batch reads on past the frame that completes its request: on
// the same socket the peer's next messages often follow at once (in a
// two-rank allreduce, the header's wait ends with the peer's first data
// segments behind it, since the peer checked the headers first). Their
// receives are not posted yet, so each was buffered: a fresh allocation the
// size of the message (page faults on every op, the pages zeroed by the
// kernel), and a second copy once the receive came. Yet the driver is about
// to return and post those receives. So once its request is done (or it was
// done before the poll), a driver leaves an unexpected message's payload
// in the socket: the frame header is read, the socket stays level-triggered
// readable, and the next poll, after the receive is posted, reads it in
// place. This cannot block anyone: the driver waits for nothing more in this
// drive, nobody waits on a message whose receive is not posted, and when the
// op ends without its next wait the progress thread polls again
// (endDrive) and buffers it as before. 2 hosts x 1 rank, 64 MiB allreduce:
// about 935 page faults per op on rank 0 before (perf stat).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/store.h"
#include "transport/tcp/options.h"
#include "transport/tcp/pair.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace braid {
namespace transport {
namespace tcp {

// Connects rank `rank` of `size` through `store` (addresses only). Throws
// braid::Error / TimeoutError naming the rank and the peers that failed.
std::unique_ptr<Transport> connect(Store& store, int rank, int size, const TcpOptions& options);

class TcpTransport : public Transport, public Driver {
 public:
  TcpTransport(int rank, int size, const TcpOptions& options);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::shared_ptr<Request> isend(int dst, uint64_t tag, const void* data, size_t bytes,
                                 Request::Callback done) override;
  std::shared_ptr<Request> irecv(int src, uint64_t tag, void* data, size_t bytes,
                                 Request::Callback done) override;
  std::string peerName(int rank) const override;
  void abort(const std::string& why) override;
  void close() override;
  bool beginDrive() override;
  void endDrive() override;
  void drive(Request& r, Clock::time_point deadline) override;
  void completed() override;

  // connect()'s steps: listen and publish, read the peers' addresses, start
  // the progress thread and (eager) wait for every pair.
  void start(Store& store);
  // start() failed only because a peer's failure is in the store: filing it
  // again would hide the cause (Note [A rank that cannot connect]).
  bool failedOnAPeersReport() const { return failedOnAPeersReport_; }
  // Bytes of messages that arrived and wait for a receive: what tests check
  // to see that a protocol leaves no message behind.
  size_t unexpectedBytes();
  // Epoll batches handled by a driving waiter (Note [Waiters drive the
  // sockets]): what tests check to see that a drive moved the bytes.
  uint64_t drivenBatches();

 private:
  struct Post {
    std::shared_ptr<SendOp> send;
    std::shared_ptr<RecvOp> recv;
    int peer;
  };
  void post(Post p, const std::shared_ptr<Request>& req);
  void checkArgs(const char* op, int peer, const void* data, size_t bytes) const;
  void waitConnected(Store& store, Clock::time_point deadline);

  // Marks the thread as holding ioMu_ for this transport: a callback run
  // under it that posts must not try to take it again.
  struct Progressing {
    explicit Progressing(const TcpTransport* t) : outer(current) { current = t; }
    ~Progressing() { current = outer; }
    const TcpTransport* outer;
    static thread_local const TcpTransport* current;
  };

  // Progress thread (tcp/loop.cc).
  void loop();
  void progress();
  // false: closing. A driver's batch leaves callbacks and closed sockets to
  // the progress thread (Note [Waiters drive the sockets]).
  bool handleBatch(const epoll_event* evs, int n, bool driver = false);
  void parkWhileDriven(int* timeoutMs);
  void adoptPosts();
  // A poster's progress (Note [Posting threads progress]), holding ioMu_ in `io`.
  void adoptPostsHere(std::unique_lock<std::mutex> io);
  void wakeProgress();
  // Queues callbacks a poster or driver completed for the progress thread
  // to run (it must not run them itself); false if there were none.
  bool keepForProgress(DeferredCallbacks& callbacks);
  void runDeferred();
  void activate(Pair& p);
  void dial(Pair& p, int index);
  void acceptAll();
  void onEvent(Conn* c, uint32_t events);
  void onHandshake(Conn* c);
  void becomeReady(Conn* c);
  void onReadyEvent(Conn& c, uint32_t events);
  // With `keepArrived`, messages that arrived whole stay for their receives
  // (Note [Messages that outlive their sender]).
  void failPair(Pair& p, const std::string& why, bool keepArrived = false);
  void closeConn(Conn* c);
  void refresh(Conn& c);
  void refresh(Pair& p);
  void settle(Pair& p);  // closes sockets the peer closed; fails a drained pair
  void expireHandshakes();
  void retryMemoryWaiters();
  void updateConnected();
  // Fails everything and closes every socket; with `goodbye`, first tells
  // each peer why (Note [Saying why on the way out]).
  void teardown(const std::string& why, const std::string* goodbye = nullptr);
  void sayGoodbye(Conn& c, const std::string& why);

  const int rank_, size_;
  const int logRank_;  // TcpOptions::logRank, resolved
  const TcpOptions opt_;
  HandshakeIdentity id_;
  PairShared shared_;
  std::vector<std::string> addrs_;  // every rank's listening address
  int listenFd_ = -1, epollFd_ = -1, wakeFd_ = -1;
  Conn listenTag_, wakeTag_;  // epoll markers

  mutable std::mutex mu_;  // guards what callers share with the progress thread
  std::condition_variable cv_;
  std::vector<std::pair<Post, std::shared_ptr<Request>>> inbox_;
  bool aborted_ = false, closing_ = false, closed_ = false;
  std::string abortWhy_;
  bool connected_ = false;  // eager: every pair ready
  std::string connectError_;
  std::string notConnected_;  // eager: the peers whose sockets are not all ready yet
  std::vector<std::string> rejections_;  // recent refused connections, for connect errors
  bool failedOnAPeersReport_ = false;
  std::vector<DeferredCallbacks::Call> deferred_;  // for the progress thread to run
  // Note [Waiters drive the sockets]: a thread holds the drive; the progress
  // thread is in (or about to enter) epoll_wait.
  // none: not driven. Written under mu_ (parkCv_ waits on it); read without
  // it by every completion and every wait (Note [A completion wakes the
  // driver]).
  std::atomic<std::thread::id> driver_{};
  bool polling_ = false;
  std::condition_variable parkCv_;

  // Whoever holds ioMu_ (the progress thread, or a poster that found it idle).
  std::mutex ioMu_;
  std::vector<std::unique_ptr<Pair>> pairs_;
  std::list<std::unique_ptr<Conn>> pending_;  // connecting or authenticating
  std::vector<std::unique_ptr<Conn>> graveyard_;  // closed during one epoll batch
  bool tornDown_ = false;
  uint64_t drivenBatches_ = 0;
  std::thread thread_;
};

}  // namespace tcp
}  // namespace transport
}  // namespace braid
