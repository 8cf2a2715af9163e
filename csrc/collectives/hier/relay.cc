// The world's op headers, gathered within each host and exchanged between
// hosts; and the small allreduce that rides on that exchange.
//
// Note [Op headers across hosts]
// Every op of a group across hosts starts with the world's header check (Note
// [Collectives over messages]): every rank compares every rank's header with
// its own. Sent all-to-all over TCP, that costs n(n-1) messages per op, host
// mates included (12 at 2 hosts x 2 ranks, 4032 at 8 x 8), and each rank's
// progress thread wakes for n-1 of them. When every host runs the same number
// L > 1 of ranks, the headers travel in two steps instead:
//  1. within each host, an allgather of the L headers over shared memory (a
//     fixed-size op: hb bytes, which depend on the group's size alone, so it
//     never mismatches and the check still reports both values of any field);
//  2. across hosts, each local rank l sends its host's L headers to local
//     rank l of every other host, over its cross group's own sockets (the L
//     cross groups run at once): H-1 messages per rank, one network latency.
// Every rank then holds all n headers, in rank order, and runs the same check
// as before, so errors, and the rule that a mismatch fails every rank and
// leaves the group usable, are unchanged. Messages per op: H(H-1)L over TCP
// (4 at 2x2, 448 at 8x8). A failure in either step (a lost rank, the
// deadline) breaks the group, as any lost peer does.
//
// Note [Small allreduce across hosts]
// Below BRAID_HIER_MIN_BYTES an allreduce rides on that exchange: between the
// two steps, if the host's L headers pass the check against this rank's (so
// the host runs the same op, and none of its ranks failed its checks), the
// host sums its inputs; step 2 then carries the host's sum with its headers
// (the eager protocol of Note [Eager data]), and after the check every rank
// reduces the H host sums in host order. Up to kInline (512) bytes, the
// inputs travel inside step 1's blocks (each rank reduces its host's inputs
// in local rank order: every host mate gets the same bits, and no second
// shared-memory step) and the sum inside step 2's bundle; larger ones are
// summed by a shared-memory allreduce and sent right behind the bundle. So:
// one network latency, with H-1 messages per rank where a direct exchange over
// all ranks sends 2(n-1) (2 x 2 hosts, 4 B: 230-260 us against 395-431 us,
// benchmarks/results/hosts-relay.txt). Each bundle's trailer says whether the
// host's sum came, and how large, so that every receiver takes exactly what
// was sent, whatever the check then says. If the host's shared-memory
// allreduce fails (it has checks of its own), its ranks throw that error and
// every other rank an error naming the host; the group stays usable.
//
// Note [Small broadcast across hosts]
// A broadcast of up to kInline bytes rides the same way: the root puts its
// buffer in its step-1 block, so its host mates have it once the host's
// headers are in; if they agree, the root's host puts it in its step-2
// bundles, and after the check every other rank copies it from the bundle of
// the root's host. One network latency, as the small allreduce, where the
// world's tree took the relay and then log2(n) more (2 x 2 hosts, 4 B:
// 211-228 us against 280-369, benchmarks/results/hosts-inline.txt). Larger
// broadcasts below BRAID_HIER_MIN_BYTES still take the tree.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/hier/stages.h"
#include "collectives/reduce_share.h"
#include "common/error.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {

namespace {

// Note [Small allreduce across hosts]: inputs and host sums of at most this
// many bytes travel inside the headers' own messages.
constexpr size_t kInline = 512;

}  // namespace

// What follows a host's headers in step 2 (Note [Small allreduce across hosts]).
enum class SumState : uint64_t { kNone = 0, kSent = 1, kFailed = 2 };
struct HierGroup::Trailer {
  uint64_t state;
  uint64_t bytes;
};

struct HierGroup::Rider {
  const OpDesc* op;
  const void* in;
  std::vector<SumState> states;  // by host, once the headers are in
  std::string localError;        // this host's shared-memory stage, when it failed
};

std::string HierGroup::relayHead(const OpDesc& op, const std::string& where) const {
  return errorText(opName(op.kind), rank(), "op #", world_->opCount(), ", ", where, ": ");
}

void HierGroup::relay(const OpDesc& op, uint8_t* all, size_t hb) {
  try {
    relaySteps(op, all, hb);
  } catch (const Error& e) {
    // Ranks are out of step: every transport goes, so that the peers waiting
    // in a cross group or on this host fail now, not at their deadline.
    markBroken(e.what());
    throw;
  }
}

void HierGroup::relaySteps(const OpDesc& op, uint8_t* all, size_t hb) {
  const int L = local_->size(), H = topo_.numHosts(), h = topo_.host();
  const std::vector<int>& mates = topo_.ranksOn(h);
  const size_t bytes = rider_ ? rider_->op->bytes() : 0;
  if (staging_.size() < H * bytes) staging_.resize(H * bytes);  // every host's sum

  // Step 1: this rank's header, and a tiny allreduce's input, to its host mates.
  // The blocks and bundles are kept between ops (ops run one at a time);
  // what this rank sends is zeroed first, so no stale bytes travel.
  const size_t gb = hb + kInline;
  const size_t bb = L * hb + sizeof(Trailer) + kInline;
  relayBuf_.resize(gb + L * gb + H * bb);
  uint8_t* const mine = relayBuf_.data();
  uint8_t* const gathered = mine + gb;
  std::memset(mine, 0, gb);
  std::memcpy(mine, all + rank() * hb, hb);
  if (rider_ && rider_->in && bytes <= kInline) copyBytes(mine + hb, rider_->in, bytes);
  std::vector<void*> outs(L);
  for (int j = 0; j < L; ++j) outs[j] = gathered + j * gb;
  OpDesc gather = hier::stageOp(op, OpKind::kAllgather, ReduceOp::kSum, gb);
  gather.dtype = DataType::kUInt8;
  hier::stage([&] { return relayHead(op, hier::withinHost(topo_, "gathering op headers")); },
              [&] { local_->allgather(gather, mine, outs.data()); });
  for (int j = 0; j < L; ++j) std::memcpy(all + mates[j] * hb, outs[j], hb);

  const Trailer t = hostSum(op, all, hb, gathered, gb);

  // Step 2: the host's headers (and sum) to local rank l of every other host.
  uint8_t* const bundles = gathered + L * gb;
  auto bundle = [&](int k) { return bundles + k * bb; };
  auto inlined = [&](int k) { return bundle(k) + L * hb + sizeof(Trailer); };
  const bool sent = t.state == static_cast<uint64_t>(SumState::kSent);
  for (int j = 0; j < L; ++j) std::memcpy(bundle(h) + j * hb, all + mates[j] * hb, hb);
  std::memcpy(bundle(h) + L * hb, &t, sizeof t);
  std::memset(inlined(h), 0, kInline);
  if (sent && bytes <= kInline) copyBytes(inlined(h), staging_.data() + h * bytes, bytes);
  hier::stage([&] { return relayHead(op, hier::acrossHosts(topo_, "sending op headers")); }, [&] {
    cross_->beginUnchecked(op);
    for (int k = 0; k < H; ++k) {
      if (k != h) cross_->recv(k, 0, bundle(k), bb);
    }
    for (int k = 0; k < H; ++k) {
      if (k == h) continue;
      cross_->send(k, 0, bundle(h), bb);
      if (sent && bytes > kInline) cross_->send(k, 1, staging_.data() + h * bytes, bytes);
    }
    cross_->wait();
    if (rider_) rider_->states.assign(H, SumState::kNone);
    for (int k = 0; k < H; ++k) {
      Trailer theirs;
      std::memcpy(&theirs, bundle(k) + L * hb, sizeof theirs);
      if (rider_) rider_->states[k] = static_cast<SumState>(theirs.state);
      if (k == h) continue;
      const std::vector<int>& ranks = topo_.ranksOn(k);
      for (int j = 0; j < L; ++j) std::memcpy(all + ranks[j] * hb, bundle(k) + j * hb, hb);
      if (theirs.state != static_cast<uint64_t>(SumState::kSent)) continue;
      // Sums are only sent for an op whose headers agree within the host; a
      // size we do not expect means another op, and its data are dropped.
      // Below the threshold (or under one element per local rank) a sum is
      // small: a larger one would have us allocate what a peer says.
      const uint64_t most = std::max<uint64_t>({world_->config().hierMinBytes, 16u * L, kInline});
      if (theirs.bytes > most) {
        BRAID_THROW(Error, opName(op.kind), rank(), "rank ", ranks[local_->rank()],
                    " announced a host sum of ", theirs.bytes,
                    " bytes; a small allreduce has fewer than ", most,
                    " (BRAID_HIER_MIN_BYTES differs, or the bundle is corrupt)");
      }
      const bool expected = rider_ && theirs.bytes == bytes;
      if (!expected && rider_) rider_->states[k] = SumState::kNone;
      if (theirs.bytes <= kInline) {
        if (expected) copyBytes(staging_.data() + k * bytes, inlined(k), bytes);
        continue;
      }
      uint8_t* dst = expected ? staging_.data() + k * bytes : cross_->scratch(theirs.bytes);
      cross_->recv(k, 1, dst, theirs.bytes);
      cross_->wait();  // before the next scratch(), which may move it
    }
  });
}

HierGroup::Trailer HierGroup::hostSum(const OpDesc& op, const uint8_t* all, size_t hb,
                           const uint8_t* gathered, size_t gb) {
  if (!rider_ || !world_->agree(op, all, hb, topo_.ranksOn(topo_.host()))) {
    return {static_cast<uint64_t>(SumState::kNone), 0};
  }
  const OpDesc& o = *rider_->op;
  const int L = local_->size();
  const size_t bytes = o.bytes();
  uint8_t* sum = staging_.data() + topo_.host() * bytes;
  if (o.kind == OpKind::kBroadcast) {  // Note [Small broadcast across hosts]
    if (topo_.hostOf(o.root) != topo_.host()) return {static_cast<uint64_t>(SumState::kNone), 0};
    copyBytes(sum, gathered + topo_.localRankOf(o.root) * gb + hb, bytes);
    return {static_cast<uint64_t>(SumState::kSent), bytes};
  }
  if (bytes <= kInline) {  // the inputs came with the headers: reduce in local rank order
    std::vector<const void*> ins(L);
    for (int j = 0; j < L; ++j) ins[j] = gathered + j * gb + hb;
    if (o.count) reduce::reduceN(o.dtype, kernelOp(o.redop), sum, ins.data(), L, o.count);
    return {static_cast<uint64_t>(SumState::kSent), bytes};
  }
  try {
    hier::stage([&] { return hier::stageHead("allreduce", rank(), world_->opCount(), 1, 2,
                                             hier::withinHost(topo_, "allreduce")); },
                [&] {
                  local_->allreduce(hier::stageOp(o, OpKind::kAllreduce,
                                                  hier::stageRedop(o.redop), o.count),
                                    rider_->in, sum);
                });
    return {static_cast<uint64_t>(SumState::kSent), bytes};
  } catch (const TimeoutError&) {
    throw;
  } catch (const PeerLostError&) {
    throw;
  } catch (const Error& e) {
    rider_->localError = e.what();
    return {static_cast<uint64_t>(SumState::kFailed), 0};
  }
}

void HierGroup::ride(const OpDesc& op, Rider& rider) {
  rider_ = &rider;
  struct Off {
    Rider*& r;
    ~Off() { r = nullptr; }
  } off{rider_};
  world_->begin(op, net::NetAlgo::kHierDirect);
}

void HierGroup::allreduceSmall(const OpDesc& op, const void* in, void* out) {
  Rider rider{&op, in, {}, {}};
  ride(op, rider);
  // The check passed: every host ran the same op and summed it, unless its
  // shared-memory stage failed (Note [Small allreduce across hosts]).
  if (!rider.localError.empty()) throw Error(rider.localError);
  const int H = topo_.numHosts();
  for (int k = 0; k < H; ++k) {
    if (rider.states[k] == SumState::kSent) continue;
    const std::string& id = topo_.identityOf(k);
    BRAID_THROW(Error, "allreduce", rank(), "op #", world_->opCount(),
                ": the allreduce within host '", id.substr(0, id.find('/')), "' (ranks ",
                hier::rankList(topo_.ranksOn(k)), ") failed; its ranks report why");
  }
  if (op.count == 0) return;
  const size_t bytes = op.bytes();
  std::vector<const void*> sums(H);
  for (int k = 0; k < H; ++k) sums[k] = staging_.data() + k * bytes;
  reduce::reduceN(op.dtype, kernelOp(op.redop), out, sums.data(), H, op.count);
  if (op.redop == ReduceOp::kAvg) reduce::divide(op.dtype, out, out, size(), op.count);
}

bool HierGroup::broadcastRides(const OpDesc& op) const {
  return local_ && op.kind == OpKind::kBroadcast && op.bytes() <= kInline && !staged(op);
}

void HierGroup::broadcastSmall(const OpDesc& op, void* buf) {
  // Only the root's buffer travels (Note [Small broadcast across hosts]).
  Rider rider{&op, rank() == op.root ? buf : nullptr, {}, {}};
  ride(op, rider);
  if (rank() == op.root || op.count == 0) return;
  const int hr = topo_.hostOf(op.root);
  // The check passed, so the root's host agreed and sent its buffer.
  BRAID_ENFORCE(rider.states[hr] == SumState::kSent, "broadcast", rank(), "op #",
                world_->opCount(), ": the root's host sent no data");
  copyBytes(buf, staging_.data() + hr * op.bytes(), op.bytes());
}

}  // namespace collectives
}  // namespace braid
