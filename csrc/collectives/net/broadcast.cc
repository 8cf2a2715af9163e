#include <cstring>

#include "collectives/net/collectives.h"
#include "common/error.h"

namespace braid {
namespace collectives {
namespace net {

// Binomial tree over ranks relative to the root: log2(n) latencies, each rank
// receives the buffer once. For the few hosts of a leaders' group (2-4) this
// is one or two hops; a pipelined chain (or scatter + ring allgather) would
// move large buffers faster across many hosts: not done yet.
// A buffer that fits a header's inline area rides in the root's header to
// every rank at once (Note [Eager data]): one latency whatever n.
void broadcast(NetComm& c, const OpDesc& op, void* buf) {
  const size_t bytes = op.bytes();
  if (c.fitsInline(op)) {
    c.beginEager(op, NetAlgo::kDirect, c.rank() == op.root ? buf : nullptr);
    if (c.rank() != op.root && bytes) {
      const uint8_t* data = c.inlineData(op.root);  // the check passed: the root sent it
      BRAID_ENFORCE(data, "broadcast", c.rank(), "root ", op.root, " sent no data inline");
      std::memcpy(buf, data, bytes);
    }
    return;
  }
  c.begin(op, NetAlgo::kTree);
  const int n = c.size();
  const int v = (c.rank() - op.root + n) % n;
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
