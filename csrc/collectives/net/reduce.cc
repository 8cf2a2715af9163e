#include <vector>

#include "collectives/net/collectives.h"
#include "collectives/net/ring.h"

namespace braid {
namespace collectives {
namespace net {

// Below BRAID_NET_ALLREDUCE_RING_MIN every rank sends its input to the root,
// which reduces all of them in rank order; from it, a ring reduce-scatter,
// then each rank sends its finished block to the root (each rank sends about
// 2(n-1)/n of the buffer instead of the root receiving n-1 buffers).
// Up to the header's inline area every input rides in its rank's header
// (Note [Eager data]): one latency, and the root reduces in rank order.
void reduce(NetComm& c, const OpDesc& op, const void* in, void* out) {
  auto drive = c.drive(op);
  const int n = c.size(), me = c.rank();
  const bool root = me == op.root;
  const size_t bytes = op.bytes(), es = elementSize(op.dtype);
  if (c.fitsInline(op)) {
    c.beginEager(op, NetAlgo::kDirect, in);
    if (!root || !op.count) return;
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) srcs[r] = r == me ? in : c.inlineData(r);
    reduceAll(op, out, srcs.data(), n, op.count);
    return;
  }
  if (bytes < c.config().allreduceRingMin) {
    c.begin(op, NetAlgo::kDirect);
    if (!root) {
      c.send(op.root, 1, in, bytes);
      c.wait();
      return;
    }
    std::vector<uint8_t> peers(bytes * n);
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) {
      srcs[r] = r == me ? in : peers.data() + r * bytes;
      if (r != me) c.recv(r, 1, peers.data() + r * bytes, bytes);
    }
    c.wait();
    if (op.count) reduceAll(op, out, srcs.data(), n, op.count);
    return;
  }
  c.begin(op, NetAlgo::kRing);
  const WorkType w = workTypeOf(op);
  uint8_t* work = c.workspace(op.count * w.elem());
  toWork(w, op.dtype, work, in, op.count);
  std::vector<uint8_t*> blocks(n);
  std::vector<size_t> counts(n), begins(n);
  for (int r = 0; r < n; ++r) {
    size_t b, e;
    partition(op.count, n, r, 1, &b, &e);
    counts[r] = e - b;
    begins[r] = b;
    blocks[r] = work + b * w.elem();
  }
  ringReduceScatter(c, w, blocks.data(), counts.data(), 1);
  const uint32_t gatherStep = n;
  if (!root) {
    // Finished in place (a widened block shrinks into its own start).
    finishBlock(w, op.dtype, op.redop, n, blocks[me], blocks[me], counts[me]);
    c.send(op.root, gatherStep, blocks[me], counts[me] * es);
    c.wait();
    return;
  }
  auto* o = static_cast<uint8_t*>(out);
  for (int r = 0; r < n; ++r) {
    if (r != me) c.recv(r, gatherStep, o + begins[r] * es, counts[r] * es);
  }
  finishBlock(w, op.dtype, op.redop, n, o + begins[me] * es, blocks[me], counts[me]);
  c.wait();
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
