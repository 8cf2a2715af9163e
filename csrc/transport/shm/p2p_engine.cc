#include "transport/shm/p2p_engine.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/thread_name.h"

namespace braid {
namespace transport {
namespace shm {

namespace {
constexpr uint32_t kFrameMagic = 0x62703270;  // "bp2p"
// kEager: the payload follows in the ring. kDirect: the payload stays in the
// sender's memory at `addr` (Note [Messages read in place]). kDone: the
// receiver has read send `id`'s payload (no tag, no payload). An eager frame
// is the first 24 bytes only, the others all 40.
enum FrameKind : uint32_t { kEager = 0, kDirect = 1, kDone = 2 };
struct Frame {
  uint32_t magic;
  uint32_t kind;
  int64_t tag;  // an int tag of the backend's, or a Transport's 64-bit one (ShmTransport)
  uint64_t bytes;
  uint64_t addr;
  uint64_t id;
};
constexpr size_t kEagerFrameBytes = offsetof(Frame, addr);
static_assert(kEagerFrameBytes == 24, "the eager frame's layout is the ring's protocol");
size_t frameBytes(uint32_t kind) { return kind == kEager ? kEagerFrameBytes : sizeof(Frame); }
constexpr std::chrono::milliseconds kIdleSleep{50};
}  // namespace

struct P2PEngine::Send {
  int dst;
  int64_t tag;
  const uint8_t* data;
  size_t bytes;
  Frame frame;
  size_t pos = 0;  // over frame + payload
  transport::Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  Done done;
  std::vector<uint8_t> rest;  // the payload, copied once a started send has failed
  // Bytes it puts in the ring: a kDirect or kDone frame's payload is not there.
  size_t ringBytes() const { return frameBytes(frame.kind) + (frame.kind == kEager ? bytes : 0); }
};

struct P2PEngine::Recv {
  int src;
  int64_t tag;
  uint8_t* data;
  size_t bytes;
  transport::Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  Done done;
  bool matched = false;  // attached to a message still arriving
};

struct P2PEngine::Incoming {
  int src;
  Frame frame{};
  size_t frameGot = 0;
  bool framed = false;  // all of its frame is in
  size_t got = 0;
  uint8_t* target = nullptr;   // recv buffer, or buf.data()
  std::vector<uint8_t> buf;    // unexpected or mismatched payload
  Recv* recv = nullptr;        // the receive it completes, if any
  std::exception_ptr error;    // set when the receive it matched is wrong
  bool discard = false;        // its receive timed out: the rest is read and dropped
  transport::Clock::time_point lastProgress = transport::Clock::now();
};

P2PEngine::P2PEngine(transport::Window& window, size_t directMin)
    : w_(window), rank_(window.rank()), directMin_(window.canReadPeers() ? directMin : 0),
      sends_(window.size()), incoming_(window.size()) {
  for (int r = 0; r < window.size(); ++r) ringMu_.push_back(std::make_unique<std::mutex>());
  thread_ = std::thread([this] { loop(); });
  named(thread_, "braid-p2p");
}

P2PEngine::~P2PEngine() { shutdown(); }

void P2PEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  w_.notifyActivity();
  if (thread_.joinable()) thread_.join();
}

void P2PEngine::postSend(int dst, int64_t tag, const void* data, size_t bytes,
                         transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
                         Done done, bool completeHere) {
  auto s = std::make_unique<Send>();
  const bool direct = directMin_ && bytes >= directMin_ && deadline == Clock::time_point::max();
  *s = Send{dst, tag, static_cast<const uint8_t*>(data), bytes,
            Frame{kFrameMagic, direct ? kDirect : kEager, tag, bytes,
                  reinterpret_cast<uintptr_t>(data), 0},
            0, deadline, timeout, std::move(done), {}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    BRAID_ENFORCE(!stop_, "send", rank_, "the group was shut down");
    if (direct) s->frame.id = nextId_++;
    // sendHere leaves `s` empty when it queued the rest of it.
    const bool wroteHere = !direct && sendHere(s);
    if (!wroteHere) {
      newSends_.push_back(std::move(s));
    } else if (s && !completeHere) {
      writtenHere_.push_back(std::move(s));  // the engine runs its callback
    }
  }
  if (!s) {  // the engine sends it, or the rest of it, or completes it
    w_.notifyActivity();
    return;
  }
  // All of it is in the ring: done, outside mu_ (not runDone: inCallback_
  // is the engine thread's).
  auto finished = std::move(s->done);
  if (finished) finished(nullptr, rank_);
}

// Note [Sends from the posting thread]
// A send handed to the engine costs a wake-up of this rank's engine thread
// before its bytes reach the ring, and then the receiver's: on a busy host
// the first one is as slow as the second. When nothing is queued ahead of it
// to the same rank, the posting thread writes the message into the ring
// itself (ringMu_ orders it with the engine's writes). When it all fit, a
// caller without a completion callback (`completeHere`: ShmTransport's
// requests without one) has it completed there; any other send is completed
// by the engine (writtenHere_), since callbacks run on the engine's thread:
// its bytes no longer wait for that wake-up, only its completion does. What
// does not fit is left to the engine, from where the poster stopped. Called
// with mu_ held, so no send to `dst` is waiting in newSends_ unseen. True
// when it wrote `s`, all of it (`s` is kept, to be completed) or part (`s` is
// queued to the engine).
bool P2PEngine::sendHere(std::unique_ptr<Send>& s) {
  const int dst = s->dst;
  for (auto& q : newSends_) {
    if (q->dst == dst) return false;
  }
  std::lock_guard<std::mutex> ring(*ringMu_[dst]);
  if (!sends_[dst].empty()) return false;
  if (!writeSome(*s)) sends_[dst].push_back(std::move(s));
  return true;
}

bool P2PEngine::writeSome(Send& s) {
  auto& ch = w_.to(s.dst);
  const size_t total = s.ringBytes();
  const size_t head = frameBytes(s.frame.kind), before = s.pos;
  while (s.pos < total) {
    size_t n;
    if (s.pos < head) {
      n = ch.writeQuiet(reinterpret_cast<const uint8_t*>(&s.frame) + s.pos, head - s.pos);
    } else {
      n = ch.writeQuiet(s.data + (s.pos - head), total - s.pos);
    }
    if (n == 0) break;
    s.pos += n;
  }
  if (s.pos != before) ch.wakeReader();  // once per message (or per ring's worth)
  return s.pos == total;
}

void P2PEngine::postRecv(int src, int64_t tag, void* data, size_t bytes,
                         transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
                         Done done) {
  auto r = std::make_unique<Recv>();
  *r = Recv{src, tag, static_cast<uint8_t*>(data), bytes, deadline, timeout, std::move(done)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    BRAID_ENFORCE(!stop_, "recv", rank_, "the group was shut down");
    newRecvs_.push_back(std::move(r));
  }
  w_.notifyActivity();
}


void P2PEngine::forget(Recv* r) {
  recvs_.remove_if([r](const std::unique_ptr<Recv>& p) { return p.get() == r; });
}

void P2PEngine::complete(Send& s, std::exception_ptr e) {
  auto done = std::move(s.done);
  runDone(inCallback_, done, e, rank_);
}

void P2PEngine::complete(Recv& r, std::exception_ptr e, int source) {
  auto done = std::move(r.done);
  runDone(inCallback_, done, e, source);
}

bool P2PEngine::progressSends() {
  bool moved = false;
  std::vector<std::unique_ptr<Send>> sent;  // completed once ringMu_ is released
  for (int dst = 0; dst < static_cast<int>(sends_.size()); ++dst) {
    std::lock_guard<std::mutex> ring(*ringMu_[dst]);
    auto& q = sends_[dst];
    while (!q.empty()) {
      Send& s = *q.front();
      const size_t before = s.pos;
      const bool all = writeSome(s);
      moved |= s.pos != before;
      if (!all) break;  // ring full: try again when the peer reads
      if (s.frame.kind == kDirect) {
        const uint64_t id = s.frame.id;
        awaiting_[id] = std::move(q.front());  // completes on its kDone
      } else {
        sent.push_back(std::move(q.front()));
      }
      q.pop_front();
    }
  }
  for (auto& s : sent) complete(*s, nullptr);
  return moved;
}

bool P2PEngine::matchUnexpected(Recv& r) {
  auto fits = [&](const Incoming& m) {
    return !m.recv && (r.src == kAnySource || r.src == m.src) && m.frame.tag == r.tag;
  };
  auto sizeError = [&](const Incoming& m) {
    return std::make_exception_ptr(Error(errorText("recv", rank_, "rank ", m.src, " sent ",
                                                   m.frame.bytes, " bytes with tag ", r.tag,
                                                   ", this rank expects ", r.bytes, " bytes")));
  };
  // A receive posted while the thread was stalled may be past its deadline
  // already: failExpired fails it (Note [A stalled progress thread]).
  if (transport::Clock::now() >= r.deadline) return false;
  // Complete messages first: they arrived before any still streaming in.
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    Incoming& m = **it;
    if (!fits(m)) continue;
    if (m.frame.kind == kDirect) {
      readInPlace(m, r, m.frame.bytes != r.bytes ? sizeError(m) : nullptr);
    } else if (m.frame.bytes != r.bytes) {
      complete(r, sizeError(m), m.src);
    } else {
      if (r.bytes) std::memcpy(r.data, m.buf.data(), r.bytes);
      complete(r, nullptr, m.src);
    }
    unexpected_.erase(it);
    return true;
  }
  for (auto& cur : incoming_) {
    if (!cur || !cur->framed || !fits(*cur)) continue;
    if (cur->frame.bytes != r.bytes) cur->error = sizeError(*cur);
    cur->recv = &r;  // copied out of the buffer when the rest arrives
    r.matched = true;
    return false;    // keep r posted until then
  }
  return false;
}

bool P2PEngine::progressIncoming(int src) {
  auto& ch = w_.from(src);
  bool moved = false;
  for (;;) {
    auto& cur = incoming_[src];
    if (!cur) {
      if (ch.readable() == 0) return moved;
      cur = std::make_unique<Incoming>();
      cur->src = src;
    }
    Incoming& m = *cur;
    if (!m.framed) {
      const size_t before = m.frameGot;
      const bool framed = readFrame(ch, m);
      moved |= m.frameGot != before;
      if (!framed) return moved;
      if (m.frame.kind == kDone) {
        finishDirect(src, m.frame.id);
        cur.reset();
        continue;
      }
      // Match against posted receives, oldest first. One past its deadline is
      // failed by failExpired, not filled: its caller may have given it up
      // (Note [A stalled progress thread]).
      const auto now = transport::Clock::now();
      for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
        Recv& r = **it;
        if (r.matched || (r.src != kAnySource && r.src != src) || r.tag != m.frame.tag) continue;
        if (now >= r.deadline) continue;
        if (r.bytes == m.frame.bytes) {
          m.target = r.data;
          m.recv = &r;
          r.matched = true;
        } else {
          m.error = std::make_exception_ptr(Error(errorText(
              "recv", rank_, "rank ", src, " sent ", m.frame.bytes, " bytes with tag ",
              m.frame.tag, ", this rank expects ", r.bytes, " bytes")));
          m.recv = &r;
          r.matched = true;
        }
        break;
      }
      if (m.frame.kind == kDirect) {
        std::unique_ptr<Incoming> done = std::move(cur);
        if (!done->recv) {
          unexpected_.push_back(std::move(done));
          continue;
        }
        Recv* r = done->recv;
        readInPlace(*done, *r, done->error);
        forget(r);
        continue;
      }
      if (!m.target) {
        m.buf.resize(m.frame.bytes);
        m.target = m.buf.data();
      }
    }
    while (m.got < m.frame.bytes) {
      size_t n;
      if (m.discard) {
        scratch_.resize(64 << 10);
        n = ch.read(scratch_.data(), std::min(scratch_.size(), m.frame.bytes - m.got));
      } else {
        n = ch.read(m.target + m.got, m.frame.bytes - m.got);
      }
      if (n == 0) return moved;
      m.got += n;
      m.lastProgress = transport::Clock::now();
      moved = true;
    }
    std::unique_ptr<Incoming> done = std::move(cur);
    if (done->recv && done->target != done->buf.data()) {
      Recv* r = done->recv;
      complete(*r, done->error, src);
      forget(r);
    } else if (done->recv) {
      Recv* r = done->recv;
      if (!done->error && r->bytes) std::memcpy(r->data, done->buf.data(), r->bytes);
      complete(*r, done->error, src);
      forget(r);
    } else if (!done->discard) {
      unexpected_.push_back(std::move(done));
    }
  }
}

bool P2PEngine::readFrame(ByteChannel& ch, Incoming& m) {
  for (;;) {
    // The kind is known once the eager frame's 24 bytes are in.
    const size_t want = m.frameGot < kEagerFrameBytes ? kEagerFrameBytes : frameBytes(m.frame.kind);
    if (m.frameGot == want) break;
    size_t n = ch.read(reinterpret_cast<uint8_t*>(&m.frame) + m.frameGot, want - m.frameGot);
    if (n == 0) return false;
    m.frameGot += n;
    m.lastProgress = transport::Clock::now();
    if (m.frameGot == kEagerFrameBytes) {
      BRAID_ENFORCE(m.frame.magic == kFrameMagic && m.frame.kind <= kDone, "recv", rank_,
                    "corrupt message from rank ", m.src);
    }
  }
  m.framed = true;
  return true;
}

void P2PEngine::readInPlace(const Incoming& m, Recv& r, std::exception_ptr error) {
  const int src = m.src;
  if (!error && r.bytes) {
    std::string why;
    try {
      WaitContext ctx;
      ctx.op = "recv";
      w_.readPeer(src, m.frame.addr, r.data, r.bytes, ctx);
    } catch (const std::exception& x) {
      why = x.what();
    }
    // A sender that left may have handed its buffer back during the read.
    std::string gone;
    if (w_.peerGone(src, &gone)) {
      error = std::make_exception_ptr(PeerLostError(errorText(
          "recv", rank_, gone, " while this rank read its message with tag ", m.frame.tag)));
    } else if (!why.empty()) {
      error = std::make_exception_ptr(Error(errorText(
          "recv", rank_, "reading rank ", src, "'s message with tag ", m.frame.tag, " (",
          r.bytes, " bytes) from its memory failed: ", why)));
    }
  }
  answerDone(src, m.frame.id);
  complete(r, error, src);
}

// Ahead of the sends to `src` that have not started: the sender's buffer is
// held until it comes.
void P2PEngine::answerDone(int src, uint64_t id) {
  auto s = std::make_unique<Send>();
  s->dst = src;
  s->frame = Frame{kFrameMagic, kDone, 0, 0, 0, id};
  s->deadline = Clock::time_point::max();
  std::lock_guard<std::mutex> ring(*ringMu_[src]);
  auto& q = sends_[src];
  auto at = q.begin();
  if (at != q.end() && (*at)->pos > 0) ++at;
  q.insert(at, std::move(s));
}

void P2PEngine::finishDirect(int dst, uint64_t id) {
  auto it = awaiting_.find(id);
  // Not there: failExpired failed it already, because `dst` left the group
  // after it answered (and a rank that left is not heard from again).
  if (it == awaiting_.end() || it->second->dst != dst) return;
  std::unique_ptr<Send> s = std::move(it->second);
  awaiting_.erase(it);
  complete(*s, nullptr);
}

void P2PEngine::failExpired() {
  auto now = transport::Clock::now();
  std::string why;
  // Completed once ringMu_ is released; a started one stays queued.
  std::vector<std::pair<std::unique_ptr<Send>, std::exception_ptr>> failed;
  std::vector<std::pair<Send*, std::exception_ptr>> timedOut;
  for (int dst = 0; dst < static_cast<int>(sends_.size()); ++dst) {
    std::lock_guard<std::mutex> ring(*ringMu_[dst]);
    auto& q = sends_[dst];
    const bool gone = !q.empty() && w_.peerGone(dst, &why);
    for (auto it = q.begin(); it != q.end();) {
      Send& s = **it;
      if (!gone && now < s.deadline) {
        ++it;
        continue;
      }
      if (gone) {
        failed.emplace_back(std::move(*it), std::make_exception_ptr(PeerLostError(errorText(
                                                "send", rank_, why, " before receiving tag ", s.tag))));
        it = q.erase(it);
        continue;
      }
      const bool started = s.pos > 0;
      if (started) {
        // Note [Started messages]
        // Part of this message is in the ring, and
        // the peer would read the next frame as its payload. The caller gets
        // its error and may reuse or free its buffer (completing may drop the
        // last reference to it), so the rest goes from a copy made first.
        s.rest.assign(s.data, s.data + s.bytes);
        s.data = s.rest.data();
        s.deadline = transport::Clock::time_point::max();
      }
      auto e = std::make_exception_ptr(TimeoutError(
          errorText("send", rank_, "Timed out after ", s.timeout.count(),
                    " ms waiting for rank ", dst, " to receive tag ", s.tag)));
      if (!started) {
        failed.emplace_back(std::move(*it), e);
        it = q.erase(it);
        continue;
      }
      timedOut.emplace_back(&s, e);
      ++it;
    }
  }
  for (auto& [s, e] : failed) complete(*s, e);
  for (auto& [s, e] : timedOut) complete(*s, e);
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    Send& s = *it->second;
    if (!w_.peerGone(s.dst, &why)) {
      ++it;
      continue;
    }
    complete(s, std::make_exception_ptr(PeerLostError(
                    errorText("send", rank_, why, " before reading tag ", s.tag))));
    it = awaiting_.erase(it);
  }
  // A receive attached to a message still arriving fails when the sender is
  // gone; a sender that is alive always finishes (Note [Started messages]).
  for (int src = 0; src < static_cast<int>(incoming_.size()); ++src) {
    if (!incoming_[src] || !w_.peerGone(src, &why)) continue;
    progressIncoming(src);  // what the peer wrote before it left
    std::unique_ptr<Incoming> cut = std::move(incoming_[src]);
    if (!cut || !cut->recv) continue;
    Recv* r = cut->recv;
    complete(*r,
             std::make_exception_ptr(PeerLostError(errorText(
                 "recv", rank_, why, " in the middle of a message with tag ", cut->frame.tag,
                 " (", cut->got, " of ", cut->frame.bytes, " bytes received)"))),
             src);
    forget(r);
  }
  // A receive attached to a message that stopped arriving from a sender that
  // is alive: its progress thread is stuck (Note [A stalled progress thread]).
  // It times out once past its deadline with no byte for a whole timeout; the
  // rest of the message, if it ever comes, is read and dropped.
  for (int src = 0; src < static_cast<int>(incoming_.size()); ++src) {
    Incoming* cur = incoming_[src].get();
    if (!cur || !cur->recv) continue;
    Recv* r = cur->recv;
    if (now < r->deadline || now - cur->lastProgress < r->timeout) continue;
    cur->discard = true;
    cur->recv = nullptr;
    complete(*r,
             std::make_exception_ptr(TimeoutError(errorText(
                 "recv", rank_, "Timed out after ", r->timeout.count(), " ms waiting for rank ",
                 src, " to go on with a message with tag ", cur->frame.tag, " (", cur->got,
                 " of ", cur->frame.bytes, " bytes received)"))),
             src);
    forget(r);
  }
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    Recv& r = **it;
    std::string msg;
    const bool gone = !r.matched && r.src != kAnySource && w_.peerGone(r.src, &why);
    if (gone) {
      msg = errorText("recv", rank_, why, " before sending tag ", r.tag);
    } else if (!r.matched && now >= r.deadline) {
      msg = errorText("recv", rank_, "Timed out after ", r.timeout.count(), " ms waiting for ",
                      r.src == kAnySource ? std::string("any rank")
                                          : strCat("rank ", r.src),
                      " (tag ", r.tag, ")");
    }
    if (msg.empty()) {
      ++it;
      continue;
    }
    complete(r,
             gone ? std::make_exception_ptr(PeerLostError(msg))
                  : std::make_exception_ptr(TimeoutError(msg)),
             r.src);
    it = recvs_.erase(it);
  }
}

void P2PEngine::loop() {
  auto lastCheck = transport::Clock::now();
  std::string fatal;
  for (;;) {
    uint32_t epoch = w_.activityEpoch();
    bool stop;
    std::vector<std::unique_ptr<Recv>> posted;
    std::vector<std::unique_ptr<Send>> written;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop = stop_;
      written.swap(writtenHere_);
      for (auto& s : newSends_) {
        std::lock_guard<std::mutex> ring(*ringMu_[s->dst]);
        sends_[s->dst].push_back(std::move(s));
      }
      newSends_.clear();
      posted.swap(newRecvs_);
    }
    try {
      // Outside the lock: a match completes the receive, and its callback may
      // post the next op. Sends the posters wrote whole first: a later send
      // to the same rank went into the ring after them.
      for (auto& s : written) complete(*std::exchange(s, nullptr), nullptr);
      for (auto& r : posted) {
        if (!matchUnexpected(*r)) recvs_.push_back(std::move(r));
      }
      if (stop) break;
      bool moved = progressSends();
      for (int src = 0; src < static_cast<int>(incoming_.size()); ++src) {
        moved |= progressIncoming(src);
      }
      auto now = transport::Clock::now();
      if (now - lastCheck > std::chrono::milliseconds(20)) {
        failExpired();
        lastCheck = now;
      }
      if (!moved) w_.waitActivity(epoch, kIdleSleep);
    } catch (const std::exception& e) {
      // Nothing may escape this thread (std::terminate): a corrupt stream or
      // a throwing callback fails every pending and later op instead.
      fatal = e.what();
      for (auto& r : posted) {
        if (r) recvs_.push_back(std::move(r));
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : written) {
        if (w) writtenHere_.push_back(std::move(w));
      }
      stop_ = true;
      break;
    }
  }
  auto err = [&](const char* op) {
    return std::make_exception_ptr(
        Error(fatal.empty() ? errorText(op, rank_, "the group was shut down") : fatal));
  };
  for (auto& q : sends_) {
    for (auto& s : q) complete(*s, err("send"));
  }
  // Their receivers must not read them once handed back (Note [Messages read
  // in place]): they see this rank gone first.
  if (!awaiting_.empty()) w_.markClosed();
  for (auto& [id, s] : awaiting_) complete(*s, err("send"));
  for (auto& r : recvs_) complete(*r, err("recv"), r->src);
  std::vector<std::unique_ptr<Send>> late;  // all of each is in the ring
  {
    std::lock_guard<std::mutex> lock(mu_);
    late.swap(writtenHere_);
  }
  for (auto& s : late) complete(*s, nullptr);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : newSends_) complete(*s, err("send"));
  for (auto& r : newRecvs_) complete(*r, err("recv"), r->src);
}

}  // namespace shm
}  // namespace transport
}  // namespace braid
