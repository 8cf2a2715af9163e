// Allgather and reduce-scatter in two stages (Note [Staged allgather and
// reduce-scatter]).
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "reduce/reduce.h"

namespace braid {
namespace collectives {

// Note [Staged allgather and reduce-scatter]
// A flat ring over n = H x L ranks pushes n - 1 blocks through each link
// between hosts. Staged, each host takes in only the (H - 1) x L blocks it
// lacks, over all its ranks' sockets at once (2 x 2 ranks: 2 blocks per host
// instead of 3).
// Allgather: in cross group l (the ranks of local rank l on every host), an
// allgather of the ranks' own blocks, straight into outs; then, for each host
// k, an allgather within this host of the blocks of host k's ranks, which
// local rank l received in the first stage.
// Reduce-scatter, the mirror image: for each host k, a reduce-scatter within
// this host of the inputs meant for host k's ranks, leaving local rank l with
// this host's partial sum for rank (k, l); then, in cross group l, a
// reduce-scatter of those H partial sums, leaving each rank its own block.
// Like the staged allreduce, the stages sum and AVG divides once at the end,
// and each stage's reduced-precision result is rounded to the dtype.

void HierGroup::allgatherStages(const OpDesc& op, const void* in, void* const* outs) {
  const int H = topo_.numHosts(), L = local_->size(), l = local_->rank();
  const OpDesc part = hier::stageOp(op, OpKind::kAllgather, op.redop, op.count);
  std::vector<void*> mine(H);  // the blocks of local rank l on every host
  for (int k = 0; k < H; ++k) mine[k] = outs[topo_.ranksOn(k)[l]];
  hier::stage(
      [&] {
        return hier::stageHead("allgather", rank(), world_->opCount(), 1, 2,
                               hier::acrossHosts(topo_, "allgather"));
      },
      [&] { net::allgather(*cross_, part, in, mine.data()); });
  std::vector<void*> mates(L);
  for (int k = 0; k < H; ++k) {
    for (int j = 0; j < L; ++j) mates[j] = outs[topo_.ranksOn(k)[j]];
    hier::stage(
        [&] {
          return hier::stageHead("allgather", rank(), world_->opCount(), 2, 2,
                                 hier::withinHost(topo_, "allgather") +
                                     strCat("; the blocks of host ", k + 1, " of ", H));
        },
        [&] { local_->allgather(part, mine[k], mates.data()); });
  }
}

void HierGroup::reduceScatterStages(const OpDesc& op, const void* const* ins, void* out) {
  const int H = topo_.numHosts(), L = local_->size();
  const size_t count = op.count, bytes = op.bytes();
  const OpDesc part =
      hier::stageOp(op, OpKind::kReduceScatter, hier::stageRedop(op.redop), count);
  if (staging_.size() < H * bytes) staging_.resize(H * bytes);
  std::vector<const void*> sums(H);  // this host's partial sums for rank (k, l)
  std::vector<const void*> mates(L);
  for (int k = 0; k < H; ++k) {
    for (int j = 0; j < L; ++j) mates[j] = ins[topo_.ranksOn(k)[j]];
    uint8_t* sum = staging_.data() + k * bytes;
    sums[k] = sum;
    hier::stage(
        [&] {
          return hier::stageHead("reduce_scatter", rank(), world_->opCount(), 1, 2,
                                 hier::withinHost(topo_, "reduce-scatter") +
                                     strCat("; the blocks of host ", k + 1, " of ", H));
        },
        [&] { local_->reduceScatter(part, mates.data(), sum); });
  }
  hier::stage(
      [&] {
        return hier::stageHead("reduce_scatter", rank(), world_->opCount(), 2, 2,
                               hier::acrossHosts(topo_, "reduce-scatter"));
      },
      [&] { net::reduceScatter(*cross_, part, sums.data(), out); });
  if (op.redop == ReduceOp::kAvg && count) reduce::divide(op.dtype, out, out, size(), count);
}

}  // namespace collectives
}  // namespace braid
