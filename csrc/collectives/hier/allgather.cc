// Allgather and reduce-scatter in two stages (Note [Staged allgather and
// reduce-scatter]), pipelined (Note [Pipelined stages] in hier/pipeline.h).
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/hier/pipeline.h"
#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "math/reduce.h"

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
// and each stage's reduced-precision result is rounded to the dtype. Large
// blocks go through in pieces (the same range of every block at once), the
// TCP stage of one piece beside the shared-memory stages of the next
// (allgather) or the previous (reduce-scatter).

namespace {
template <typename P>
P at(P p, size_t offset) {
  return reinterpret_cast<P>(reinterpret_cast<uintptr_t>(p) + offset);
}
}  // namespace

void HierGroup::allgatherStages(const OpDesc& op, const void* in, void* const* outs) {
  const int H = topo_.numHosts(), L = local_->size(), l = local_->rank();
  const hier::Pieces pieces(op, world_->config().hierPieceBytes);
  // Piece i of the block of rank (k, j).
  auto block = [&](int k, int j, size_t i) {
    return at(outs[topo_.ranksOn(k)[j]], pieces.offset(i));
  };
  auto across = [&](size_t i) {
    std::vector<void*> mine(H);  // local rank l's blocks on every host
    for (int k = 0; k < H; ++k) mine[k] = block(k, l, i);
    hier::stage(
        [&] {
          return stageHead("allgather", 1,
                           hier::acrossHosts(topo_, "allgather") + pieces.suffix(i));
        },
        [&] {
          net::allgather(*cross_, pieces.op(op, OpKind::kAllgather, op.redop, i),
                         at(in, pieces.offset(i)), mine.data());
        });
  };
  auto within = [&](size_t i) {
    std::vector<void*> mates(L);
    for (int k = 0; k < H; ++k) {
      for (int j = 0; j < L; ++j) mates[j] = block(k, j, i);
      hier::stage(
          [&] {
            return stageHead("allgather", 2,
                             hier::withinHost(topo_, "allgather") +
                                 strCat("; the blocks of host ", k + 1, " of ", H) +
                                 pieces.suffix(i));
          },
          [&] {
            local_->allgather(pieces.op(op, OpKind::kAllgather, op.redop, i), mates[l],
                              mates.data());
          });
    }
  };
  hier::acrossThenWithin(pieces.count(), *crossT_, across, within);
}

void HierGroup::reduceScatterStages(const OpDesc& op, const void* const* ins, void* out) {
  const int H = topo_.numHosts(), L = local_->size();
  const size_t bytes = op.bytes();
  const ReduceOp red = hier::stageRedop(op.redop);
  const hier::Pieces pieces(op, world_->config().hierPieceBytes);
  if (staging_.size() < H * bytes) staging_.resize(H * bytes);
  // This host's partial sum for rank (k, l), piece i.
  auto partial = [&](int k, size_t i) { return staging_.data() + k * bytes + pieces.offset(i); };
  auto within = [&](size_t i) {
    std::vector<const void*> mates(L);
    for (int k = 0; k < H; ++k) {
      for (int j = 0; j < L; ++j) mates[j] = at(ins[topo_.ranksOn(k)[j]], pieces.offset(i));
      hier::stage(
          [&] {
            return stageHead("reduce_scatter", 1,
                             hier::withinHost(topo_, "reduce-scatter") +
                                 strCat("; the blocks of host ", k + 1, " of ", H) +
                                 pieces.suffix(i));
          },
          [&] {
            local_->reduceScatter(pieces.op(op, OpKind::kReduceScatter, red, i), mates.data(),
                                  partial(k, i));
          });
    }
  };
  auto across = [&](size_t i) {
    std::vector<const void*> sums(H);
    for (int k = 0; k < H; ++k) sums[k] = partial(k, i);
    hier::stage(
        [&] {
          return stageHead("reduce_scatter", 2,
                           hier::acrossHosts(topo_, "reduce-scatter") + pieces.suffix(i));
        },
        [&] {
          net::reduceScatter(*cross_, pieces.op(op, OpKind::kReduceScatter, red, i), sums.data(),
                             at(out, pieces.offset(i)));
        });
  };
  hier::withinThenAcross(pieces.count(), *crossT_, within, across);
  if (op.redop == ReduceOp::kAvg && op.count) {
    reduce::divide(op.dtype, out, out, size(), op.count);
  }
}

}  // namespace collectives
}  // namespace braid
