// Broadcast and reduce in two stages (Note [Staged broadcast and reduce]),
// pipelined (Note [Pipelined stages] in hier/pipeline.h).
#include <algorithm>
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/hier/pipeline.h"
#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {

// Note [Staged broadcast and reduce]
// The root is local rank lr on host hr. Broadcast: the ranks of local rank lr
// (cross group lr) broadcast from host hr across hosts, then every host
// broadcasts from its local rank lr over shared memory, so each host takes in
// the buffer once (a flat tree over all ranks sends it to every rank over TCP,
// to ranks on the root's own host too). Reduce is the mirror image: a reduce
// to local rank lr within each host, then a reduce across hosts to host hr in
// cross group lr. Ranks of other local ranks sit out the TCP stage: their
// cross groups run nothing, so every cross group still counts the same ops on
// all its ranks. The stages sum and AVG divides once, on the root. Large
// buffers go through in pieces, the TCP stage of one piece beside the
// shared-memory stage of the next (broadcast) or the previous (reduce).

void HierGroup::broadcastStages(const OpDesc& op, void* buf) {
  const int hr = topo_.hostOf(op.root), lr = topo_.localRankOf(op.root);
  const bool crosses = local_->rank() == lr;
  const hier::Pieces pieces(op, world_->config().hierPieceBytes);
  auto* b = static_cast<uint8_t*>(buf);
  auto across = [&](size_t i) {
    hier::stage(
        [&] {
          return stageHead("broadcast", 1,
                           hier::acrossHosts(topo_, "broadcast") + pieces.suffix(i));
        },
        [&] {
          net::broadcast(*cross_, pieces.op(op, OpKind::kBroadcast, op.redop, i, hr),
                         b + pieces.offset(i));
        });
  };
  auto within = [&](size_t i) {
    hier::stage(
        [&] {
          return stageHead("broadcast", 2, hier::withinHost(topo_, "broadcast") + pieces.suffix(i));
        },
        [&] {
          local_->broadcast(pieces.op(op, OpKind::kBroadcast, op.redop, i, lr),
                            b + pieces.offset(i));
        });
  };
  if (crosses) return hier::acrossThenWithin(pieces.count(), *crossT_, across, within);
  for (size_t i = 0; i < pieces.count(); ++i) within(i);
}

void HierGroup::reduceStages(const OpDesc& op, const void* in, void* out) {
  const int hr = topo_.hostOf(op.root), lr = topo_.localRankOf(op.root);
  const bool crosses = local_->rank() == lr, root = rank() == op.root;
  const ReduceOp red = hier::stageRedop(op.redop);
  const hier::Pieces pieces(op, world_->config().hierPieceBytes);
  if (staging_.size() < op.bytes()) staging_.resize(op.bytes());
  uint8_t* sum = staging_.data();  // this host's sum, on local rank lr
  auto within = [&](size_t i) {
    hier::stage(
        [&] {
          return stageHead("reduce", 1, hier::withinHost(topo_, "reduce") + pieces.suffix(i));
        },
        [&] {
          local_->reduce(pieces.op(op, OpKind::kReduce, red, i, lr),
                         static_cast<const uint8_t*>(in) + pieces.offset(i),
                         sum + pieces.offset(i));
        });
  };
  auto across = [&](size_t i) {
    uint8_t* s = sum + pieces.offset(i);
    hier::stage(
        [&] {
          return stageHead("reduce", 2, hier::acrossHosts(topo_, "reduce") + pieces.suffix(i));
        },
        [&] {
          net::reduce(*cross_, pieces.op(op, OpKind::kReduce, red, i, hr), s,
                      root ? static_cast<uint8_t*>(out) + pieces.offset(i) : s);
        });
  };
  if (crosses) {
    hier::withinThenAcross(pieces.count(), *crossT_, within, across);
  } else {
    for (size_t i = 0; i < pieces.count(); ++i) within(i);
  }
  if (root && op.redop == ReduceOp::kAvg && op.count) {
    reduce::divide(op.dtype, out, out, size(), op.count);
  }
}

}  // namespace collectives
}  // namespace braid
