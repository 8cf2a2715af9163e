#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/shm/collectives.h"
#include "collectives/reduce_share.h"

namespace braid {
namespace collectives {

// Each rank writes one piece of every section into its slot; each then
// reduces its own section's piece from all slots straight into its output.
// Traffic per rank: n pieces in, n pieces read, one written. gloo instead
// emulates this with a full allreduce (twice the traffic).
void reduceScatter(Communicator& c, const OpDesc& op, const void* const* ins, void* out) {
  if (c.plan(op.kind, op.bytes()) == Algo::kDirect) return reduceScatterDirect(c, op, ins, out);
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  const size_t es = elementSize(op.dtype);
  const size_t pieceElems = std::max<size_t>(1, c.chunkBytes() / n / 64 * 64 / es);
  const size_t pieceBytes = pieceElems * es;
  std::vector<const void*> srcs(n);
  size_t done = 0;
  bool first = true;
  while (first || done < op.count) {
    size_t ck = std::min(pieceElems, op.count - done);
    uint64_t s = c.nextStep();
    for (int r = 0; r < n; ++r) {
      copyBytes(c.slot(me, s) + r * pieceBytes,
                  static_cast<const uint8_t*>(ins[r]) + done * es, ck * es);
    }
    if (first) {
      c.writeHeader(op, s, Algo::kShm);
      c.exchange(op, s);
    } else {
      c.publish(s);
      c.waitAll(s);
    }
    first = false;
    if (ck) {
      for (int r = 0; r < n; ++r) srcs[r] = c.slot(r, s) + me * pieceBytes;
      uint8_t* o = static_cast<uint8_t*>(out) + done * es;
      reduceShare(op, o, srcs.data(), n, ck);
    }
    done += ck;
  }
}

// Note [Alltoall's path]
// Block sizes differ per pair of ranks, and a rank knows only its own until
// the header step. So alltoall picks its path after that step, from the
// largest block any rank announced (the same number on every rank), through
// the same plan() and settings as the other ops (compared in the header).
// The header step also carries the shm path's first pieces, except on a rank
// whose own blocks already make the op go direct (plan() is monotone in
// bytes). A rank that copied them for an op that then goes direct wasted
// less than BRAID_DIRECT_MIN_BYTES per peer.
//
// On the shm path each slot holds one piece per destination; a rank's j-th
// piece goes to rank j. The number of steps comes from the largest block, so
// every rank runs the same number.
void alltoall(Communicator& c, const OpDesc& op0, const void* const* ins, void* const* outs) {
  OpDesc op = op0;
  const int n = c.size();
  const int me = c.rank();
  uint64_t largest = 0;
  for (int j = 0; j < n; ++j) largest = std::max<uint64_t>(largest, op.sendBytes[j]);
  const bool surelyDirect = c.plan(op.kind, largest) == Algo::kDirect;
  op.peerAddrs = addressesOf(ins, n);  // for the direct path
  c.beginOp(op);
  const size_t piece = std::max<size_t>(64, c.chunkBytes() / n / 64 * 64);
  uint64_t steps = 1;
  for (uint64_t k = 0; k < steps; ++k) {
    const size_t off = k * piece;
    uint64_t s = c.nextStep();
    for (int j = 0; j < n && !(k == 0 && surelyDirect); ++j) {
      size_t len = op.sendBytes[j] > off ? std::min<size_t>(piece, op.sendBytes[j] - off) : 0;
      if (len) std::memcpy(c.slot(me, s) + j * piece, static_cast<const uint8_t*>(ins[j]) + off, len);
    }
    if (k == 0) {
      c.writeHeader(op, s, Algo::kBySizes);
      c.exchange(op, s);  // also checks that the size matrix is consistent
      uint64_t maxBytes = c.maxAnnouncedBytes(s);
      if (c.plan(op.kind, maxBytes) == Algo::kDirect) return alltoallDirect(c, op, s, ins, outs);
      steps = std::max<uint64_t>(1, (maxBytes + piece - 1) / piece);
    }
    auto copyOut = [&](int i) {
      size_t len = op.recvBytes[i] > off ? std::min<size_t>(piece, op.recvBytes[i] - off) : 0;
      if (len) std::memcpy(static_cast<uint8_t*>(outs[i]) + off, c.slot(i, s) + me * piece, len);
    };
    if (k == 0) {
      for (int i = 0; i < n; ++i) copyOut(i);
    } else {
      c.publish(s);
      c.inArrivalOrder(s, copyOut);  // Note [Arrival order]
    }
  }
}

}  // namespace collectives
}  // namespace braid
