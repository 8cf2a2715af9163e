#include "collectives/net/collectives.h"

namespace braid {
namespace collectives {
namespace net {

// Blocks of up to NetComm::kEagerMax go with the headers (Note [Eager data]):
// a small alltoall costs one latency, not two. Then every receive is posted,
// then the other sends in pairwise order (to me + s at step s), so that at
// any moment each rank sends mostly to a different peer. The sizes were
// checked pairwise in the header exchange, so both ends of a pair agree on
// whether its block went eagerly.
void alltoall(NetComm& c, const OpDesc& op, const void* const* ins, void* const* outs) {
  auto drive = c.drive(op);
  c.beginEagerEach(op, NetAlgo::kPairwise, ins, op.sendBytes);
  const int n = c.size(), me = c.rank();
  for (int s = 1; s < n; ++s) {
    const int src = (me - s + n) % n;
    c.recv(src, 1, outs[src], op.recvBytes[src]);
  }
  for (int s = 1; s < n; ++s) {
    const int dst = (me + s) % n;
    if (!NetComm::eagerPair(op.sendBytes[dst])) c.send(dst, 1, ins[dst], op.sendBytes[dst]);
  }
  if (outs[me] != ins[me]) copyBytes(outs[me], ins[me], op.sendBytes[me]);
  c.wait();
}

void barrier(NetComm& c, const OpDesc& op) { c.begin(op, NetAlgo::kHeaderOnly); }

void failOp(NetComm& c, const OpDesc& op) { c.begin(op, NetAlgo::kHeaderOnly); }

}  // namespace net
}  // namespace collectives
}  // namespace braid
