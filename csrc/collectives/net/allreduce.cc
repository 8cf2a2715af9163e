#include <vector>

#include "collectives/net/collectives.h"
#include "collectives/net/ring.h"

namespace braid {
namespace collectives {
namespace net {

void allreduce(NetComm& c, const OpDesc& op, const void* in, void* out) {
  if (op.bytes() >= c.config().allreduceRingMin) return allreduceRing(c, op, in, out);
  allreduceDirect(c, op, in, out);
}

// Every rank sends its input to every peer, behind its header (Note [Eager
// data]), and reduces all n inputs in rank order: one latency, (n-1) x the
// buffer sent per rank, the same bits on every rank as the shm one-shot path.
void allreduceDirect(NetComm& c, const OpDesc& op, const void* in, void* out) {
  c.beginEager(op, NetAlgo::kDirect, in);
  const int n = c.size(), me = c.rank();
  const size_t bytes = op.bytes();
  uint8_t* peers = c.scratch(bytes * n);
  std::vector<const void*> srcs(n);
  for (int r = 0; r < n; ++r) {
    srcs[r] = r == me ? in : peers + r * bytes;
    if (r != me) c.recv(r, 1, peers + r * bytes, bytes);
  }
  c.wait();
  if (op.count) reduceAll(op, out, srcs.data(), n, op.count);
}

// Ring reduce-scatter + ring allgather over n nearly equal blocks (some empty
// when count < n): each rank sends and receives 2(n-1)/n of the buffer.
void allreduceRing(NetComm& c, const OpDesc& op, const void* in, void* out) {
  c.begin(op, NetAlgo::kRing);
  const int n = c.size(), me = c.rank();
  const WorkType w = workTypeOf(op);
  const size_t es = elementSize(op.dtype);
  std::vector<uint8_t> wide;
  uint8_t* work = static_cast<uint8_t*>(out);
  if (w.widened) {
    wide.resize(op.count * w.elem());
    work = wide.data();
  }
  toWork(w, op.dtype, work, in, in == out && !w.widened ? 0 : op.count);
  std::vector<uint8_t*> wblocks(n), oblocks(n);
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) {
    size_t b, e;
    partition(op.count, n, r, 1, &b, &e);
    counts[r] = e - b;
    wblocks[r] = work + b * w.elem();
    oblocks[r] = static_cast<uint8_t*>(out) + b * es;
  }
  ringReduceScatter(c, w, wblocks.data(), counts.data(), 1);
  finishBlock(w, op.dtype, op.redop, n, oblocks[me], wblocks[me], counts[me]);
  ringAllgather(c, es, oblocks.data(), counts.data(), n);
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
