// The data path between this rank and one peer: its sockets, the queue of
// sends that they stripe, and the matching of received messages to posted
// receives. Everything here runs on the progress thread.
//
// Note [TCP matching and buffering]
// The sender numbers its messages to each peer (seq). The receiver learns a
// message from the first of its frames to arrive, on any socket, and matches
// messages strictly in seq order, each to the first posted receive with its
// tag (MPI's non-overtaking rule). A frame of a message beyond the next one to
// match waits on its socket (the socket stops being read) until the earlier
// ones are known; no deadlock, because the sender hands out every message's
// first chunk before the next message's, so the next message's first frame
// is never behind a waiting frame on its socket. A message with no receive
// yet is unexpected: it is buffered whole when the group's budget
// (BRAID_TCP_UNEXPECTED_BYTES, shared by all peers) has room, else its
// socket waits until a receive is posted (TCP flow control then stops the
// sender), as MPI's rendezvous protocol would. Frames of a matched message go
// straight into the receive's buffer at their offsets.
// A receive posted while its message is still arriving takes the message
// over: the bytes buffered so far are copied into it, the buffer is freed,
// and the remaining frames go straight into the receive. Ranks of a ring
// often post a receive a few microseconds after the peer's first frame
// lands, and buffering the rest of a 32 MiB message cost an extra
// allocation, page faults and copy (2-rank allreduce of 64 MiB across
// hosts: see Pair::adopt).
//
// Note [Messages that outlive their sender]
// A rank that finished its last op closes its sockets at once, and its last
// messages may still wait at the receiver for their receives: a small op's
// data travels behind its header (Note [Eager data]) and is taken only once
// the headers were checked. So when the peer closed every socket cleanly
// (between frames), the messages that arrived whole stay, and receives
// posted later still take them; only a receive with nothing left to match
// fails, naming the peer. Before, the pair dropped them and the slower rank
// failed its last op with "closed the connection" (1 run in 15 of 50 small
// allreduces across two hosts, when the data's socket was read before the
// header's). A peer that breaks off (a reset, a frame cut short, a goodbye)
// still fails everything at once.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/transport.h"

namespace braid {
namespace transport {
namespace tcp {

struct SendOp {
  std::shared_ptr<Request> req;
  const uint8_t* data;
  uint64_t bytes, tag, seq = 0;
  uint64_t assigned = 0, written = 0;  // bytes handed to sockets, bytes written
  bool started = false;
};

struct RecvOp {
  std::shared_ptr<Request> req;
  uint8_t* data;
  uint64_t bytes, tag;
};

struct InMsg {
  InMsg(uint64_t s, uint64_t t, uint64_t n) : seq(s), tag(t), total(n) {}
  uint64_t seq, tag, total;
  uint64_t claimed = 0, arrived = 0;  // bytes of frames seen, bytes read
  std::shared_ptr<RecvOp> recv;       // its receive, once matched
  // Unexpected: its bytes (budget allowing). Not zeroed: only the pages that
  // frames reach are ever touched.
  std::unique_ptr<uint8_t[]> buf;
  std::vector<std::pair<uint64_t, uint64_t>> bufFrames;  // (offset, bytes) read into buf
  bool buffered = false;
  bool discard = false;               // its receive failed: bytes are dropped
};

// One socket. While connecting or authenticating it sits in the transport's
// pending list; once authenticated it belongs to its Pair.
struct Conn {
  int fd = -1;
  int peer = -1, index = -1;
  std::string address;  // the other end, for messages
  bool dialer = false, connecting = false, ready = false;
  bool holdsSlot = false;  // its pair's slot `index` is reserved for it
  bool inEpoll = false;
  std::unique_ptr<Handshake> hs;
  Clock::time_point deadline;
  uint32_t registered = 0;  // events registered with epoll
  // Write side: the frame being written.
  bool busy = false, wantWrite = false;
  uint8_t hdr[kFrameHeaderBytes];
  size_t hdrSent = 0, payloadSent = 0, payloadLen = 0;
  uint64_t chunkOffset = 0;
  std::shared_ptr<SendOp> op;
  // Read side: the frame being read.
  uint8_t rhdr[kFrameHeaderBytes];
  size_t rhave = 0;
  bool inPayload = false, stalled = false;
  bool eof = false;          // the peer closed it cleanly, between frames
  bool peerClosing = false;  // seen EPOLLRDHUP while stalled: buffer past the budget
  FrameHeader cur;
  InMsg* msg = nullptr;
  uint64_t left = 0;
  std::string goodbye;  // the peer's reason, as its goodbye frame arrives
  SocketOrder order{0};
};

// What the pairs of one transport share.
struct PairShared {
  int rank = 0;
  size_t chunkBytes = 0;
  size_t maxUnexpected = 0;
  size_t unexpectedBytes = 0;
  // A socket stopped reading for want of budget (Pair::onReadable), and
  // bytes were released since: retryMemoryWaiters() is due. Releases while
  // no socket waits set nothing, so that the common case (a small message
  // taken from the buffer) does not wake the progress thread.
  bool memoryWaiting = false;
  bool memoryFreed = false;
  // The request a driver waits on during its batch, and whether it is done:
  // then unexpected payloads stay in their sockets (Note [A driver done
  // leaves early data in the socket] in tcp/transport.h).
  const Request* driven = nullptr;
  bool drivenDone = false;
};

class Pair {
 public:
  enum class Slot { kEmpty, kDialing, kAccepting, kReady };

  Pair(PairShared& sh, int peer, int sockets);

  // Each returns "" or why the pair must fail (a socket or protocol error).
  std::string addSend(std::shared_ptr<SendOp> s);
  std::string addRecv(std::shared_ptr<RecvOp> r);
  // Hands `r` the first message with its tag that arrived and waits for a
  // receive; false (and `r` untouched) when there is none.
  bool matchArrived(std::shared_ptr<RecvOp>& r);
  std::string onWritable(Conn& c);
  std::string onReadable(Conn& c);
  // Retries sockets that wait for a receive, memory, or an earlier message.
  std::string retryStalled();
  // Whether no socket can deliver anything more (all closed by the peer, or
  // waiting behind an earlier message after the peer closed them).
  bool drained() const;
  // Whether any op with this peer is posted and not done.
  bool hasPending() const;
  // Fails every op with the pair and forgets buffered messages, except, with
  // `keepArrived`, those that arrived whole and wait for their receive (Note
  // [Messages that outlive their sender]).
  void failAll(std::exception_ptr e, bool keepArrived = false);

  const int peer;
  std::vector<Slot> slots;
  std::vector<std::unique_ptr<Conn>> conns;  // by socket index, once ready
  std::exception_ptr failed;
  bool activated = false;  // dials were started (eager, or lazily on first use)
  uint64_t nextSendSeq = 0;

 private:
  bool nextChunk(Conn& c);
  std::string readGoodbye(Conn& c);
  std::string pumpWrites();
  void deliverLocal(const SendOp& s);
  InMsg* locate(const FrameHeader& h, std::string* why);
  void match(InMsg& m);
  void adopt(InMsg& m);
  void finish(InMsg& m);
  void release(InMsg& m);
  // Completes a request that succeeded, noting whether it is the driver's.
  void succeed(Request& r);
  std::string sizeMismatch(const RecvOp& r, const InMsg& m) const;

  PairShared& sh_;
  std::deque<std::shared_ptr<SendOp>> sendq_;
  std::list<std::shared_ptr<RecvOp>> posted_;  // unmatched, posting order
  std::map<uint64_t, std::unique_ptr<InMsg>> msgs_;  // known, not yet delivered
  std::deque<InMsg*> unexpected_;                    // unmatched, seq order
  uint64_t nextMatch_ = 0;
  std::vector<uint8_t> scratch_;  // where discarded bytes go
  uint64_t progress_ = 0;         // bumped whenever matching state changes
};

}  // namespace tcp
}  // namespace transport
}  // namespace braid
