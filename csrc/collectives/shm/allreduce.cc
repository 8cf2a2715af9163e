#include <cstring>
#include <vector>

#include "collectives/shm/collectives.h"
#include "collectives/shm/tree.h"
#include "collectives/reduce_share.h"

namespace braid {
namespace collectives {

void allreduce(Communicator& c, const OpDesc& op, const void* in, void* out) {
  if (op.narrowed()) return allreduceNarrowed(c, op, in, out);
  RegionTable::Ref ref;
  const bool registered = in == out && c.regions()->find(out, op.bytes(), &ref);
  switch (c.plan(op.kind, op.bytes(), registered)) {
    case Algo::kRegistered: return allreduceRegistered(c, op, out, ref);
    case Algo::kDirect: return allreduceDirect(c, op, in, out);
    case Algo::kOneShot: return allreduceOneShot(c, op, in, out);
    case Algo::kTree: return allreduceTree(c, op, in, out);
    default: return allreduceRsAg(c, op, in, out);
  }
}

// One step: every rank publishes its input and reduces all of them. The
// inputs are combined in rank order on every rank, so all ranks get the same
// bits.
void allreduceOneShot(Communicator& c, const OpDesc& op, const void* in, void* out) {
  c.beginOp(op);
  const int n = c.size();
  uint64_t s = c.nextStep();
  c.writeHeader(op, s, Algo::kOneShot);
  copyBytes(c.slot(c.rank(), s), in, op.bytes());
  c.exchange(op, s);
  if (op.count == 0) return;
  std::vector<const void*> srcs(n);
  for (int r = 0; r < n; ++r) srcs[r] = c.slot(r, s);
  reduceShare(op, out, srcs.data(), n, op.count);
}

// Note [Pipelined reduce-scatter + allgather]
// The buffer moves through shared memory in slot-sized chunks, two steps per
// chunk: (A) every rank copies in the shares of its chunk that the other
// ranks reduce, then reduces its own 1/n share from its own input and the
// peers' slots into its next slot; (B) every rank copies all shares out.
// Each rank reads and writes about twice the buffer, with every chunk still
// in cache when the peers read it, instead of n reads of everything as in
// the one-shot path. Shares are combined in rank order, as in one-shot.
void allreduceRsAg(Communicator& c, const OpDesc& op, const void* in, void* out) {
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  const size_t es = elementSize(op.dtype);
  const size_t align = 64 / es ? 64 / es : 1;
  const size_t chunkElems = c.chunkBytes() / es;
  const size_t total = op.count;
  std::vector<const void*> srcs(n);
  size_t done = 0;
  bool first = true;
  while (first || done < total) {
    size_t ck = std::min(chunkElems, total - done);
    auto* inChunk = static_cast<const uint8_t*>(in) + done * es;
    auto* outChunk = static_cast<uint8_t*>(out) + done * es;
    uint64_t sa = c.nextStep();
    if (first) c.writeHeader(op, sa, Algo::kShm);
    size_t b, e;
    for (int r = 0; r < n; ++r) {
      partition(ck, n, r, align, &b, &e);
      if (r != me && e > b) std::memcpy(c.slot(me, sa) + b * es, inChunk + b * es, (e - b) * es);
    }
    c.chunkStep(op, sa, first);
    first = false;
    partition(ck, n, me, align, &b, &e);
    uint64_t sb = c.nextStep();
    if (e > b) {
      for (int r = 0; r < n; ++r) srcs[r] = (r == me ? inChunk : c.slot(r, sa)) + b * es;
      uint8_t* mine = c.slot(me, sb) + b * es;
      reduceShare(op, mine, srcs.data(), n, e - b);
    }
    c.publish(sb);
    c.inArrivalOrder(sb, [&](int r) {  // Note [Arrival order]
      partition(ck, n, r, align, &b, &e);
      if (e > b) std::memcpy(outChunk + b * es, c.slot(r, sb) + b * es, (e - b) * es);
    });
    done += ck;
  }
}

}  // namespace collectives
}  // namespace braid
