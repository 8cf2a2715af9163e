// The Communicator runs collectives for one group over a Window, one op at a
// time, on the thread that calls it (the backend's worker).
//
// Note [Op headers]
// The first step of every op carries a header: the op's kind, dtype, reduce
// op, root, shape and number, and the path it takes with the settings that
// chose that path or shape its steps (Note [Settings that shape an op] in
// plan.h). Every rank waits for every peer in that step
// and compares each peer's header with its own, so a mismatch (different
// shapes, dtypes, ops, roots, a different op at the same point, or a rank
// that failed its argument checks and sent a poison header) is seen by every
// rank at once: all of them throw after the same step, the step numbers stay
// aligned, and the group remains usable for the next op. The remaining steps
// of an op depend only on header fields that were found equal.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/shm/plan.h"
#include "collectives/shm/registered.h"
#include "common/error.h"
#include "common/types.h"
#include "transport/window.h"

namespace braid {
namespace collectives {

constexpr int kMaxDims = 8;

struct Shape {
  int32_t ndim = 0;
  int64_t dims[kMaxDims] = {0};
  std::string str() const;
  bool operator==(const Shape& o) const;
};

// What the ranks must agree on. count is the number of elements in each
// rank's block: the whole buffer for allreduce/broadcast/reduce, one rank's
// share for allgather/gather/scatter/reduce_scatter.
struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  DataType dtype = DataType::kUInt8;
  ReduceOp redop = ReduceOp::kSum;
  int root = 0;
  size_t count = 0;
  Shape shape;  // as the user passed it, for checks and messages
  // alltoall: bytes this rank sends to / receives from each rank (size() each)
  const uint64_t* sendBytes = nullptr;
  const uint64_t* recvBytes = nullptr;
  // Addresses of this rank's buffers, for peers' direct reads
  // (Note [Direct transfers]): the input (or the root's buffer) and output,
  // and, for ops with one buffer per peer, one address per rank.
  uint64_t inAddr = 0;
  uint64_t outAddr = 0;
  std::vector<uint64_t> peerAddrs;
  // Allreduce only (Note [Allreduce on a narrower wire] in collectives.h):
  // when wireDivisor > 0 the float32 buffer's values, divided by it, travel
  // and are summed as `wire` values (kFloat16 or kBFloat16).
  DataType wire = DataType::kFloat32;
  float wireDivisor = 0.f;
  bool narrowed() const { return wireDivisor > 0.f; }
  // Note [Adopting a repeated buffer] (c10d/buffer_adoption.h): this rank
  // offers to move the op's buffer into registered memory after the op. Not
  // compared between ranks: the buffer moves only where every rank offered
  // (Communicator::everyRankOffered).
  bool offersBuffer = false;
  // Set when this rank failed the op's argument checks: the op then only
  // tells the peers (see Note [Op headers]) and throws this message.
  std::string localError;
  transport::Clock::time_point deadline = transport::Clock::time_point::max();
  std::chrono::milliseconds timeout{0};

  size_t bytes() const { return count * elementSize(dtype); }
};

class Communicator {
 public:
  // cfg: the group's settings; by default read from the environment, now
  // (Note [Settings that shape an op]). Throws on invalid values.
  // Control bytes per slot that a window for `size` ranks must offer (the
  // op header and the per-rank tables): WindowOptions::controlBytes.
  static size_t controlBytesFor(int size);

  explicit Communicator(std::unique_ptr<transport::Window> window,
                        std::optional<CollectiveConfig> cfg = std::nullopt);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  transport::Window& window() { return *window_; }
  uint64_t opCount() const { return opSeq_; }
  const CollectiveConfig& config() const { return cfg_; }
  GroupLimits limits() const {
    return {window_->slotBytes(), window_->canReadPeers(), window_->lineBytes(rank_) ? size_ : 0};
  }
  // The algorithm for `kind` with `bytes` per rank: see plan() in plan.h.
  Algo plan(OpKind kind, size_t bytes, bool registered = false) const {
    return collectives::plan(kind, bytes, cfg_, limits(), registered);
  }
  // This rank's registered regions and its mappings of the peers' (Note
  // [Registered buffers]); shared with the tensors that free them.
  const std::shared_ptr<RegionTable>& regions() const { return regions_; }

  // ---- scaffolding for the algorithm files --------------------------------
  // Starts an op: numbers it and sets the context used in error messages.
  void beginOp(const OpDesc& op);
  // The next step; waits until this rank's slot for it is free again.
  uint64_t nextStep();
  uint8_t* slot(int rank, uint64_t step) { return window_->data(rank, step); }
  size_t slotBytes() const { return window_->slotBytes(); }
  // Bytes per chunk of pipelined collectives (at most slotBytes()). See
  // Note [Chunk size and direct reads].
  size_t chunkBytes() const { return chunkBytes_; }
  // First step of an op: write the header (before or after the data), then
  // exchange() publishes, waits for all and checks. Throws on any mismatch.
  // `algo` is the path this rank takes (Note [Settings that shape an op]).
  void writeHeader(const OpDesc& op, uint64_t step, Algo algo);
  void exchange(const OpDesc& op, uint64_t step);
  // An op whose first step carries the header alone: beginOp, then the
  // header step (write, exchange, check). Returns that step's number.
  uint64_t headerStep(const OpDesc& op, Algo algo);
  // A pipelined op's chunk step: the first one carries the header (exchange,
  // which throws on every rank if any header differs), the others publish
  // and wait for every peer.
  void chunkStep(const OpDesc& op, uint64_t step, bool first) {
    if (first) {
      exchange(op, step);
    } else {
      publish(step);
      waitAll(step);
    }
  }
  void publish(uint64_t step) { window_->publish(step); }
  void waitAll(uint64_t step) { window_->waitAll(step, ctx_); }
  void wait(int peer, uint64_t step) { window_->wait(peer, step, ctx_); }
  // Calls visit(r) once for every rank r (this one included) that has
  // published `step`, in the order they get there (Note [Arrival order]).
  template <class F>
  void inArrivalOrder(uint64_t step, F&& visit);
  // ---- the tree (Note [Tree allreduce] in tree.h) ---------------------------
  // Takes the two steps of a tree op (gather, release); returns the first.
  // Waits for every peer only where the flat rule needs it (Note [Tree slots]).
  uint64_t treeSteps();
  // A tree op that ended well at its release step `s`: the next tree op may
  // reuse the slots without waiting for every peer (Note [Tree slots]).
  void treeDone(uint64_t s) { afterTree_ = s; }
  // Bytes beside `rank`'s step counter (Note [Bytes beside the step counter]
  // in transport/window.h).
  uint8_t* line(int rank) { return window_->lineBytes(rank); }
  // Where a rank that found a tree op's error writes why, in the control
  // area of the op's first step: kTreeErrorBytes, NUL-terminated.
  static constexpr size_t kTreeErrorBytes = 512;
  char* treeErrorText(int rank, uint64_t step);
  // The root's release of the tree op whose release step is `step`: the
  // status beside its counter (0, or 1 + the rank that found an error; when
  // that is this rank, `why` goes to its treeErrorText), then the publish.
  void treeRelease(uint64_t step, uint64_t status, const std::string& why);
  // Writes `why` as this rank's treeErrorText of `step`.
  void setTreeError(uint64_t step, const std::string& why);
  // The path `rank` announced in `step`'s header.
  Algo algoIn(int rank, uint64_t step);
  // Compares `peer`'s header of `step` with this rank's; throws as exchange().
  void checkHeader(const OpDesc& op, int peer, uint64_t step) { checkPeer(op, peer, step); }

  // The largest alltoall send size any rank announced in `step`'s header.
  uint64_t maxAnnouncedBytes(uint64_t step);
  // Buffer addresses `rank` announced in `step`'s header.
  uint64_t inAddr(int rank, uint64_t step);
  uint64_t outAddr(int rank, uint64_t step);
  uint64_t peerAddr(int rank, uint64_t step, int which);

  // Copies from `peer`'s memory, for the current op.
  void readPeer(int peer, uint64_t addr, void* dst, size_t bytes) {
    window_->readPeer(peer, addr, dst, bytes, ctx_);
  }
  // Scratch memory of 2 * slotBytes() for this rank's private use.
  uint8_t* scratch() { return scratch_.data(); }

  // Breaks the group for good after an error that leaves ranks out of step
  // (a timeout, a dead peer): later ops fail at once with the first error.
  void markBroken(const std::string& why);
  const std::string& brokenReason() const { return broken_; }
  // Whether every rank's header of the current op had offersBuffer set (Note
  // [Adopting a repeated buffer]); the same on every rank once its header
  // step has passed, false before.
  bool everyRankOffered() const { return everyRankOffered_; }

 private:
  void checkPeer(const OpDesc& op, int peer, uint64_t step);
  // Note [Flat ranks among tree ranks] (tree.h): the release step of the
  // tree op that some peers run where this rank runs a flat one; then throws
  // what this rank found (or op.localError).
  [[noreturn]] void followTree(const OpDesc& op, uint64_t step);

  std::unique_ptr<transport::Window> window_;
  const int rank_;
  const int size_;
  uint64_t step_ = 0;
  uint64_t opSeq_ = 0;
  uint64_t afterTree_ = 0;  // release step of the tree op just before, if it ended well
  transport::WaitContext ctx_;
  std::string broken_;
  bool everyRankOffered_ = false;
  std::vector<int> arrivals_;  // inArrivalOrder's ranks still to come
  std::vector<uint8_t> scratch_;
  const CollectiveConfig cfg_;
  const size_t chunkBytes_;
  const std::shared_ptr<RegionTable> regions_;
};

// Buffer addresses as announced in headers, one per rank.
std::vector<uint64_t> addressesOf(const void* const* ptrs, int n);

// memcpy for buffers that may be null when empty (an empty tensor or
// vector): memcpy's pointers must be valid even when n == 0.
inline void copyBytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

// Splits `count` elements into `parts` nearly equal ranges whose starts are
// multiples of `align` elements; returns [begin, end) of part `i`.
void partition(size_t count, int parts, int i, size_t align, size_t* begin, size_t* end);

// Note [Arrival order]
// A step whose every rank copies pieces out of every rank's slot (the
// pipelined allreduce's second step, allgather's and alltoall's later
// chunks) need not wait for the last rank before it starts: it copies each
// piece as soon as its rank has published, so one late rank delays only the
// copy of its own piece, and the copies of the others overlap its lateness.
// Ranks already there are served in the staggered order of waitAll (from
// this rank up); when none is, it blocks on the first still missing with
// the window's own wait (the spin policy, timeouts and dead peers as
// everywhere). Reductions do not do this: they combine every rank's piece
// in rank order, so that every rank gets the same bits, and wait for all.
template <class F>
void Communicator::inArrivalOrder(uint64_t step, F&& visit) {
  arrivals_.clear();
  for (int i = 1; i <= size_; ++i) arrivals_.push_back((rank_ + i) % size_);
  while (!arrivals_.empty()) {
    size_t kept = 0;
    for (int r : arrivals_) {
      if (window_->published(r) >= step) {
        visit(r);
      } else {
        arrivals_[kept++] = r;
      }
    }
    arrivals_.resize(kept);
    if (kept > 0 && window_->published(arrivals_.front()) < step) {
      try {
        window_->wait(arrivals_.front(), step, ctx_);
      } catch (const TimeoutError&) {
        // Past the deadline: throws naming every rank still missing, or
        // returns if the last of them has just arrived.
        window_->waitAll(step, ctx_);
      }
    }
  }
}

}  // namespace collectives
}  // namespace braid
