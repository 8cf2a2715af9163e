// What the staged collectives of a HierGroup share (hier/*.cc): the OpDesc of
// one stage, and errors that say which stage failed.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/shm/communicator.h"
#include "common/error.h"
#include "transport/topology.h"

namespace braid {
namespace collectives {
namespace hier {

// The op one stage runs over a sub-group: `count` elements of op's dtype,
// with op's deadline.
inline OpDesc stageOp(const OpDesc& op, OpKind kind, ReduceOp redop, size_t count, int root = 0) {
  OpDesc s;
  s.kind = kind;
  s.dtype = op.dtype;
  s.redop = redop;
  s.root = root;
  s.count = count;
  s.shape.ndim = 1;
  s.shape.dims[0] = static_cast<int64_t>(count);
  s.deadline = op.deadline;
  s.timeout = op.timeout;
  return s;
}

// The stages sum and divide once at the end (ReduceOp::kAvg divides by the
// sub-group's size, which is not the group's).
inline ReduceOp stageRedop(ReduceOp r) { return r == ReduceOp::kAvg ? ReduceOp::kSum : r; }

// A buffer (or each block) of op.count elements, cut into pieces of
// BRAID_HIER_PIPELINE_BYTES (Note [Pipelined stages]); one piece when that is
// 0, and an empty buffer is one empty piece.
class Pieces {
 public:
  Pieces(const OpDesc& op, uint64_t pieceBytes)
      : es_(elementSize(op.dtype)),
        total_(op.count),
        per_(pieceBytes ? std::max<size_t>(1, pieceBytes / es_) : std::max<size_t>(1, total_)),
        n_(std::max<size_t>(1, (total_ + per_ - 1) / per_)) {}
  size_t count() const { return n_; }
  size_t size(size_t i) const { return std::min(per_, total_ - std::min(total_, i * per_)); }
  size_t offset(size_t i) const { return i * per_ * es_; }  // bytes
  // Piece i's op, as stageOp.
  OpDesc op(const OpDesc& o, OpKind kind, ReduceOp redop, size_t i, int root = 0) const {
    return stageOp(o, kind, redop, size(i), root);
  }
  // "; piece 2 of 4" for errors; nothing for one piece.
  std::string suffix(size_t i) const {
    return n_ > 1 ? strCat("; piece ", i + 1, " of ", n_) : std::string();
  }

 private:
  size_t es_, total_, per_, n_;
};

inline std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += strCat(i ? ", " : "", ranks[i]);
  return s;
}

// "allgather across hosts, among ranks 1, 5, where this rank is rank 1 of 2":
// the ranks that have this rank's local rank on every host (its cross group).
inline std::string acrossHosts(const transport::Topology& topo, const char* what) {
  std::vector<int> peers;
  for (int k = 0; k < topo.numHosts(); ++k) peers.push_back(topo.ranksOn(k)[topo.localRank()]);
  return strCat(what, " across hosts, among ranks ", rankList(peers), ", where this rank is rank ",
                topo.host(), " of ", topo.numHosts());
}

// "reduce-scatter within this host, among ranks 0, 1, where this rank is rank 0 of 2".
inline std::string withinHost(const transport::Topology& topo, const char* what) {
  return strCat(what, " within this host, among ranks ", rankList(topo.ranksOn(topo.host())),
                ", where this rank is rank ", topo.localRank(), " of ", topo.localSize());
}

// "braid allgather (rank 5): op #7, stage 2 of 2 (<where>): ", which the
// stage's own error follows.
inline std::string stageHead(const char* op, int rank, uint64_t opNo, int n, int of,
                             const std::string& where) {
  return errorText(op, rank, "op #", opNo, ", stage ", n, " of ", of, " (", where, "): ");
}

// Runs one stage; its errors keep their type (a timeout or a lost peer breaks
// the group) and lead with what the caller ran: the op, this rank and the
// world's op number, as every other error of the group does. The stage's own
// error follows, in its sub-group's terms (its rank numbers and op count),
// which the head translates (built only on failure).
template <typename H, typename F>
void stage(H&& head, F&& f) {
  try {
    f();
  } catch (const TimeoutError& e) {
    throw TimeoutError(head() + e.what());
  } catch (const PeerLostError& e) {
    throw PeerLostError(head() + e.what());
  } catch (const Error& e) {
    throw Error(head() + e.what());
  }
}

}  // namespace hier
}  // namespace collectives
}  // namespace braid
