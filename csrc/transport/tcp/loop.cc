// TcpTransport's progress thread: epoll over the listening socket, the wake
// eventfd and every socket; dials, handshakes, and the pairs' data paths.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "transport/tcp/transport.h"

namespace braid {
namespace transport {
namespace tcp {
namespace {

constexpr size_t kMaxPendingHandshakes = 1024;
constexpr size_t kMaxRejectionsKept = 8;

void failRequest(const std::shared_ptr<Request>& req, const std::string& why) {
  req->complete(std::make_exception_ptr(PeerLostError(req->what() + ": " + why)));
}

std::string what(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace

void TcpTransport::loop() {
  try {
    progress();
  } catch (const std::exception& e) {
    // Out of memory, or a system call that cannot fail did: nothing more can
    // move, so every op fails now rather than at its deadline.
    std::string why = strCat("the progress thread failed: ", e.what());
    BRAID_LOG(kError, "tcp", logRank_) << why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
      abortWhy_ = why;
    }
    std::lock_guard<std::mutex> io(ioMu_);
    teardown("aborted: " + why);
    runDeferred();
  }
  std::lock_guard<std::mutex> io(ioMu_);
  graveyard_.clear();
}

void TcpTransport::progress() {
  int timeoutMs;
  {
    std::lock_guard<std::mutex> io(ioMu_);
    if (opt_.connect == ConnectMode::kEager) {
      for (int p = 0; p < rank_; ++p) {
        if (!opt_.skips(p)) activate(*pairs_[p]);
      }
    }
    updateConnected();
    timeoutMs = pending_.empty() ? -1 : 100;
  }
  epoll_event evs[64];
  for (bool more = true; more;) {
    parkWhileDriven(&timeoutMs);
    int n = epoll_wait(epollFd_, evs, 64, timeoutMs);
    {
      std::lock_guard<std::mutex> lock(mu_);
      polling_ = false;
      if (driver_ != std::thread::id()) parkCv_.notify_all();
    }
    DeferredCompletions done;  // made after ioMu_ is released (Note [Completing after the lock])
    std::lock_guard<std::mutex> io(ioMu_);
    Progressing mark(this);
    more = handleBatch(evs, n);
    // Read under ioMu_: a poster may have begun a handshake (lazy connect).
    timeoutMs = pending_.empty() ? -1 : 100;
  }
  std::lock_guard<std::mutex> io(ioMu_);
  teardown("the transport is closed");
  runDeferred();
}

// Note [Waiters drive the sockets]: out of epoll_wait while a thread drives.
// Back from a park, the first poll returns at once: the driver may have left
// callbacks, closed sockets or handshakes whose deadlines the timeout misses.
void TcpTransport::parkWhileDriven(int* timeoutMs) {
  std::unique_lock<std::mutex> lock(mu_);
  bool parked = false;
  while (driver_ != std::thread::id() && !closing_) {
    parked = true;
    parkCv_.wait(lock);
  }
  if (parked) *timeoutMs = 0;
  polling_ = true;
}

bool TcpTransport::handleBatch(const epoll_event* evs, int n, bool driver) {
  for (int i = 0; i < n; ++i) {
    auto* c = static_cast<Conn*>(evs[i].data.ptr);
    if (c == &listenTag_) {
      acceptAll();
    } else if (c == &wakeTag_) {
      uint64_t v;
      (void)!::read(wakeFd_, &v, sizeof(v));
    } else if (c->fd >= 0) {
      onEvent(c, evs[i].events);
    }
  }
  bool closing, aborted;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing = closing_;
    aborted = aborted_;
    why = abortWhy_;
  }
  if (closing) return false;
  if (aborted) teardown("aborted: " + why, &why);
  adoptPosts();
  if (!driver) runDeferred();
  if (shared_.memoryFreed) retryMemoryWaiters();
  if (!pending_.empty()) expireHandshakes();
  if (!driver) graveyard_.clear();
  return true;
}

void TcpTransport::adoptPosts() {
  std::vector<std::pair<Post, std::shared_ptr<Request>>> posts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts.swap(inbox_);
  }
  for (auto& [post, req] : posts) {
    Pair& p = *pairs_[post.peer];
    if (tornDown_ || p.failed) {
      // Note [Messages that outlive their sender]
      if (!tornDown_ && post.recv && p.matchArrived(post.recv)) continue;
      failRequest(req, tornDown_ ? "the transport was aborted or closed" : what(p.failed));
      continue;
    }
    if (!p.activated && p.peer != rank_ && opt_.connect == ConnectMode::kLazy) activate(p);
    std::string err = post.send ? p.addSend(std::move(post.send)) : p.addRecv(std::move(post.recv));
    if (!err.empty()) failPair(p, err);
    if (!p.failed) settle(p);
  }
}

void TcpTransport::activate(Pair& p) {
  p.activated = true;
  for (int i = 0; i < static_cast<int>(p.slots.size()) && !p.failed; ++i) {
    if (p.slots[i] == Pair::Slot::kEmpty) dial(p, i);
  }
}

void TcpTransport::dial(Pair& p, int index) {
  int fd;
  try {
    fd = dialStart(parseAddr(addrs_[p.peer], rank_), rank_);
    setCongestion(fd, opt_.congestion);  // Note [Congestion control]
  } catch (const Error& e) {
    failPair(p, e.what());
    return;
  }
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->peer = p.peer;
  c->index = index;
  c->address = addrs_[p.peer];
  c->dialer = c->connecting = c->holdsSlot = true;
  c->hs = std::make_unique<Handshake>(id_, p.peer, index);
  c->deadline = Clock::now() + opt_.timeout;
  p.slots[index] = Pair::Slot::kDialing;
  refresh(*c);
  pending_.push_back(std::move(c));
}

void TcpTransport::acceptAll() {
  for (;;) {
    int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that died in the backlog
    if (tornDown_ || pending_.size() >= kMaxPendingHandshakes) {
      BRAID_LOG(kWarn, "tcp", logRank_)
          << "tcp accept: dropped a connection from " << peerAddress(fd)
          << (tornDown_ ? " (shutting down)" : " (too many handshakes)");
      ::close(fd);
      continue;
    }
    setNoDelay(fd);
    setCongestion(fd, opt_.congestion);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->address = peerAddress(fd);
    c->hs = std::make_unique<Handshake>(id_);
    c->deadline = Clock::now() + opt_.timeout;
    refresh(*c);
    pending_.push_back(std::move(c));
  }
}

void TcpTransport::onEvent(Conn* c, uint32_t events) {
  if (c->ready) return onReadyEvent(*c, events);
  if (c->connecting) {
    std::string err = dialResult(c->fd);
    if (!err.empty() && !c->holdsSlot) return closeConn(c);  // a dial that lost anyway
    if (!err.empty()) {
      return failPair(*pairs_[c->peer], strCat("connecting socket ", c->index, ": ", err));
    }
    c->connecting = false;
  }
  onHandshake(c);
}

void TcpTransport::onHandshake(Conn* c) {
  for (;;) {
    Handshake::Step s = c->hs->advance(c->fd);
    if (s == Handshake::Step::kWant) return refresh(*c);
    if (s == Handshake::Step::kDone) return becomeReady(c);
    if (s == Handshake::Step::kVerified) {
      // The dialer proved the secret: keep its socket unless the slot is
      // taken (see "Who dials" in tcp/transport.h).
      Pair& p = *pairs_[c->hs->peer()];
      const int idx = c->hs->index();
      Refusal r = Refusal::kNone;
      if (opt_.skips(p.peer)) {
        r = Refusal::kWrongRank;  // ranks that disagree on who shares a host
      } else if (p.failed || p.slots[idx] == Pair::Slot::kAccepting || p.slots[idx] == Pair::Slot::kReady ||
          (p.slots[idx] == Pair::Slot::kDialing && p.peer > rank_)) {
        r = Refusal::kDuplicate;
      } else if (p.slots[idx] == Pair::Slot::kDialing) {
        // Our own dial of this socket loses to the lower rank's. It is left to
        // run: the peer refuses it as a duplicate, and both sides close it
        // quietly (closing it now would look like a failed handshake there).
        for (auto& d : pending_) {
          if (d->dialer && d->peer == p.peer && d->index == idx) d->holdsSlot = false;
        }
      }
      if (r == Refusal::kNone) {
        c->peer = p.peer;
        c->index = idx;
        c->holdsSlot = true;
        p.slots[idx] = Pair::Slot::kAccepting;
      }
      c->hs->decide(r);
      continue;
    }
    // Failed.
    if (c->dialer && (c->hs->refusedAsDuplicate() || !c->holdsSlot)) {
      return closeConn(c);  // the lower rank's dial of this socket won
    }
    if (c->dialer) {
      return failPair(*pairs_[c->peer], strCat("socket ", c->index, ": ", c->hs->why()));
    }
    if (c->hs->refusedAsDuplicate() || c->hs->why().rfind("duplicate", 0) == 0) {
      BRAID_LOG(kDebug, "tcp", logRank_) << "refused a second dial of socket " << c->hs->index()
                                      << " from " << peerName(c->hs->peer()) << " (ours wins)";
      return closeConn(c);
    }
    std::string claim = c->hs->peer() >= 0 ? strCat(" (claiming rank ", c->hs->peer(), ")") : "";
    std::string msg = strCat("tcp accept (rank ", rank_, "): refused a connection from ",
                             c->address, claim, ": ", c->hs->why());
    BRAID_LOG(kWarn, "tcp", logRank_) << msg;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (rejections_.size() < kMaxRejectionsKept) rejections_.push_back(msg);
    }
    cv_.notify_all();  // waitConnected may be waiting for it (a peer's report came first)
    return closeConn(c);
  }
}

void TcpTransport::becomeReady(Conn* c) {
  Pair& p = *pairs_[c->peer];
  if (!c->holdsSlot || p.failed) return closeConn(c);  // a dial that lost its socket
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](auto& u) { return u.get() == c; });
  std::unique_ptr<Conn> owned = std::move(*it);
  pending_.erase(it);
  c->hs.reset();
  c->ready = true;
  c->order = SocketOrder(static_cast<uint32_t>(c->peer));
  p.slots[c->index] = Pair::Slot::kReady;
  p.conns[c->index] = std::move(owned);
  BRAID_LOG(kDebug, "tcp", logRank_) << "socket " << c->index << " to " << peerName(c->peer)
                                  << " authenticated (" << (c->dialer ? "dialed" : "accepted") << ")";
  std::string err = p.onWritable(*c);
  if (err.empty()) err = p.onReadable(*c);
  if (!err.empty()) return failPair(p, strCat("socket ", c->index, ": ", err));
  settle(p);
  updateConnected();
}

void TcpTransport::onReadyEvent(Conn& c, uint32_t events) {
  Pair& p = *pairs_[c.peer];
  std::string err;
  if (events & EPOLLERR) {
    err = "connection error: " + dialResult(c.fd);
  } else if (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) {
    if (c.stalled && (events & (EPOLLHUP | EPOLLRDHUP))) {
      c.peerClosing = true;  // read what it sent, past the buffer budget if need be
      c.stalled = false;
    }
    if (!c.stalled) err = p.onReadable(c);
  }
  if (err.empty() && (events & EPOLLOUT)) err = p.onWritable(c);
  if (err.empty()) err = p.retryStalled();
  if (!err.empty()) return failPair(p, strCat("socket ", c.index, ": ", err));
  settle(p);
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
