#include "transport/tcp/pair.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace braid {
namespace transport {
namespace tcp {
namespace {

constexpr size_t kScratchBytes = 64 << 10;
constexpr size_t kReadBudget = 8 << 20;  // per wake-up, so one socket cannot starve the rest

std::string sysError(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

Pair::Pair(PairShared& sh, int p, int sockets)
    : peer(p), slots(sockets, Slot::kEmpty), conns(sockets), sh_(sh) {}

std::string Pair::sizeMismatch(const RecvOp& r, const InMsg& m) const {
  return strCat(r.req->what(), ": rank ", peer, " sent ", m.total, " bytes with tag ", m.tag,
                ", the receive is for ", r.bytes, " bytes");
}

std::string Pair::addSend(std::shared_ptr<SendOp> s) {
  s->seq = nextSendSeq++;
  if (peer == sh_.rank) {
    deliverLocal(*s);
    s->req->complete(nullptr);
    return "";
  }
  sendq_.push_back(std::move(s));
  return pumpWrites();
}

void Pair::deliverLocal(const SendOp& s) {
  auto owned = std::make_unique<InMsg>(s.seq, s.tag, s.bytes);
  InMsg& m = *owned;
  msgs_[s.seq] = std::move(owned);
  ++nextMatch_;
  match(m);
  if (!m.recv && !m.discard) {  // a send to oneself is always buffered
    m.buf.reset(new uint8_t[s.bytes]);
    if (s.bytes) std::memcpy(m.buf.get(), s.data, s.bytes);
    m.buffered = true;
    sh_.unexpectedBytes += m.total;
  } else if (m.recv && !m.discard && s.bytes) {
    std::memcpy(m.recv->data, s.data, s.bytes);
  }
  m.claimed = m.arrived = m.total;
  finish(m);
}

std::string Pair::addRecv(std::shared_ptr<RecvOp> r) {
  ++progress_;
  if (!matchArrived(r)) posted_.push_back(std::move(r));
  return retryStalled();
}

bool Pair::matchArrived(std::shared_ptr<RecvOp>& r) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    InMsg& m = **it;
    if (m.tag != r->tag) continue;
    unexpected_.erase(it);
    if (m.total != r->bytes) {
      r->req->complete(std::make_exception_ptr(Error(sizeMismatch(*r, m))));
      m.discard = true;
      release(m);
    } else {
      m.recv = std::move(r);
      adopt(m);
    }
    if (m.arrived == m.total) finish(m);
    return true;
  }
  return false;
}

void Pair::match(InMsg& m) {
  ++progress_;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->tag != m.tag) continue;
    std::shared_ptr<RecvOp> r = std::move(*it);
    posted_.erase(it);
    if (r->bytes != m.total) {
      r->req->complete(std::make_exception_ptr(Error(sizeMismatch(*r, m))));
      m.discard = true;
    } else {
      m.recv = std::move(r);
    }
    return;
  }
  unexpected_.push_back(&m);
}

void Pair::succeed(Request& r) {
  if (&r == sh_.driven) sh_.drivenDone = true;
  r.complete(nullptr);
}

void Pair::release(InMsg& m) {
  if (!m.buffered) return;
  sh_.unexpectedBytes -= m.total;
  if (sh_.memoryWaiting) sh_.memoryFreed = true;
  m.buf.reset();
  std::vector<std::pair<uint64_t, uint64_t>>().swap(m.bufFrames);
  m.buffered = false;
}

// A receive matched a message that is still arriving into its buffer
// (Note [TCP matching and buffering]): copy the frames read whole and the
// part read of frames in progress; their sockets read the rest in place.
void Pair::adopt(InMsg& m) {
  if (!m.buffered || m.arrived == m.total) return;  // finish() copies it whole
  auto copy = [&](uint64_t off, uint64_t len) {
    if (len) std::memcpy(m.recv->data + off, m.buf.get() + off, len);
  };
  for (const auto& f : m.bufFrames) copy(f.first, f.second);
  for (const auto& c : conns) {
    if (c && c->inPayload && c->msg == &m) copy(c->cur.offset, c->cur.chunk - c->left);
  }
  release(m);
}

// Called when every byte of `m` arrived: delivers it, or keeps it buffered
// until its receive is posted.
void Pair::finish(InMsg& m) {
  if (!m.discard && !m.recv) return;  // unexpected: stays in msgs_
  if (m.recv && !m.discard) {
    if (m.buffered && m.total) std::memcpy(m.recv->data, m.buf.get(), m.total);
    succeed(*m.recv->req);
  }
  release(m);
  msgs_.erase(m.seq);
}

bool Pair::nextChunk(Conn& c) {
  while (!sendq_.empty()) {
    std::shared_ptr<SendOp> s = sendq_.front();
    uint64_t len = std::min<uint64_t>(sh_.chunkBytes, s->bytes - s->assigned);
    FrameHeader h;
    h.source = static_cast<uint32_t>(sh_.rank);
    h.chunk = static_cast<uint32_t>(len);
    h.tag = s->tag;
    h.seq = s->seq;
    h.total = s->bytes;
    h.offset = s->assigned;
    encodeFrame(h, c.hdr);
    c.hdrSent = c.payloadSent = 0;
    c.payloadLen = len;
    c.chunkOffset = s->assigned;
    c.busy = true;
    s->assigned += len;
    s->started = true;
    if (s->assigned == s->bytes) sendq_.pop_front();
    c.op = std::move(s);
    return true;
  }
  return false;
}

std::string Pair::pumpWrites() {
  for (auto& c : conns) {
    if (!c || c->busy || c->fd < 0 || sendq_.empty()) continue;
    std::string err = onWritable(*c);
    if (!err.empty()) return err;
  }
  return "";
}

std::string Pair::onWritable(Conn& c) {
  for (;;) {
    if (!c.busy && !nextChunk(c)) {
      c.wantWrite = false;
      return "";
    }
    iovec iov[2];
    int n = 0;
    if (c.hdrSent < kFrameHeaderBytes) {
      iov[n++] = {c.hdr + c.hdrSent, kFrameHeaderBytes - c.hdrSent};
    }
    if (c.payloadSent < c.payloadLen) {
      iov[n++] = {const_cast<uint8_t*>(c.op->data) + c.chunkOffset + c.payloadSent,
                  c.payloadLen - c.payloadSent};
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = n;
    ssize_t w = n ? ::sendmsg(c.fd, &mh, MSG_NOSIGNAL) : 0;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      c.wantWrite = true;
      return "";
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return sysError("send failed");
    size_t got = static_cast<size_t>(w);
    size_t h = std::min(got, kFrameHeaderBytes - c.hdrSent);
    c.hdrSent += h;
    c.payloadSent += got - h;
    if (c.hdrSent < kFrameHeaderBytes || c.payloadSent < c.payloadLen) continue;
    c.busy = false;
    std::shared_ptr<SendOp> s = std::move(c.op);
    s->written += c.payloadLen;
    if (s->written == s->bytes) succeed(*s->req);
  }
}

InMsg* Pair::locate(const FrameHeader& h, std::string* why) {
  InMsg* m = nullptr;
  if (h.seq < nextMatch_) {
    auto it = msgs_.find(h.seq);
    if (it == msgs_.end()) {
      *why = strCat("frame of message ", h.seq, ", which was already delivered");
      return nullptr;
    }
    m = it->second.get();
  } else if (h.seq == nextMatch_) {
    auto owned = std::make_unique<InMsg>(h.seq, h.tag, h.total);
    m = owned.get();
    msgs_[h.seq] = std::move(owned);
    ++nextMatch_;
    match(*m);
  } else {
    return nullptr;  // an earlier message is not known yet: wait
  }
  if (!checkMessage(h, m->tag, m->total, &m->claimed, why)) return nullptr;
  return m;
}

std::string Pair::onReadable(Conn& c) {
  size_t budget = kReadBudget;
  while (budget > 0) {
    if (!c.inPayload) {
      while (c.rhave < kFrameHeaderBytes) {
        ssize_t n = ::recv(c.fd, c.rhdr + c.rhave, kFrameHeaderBytes - c.rhave, 0);
        if (n == 0 && c.rhave == 0) {
          c.eof = true;  // between frames: the transport decides (TcpTransport::settle)
          return "";
        }
        if (n == 0) return "closed the connection in the middle of a frame header";
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return sysError("recv failed");
        c.rhave += static_cast<size_t>(n);
      }
      std::string why;
      if (decodeFrame(c.rhdr, c.rhave, &c.cur, &why) != DecodeStatus::kOk) return why;
      if (!c.order.check(c.cur, &why)) return why;
      c.rhave = 0;
      c.inPayload = true;
      c.msg = nullptr;
      c.left = c.cur.chunk;
    }
    if (c.cur.opcode == Opcode::kGoodbye) return readGoodbye(c);
    if (!c.msg) {
      std::string why;
      c.msg = locate(c.cur, &why);
      if (!why.empty()) return why;
      if (!c.msg) {
        c.stalled = true;  // an earlier message is not known yet
        return "";
      }
    }
    InMsg& m = *c.msg;
    if (!m.recv && !m.discard && !m.buffered && m.total > 0) {
      // Note [A driver done leaves early data in the socket] (tcp/transport.h)
      if (sh_.drivenDone) return "";
      if (!c.peerClosing && sh_.unexpectedBytes + m.total > sh_.maxUnexpected) {
        c.stalled = true;  // no receive and no room: wait for either
        sh_.memoryWaiting = true;
        return "";
      }
      m.buf.reset(new uint8_t[m.total]);
      m.buffered = true;
      sh_.unexpectedBytes += m.total;
    }
    uint8_t* base = m.discard ? nullptr : m.buffered ? m.buf.get() : m.recv ? m.recv->data : nullptr;
    while (c.left > 0) {
      size_t want = static_cast<size_t>(c.left);
      uint8_t* dst;
      if (base) {
        dst = base + c.cur.offset + (c.cur.chunk - c.left);
      } else {
        if (scratch_.empty()) scratch_.resize(kScratchBytes);
        dst = scratch_.data();
        want = std::min(want, kScratchBytes);
      }
      ssize_t n = ::recv(c.fd, dst, want, 0);
      if (n == 0) return "closed the connection in the middle of a message";
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return sysError("recv failed");
      c.left -= static_cast<uint64_t>(n);
      budget -= std::min(budget, static_cast<size_t>(n));
    }
    c.inPayload = false;
    c.msg = nullptr;
    if (m.buffered) m.bufFrames.emplace_back(c.cur.offset, c.cur.chunk);
    m.arrived += c.cur.chunk;
    if (m.arrived == m.total) finish(m);
  }
  return "";
}

// The peer is leaving and says why (Note [Saying why on the way out]): the
// pair fails with its reason.
std::string Pair::readGoodbye(Conn& c) {
  while (c.left > 0) {
    char buf[kMaxGoodbyeBytes];
    ssize_t n = ::recv(c.fd, buf, static_cast<size_t>(c.left), 0);
    if (n == 0) return "closed the connection in the middle of its goodbye";
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sysError("recv failed");
    c.goodbye.append(buf, static_cast<size_t>(n));
    c.left -= static_cast<uint64_t>(n);
  }
  std::string why = c.goodbye;
  for (char& ch : why) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';  // one log line
  }
  return why.empty() ? "it left (no reason given)" : "it left: " + why;
}

std::string Pair::retryStalled() {
  for (bool again = true; again;) {
    again = false;
    for (auto& c : conns) {
      if (!c || !c->stalled || c->fd < 0) continue;
      uint64_t before = progress_;
      c->stalled = false;
      std::string err = onReadable(*c);
      if (!err.empty()) return err;
      if (progress_ != before) again = true;
    }
  }
  return "";
}

bool Pair::drained() const {
  if (conns.empty()) return false;
  bool anyClosed = false;
  for (auto& c : conns) {
    if (!c) return false;  // not connected yet
    if (c->fd < 0) anyClosed = true;
    else if (!(c->stalled && c->peerClosing)) return false;
  }
  return anyClosed;
}

bool Pair::hasPending() const {
  if (!sendq_.empty() || !posted_.empty()) return true;
  for (auto& c : conns) {
    if (c && c->op) return true;
  }
  for (auto& kv : msgs_) {
    if (kv.second->recv && !kv.second->discard) return true;
  }
  return false;
}

void Pair::failAll(std::exception_ptr e, bool keepArrived) {
  if (!failed) failed = e;
  auto failReq = [&](const std::shared_ptr<Request>& req) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      req->complete(std::make_exception_ptr(PeerLostError(req->what() + ": " + x.what())));
    }
  };
  for (auto& s : sendq_) failReq(s->req);
  sendq_.clear();
  for (auto& c : conns) {
    if (c && c->op) failReq(c->op->req);
    if (c) c->op.reset(), c->busy = false, c->msg = nullptr;
  }
  for (auto& r : posted_) failReq(r->req);
  posted_.clear();
  // Note [Messages that outlive their sender]: whole unexpected messages stay.
  auto whole = [&](const InMsg& m) {
    return keepArrived && !m.recv && !m.discard && m.arrived == m.total;
  };
  for (auto it = msgs_.begin(); it != msgs_.end();) {
    InMsg& m = *it->second;
    if (whole(m)) {
      ++it;
      continue;
    }
    if (m.recv && !m.discard) failReq(m.recv->req);
    release(m);
    it = msgs_.erase(it);
  }
  std::deque<InMsg*> kept;
  for (InMsg* m : unexpected_) {
    if (msgs_.count(m->seq)) kept.push_back(m);
  }
  unexpected_.swap(kept);
}

}  // namespace tcp
}  // namespace transport
}  // namespace braid
