#include <algorithm>
#include <cstring>

#include "collectives/shm/collectives.h"

namespace braid {
namespace collectives {

namespace {

// Each rank streams its block through its slots; `everyone` decides whether
// all ranks copy every block out (allgather) or the root alone (gather).
void gatherImpl(Communicator& c, const OpDesc& op, const void* in, void* const* outs,
                bool everyone) {
  if (c.plan(op.kind, op.bytes()) == Algo::kDirect) {
    return allgatherDirect(c, op, in, outs, everyone);
  }
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  const bool collect = everyone || me == op.root;
  const size_t total = op.bytes();
  size_t done = 0;
  bool first = true;
  while (first || done < total) {
    size_t len = std::min(c.chunkBytes(), total - done);
    uint64_t s = c.nextStep();
    copyBytes(c.slot(me, s), static_cast<const uint8_t*>(in) + done, len);
    auto copyOut = [&](int r) {
      if (r == me && outs[r] == in) return;  // already in place (Note [The host's sum in place])
      copyBytes(static_cast<uint8_t*>(outs[r]) + done, c.slot(r, s), len);
    };
    if (first) {
      c.writeHeader(op, s, Algo::kShm);
      c.exchange(op, s);
      if (collect) {
        for (int r = 0; r < n; ++r) copyOut(r);
      }
    } else {
      c.publish(s);
      if (collect) c.inArrivalOrder(s, copyOut);  // Note [Arrival order]
    }
    first = false;
    done += len;
  }
}

}  // namespace

void allgather(Communicator& c, const OpDesc& op, const void* in, void* const* outs) {
  gatherImpl(c, op, in, outs, true);
}

void gather(Communicator& c, const OpDesc& op, const void* in, void* const* outs) {
  gatherImpl(c, op, in, outs, false);
}

// The root writes one piece per rank into its slot; each rank copies its own.
void scatter(Communicator& c, const OpDesc& op, const void* const* ins, void* out) {
  if (c.plan(op.kind, op.bytes()) == Algo::kDirect) return scatterDirect(c, op, ins, out);
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  const bool root = me == op.root;
  const size_t total = op.bytes();
  const size_t piece = std::max<size_t>(64, c.chunkBytes() / n / 64 * 64);
  size_t done = 0;
  bool first = true;
  while (first || done < total) {
    size_t len = std::min(piece, total - done);
    uint64_t s = c.nextStep();
    if (root) {
      for (int r = 0; r < n; ++r) {
        copyBytes(c.slot(me, s) + r * piece, static_cast<const uint8_t*>(ins[r]) + done, len);
      }
    }
    if (first) {
      c.writeHeader(op, s, Algo::kShm);
      c.exchange(op, s);
    } else {
      c.publish(s);
      if (!root) c.wait(op.root, s);
    }
    first = false;
    copyBytes(static_cast<uint8_t*>(out) + done, c.slot(op.root, s) + me * piece, len);
    done += len;
  }
}

}  // namespace collectives
}  // namespace braid
