// Broadcast and reduce in two stages (Note [Staged broadcast and reduce]).
#include "collectives/hier/hier_group.h"
#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "reduce/reduce.h"

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
// all its ranks. The stages sum and AVG divides once, on the root.

namespace {
int localRankOf(const transport::Topology& topo, int rank) {
  const std::vector<int>& mates = topo.ranksOn(topo.hostOf(rank));
  for (size_t j = 0; j < mates.size(); ++j) {
    if (mates[j] == rank) return static_cast<int>(j);
  }
  return -1;  // not reached: every rank is on its host
}
}  // namespace

void HierGroup::broadcastStages(const OpDesc& op, void* buf) {
  const int hr = topo_.hostOf(op.root), lr = localRankOf(topo_, op.root);
  if (local_->rank() == lr) {
    hier::stage(
        [&] {
          return hier::stageHead("broadcast", rank(), world_->opCount(), 1, 2,
                                 hier::acrossHosts(topo_, "broadcast"));
        },
        [&] {
          net::broadcast(*cross_, hier::stageOp(op, OpKind::kBroadcast, op.redop, op.count, hr),
                         buf);
        });
  }
  hier::stage(
      [&] {
        return hier::stageHead("broadcast", rank(), world_->opCount(), 2, 2,
                               hier::withinHost(topo_, "broadcast"));
      },
      [&] {
        local_->broadcast(hier::stageOp(op, OpKind::kBroadcast, op.redop, op.count, lr), buf);
      });
}

void HierGroup::reduceStages(const OpDesc& op, const void* in, void* out) {
  const int hr = topo_.hostOf(op.root), lr = localRankOf(topo_, op.root);
  const ReduceOp red = hier::stageRedop(op.redop);
  if (staging_.size() < op.bytes()) staging_.resize(op.bytes());
  uint8_t* sum = staging_.data();  // this host's sum, on local rank lr
  hier::stage(
      [&] {
        return hier::stageHead("reduce", rank(), world_->opCount(), 1, 2,
                               hier::withinHost(topo_, "reduce"));
      },
      [&] { local_->reduce(hier::stageOp(op, OpKind::kReduce, red, op.count, lr), in, sum); });
  if (local_->rank() != lr) return;
  const bool root = rank() == op.root;
  hier::stage(
      [&] {
        return hier::stageHead("reduce", rank(), world_->opCount(), 2, 2,
                               hier::acrossHosts(topo_, "reduce"));
      },
      [&] {
        net::reduce(*cross_, hier::stageOp(op, OpKind::kReduce, red, op.count, hr), sum,
                    root ? out : sum);
      });
  if (root && op.redop == ReduceOp::kAvg && op.count) {
    reduce::divide(op.dtype, out, out, size(), op.count);
  }
}

}  // namespace collectives
}  // namespace braid
