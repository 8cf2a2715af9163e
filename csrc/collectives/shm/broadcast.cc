#include <algorithm>
#include <cstring>

#include "collectives/shm/collectives.h"
#include "collectives/shm/tree.h"

namespace braid {
namespace collectives {

// The root streams the buffer through its slots; the others copy each chunk
// out as soon as it is published. With two slots the root runs one chunk
// ahead of the slowest reader (Note [Step protocol]).
void broadcast(Communicator& c, const OpDesc& op, void* buf) {
  if (c.plan(op.kind, op.bytes()) == Algo::kDirect) return broadcastDirect(c, op, buf);
  c.beginOp(op);
  const bool root = c.rank() == op.root;
  const size_t total = op.bytes();
  const size_t chunk = c.chunkBytes();
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  bool first = true;
  while (first || done < total) {
    size_t len = std::min(chunk, total - done);
    uint64_t s = c.nextStep();
    if (root) copyBytes(c.slot(c.rank(), s), p + done, len);
    if (first) {
      c.writeHeader(op, s, Algo::kShm);
      c.exchange(op, s);
    } else {
      c.publish(s);
      if (!root) c.wait(op.root, s);
    }
    first = false;
    if (!root) copyBytes(p + done, c.slot(op.root, s), len);
    done += len;
  }
}

// Barriers take the tree in groups where small allreduces do (Note [Tree
// allreduce] in tree.h): the same two steps, with no data.
void barrier(Communicator& c, const OpDesc& op) {
  if (c.plan(OpKind::kBarrier, 0) == Algo::kTree) return allreduceTree(c, op, nullptr, nullptr);
  c.headerStep(op, Algo::kHeaderOnly);
}

void failOp(Communicator& c, const OpDesc& op) {
  c.headerStep(op, Algo::kHeaderOnly);  // throws op.localError once the peers have seen it
}

}  // namespace collectives
}  // namespace braid
