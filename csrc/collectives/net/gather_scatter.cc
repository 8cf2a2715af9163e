#include <vector>

#include "collectives/net/collectives.h"

namespace braid {
namespace collectives {
namespace net {

// Straight to the root: the root's link carries (n-1) blocks either way; a
// tree would only save latency at many ranks. Blocks that fit the header's
// inline area ride in the headers, and blocks of up to NetComm::kEagerMax
// follow them at once (Note [Eager data]): one latency, not two.
void gather(NetComm& c, const OpDesc& op, const void* in, void* const* outs) {
  auto drive = c.drive(op);
  const int me = c.rank();
  if (c.fitsInline(op)) {
    c.beginEager(op, NetAlgo::kDirect, in);
    if (me == op.root) c.copyInlines(in, outs, op.bytes());
    return;
  }
  c.beginEagerToRoot(op, NetAlgo::kDirect, in);
  if (me != op.root) {
    if (!NetComm::eagerPair(op.bytes())) c.send(op.root, 1, in, op.bytes());
  } else {
    for (int r = 0; r < c.size(); ++r) {
      if (r != me) c.recv(r, 1, outs[r], op.bytes());
    }
    if (outs[me] != in) copyBytes(outs[me], in, op.bytes());
  }
  c.wait();
}

// The root's blocks of up to NetComm::kEagerMax go with its headers (Note
// [Eager data]).
void scatter(NetComm& c, const OpDesc& op, const void* const* ins, void* out) {
  auto drive = c.drive(op);
  const int me = c.rank();
  const bool root = me == op.root;
  std::vector<uint64_t> each(root ? c.size() : 0, op.bytes());
  c.beginEagerEach(op, NetAlgo::kDirect, root ? ins : nullptr, each.data());
  if (!root) {
    c.recv(op.root, 1, out, op.bytes());
  } else {
    for (int r = 0; r < c.size(); ++r) {
      if (r != me && !NetComm::eagerPair(op.bytes())) c.send(r, 1, ins[r], op.bytes());
    }
    if (ins[me] != out) copyBytes(out, ins[me], op.bytes());
  }
  c.wait();
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
