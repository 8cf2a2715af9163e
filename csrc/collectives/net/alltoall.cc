#include "collectives/net/collectives.h"

namespace braid {
namespace collectives {
namespace net {

// Every receive posted first, then the sends in pairwise order (to me + s at
// step s), so that at any moment each rank sends mostly to a different peer.
// The sizes were checked pairwise in the header exchange.
void alltoall(NetComm& c, const OpDesc& op, const void* const* ins, void* const* outs) {
  c.begin(op, NetAlgo::kPairwise);
  const int n = c.size(), me = c.rank();
  for (int s = 1; s < n; ++s) {
    const int src = (me - s + n) % n;
    c.recv(src, 1, outs[src], op.recvBytes[src]);
  }
  for (int s = 1; s < n; ++s) {
    const int dst = (me + s) % n;
    c.send(dst, 1, ins[dst], op.sendBytes[dst]);
  }
  if (outs[me] != ins[me]) copyBytes(outs[me], ins[me], op.sendBytes[me]);
  c.wait();
}

void barrier(NetComm& c, const OpDesc& op) { c.begin(op, NetAlgo::kHeaderOnly); }

void failOp(NetComm& c, const OpDesc& op) { c.begin(op, NetAlgo::kHeaderOnly); }

}  // namespace net
}  // namespace collectives
}  // namespace braid
