// TcpTransport on the progress thread: epoll interest, closing sockets,
// failing pairs, deadlines, and tearing everything down.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
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

void TcpTransport::refresh(Conn& c) {
  if (c.fd < 0) return;
  uint32_t want;
  if (!c.ready) {
    want = (c.connecting || c.hs->wantsWrite()) ? EPOLLOUT : EPOLLIN;
  } else {
    // A stalled socket is not read, but still watched for the peer leaving.
    uint32_t in = c.stalled ? (c.peerClosing ? 0u : uint32_t(EPOLLRDHUP)) : uint32_t(EPOLLIN);
    want = in | (c.wantWrite ? uint32_t(EPOLLOUT) : 0u);
  }
  if (c.inEpoll && want == c.registered) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = &c;
  int rc = epoll_ctl(epollFd_, c.inEpoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd, &ev);
  BRAID_ENFORCE(rc == 0, "tcp progress", rank_, "epoll_ctl on the socket of ", c.address, ": ",
                std::strerror(errno));
  c.inEpoll = true;
  c.registered = want;
}

void TcpTransport::refresh(Pair& p) {
  for (auto& c : p.conns) {
    if (c) refresh(*c);
  }
}

void TcpTransport::settle(Pair& p) {
  for (auto& c : p.conns) {
    if (!c || !c->eof || c->fd < 0) continue;
    // The peer closed this socket between frames. The others may still hold
    // data it sent before leaving, so the pair fails only once none can deliver.
    if (c->inEpoll) epoll_ctl(epollFd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->fd = -1;
  }
  if (p.drained()) {
    return failPair(p, "closed its connections (it left: destroyed the group, exited or gave up)",
                    /*keepArrived=*/true);
  }
  refresh(p);
}

void TcpTransport::closeConn(Conn* c) {
  if (c->fd >= 0) {
    if (c->inEpoll) epoll_ctl(epollFd_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->fd = -1;
  }
  if (c->holdsSlot && c->peer >= 0) {
    Pair& p = *pairs_[c->peer];
    p.slots[c->index] = Pair::Slot::kEmpty;
    c->holdsSlot = false;
    if (p.conns[c->index].get() == c) {
      graveyard_.push_back(std::move(p.conns[c->index]));
      return;
    }
  }
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](auto& u) { return u.get() == c; });
  if (it != pending_.end()) {
    graveyard_.push_back(std::move(*it));
    pending_.erase(it);
  }
}

void TcpTransport::failPair(Pair& p, const std::string& why, bool keepArrived) {
  if (p.failed) return;
  std::string text = strCat(peerName(p.peer), ": ", why);
  if (p.hasPending()) {
    BRAID_LOG(kWarn, "tcp", logRank_) << "lost " << text;
  } else {
    BRAID_LOG(kInfo, "tcp", logRank_) << "lost " << text << " (nothing pending)";
  }
  p.failAll(std::make_exception_ptr(PeerLostError(text)), keepArrived);
  for (auto& c : p.conns) {
    if (c) closeConn(c.get());
  }
  std::vector<Conn*> dials;
  for (auto& c : pending_) {
    if (c->peer == p.peer) dials.push_back(c.get());
  }
  for (Conn* c : dials) closeConn(c);
  std::lock_guard<std::mutex> lock(mu_);
  if (!connected_ && connectError_.empty()) {
    connectError_ = strCat("braid tcp connect (rank ", rank_, "): ", text);
    cv_.notify_all();
  }
}

void TcpTransport::expireHandshakes() {
  const auto now = Clock::now();
  std::vector<Conn*> late;
  for (auto& c : pending_) {
    if (c->deadline <= now) late.push_back(c.get());
  }
  for (Conn* c : late) {
    if (c->fd < 0) continue;
    if (c->dialer && !c->holdsSlot) {
      closeConn(c);  // a dial that lost its socket to the peer's
      continue;
    }
    if (c->dialer) {
      failPair(*pairs_[c->peer], strCat("socket ", c->index, ": no answer to the handshake within ",
                                        opt_.timeout.count(), " ms"));
      continue;
    }
    std::string msg = strCat("tcp accept (rank ", rank_, "): dropped a connection from ", c->address,
                             ": no complete handshake within ", opt_.timeout.count(), " ms");
    BRAID_LOG(kWarn, "tcp", logRank_) << msg;
    closeConn(c);
  }
}

void TcpTransport::retryMemoryWaiters() {
  shared_.memoryFreed = false;
  shared_.memoryWaiting = false;  // set again by a socket that still finds no room
  for (auto& p : pairs_) {
    if (p->failed) continue;
    std::string err = p->retryStalled();
    if (!err.empty()) failPair(*p, err);
    else settle(*p);
  }
}

void TcpTransport::updateConnected() {
  // Eagerly, connect's timeout names the peers still missing; lazily, one is enough to know.
  const bool eager = opt_.connect == ConnectMode::kEager;
  std::vector<int> missing;
  for (auto& p : pairs_) {
    if (opt_.skips(p->peer)) continue;
    for (auto s : p->slots) {
      if (s != Pair::Slot::kReady) {
        missing.push_back(p->peer);
        break;
      }
    }
    if (!missing.empty() && !eager) return;
  }
  std::string names;
  constexpr size_t kNamed = 8;
  for (size_t i = 0; i < missing.size() && i < kNamed; ++i) {
    names += (i ? ", " : "") + peerName(missing[i]);
  }
  if (missing.size() > kNamed) names += strCat(" and ", missing.size() - kNamed, " more");
  std::lock_guard<std::mutex> lock(mu_);
  notConnected_ = names;
  if (!missing.empty()) return;
  if (!connected_) {
    connected_ = true;
    cv_.notify_all();
  }
}

// Note [Saying why on the way out]
// When a rank's op fails because a host went away, the rank aborts its
// transports so that its peers fail now rather than at their deadline. But a
// peer that sees this rank leave before it sees the lost host itself would
// name this rank, not the cause: in a 2x2 job whose host h1 dies, rank 2
// could fail with "lost rank 0 on host 'h0'" (seen 2 runs in 30 under load).
// So an aborting rank first writes a goodbye frame carrying its reason on
// every socket that is between frames (Note [TCP framing]) and the peer's
// error quotes it. Best effort: a socket in the middle of a frame, or with a
// full send buffer, just closes. Unread bytes at close() would make the kernel
// send a reset, which may overtake the goodbye at the peer, so the bytes
// already buffered are read and dropped first.
void TcpTransport::sayGoodbye(Conn& c, const std::string& why) {
  if (c.fd < 0 || !c.ready || c.busy) return;
  FrameHeader h;
  h.opcode = Opcode::kGoodbye;
  h.source = static_cast<uint32_t>(rank_);
  h.chunk = static_cast<uint32_t>(std::min<size_t>(why.size(), kMaxGoodbyeBytes));
  uint8_t hdr[kFrameHeaderBytes];
  encodeFrame(h, hdr);
  iovec iov[2] = {{hdr, sizeof(hdr)}, {const_cast<char*>(why.data()), h.chunk}};
  msghdr mh{};
  mh.msg_iov = iov;
  mh.msg_iovlen = 2;
  (void)!::sendmsg(c.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(c.fd, SHUT_WR);
  uint8_t sink[16384];
  for (int i = 0; i < 4096 && ::recv(c.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
}

void TcpTransport::teardown(const std::string& why, const std::string* goodbye) {
  if (tornDown_) return;
  tornDown_ = true;
  auto error = std::make_exception_ptr(Error(why));
  for (auto& p : pairs_) {
    p->failAll(error);
    for (auto& c : p->conns) {
      if (c && goodbye) sayGoodbye(*c, *goodbye);
      if (c) closeConn(c.get());
    }
  }
  while (!pending_.empty()) closeConn(pending_.front().get());
  std::vector<std::pair<Post, std::shared_ptr<Request>>> posts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posts.swap(inbox_);
    if (!connected_ && connectError_.empty()) {
      connectError_ = strCat("braid tcp connect (rank ", rank_, "): ", why);
      cv_.notify_all();
    }
  }
  for (auto& pr : posts) {
    pr.second->complete(std::make_exception_ptr(Error(pr.second->what() + ": " + why)));
  }
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
