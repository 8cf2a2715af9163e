// The collectives over a message Transport (transport/transport.h): one
// NetComm per group numbers the ops, derives their message tags, exchanges and
// checks the op headers, and turns transport failures into the group's errors.
// Ops run one at a time on the calling thread. See Note [Collectives over
// messages].
//
// Note [Collectives over messages]
// Tags. An op's messages carry tag (opSeq << 24) | step: the op's number in
// this group (every rank counts the same ops) and the step within the op (0 is
// the header exchange). The transport matches per source and tag in order, so
// a fast rank's messages of op k+1 wait in the transport until this rank posts
// op k+1's receives, and can never be taken by a receive of op k.
// Headers. Every op starts with a fixed-size exchange of headers (NetHeader in
// net_comm.cc: kind, dtype, reduce op, root, count, shape, the algorithm and
// the net settings that shape the steps, or a poison flag with a rank's
// argument error; alltoall adds every rank's send and receive sizes) from
// every rank to every other, before any data moves. Every rank compares every
// header with its own and, in the same order, the whole alltoall size matrix,
// so a mismatch fails every rank (if all headers equal mine, there is none),
// each having consumed exactly the op's header messages: the group stays
// usable. All-to-all costs n-1 messages per rank (n(n-1) in all) but one
// latency; gather-to-0 + verdict broadcast costs 2(n-1) messages but two
// latencies and a serial hop through rank 0. Groups across hosts are mostly
// the leaders of a few hosts (2-16), where the latency is what counts, and the
// exchange doubles as the barrier. Above a few hundred ranks a tree would be
// better; not needed for the hierarchy's leader groups. A group across hosts
// with several ranks per host sends its world's headers through its host
// and cross groups instead (a HeaderRelay, Note [Op headers across hosts]).
// Failures. A transport error (a peer lost, the op's deadline passed) leaves
// the ranks out of step: the NetComm names the op, this rank and the peer,
// marks the group broken (later ops fail at once with the first error),
// aborts the transport (so the peers fail fast with PeerLostError instead of
// waiting for their deadline) and waits for its pending requests to end
// before it throws, so the caller's buffers are free again. A timeout names
// the first request of the step still pending: in the header exchange the
// missing rank itself, in a ring step the left neighbour that is waiting in
// turn. Aborting ends the whole transport: one NetComm per transport group.
// Algorithms (net/collectives.h): allreduce is a ring reduce-scatter + ring
// allgather from BRAID_NET_ALLREDUCE_RING_MIN bytes (bandwidth-optimal: each
// rank sends 2(n-1)/n of the buffer; with two ranks the two run as one
// stream, Note [Two-rank allreduce]), and below it a direct exchange (every
// rank sends its whole input to every peer and reduces all n in rank order:
// one latency, the shm one-shot's bits); the threshold travels in the header.
// float16/bfloat16 SUM/AVG/PRODUCT rings carry their partial results as
// float32 (twice the bytes in the reduce-scatter half) and round once, as the
// shm path does (Note [Reduced-precision accumulation]); gloo's ring rounds at
// every hop. reduce_scatter and reduce use the same ring (reduce then sends
// each block to the root); broadcast is a binomial tree (log2(n) latencies),
// or from a few segments a pipelined chain (Note [Broadcast across hosts]);
// allgather is a ring; alltoall posts every receive, then
// the sends in pairwise order ((me + s) mod n); gather/scatter go straight
// to/from the root; barrier is the header exchange alone. Data of up to
// kInlineBytes per rank ride inside the headers instead, in one latency: an
// allreduce's, reduce's, allgather's and gather's inputs, a broadcast's root
// buffer (fitsInline, Note [Eager data]); blocks of up to kEagerMax of
// alltoall, scatter and gather follow their headers at once, before the
// check (beginEagerEach, beginEagerToRoot).
// What the hierarchy (collectives/hier, next) needs from this layer: an
// allreduce of one slice of the buffer per call, whose NetComm is either the
// leaders' group or one of several per-local-rank groups (one transport group
// per local rank, so the slices run over every local rank's sockets at once);
// buffers as raw pointers with counts per slice (a slice may be empty: the
// ring handles 0-element blocks); errors that name the op, rank and peer to
// wrap with the host; and the same op numbering across the shm and net
// stages, which is the hierarchy's to keep (each group numbers its own ops).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/shm/communicator.h"
#include "transport/transport.h"

namespace braid {
namespace collectives {
namespace net {

// The net settings that shape an op's steps (read once per group; compared in
// every header, Note [Settings that shape an op]).
struct NetConfig {
  uint64_t allreduceRingMin = 64 << 10;  // BRAID_NET_ALLREDUCE_RING_MIN
  // Set by the hierarchy (hier/hier_group.cc, BRAID_HIER_MIN_BYTES):
  // travels in the header so that ranks which would split differently fail.
  uint64_t hierMinBytes = 0;
  // BRAID_HIER_PIPELINE_BYTES (hier/hier_group.cc): the pieces the staged
  // ops pipeline (Note [Pipelined stages]); 0: one piece.
  uint64_t hierPieceBytes = 0;
  // The shared-memory settings of the hierarchy's host groups (set by it:
  // hier/hier_group.cc; zero elsewhere), compared for the kinds it stages:
  // host mates that differed on one that shapes a stage would fail in that
  // stage alone, while the other hosts waited for them in the next.
  CollectiveConfig local{0, 0, 0, 0, 0};
  // BRAID_NET_DRIVE_MIN_BYTES: ops that move at least this many bytes per
  // rank move them on the calling thread (NetComm::drive); -1: none. Not in
  // the header: it changes which thread works, not the steps.
  int64_t driveMinBytes = 1 << 20;
  // Throws an Error naming "init" and `rank` when a value is invalid.
  static NetConfig fromEnv(int rank);
};

// The kinds a hierarchy may run in stages (hier/hier_group.cc), from
// hierMinBytes in pieces of hierPieceBytes: their headers compare both.
bool hierStages(OpKind k);

// How an op moves its data. Values travel in headers.
enum class NetAlgo : uint32_t {
  kHeaderOnly = 1,  // barrier, or a rank that failed its argument checks
  kDirect,          // every rank straight to the ranks that need its data
  kRing,            // ring reduce-scatter and/or allgather
  kTree,            // binomial tree
  kPairwise,        // alltoall
  kHier,            // the header here, the data by the hierarchy's stages
  kHierDirect,      // a small allreduce riding on the hierarchy's header exchange
  kChain,           // pipelined chain (Note [Broadcast across hosts], broadcast.cc)
};
const char* netAlgoName(NetAlgo a);

// Carries a NetComm's header exchange another way than all-to-all over its
// transport: a group across hosts gathers the headers within each host and
// exchanges them between hosts (Note [Op headers across hosts] in
// hier/relay.cc). The check after it is the NetComm's, unchanged.
class HeaderRelay {
 public:
  virtual ~HeaderRelay() = default;
  // `all` holds size() headers of `hb` bytes in rank order, this rank's
  // filled in: fills every other rank's, by op's deadline. Throws a braid
  // Error; the NetComm then breaks the group, as for a lost peer.
  virtual void relay(const OpDesc& op, uint8_t* all, size_t hb) = 0;
};

class NetComm {
 public:
  explicit NetComm(transport::Transport& t, std::optional<NetConfig> cfg = std::nullopt);
  ~NetComm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const NetConfig& config() const { return cfg_; }
  uint64_t opCount() const { return opSeq_; }
  transport::Transport& transport() { return t_; }

  // Starts an op: numbers it, exchanges and checks headers (throws on a
  // mismatch, the group stays usable; throws op.localError on a rank that
  // failed its checks, after telling the peers; a reduction the kernels do
  // not support, kPremulSum included, fails the same way on every rank).
  void begin(const OpDesc& op, NetAlgo algo);
  // begin() that also sends op.bytes() of `eager` to every peer without
  // waiting for the check (Note [Eager data]): inside the header message up
  // to kInlineBytes, else on step 1 right behind it. Then, for each peer,
  // either inlineData(peer) points at its data or the caller posts its
  // step-1 receive; then wait()s.
  void beginEager(const OpDesc& op, NetAlgo algo, const void* eager);
  static constexpr size_t kInlineBytes = 256;
  // begin() that also sends, on step 1 without waiting for the check, each
  // peer p its own block to[p] of bytes[p] (alltoall, a scatter's root), for
  // every p with eagerPair(bytes[p]) (Note [Eager data]); null `to`: none.
  // The caller then posts every pair's step-1 receive as usual, and its sends
  // for the other pairs only; then wait()s.
  void beginEagerEach(const OpDesc& op, NetAlgo algo, const void* const* to,
                      const uint64_t* bytes);
  // begin() that also sends op.bytes() of `data` to op.root on step 1 when
  // eagerPair(op.bytes()) and this rank is not the root (a gather's blocks);
  // the root posts its step-1 receives, the others send nothing more.
  void beginEagerToRoot(const OpDesc& op, NetAlgo algo, const void* data);
  // Whether a block of `bytes` for one peer goes eagerly (Note [Eager data]).
  static bool eagerPair(uint64_t bytes) { return bytes > 0 && bytes <= kEagerMax; }
  static constexpr uint64_t kEagerMax = 64 << 10;
  // Whether eager data of up to kInlineBytes travel inline (the same on every
  // rank: not while headers go through a HeaderRelay).
  bool inlines() const { return !relay_; }
  // Whether op's data (op.bytes() per rank) ride inside the headers: the ops
  // that take this path then beginEager(op, NetAlgo::kDirect, data) on every
  // rank, with null data on a rank that has none to send.
  bool fitsInline(const OpDesc& op) const { return inlines() && op.bytes() <= kInlineBytes; }
  // Rank `r`'s eager data if it came inside its header (valid until the next
  // op), else null.
  const uint8_t* inlineData(int r) const;
  // Every rank's inline block of `bytes` into outs[r], this rank's from
  // `mine` (a gathered op that rode in the headers).
  void copyInlines(const void* mine, void* const* outs, size_t bytes) const;
  // Numbers an op whose agreement is checked elsewhere and posts nothing: a
  // HeaderRelay's own messages (Note [Op headers across hosts]).
  void beginUnchecked(const OpDesc& op) { start(op); }
  // From now on headers travel through `r` (not owned; null: all-to-all).
  void setRelay(HeaderRelay* r) { relay_ = r; }
  // Whether the headers of `ranks` in `all` (as HeaderRelay::relay's) pass
  // the check against this rank's, op's: the ranks run the same op, and it
  // passes the whole check unless a rank outside `ranks` differs.
  bool agree(const OpDesc& op, const uint8_t* all, size_t hb, const std::vector<int>& ranks);

  // Held for the whole of an op that moves at least driveMinBytes per rank
  // (declared before its begin()): the op's waits then move the transport's
  // bytes on this thread (Note [Waiters drive the sockets] in
  // transport/tcp/transport.h).
  transport::DriveScope drive(const OpDesc& op);

  // Posts step `step` of the current op; wait() waits for everything posted.
  // Messages of 0 bytes are not sent: both ends skip them (sizes are agreed).
  void send(int dst, uint32_t step, const void* data, size_t bytes);
  void recv(int src, uint32_t step, void* data, size_t bytes);
  void wait();
  // The number of ops posted since the last wait(), and a wait for the i-th
  // of them alone (for pipelines that use data as it arrives).
  size_t posted() const { return pending_.size(); }
  void waitPosted(size_t i);
  // Scratch memory of at least `bytes`, kept between ops (no page faults and
  // no zeroing on the common path). Valid until the next call.
  uint8_t* scratch(size_t bytes);
  // A second such buffer, apart from scratch(): an op's working copy of its
  // whole buffer (widened halves, a reduce's partials). Valid until the next call.
  uint8_t* workspace(size_t bytes);

  void markBroken(const std::string& why);
  const std::string& brokenReason() const { return broken_; }

 private:
  struct Pending {
    std::shared_ptr<transport::Request> req;
    int peer;
  };
  uint64_t tag(uint32_t step) const { return (opSeq_ << 24) | step; }
  [[noreturn]] void fail(const Pending& p, const char* kind, const std::string& text,
                         bool timeout, bool lost);
  // Breaks the group with `msg`, aborts the transport, waits out the pending
  // requests and throws msg as a timeout, a lost peer or an Error.
  [[noreturn]] void abandon(const std::string& msg, bool timeout, bool lost);
  // What a rank sends with its header (Note [Eager data]); travels in it.
  enum class EagerTo : uint32_t { kNone = 0, kEveryone, kRoot, kEach };
  struct Eager {
    EagerTo to = EagerTo::kNone;
    const void* data = nullptr;          // kEveryone, kRoot: op.bytes() of it
    const void* const* each = nullptr;   // kEach: each[p] to rank p ...
    const uint64_t* bytes = nullptr;     // ... bytes[p] of it, if eagerPair
  };
  // Posts the eager data for peer p (after its header message).
  void sendEager(const OpDesc& op, const Eager& e, int p, bool inlined);
  void relayHeaders(const OpDesc& op, uint8_t* all, size_t hb, const Eager& e);
  void allToAllHeaders(const OpDesc& op, uint8_t* all, size_t hb, const Eager& e, bool inlined);
  void exchangeHeaders(const OpDesc& op, NetAlgo algo, const Eager& e);
  // Throws at the first difference (Note [Collectives over messages]);
  // `only`: compares those ranks' headers alone (agree()).
  void checkHeaders(const OpDesc& op, const uint8_t* headers, size_t headerBytes,
                    const std::vector<int>* only = nullptr);
  void start(const OpDesc& op);
  void checkedExchange(const OpDesc& op, NetAlgo algo, const Eager& e);
  // After a failed check: takes the eager data that peers announced (so the
  // group stays in step), then returns.
  void consumeEager(const std::vector<uint8_t>& headers, size_t headerBytes);
  void waitOne(const Pending& p);

  transport::Transport& t_;
  const int rank_;
  const int size_;
  const NetConfig cfg_;
  std::vector<int> everyone_;  // 0 .. size() - 1, for checkHeaders
  uint64_t opSeq_ = 0;
  const char* opName_ = "";
  OpDesc cur_;
  std::vector<Pending> pending_;
  std::vector<uint8_t> scratch_, workspace_;
  // The header messages of the all-to-all exchange, each header followed by
  // its inline area (Note [Eager data]); kept between ops.
  std::vector<uint8_t> wire_;
  size_t wireStride_ = 0;
  std::vector<uint8_t> inlineFrom_;  // by rank: this op's eager data came inline
  std::string broken_;
  HeaderRelay* relay_ = nullptr;
};

}  // namespace net
}  // namespace collectives
}  // namespace braid
