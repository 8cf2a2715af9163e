// A Window connects the ranks of one group through memory that every rank can
// read and its owner writes, with one published step counter per rank.
//
// Note [Step protocol]
// Every collective is a sequence of steps, numbered identically on every rank.
// In step t a rank (1) writes its slot t % kSlots (control area + data),
// (2) publishes t, (3) waits until the peers it needs have published t, and
// (4) reads their slots for step t. A rank finishes reading step-t data
// before it publishes step t+1, so once a peer has published t+1 it is done
// with every slot of step t. Before writing slot t % kSlots again (at step t + kSlots) a
// rank therefore waits until all peers have published t + 1 (beginStep): with
// kSlots = 2 this costs nothing in the common case, since the previous step
// already waited for everyone. No trailing barrier is ever needed, and a rank
// can run one step ahead of a slow peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace braid {
namespace transport {

using Clock = std::chrono::steady_clock;

// What a wait is for, so that a failure can say it.
struct WaitContext {
  const char* op = "op";       // e.g. "allreduce"
  uint64_t opSeq = 0;          // the op's number in its group
  Clock::time_point deadline;  // when to give up
  std::chrono::milliseconds timeout{0};
};

// A single-producer single-consumer byte stream between two ranks, for
// point-to-point messages. Non-blocking: callers poll.
class ByteChannel {
 public:
  virtual ~ByteChannel() = default;
  virtual size_t write(const void* src, size_t n) = 0;  // returns bytes written
  // write() without waking the reader: a message written in pieces wakes it
  // once, with wakeReader(), when all that fits is in.
  virtual size_t writeQuiet(const void* src, size_t n) = 0;
  virtual void wakeReader() = 0;
  virtual size_t read(void* dst, size_t n) = 0;         // returns bytes read
  virtual size_t readable() const = 0;
  virtual size_t capacity() const = 0;
};

class Window {
 public:
  static constexpr int kSlots = 2;

  virtual ~Window() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual size_t slotBytes() const = 0;     // data bytes per slot
  virtual size_t controlBytes() const = 0;  // control bytes per slot

  virtual uint8_t* data(int rank, uint64_t step) = 0;
  virtual uint8_t* control(int rank, uint64_t step) = 0;

  // Note [Bytes beside the step counter]
  // kLineBytes bytes in the cache line of `rank`'s step counter, or nullptr
  // where the window has none. Only the owner writes its own, before it
  // publishes the step they belong to; a peer reads them once it has seen
  // that step. A waiter then gets the step and a small payload (the tree
  // allreduce's partial or result, collectives/shm/tree.h) in one cache-line
  // transfer. Whoever uses them must know that no peer still reads the bytes
  // of an earlier step when it writes them again: the window cannot tell.
  static constexpr size_t kLineBytes = 56;
  virtual uint8_t* lineBytes(int rank) {
    (void)rank;
    return nullptr;
  }

  virtual uint64_t published(int rank) const = 0;
  virtual void publish(uint64_t step) = 0;
  // Waits until `peer` has published `step` or later. Throws TimeoutError
  // (naming the missing rank), or Error when the peer died or left, or when
  // the window was aborted.
  virtual void wait(int peer, uint64_t step, const WaitContext& ctx) = 0;
  // Waits until every rank has published `step`; a timeout names all missing.
  virtual void waitAll(uint64_t step, const WaitContext& ctx) = 0;

  // Point-to-point streams: to(peer) is written by this rank and read by
  // peer; from(peer) is the reverse.
  virtual ByteChannel& to(int peer) = 0;
  virtual ByteChannel& from(int peer) = 0;
  // A poller reads activityEpoch(), tries its channels, and when nothing
  // moved sleeps in waitActivity until a peer writes to or reads from one of
  // this rank's channels (or maxWait passes).
  virtual uint32_t activityEpoch() = 0;
  virtual void waitActivity(uint32_t epoch, std::chrono::microseconds maxWait) = 0;
  // Wakes this rank's own poller (after posting it new work).
  virtual void notifyActivity() = 0;
  // Whether `peer` is gone (exited or closed the group); for pollers.
  virtual bool peerGone(int peer, std::string* why) = 0;

  // Single-copy reads from a peer's private memory (cross-memory attach),
  // when every rank of the group may read every other's (probed at
  // creation; BRAID_SHM_CMA=0 turns it off). See Note [Direct transfers].
  virtual bool canReadPeers() const = 0;
  // Copies `bytes` at `remoteAddr` in `peer`'s address space to `dst`.
  // Throws braid::Error naming op and rank on failure.
  virtual void readPeer(int peer, uint64_t remoteAddr, void* dst, size_t bytes,
                        const WaitContext& ctx) = 0;

  // Makes every current and future wait throw; for shutdown.
  virtual void abort() = 0;
  // Tells peers this rank left the group (they fail instead of timing out).
  virtual void markClosed() = 0;
  // Tells peers this rank gave up on the group after an error (`why`): their
  // waits on it fail at once with `why`, instead of timing out naming this
  // rank (Note [A rank that gives up]). The first call wins.
  virtual void giveUp(const std::string& why) = 0;
};

}  // namespace transport
}  // namespace braid
