#include "collectives/net/net_comm.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/settings.h"
#include "collectives/op_header.h"
#include "collectives/reduce_share.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {
namespace net {

// Compared in every header (Note [Settings that shape an op]).
BRAID_SETTING_INT(kRingMin, "BRAID_NET_ALLREDUCE_RING_MIN", 64 << 10,
                  "Bytes from which allreduce, reduce and reduce_scatter across hosts take the "
                  "ring (reduce-scatter + allgather); below, every rank sends its input straight "
                  "to the ranks that reduce it (one latency). Must be equal on every rank.");

// Local only (Note [Waiters drive the sockets] in transport/tcp/transport.h).
BRAID_SETTING_INT(kDriveMin, "BRAID_NET_DRIVE_MIN_BYTES", 1 << 20,
                  "Bytes per rank from which a collective across hosts moves its TCP bytes on "
                  "the calling thread, with the transport's progress thread parked, instead of "
                  "handing every message between the two; -1: never. Below it the hand-offs "
                  "cost less than parking the progress thread.");

namespace {

constexpr uint32_t kNetMagic = 0x6e686472;  // "nhdr"

// One rank's header as it travels (Note [Collectives over messages]); followed
// by 2 * size() uint64: alltoall's send sizes, then its receive sizes (zeros
// for other ops), so that every header of a group has the same size.
struct NetHeader {
  OpHeader op;  // compared by checkOpHeader (Note [Op headers])
  uint32_t algo;
  uint32_t eagerInline;  // the eager data are in the header message's inline area
  uint32_t eagerTo;      // NetComm::EagerTo: who gets eager data (Note [Eager data])
  uint32_t reserved;
  uint64_t ringMin;     // BRAID_NET_ALLREDUCE_RING_MIN
  uint64_t hierMin;     // BRAID_HIER_MIN_BYTES (hier/hier_group.cc)
  uint64_t hierPiece;   // BRAID_HIER_PIPELINE_BYTES (hier/hier_group.cc)
  uint64_t eagerBytes;  // kEveryone, kRoot: data that follow on step 1 (Note [Eager data])
  // NetConfig::local: the hierarchy's shared-memory settings.
  uint64_t allreduceOneShotMax, reduceOneShotMax, directMin, directOps, chunkSetting;
};

bool reduces(OpKind k) {
  return k == OpKind::kAllreduce || k == OpKind::kReduce || k == OpKind::kReduceScatter;
}

// Every reducing op chooses between the ring and the direct exchange by
// BRAID_NET_ALLREDUCE_RING_MIN.
bool usesRingMin(OpKind k) { return reduces(k); }

}  // namespace

bool hierStages(OpKind k) {
  return k == OpKind::kAllreduce || k == OpKind::kBroadcast || k == OpKind::kReduce ||
         k == OpKind::kAllgather || k == OpKind::kReduceScatter;
}

NetConfig NetConfig::fromEnv(int rank) {
  NetConfig c;
  int64_t v = kRingMin.get();
  if (v < 0) BRAID_THROW(Error, "init", rank, "BRAID_NET_ALLREDUCE_RING_MIN must be >= 0, got ", v);
  c.allreduceRingMin = static_cast<uint64_t>(v);
  c.driveMinBytes = kDriveMin.get();
  if (c.driveMinBytes < -1) {
    BRAID_THROW(Error, "init", rank, "BRAID_NET_DRIVE_MIN_BYTES must be >= -1, got ",
                c.driveMinBytes);
  }
  return c;
}

const char* netAlgoName(NetAlgo a) {
  switch (a) {
    case NetAlgo::kHeaderOnly: return "header-only";
    case NetAlgo::kDirect: return "direct";
    case NetAlgo::kRing: return "ring";
    case NetAlgo::kTree: return "tree";
    case NetAlgo::kChain: return "chain";
    case NetAlgo::kPairwise: return "pairwise";
    case NetAlgo::kHier: return "hierarchical";
    case NetAlgo::kHierDirect: return "hierarchical direct";
  }
  return "unknown";
}

NetComm::NetComm(transport::Transport& t, std::optional<NetConfig> cfg)
    : t_(t), rank_(t.rank()), size_(t.size()), cfg_(cfg ? *cfg : NetConfig::fromEnv(rank_)) {
  for (int p = 0; p < size_; ++p) everyone_.push_back(p);
}

NetComm::~NetComm() = default;

void NetComm::markBroken(const std::string& why) {
  if (broken_.empty()) broken_ = why;
}

void NetComm::send(int dst, uint32_t step, const void* data, size_t bytes) {
  if (bytes == 0) return;
  pending_.push_back({t_.isend(dst, tag(step), data, bytes), dst});
}

void NetComm::recv(int src, uint32_t step, void* data, size_t bytes) {
  if (bytes == 0) return;
  pending_.push_back({t_.irecv(src, tag(step), data, bytes), src});
}

transport::DriveScope NetComm::drive(const OpDesc& op) {
  uint64_t moved = op.bytes();
  if (op.sendBytes) {
    moved = 0;
    for (int p = 0; p < size_; ++p) moved += op.sendBytes[p];
  }
  const bool want = cfg_.driveMinBytes >= 0 && moved >= static_cast<uint64_t>(cfg_.driveMinBytes);
  return transport::DriveScope(t_, want);
}

void NetComm::waitOne(const Pending& p) {
  try {
    p.req->waitDriven(cur_.deadline);
  } catch (const TimeoutError& e) {
    fail(p, "timed out", e.what(), true, false);
  } catch (const PeerLostError& e) {
    fail(p, "lost", e.what(), false, true);
  } catch (const Error& e) {
    fail(p, "failed with", e.what(), false, false);
  }
}

void NetComm::wait() {
  for (const Pending& p : pending_) waitOne(p);
  pending_.clear();
}

void NetComm::waitPosted(size_t i) { waitOne(pending_.at(i)); }

uint8_t* NetComm::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

uint8_t* NetComm::workspace(size_t bytes) {
  if (workspace_.size() < bytes) workspace_.resize(bytes);
  return workspace_.data();
}

void NetComm::fail(const Pending& p, const char* kind, const std::string& text, bool timeout,
                   bool lost) {
  std::string msg;
  if (timeout) {
    msg = errorText(opName_, rank_, "op #", opSeq_, " timed out after ", cur_.timeout.count(),
                    " ms waiting for ", t_.peerName(p.peer), " (", text, ")");
  } else {
    msg = errorText(opName_, rank_, "op #", opSeq_, " ", kind, " ", t_.peerName(p.peer), ": ",
                    text);
  }
  abandon(msg, timeout, lost);
}

void NetComm::abandon(const std::string& msg, bool timeout, bool lost) {
  markBroken(msg);
  // The peers fail fast (they see this rank leave) and our requests end, so
  // the caller's buffers are ours again before we throw.
  t_.abort(msg);
  for (const Pending& q : pending_) {
    try {
      q.req->waitDriven(transport::Clock::now() + std::chrono::seconds(10));
    } catch (const Error&) {
    }
  }
  pending_.clear();
  if (timeout) throw TimeoutError(msg);
  if (lost) throw PeerLostError(msg);
  throw Error(msg);
}

// Note [Eager data]
// A small allreduce would cost two latencies: the header exchange, then the
// data. Instead each rank sends its data with its header, before it has seen
// anyone's (the eager protocol of MPI's small messages), so the op costs one
// latency. Up to kInlineBytes the data travel inside the header message: the
// all-to-all exchange sends every header with an inline area of that size,
// whatever the op. Two messages cost the receiver two wake-ups whenever the
// second lands after its progress thread took the first: at 2 hosts x 1 rank
// a 4 B allreduce took 127-153 us as two messages and 95-120 us as one, and a
// 4 B broadcast, which rides in the root's header, 141-152 us as a tree and
// 86-114 us inline (benchmarks/results/hosts-inline.txt). The area costs 256
// bytes more per header. Larger data follow the header as a message of their
// own on step 1, and wait in the receiver's transport as an unexpected
// message until the check passed and the receive is posted. Ops whose blocks
// differ by destination send them the same way, each block of up to
// kEagerMax (64 KiB: the receiver buffers it before it is expected, which
// costs a copy that larger blocks would notice) to its own rank: an alltoall
// each pair's block (EagerTo::kEach), a scatter's root each rank's
// (kEach), a gather's ranks theirs to the root (kRoot). The others follow
// the check as before, and both ends of a pair agree on which way its block
// went, since its size passed the check. When the check fails, the ranks
// that sent data said so in their headers (to whom, with the size, or for
// kEach in the row of send sizes that an alltoall's header carries anyway,
// and whether it was inline), and every receiver takes exactly the step-1
// messages meant for it before it throws: no message is left behind and the
// group stays usable. A rank that failed its argument checks sends a header
// alone.
void NetComm::beginEager(const OpDesc& op, NetAlgo algo, const void* eager) {
  start(op);
  Eager e;
  // A poison header goes alone.
  if (eager && op.localError.empty() && op.bytes()) e = Eager{EagerTo::kEveryone, eager};
  checkedExchange(op, algo, e);
}

void NetComm::beginEagerEach(const OpDesc& op, NetAlgo algo, const void* const* to,
                             const uint64_t* bytes) {
  start(op);
  Eager e;
  if (to && op.localError.empty()) e = Eager{EagerTo::kEach, nullptr, to, bytes};
  checkedExchange(op, algo, e);
}

void NetComm::beginEagerToRoot(const OpDesc& op, NetAlgo algo, const void* data) {
  start(op);
  Eager e;
  if (data && op.localError.empty() && rank_ != op.root && eagerPair(op.bytes())) {
    e = Eager{EagerTo::kRoot, data};
  }
  checkedExchange(op, algo, e);
}

void NetComm::sendEager(const OpDesc& op, const Eager& e, int p, bool inlined) {
  switch (e.to) {
    case EagerTo::kNone: return;
    case EagerTo::kEveryone:
      if (!inlined) send(p, 1, e.data, op.bytes());
      return;
    case EagerTo::kRoot:
      if (p == op.root) send(p, 1, e.data, op.bytes());
      return;
    case EagerTo::kEach:
      if (eagerPair(e.bytes[p])) send(p, 1, e.each[p], e.bytes[p]);
      return;
  }
}

void NetComm::start(const OpDesc& op) {
  ++opSeq_;
  opName_ = opName(op.kind);
  cur_ = op;
  if (!broken_.empty()) {
    BRAID_THROW(Error, opName_, rank_, "the group is unusable after an earlier error: ", broken_);
  }
}

void NetComm::begin(const OpDesc& op, NetAlgo algo) {
  start(op);
  checkedExchange(op, algo, Eager{});
}

void NetComm::checkedExchange(const OpDesc& op, NetAlgo algo, const Eager& e) {
  // A reduction the kernels cannot run would throw mid-op and leave the peers
  // waiting: it fails in the header exchange instead, like an argument error.
  if (op.localError.empty() && reduces(op.kind) &&
      !reduce::supported(op.dtype, kernelOp(op.redop))) {
    OpDesc poisoned = op;
    poisoned.localError =
        errorText(opName_, rank_, "reduce op ", toString(op.redop), " is not supported for ",
                  toString(op.dtype),
                  op.redop == ReduceOp::kPremulSum ? " (PREMUL_SUM: scale the input, pass SUM)" : "");
    cur_ = poisoned;
    return exchangeHeaders(poisoned, NetAlgo::kHeaderOnly, Eager{});
  }
  exchangeHeaders(op, algo, e);
}

void NetComm::consumeEager(const std::vector<uint8_t>& headers, size_t hb) {
  // Step-1 data only: inline data came with the header.
  auto following = [&](int p) -> uint64_t {
    const NetHeader* h = reinterpret_cast<const NetHeader*>(headers.data() + p * hb);
    if (p == rank_) return 0;
    switch (static_cast<EagerTo>(h->eagerTo)) {
      case EagerTo::kEveryone: return h->eagerInline ? 0 : h->eagerBytes;
      case EagerTo::kRoot: return h->op.root == rank_ ? h->eagerBytes : 0;
      case EagerTo::kEach: {
        const uint64_t b = reinterpret_cast<const uint64_t*>(h + 1)[rank_];
        return eagerPair(b) ? b : 0;
      }
      default: return 0;
    }
  };
  size_t total = 0;
  for (int p = 0; p < size_; ++p) total += following(p);
  uint8_t* sink = scratch(total);
  for (int p = 0; p < size_; ++p) {
    const uint64_t b = following(p);
    if (!b) continue;
    recv(p, 1, sink, b);
    sink += b;
  }
  wait();  // our own eager sends too
}

void NetComm::exchangeHeaders(const OpDesc& op, NetAlgo algo, const Eager& e) {
  const int n = size_;
  const size_t hb = sizeof(NetHeader) + 2 * n * sizeof(uint64_t);
  std::vector<uint8_t> all(n * hb, 0);
  auto at = [&](int r) { return reinterpret_cast<NetHeader*>(all.data() + r * hb); };
  auto sizes = [&](int r) { return reinterpret_cast<uint64_t*>(all.data() + r * hb + sizeof(NetHeader)); };
  NetHeader* h = at(rank_);
  fillOpHeader(&h->op, kNetMagic, op, opSeq_);
  h->algo = static_cast<uint32_t>(algo);
  h->ringMin = cfg_.allreduceRingMin;
  h->hierMin = cfg_.hierMinBytes;
  h->hierPiece = cfg_.hierPieceBytes;
  h->eagerTo = static_cast<uint32_t>(e.to);
  const bool alike = e.to == EagerTo::kEveryone || e.to == EagerTo::kRoot;
  h->eagerBytes = alike ? op.bytes() : 0;
  // The relay carries fixed blocks of its own (Note [Op headers across hosts]).
  const bool inlined = e.to == EagerTo::kEveryone && fitsInline(op);
  h->eagerInline = inlined;
  h->allreduceOneShotMax = cfg_.local.allreduceOneShotMax;
  h->reduceOneShotMax = cfg_.local.reduceOneShotMax;
  h->directMin = cfg_.local.directMinBytes;
  h->directOps = cfg_.local.directOps;
  h->chunkSetting = cfg_.local.chunkBytes;
  if (op.kind == OpKind::kAlltoall && op.sendBytes && op.recvBytes) {
    for (int j = 0; j < n; ++j) {
      sizes(rank_)[j] = op.sendBytes[j];
      sizes(rank_)[n + j] = op.recvBytes[j];
    }
  }
  // kEach: what each peer gets, so that a receiver knows what to take when
  // the check fails (alltoall: its send sizes again).
  if (e.to == EagerTo::kEach) {
    for (int j = 0; j < n; ++j) sizes(rank_)[j] = e.bytes[j];
  }
  if (relay_) {
    relayHeaders(op, all.data(), hb, e);
  } else {
    allToAllHeaders(op, all.data(), hb, e, inlined);
  }
  inlineFrom_.assign(n, 0);
  for (int p = 0; p < n; ++p) inlineFrom_[p] = p != rank_ && at(p)->eagerInline;
  try {
    checkHeaders(op, all.data(), hb);
  } catch (const Error&) {
    consumeEager(all, hb);
    throw;
  }
}

void NetComm::relayHeaders(const OpDesc& op, uint8_t* all, size_t hb, const Eager& e) {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) sendEager(op, e, p, false);
  }
  try {
    relay_->relay(op, all, hb);
  } catch (const TimeoutError& e) {
    abandon(e.what(), true, false);
  } catch (const PeerLostError& e) {
    abandon(e.what(), false, true);
  } catch (const Error& e) {
    abandon(e.what(), false, false);
  }
}

bool NetComm::agree(const OpDesc& op, const uint8_t* all, size_t hb,
                    const std::vector<int>& ranks) {
  try {
    checkHeaders(op, all, hb, &ranks);
    return true;
  } catch (const Error&) {
    return false;  // every rank checks all headers next, and says why
  }
}

const uint8_t* NetComm::inlineData(int r) const {
  return r >= 0 && r < static_cast<int>(inlineFrom_.size()) && inlineFrom_[r]
             ? wire_.data() + r * wireStride_ + wireStride_ - kInlineBytes
             : nullptr;
}

void NetComm::copyInlines(const void* mine, void* const* outs, size_t bytes) const {
  for (int r = 0; r < size_; ++r) {
    const void* block = r == rank_ ? mine : inlineData(r);
    if (outs[r] != block) copyBytes(outs[r], block, bytes);
  }
}

void NetComm::allToAllHeaders(const OpDesc& op, uint8_t* all, size_t hb, const Eager& e,
                              bool inlined) {
  const int n = size_;
  // Each message: the header, padded to 64 bytes so that the inline data are
  // aligned for any dtype, then the inline area (Note [Eager data]).
  const size_t padded = (hb + 63) / 64 * 64;
  wireStride_ = padded + kInlineBytes;
  if (wire_.size() < n * wireStride_) wire_.resize(n * wireStride_);
  for (int p = 0; p < n; ++p) {
    if (p != rank_) recv(p, 0, wire_.data() + p * wireStride_, wireStride_);
  }
  uint8_t* mine = wire_.data() + rank_ * wireStride_;
  std::memcpy(mine, all + rank_ * hb, hb);
  std::memset(mine + hb, 0, wireStride_ - hb);  // no stale bytes on the wire
  if (inlined) std::memcpy(mine + padded, e.data, op.bytes());
  // Each peer's header, then at once any eager data that did not fit inline:
  // back to back, the two often reach the peer in one wake-up of its progress
  // thread (all the headers first would cost it one more per peer).
  std::vector<size_t> headerOps, eagerOps;
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    headerOps.push_back(posted());
    send(p, 0, mine, wireStride_);
    const size_t before = posted();
    sendEager(op, e, p, inlined);
    for (size_t i = before; i < posted(); ++i) eagerOps.push_back(i);
  }
  for (size_t i = 0; i < size_t(n - 1); ++i) waitPosted(i);  // the header receives
  for (size_t i : headerOps) waitPosted(i);
  // Only the eager sends stay pending, for the op's own wait().
  std::vector<Pending> eagerSends;
  for (size_t i : eagerOps) eagerSends.push_back(std::move(pending_[i]));
  pending_.swap(eagerSends);
  for (int p = 0; p < n; ++p) {
    if (p != rank_) std::memcpy(all + p * hb, wire_.data() + p * wireStride_, hb);
  }
}

void NetComm::checkHeaders(const OpDesc& op, const uint8_t* all, size_t hb,
                           const std::vector<int>* only) {
  const int n = size_;
  auto at = [&](int r) { return reinterpret_cast<const NetHeader*>(all + r * hb); };
  auto sizes = [&](int r) { return reinterpret_cast<const uint64_t*>(all + r * hb + sizeof(NetHeader)); };
  const std::vector<int>& ranks = only ? *only : everyone_;
  const NetHeader* h = at(rank_);
  const NetAlgo algo = static_cast<NetAlgo>(h->algo);
  // Note [Op headers]: every rank checks in the same order, so every rank
  // fails when any header differs from its own.
  const char* me = opName_;
  if (h->op.failed) throw Error(op.localError);
  // Failures first, so that a rank's argument error is what every rank reports.
  for (int p : ranks) {
    const OpHeader& o = at(p)->op;
    if (o.failed || o.magic != kNetMagic) checkOpHeader(me, rank_, p, o, h->op);
  }
  // Note [Settings that shape an op]: a setting the op's steps depend on.
  auto sameSetting = [&](int p, const char* name, uint64_t theirs, uint64_t mine) {
    if (theirs != mine) {
      settingDiffers(me, rank_, p, name, std::to_string(theirs), std::to_string(mine));
    }
  };
  for (int p : ranks) {
    const NetHeader* o = at(p);
    checkOpHeader(me, rank_, p, o->op, h->op);
    if (usesRingMin(op.kind)) {
      sameSetting(p, "BRAID_NET_ALLREDUCE_RING_MIN", o->ringMin, h->ringMin);
    }
    if (hierStages(op.kind)) {
      sameSetting(p, "BRAID_HIER_MIN_BYTES", o->hierMin, h->hierMin);
      sameSetting(p, "BRAID_HIER_PIPELINE_BYTES", o->hierPiece, h->hierPiece);
      sameSetting(p, "BRAID_ALLREDUCE_ONESHOT_MAX", o->allreduceOneShotMax, h->allreduceOneShotMax);
      sameSetting(p, "BRAID_REDUCE_ONESHOT_MAX", o->reduceOneShotMax, h->reduceOneShotMax);
      sameSetting(p, "BRAID_DIRECT_MIN_BYTES", o->directMin, h->directMin);
      sameSetting(p, "BRAID_CHUNK_BYTES", o->chunkSetting, h->chunkSetting);
      if (o->directOps != h->directOps) {
        settingDiffers(me, rank_, p, "BRAID_DIRECT_OPS",
                       directOpsList(static_cast<uint32_t>(o->directOps)),
                       directOpsList(static_cast<uint32_t>(h->directOps)));
      }
    }
    if (o->algo != h->algo) {
      BRAID_THROW(Error, me, rank_, "rank ", p, " takes the ",
                  netAlgoName(static_cast<NetAlgo>(o->algo)), " path, this rank the ",
                  netAlgoName(algo), " path");
    }
  }
  if (op.kind == OpKind::kAlltoall && !only) {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        uint64_t sends = sizes(i)[j], expects = sizes(j)[n + i];
        if (sends != expects) {
          BRAID_THROW(Error, me, rank_, "rank ", i, " sends ", sends, " bytes to rank ", j,
                      ", which expects ", expects, " bytes from it");
        }
      }
    }
  }
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
