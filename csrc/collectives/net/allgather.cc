#include <vector>

#include "collectives/net/collectives.h"
#include "collectives/net/ring.h"

namespace braid {
namespace collectives {
namespace net {

// Blocks that fit the header's inline area ride in the headers (Note [Eager
// data]): one latency. Else a ring: n-1 steps, each rank forwards the block
// it received last.
void allgather(NetComm& c, const OpDesc& op, const void* in, void* const* outs) {
  auto drive = c.drive(op);
  const int n = c.size();
  if (c.fitsInline(op)) {
    c.beginEager(op, NetAlgo::kDirect, in);
    c.copyInlines(in, outs, op.bytes());
    return;
  }
  c.begin(op, NetAlgo::kRing);
  if (outs[c.rank()] != in) copyBytes(outs[c.rank()], in, op.bytes());
  std::vector<uint8_t*> blocks(n);
  std::vector<size_t> counts(n, op.count);
  for (int r = 0; r < n; ++r) blocks[r] = static_cast<uint8_t*>(outs[r]);
  ringAllgather(c, elementSize(op.dtype), blocks.data(), counts.data(), 1);
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
