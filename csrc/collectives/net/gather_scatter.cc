#include "collectives/net/collectives.h"

namespace braid {
namespace collectives {
namespace net {

// Straight to the root: the root's link carries (n-1) blocks either way; a
// tree would only save latency at many ranks. Blocks that fit the header's
// inline area ride in the headers (Note [Eager data]).
void gather(NetComm& c, const OpDesc& op, const void* in, void* const* outs) {
  const int me = c.rank();
  if (c.fitsInline(op)) {
    c.beginEager(op, NetAlgo::kDirect, in);
    if (me == op.root) c.copyInlines(in, outs, op.bytes());
    return;
  }
  c.begin(op, NetAlgo::kDirect);
  if (me != op.root) {
    c.send(op.root, 1, in, op.bytes());
  } else {
    for (int r = 0; r < c.size(); ++r) {
      if (r != me) c.recv(r, 1, outs[r], op.bytes());
    }
    if (outs[me] != in) copyBytes(outs[me], in, op.bytes());
  }
  c.wait();
}

void scatter(NetComm& c, const OpDesc& op, const void* const* ins, void* out) {
  c.begin(op, NetAlgo::kDirect);
  const int me = c.rank();
  if (me != op.root) {
    c.recv(op.root, 1, out, op.bytes());
  } else {
    for (int r = 0; r < c.size(); ++r) {
      if (r != me) c.send(r, 1, ins[r], op.bytes());
    }
    if (ins[me] != out) copyBytes(out, ins[me], op.bytes());
  }
  c.wait();
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
