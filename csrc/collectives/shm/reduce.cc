#include <cstring>
#include <vector>

#include "collectives/shm/collectives.h"
#include "collectives/reduce_share.h"

namespace braid {
namespace collectives {

void reduce(Communicator& c, const OpDesc& op, const void* in, void* out) {
  if (c.plan(op.kind, op.bytes()) == Algo::kOneShot) return reduceOneShot(c, op, in, out);
  reducePipelined(c, op, in, out);
}

// Everyone publishes its input, the root reduces all.
void reduceOneShot(Communicator& c, const OpDesc& op, const void* in, void* out) {
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  uint64_t s = c.nextStep();
  c.writeHeader(op, s, Algo::kOneShot);
  copyBytes(c.slot(me, s), in, op.bytes());
  c.exchange(op, s);
  if (me != op.root || op.count == 0) return;
  std::vector<const void*> srcs(n);
  for (int r = 0; r < n; ++r) srcs[r] = c.slot(r, s);
  reduceShare(op, out, srcs.data(), n, op.count);
}

// As allreduce's Note [Pipelined reduce-scatter + allgather], but only the
// root gathers.
void reducePipelined(Communicator& c, const OpDesc& op, const void* in, void* out) {
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  const bool root = me == op.root;
  const size_t es = elementSize(op.dtype);
  std::vector<const void*> srcs(n);
  const size_t chunkElems = c.chunkBytes() / es;
  const size_t align = 64 / es ? 64 / es : 1;
  size_t done = 0;
  bool first = true;
  while (first || done < op.count) {
    size_t ck = std::min(chunkElems, op.count - done);
    uint64_t sa = c.nextStep();
    if (first) c.writeHeader(op, sa, Algo::kShm);
    copyBytes(c.slot(me, sa), static_cast<const uint8_t*>(in) + done * es, ck * es);
    c.chunkStep(op, sa, first);
    first = false;
    size_t b, e;
    partition(ck, n, me, align, &b, &e);
    uint64_t sb = c.nextStep();
    if (e > b) {
      for (int r = 0; r < n; ++r) srcs[r] = c.slot(r, sa) + b * es;
      uint8_t* mine = c.slot(me, sb) + b * es;
      reduceShare(op, mine, srcs.data(), n, e - b);
    }
    c.publish(sb);
    if (root) {
      c.waitAll(sb);
      auto* o = static_cast<uint8_t*>(out) + done * es;
      for (int r = 0; r < n; ++r) {
        partition(ck, n, r, align, &b, &e);
        if (e > b) std::memcpy(o + b * es, c.slot(r, sb) + b * es, (e - b) * es);
      }
    }
    done += ck;
  }
}

}  // namespace collectives
}  // namespace braid
