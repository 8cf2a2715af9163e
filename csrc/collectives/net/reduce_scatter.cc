#include <vector>

#include "collectives/net/collectives.h"
#include "collectives/net/ring.h"

namespace braid {
namespace collectives {
namespace net {

// From BRAID_NET_ALLREDUCE_RING_MIN bytes per section a ring over the
// sections (working copy in the work type); below, each rank sends section j
// to rank j, which reduces the n sections in rank order. Both send (n-1)
// sections per rank; the direct one in one latency, the ring in n-1 steps
// with one neighbour each.
void reduceScatter(NetComm& c, const OpDesc& op, const void* const* ins, void* out) {
  auto drive = c.drive(op);
  const int n = c.size(), me = c.rank();
  const size_t bytes = op.bytes();
  if (bytes < c.config().allreduceRingMin) {
    c.begin(op, NetAlgo::kDirect);
    std::vector<uint8_t> peers(bytes * n);
    std::vector<const void*> srcs(n);
    for (int r = 0; r < n; ++r) {
      srcs[r] = r == me ? ins[me] : peers.data() + r * bytes;
      if (r != me) c.recv(r, 1, peers.data() + r * bytes, bytes);
    }
    for (int s = 1; s < n; ++s) c.send((me + s) % n, 1, ins[(me + s) % n], bytes);
    c.wait();
    if (op.count) reduceAll(op, out, srcs.data(), n, op.count);
    return;
  }
  c.begin(op, NetAlgo::kRing);
  const WorkType w = workTypeOf(op);
  const size_t wb = op.count * w.elem();
  uint8_t* work = c.workspace(wb * n);
  std::vector<uint8_t*> blocks(n);
  std::vector<size_t> counts(n, op.count);
  for (int r = 0; r < n; ++r) {
    blocks[r] = work + r * wb;
    toWork(w, op.dtype, blocks[r], ins[r], op.count);
  }
  ringReduceScatter(c, w, blocks.data(), counts.data(), 1);
  finishBlock(w, op.dtype, op.redop, n, out, blocks[me], op.count);
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
