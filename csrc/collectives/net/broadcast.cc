#include "collectives/net/collectives.h"

namespace braid {
namespace collectives {
namespace net {

// Binomial tree over ranks relative to the root: log2(n) latencies, each rank
// receives the buffer once. For the few hosts of a leaders' group (2-4) this
// is one or two hops; a pipelined chain (or scatter + ring allgather) would
// move large buffers faster across many hosts: not done yet.
void broadcast(NetComm& c, const OpDesc& op, void* buf) {
  c.begin(op, NetAlgo::kTree);
  const int n = c.size();
  const int v = (c.rank() - op.root + n) % n;
  const size_t bytes = op.bytes();
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      c.recv((v - mask + op.root) % n, 1, buf, bytes);
      c.wait();
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) c.send((v + mask + op.root) % n, 1, buf, bytes);
  }
  c.wait();
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
