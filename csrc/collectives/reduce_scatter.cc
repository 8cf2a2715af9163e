#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
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

// Each slot holds one piece per destination; a rank's j-th piece goes to
// rank j. The number of steps comes from the largest block any rank sends,
// announced in the header, so every rank runs the same number.
void alltoall(Communicator& c, const OpDesc& op, const void* const* ins, void* const* outs) {
  // Sizes differ per pair and are only agreed after the header step, so the
  // choice cannot depend on them: direct whenever the group allows it.
  if (c.window().canReadPeers()) return alltoallDirect(c, op, ins, outs);
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  const size_t piece = std::max<size_t>(64, c.chunkBytes() / n / 64 * 64);
  uint64_t steps = 1;
  for (uint64_t k = 0; k < steps; ++k) {
    const size_t off = k * piece;
    uint64_t s = c.nextStep();
    for (int j = 0; j < n; ++j) {
      size_t len = op.sendBytes[j] > off ? std::min<size_t>(piece, op.sendBytes[j] - off) : 0;
      if (len) std::memcpy(c.slot(me, s) + j * piece, static_cast<const uint8_t*>(ins[j]) + off, len);
    }
    if (k == 0) {
      c.writeHeader(op, s, Algo::kShm);
      c.exchange(op, s);
      uint64_t maxBytes = c.maxAnnouncedBytes(s);
      steps = std::max<uint64_t>(1, (maxBytes + piece - 1) / piece);
    } else {
      c.publish(s);
      c.waitAll(s);
    }
    for (int i = 0; i < n; ++i) {
      size_t len = op.recvBytes[i] > off ? std::min<size_t>(piece, op.recvBytes[i] - off) : 0;
      if (len) std::memcpy(static_cast<uint8_t*>(outs[i]) + off, c.slot(i, s) + me * piece, len);
    }
  }
}

}  // namespace collectives
}  // namespace braid
