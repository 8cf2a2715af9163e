// Direct versions of the ops that move blocks without reducing them, and of
// reduce_scatter. See Note [Direct transfers].
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/shm/collectives.h"
#include "collectives/reduce_share.h"

namespace braid {
namespace collectives {

namespace {
// Last step of a direct op: `waiters` stay until every peer has published it,
// that is, finished reading their buffers.
void finishDirect(Communicator& c, bool wait) {
  uint64_t s = c.nextStep();
  c.publish(s);
  if (wait) c.waitAll(s);
}
}  // namespace

void allgatherDirect(Communicator& c, const OpDesc& op0, const void* in, void* const* outs,
                     bool everyone) {
  OpDesc op = op0;
  op.inAddr = reinterpret_cast<uint64_t>(in);
  const int n = c.size();
  const int me = c.rank();
  const bool collect = everyone || me == op.root;
  uint64_t s0 = c.headerStep(op, Algo::kDirect);
  if (collect) {
    for (int r = 0; r < n; ++r) {
      if (r == me) {
        if (outs[r] != in) copyBytes(outs[r], in, op.bytes());
      } else {
        c.readPeer(r, c.inAddr(r, s0), outs[r], op.bytes());
      }
    }
  }
  // Everyone's input is read by the collectors; a collector waits for all.
  finishDirect(c, true);
}

void scatterDirect(Communicator& c, const OpDesc& op0, const void* const* ins, void* out) {
  OpDesc op = op0;
  const int n = c.size();
  const int me = c.rank();
  const bool root = me == op.root;
  if (root) {
    op.peerAddrs = addressesOf(reinterpret_cast<const void* const*>(ins), n);
  }
  uint64_t s0 = c.headerStep(op, Algo::kDirect);
  if (root) {
    copyBytes(out, ins[me], op.bytes());
  } else {
    c.readPeer(op.root, c.peerAddr(op.root, s0, me), out, op.bytes());
  }
  finishDirect(c, root);
}

void reduceScatterDirect(Communicator& c, const OpDesc& op0, const void* const* ins, void* out) {
  OpDesc op = op0;
  const int n = c.size();
  const int me = c.rank();
  op.peerAddrs = addressesOf(ins, n);
  uint64_t s0 = c.headerStep(op, Algo::kDirect);
  const size_t es = elementSize(op.dtype);
  const size_t chunkElems = std::max<size_t>(1, 2 * c.slotBytes() / es / std::max(1, n - 1));
  std::vector<uint64_t> addrs(n);
  for (int r = 0; r < n; ++r) addrs[r] = c.peerAddr(r, s0, me);
  std::vector<const void*> srcs(n);
  auto* o = static_cast<uint8_t*>(out);
  for (size_t done = 0; done < op.count;) {
    const size_t ck = std::min(chunkElems, op.count - done);
    uint8_t* scratch = c.scratch();
    for (int r = 0; r < n; ++r) {
      if (r == me) {
        srcs[r] = static_cast<const uint8_t*>(ins[me]) + done * es;
      } else {
        c.readPeer(r, addrs[r] + done * es, scratch, ck * es);
        srcs[r] = scratch;
        scratch += ck * es;
      }
    }
    reduceShare(op, o + done * es, srcs.data(), n, ck);
    done += ck;
  }
  finishDirect(c, true);
}

void alltoallDirect(Communicator& c, const OpDesc& op, uint64_t s0, const void* const* ins,
                    void* const* outs) {
  const int n = c.size();
  const int me = c.rank();
  for (int r = 0; r < n; ++r) {
    if (r == me) {
      if (op.recvBytes[r]) std::memcpy(outs[r], ins[r], op.recvBytes[r]);
    } else {
      c.readPeer(r, c.peerAddr(r, s0, me), outs[r], op.recvBytes[r]);
    }
  }
  finishDirect(c, true);
}

}  // namespace collectives
}  // namespace braid
