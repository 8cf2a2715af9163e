// Allreduce in three stages (Note [Collectives across hosts]), pipelined
// (Note [Pipelined stages] in hier/pipeline.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/hier/hier_group.h"
#include "collectives/hier/pipeline.h"
#include "collectives/hier/stages.h"
#include "collectives/net/collectives.h"
#include "common/error.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {

using hier::stage;
using hier::stageOp;

// A piece of the buffer, elements [first, first + count), cut into L sections
// of q = ceil(count / L) elements (the shared-memory reduce-scatter and
// allgather move equal sections); the last non-empty section may be short and
// later ones empty: those go through padded copies, so at most one section's
// worth is copied.
struct HierGroup::Piece {
  size_t first = 0, count = 0, q = 0;
  std::vector<const void*> ins;
  std::vector<void*> outs;
  std::unique_ptr<uint8_t[]> padIn, padOut;
  size_t valid(int r) const {
    size_t b = std::min(count, r * q);
    return std::min(count, b + q) - b;
  }
};

// Note [The host's sum in place]
// Each rank reduces its section of a piece straight into that section's place
// in `out` (outs[l]; the padded copy for a short section): the TCP stage
// allreduces it there, and the allgather then only reads the other local
// ranks' sections, since it copies a rank's own section only from elsewhere.
// Through a staging buffer, that copy took about 6% of the CPU time of a
// 64 MiB allreduce on 2 hosts x 2 ranks (perf). No rank reads what another
// writes meanwhile: in the reduce-scatter a rank writes only its own section
// while the local peers read theirs from its `in` (the same memory in place,
// `in` == `out`), and it returns only once they all have; the allgather reads
// a rank's section only after that rank has entered it, its TCP stage done.
namespace {

void cut(HierGroup::Piece& p, int L, size_t es, const uint8_t* in, uint8_t* out) {
  in += p.first * es;
  out += p.first * es;
  size_t padded = 0;
  for (int r = 0; r < L; ++r) padded += p.valid(r) < p.q;
  if (padded) {
    p.padIn.reset(new uint8_t[padded * p.q * es]);
    p.padOut.reset(new uint8_t[padded * p.q * es]);
  }
  p.ins.resize(L);
  p.outs.resize(L);
  for (int r = 0, k = 0; r < L; ++r) {
    const size_t v = p.valid(r);
    if (v == p.q) {
      p.ins[r] = in + r * p.q * es;
      p.outs[r] = out + r * p.q * es;
      continue;
    }
    uint8_t* pi = p.padIn.get() + k * p.q * es;
    if (v) std::memcpy(pi, in + r * p.q * es, v * es);
    std::memset(pi + v * es, 0, (p.q - v) * es);
    p.ins[r] = pi;
    p.outs[r] = p.padOut.get() + k * p.q * es;
    ++k;
  }
}

void unpad(const HierGroup::Piece& p, int L, size_t es, uint8_t* out) {
  out += p.first * es;
  for (int r = 0, k = 0; r < L; ++r) {
    const size_t v = p.valid(r);
    if (v == p.q) continue;
    if (v) std::memcpy(out + r * p.q * es, p.padOut.get() + k * p.q * es, v * es);
    ++k;
  }
}

}  // namespace

void HierGroup::allreduceStages(const OpDesc& op, const void* in, void* out) {
  const int L = local_->size(), l = local_->rank();
  const size_t es = elementSize(op.dtype), count = op.count;
  const ReduceOp red = hier::stageRedop(op.redop);
  const uint64_t pieceBytes = world_->config().hierPieceBytes;
  // Pieces of a multiple of L elements: only the last piece has a short section.
  const size_t per = pieceBytes ? std::max<size_t>(1, pieceBytes / es / L) * L : count;
  const size_t numPieces = std::max<size_t>(1, (count + per - 1) / per);

  std::vector<Piece> pieces(numPieces);
  for (size_t i = 0; i < numPieces; ++i) {
    Piece& p = pieces[i];
    p.first = i * per;
    p.count = std::min(per, count - p.first);
    p.q = (p.count + L - 1) / L;
    cut(p, L, es, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out));
  }
  // This rank's section of piece i of the host's sum: its place in the
  // output (Note [The host's sum in place]).
  auto mine = [&](size_t i) { return static_cast<uint8_t*>(pieces[i].outs[l]); };

  // "braid allreduce (rank 5): op #7, stage 2 of 3 (...): braid allreduce (rank 1): op #3 ..."
  auto head = [&](int n, size_t i) {
    std::string where = n == 2   ? hier::acrossHosts(topo_, "allreduce")
                        : n == 1 ? hier::withinHost(topo_, "reduce-scatter")
                                 : hier::withinHost(topo_, "allgather");
    if (numPieces > 1) where += strCat("; piece ", i + 1, " of ", numPieces);
    return hier::stageHead("allreduce", rank(), world_->opCount(), n, 3, where);
  };
  auto scatter = [&](size_t i) {
    Piece& p = pieces[i];
    stage([&] { return head(1, i); }, [&] {
      local_->reduceScatter(stageOp(op, OpKind::kReduceScatter, red, p.q), p.ins.data(), mine(i));
    });
  };
  auto across = [&](size_t i) {
    const size_t v = pieces[i].valid(l);
    uint8_t* sum = mine(i);
    stage([&] { return head(2, i); }, [&] {
      net::allreduce(*cross_, stageOp(op, OpKind::kAllreduce, red, v), sum, sum);
    });
    if (op.redop == ReduceOp::kAvg && v) reduce::divide(op.dtype, sum, sum, size(), v);
  };
  auto gather = [&](size_t i) {
    Piece& p = pieces[i];
    stage([&] { return head(3, i); }, [&] {
      local_->allgather(stageOp(op, OpKind::kAllgather, red, p.q), mine(i), p.outs.data());
    });
    unpad(p, L, es, static_cast<uint8_t*>(out));
  };

  if (numPieces == 1) {
    scatter(0);
    across(0);
    gather(0);
    return;
  }
  hier::CrossStages tcp(numPieces, *crossT_);  // after the buffers: joined before they go
  try {
    for (size_t i = 0; i < numPieces; ++i) {
      scatter(i);
      tcp.submit(i, [&across, i] { across(i); });
      if (i > 0) {
        tcp.wait(i - 1);
        gather(i - 1);
      }
    }
    tcp.wait(numPieces - 1);
    gather(numPieces - 1);
  } catch (...) {
    tcp.fail(std::current_exception());
  }
}

}  // namespace collectives
}  // namespace braid
