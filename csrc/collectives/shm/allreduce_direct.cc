#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/shm/collectives.h"
#include "collectives/reduce_share.h"

namespace braid {
namespace collectives {

// See Note [Direct transfers]. Per chunk, each rank reads the peers' inputs
// for its share, reduces them with its own input straight into its output,
// publishes, and then reads the peers' reduced shares from their outputs.
// In-place is safe: a rank only overwrites a peer's share of its buffer after
// that peer published the chunk, that is, after it finished reading it.
void allreduceDirect(Communicator& c, const OpDesc& op0, const void* in, void* out) {
  OpDesc op = op0;
  op.inAddr = reinterpret_cast<uint64_t>(in);
  op.outAddr = reinterpret_cast<uint64_t>(out);
  const int n = c.size();
  const int me = c.rank();
  const size_t es = elementSize(op.dtype);
  const size_t align = 64 / es ? 64 / es : 1;
  const size_t chunkElems = c.chunkBytes() / es;
  uint64_t s0 = c.headerStep(op, Algo::kDirect);
  std::vector<uint64_t> ins(n), outs(n);
  for (int r = 0; r < n; ++r) {
    ins[r] = c.inAddr(r, s0);
    outs[r] = c.outAddr(r, s0);
  }
  std::vector<const void*> srcs(n);
  auto* inB = static_cast<const uint8_t*>(in);
  auto* outB = static_cast<uint8_t*>(out);
  for (size_t done = 0; done < op.count;) {
    const size_t ck = std::min(chunkElems, op.count - done);
    size_t b, e;
    partition(ck, n, me, align, &b, &e);
    if (e > b) {
      const size_t off = (done + b) * es, len = (e - b) * es;
      uint8_t* scratch = c.scratch();
      for (int r = 0; r < n; ++r) {
        if (r == me) {
          srcs[r] = inB + off;
        } else {
          c.readPeer(r, ins[r] + off, scratch, len);
          srcs[r] = scratch;
          scratch += len;
        }
      }
      reduceShare(op, outB + off, srcs.data(), n, e - b);
    }
    uint64_t s = c.nextStep();
    c.publish(s);
    c.waitAll(s);
    for (int r = 0; r < n; ++r) {
      partition(ck, n, r, align, &b, &e);
      if (r != me && e > b) {
        const size_t off = (done + b) * es;
        c.readPeer(r, outs[r] + off, outB + off, (e - b) * es);
      }
    }
    done += ck;
  }
  uint64_t s = c.nextStep();  // peers are done with this rank's buffers
  c.publish(s);
  c.waitAll(s);
}

// The others read the root's buffer, in one copy each.
void broadcastDirect(Communicator& c, const OpDesc& op0, void* buf) {
  OpDesc op = op0;
  op.inAddr = reinterpret_cast<uint64_t>(buf);
  const bool root = c.rank() == op.root;
  uint64_t s0 = c.headerStep(op, Algo::kDirect);
  if (!root) c.readPeer(op.root, c.inAddr(op.root, s0), buf, op.bytes());
  uint64_t s = c.nextStep();
  c.publish(s);
  if (root) c.waitAll(s);
}

}  // namespace collectives
}  // namespace braid
