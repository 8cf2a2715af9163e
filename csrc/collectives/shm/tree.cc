#include "collectives/shm/tree.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/reduce_share.h"
#include "common/error.h"
#include "math/cast.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {

namespace {

bool sixteenBit(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

uint64_t statusIn(Communicator& c, int rank) {
  uint64_t v;
  std::memcpy(&v, c.line(rank), sizeof(v));
  return v;
}

void setStatus(Communicator& c, uint64_t v) { std::memcpy(c.line(c.rank()), &v, sizeof(v)); }

// A tree rank waits for its children and the root only, so a timeout would
// name one of them (often rank 0) where the rank really missing is further
// down. So it names, as the flat path's waitAll does, the ranks the op waits
// for: those not past its gather step `s` whose children all are (a parent
// still in the gather waits for a child, and is not the cause).
void waitFor(Communicator& c, int peer, uint64_t step, uint64_t s) {
  try {
    c.wait(peer, step);
  } catch (const TimeoutError& e) {
    const int n = c.size();
    auto behind = [&](int q) { return q < n && c.window().published(q) < s; };
    std::string missing;
    for (int q = 0; q < n; ++q) {
      if (q == c.rank() || !behind(q)) continue;
      bool childBehind = false;
      for (int k = 1; k <= kTreeRadix; ++k) childBehind = childBehind || behind(kTreeRadix * q + k);
      if (!childBehind) missing += strCat(missing.empty() ? "" : ", ", q);
    }
    if (missing.empty()) throw;
    throw TimeoutError(strCat(e.what(), "; the tree op waits for rank(s) [", missing,
                              "], which have not reached its first step"));
  }
}

}  // namespace

// Note [Tree allreduce] (tree.h) describes the steps, Note [Tree slots] why
// they need no wait for every peer, Note [Flat ranks among tree ranks] how
// errors travel.
void allreduceTree(Communicator& c, const OpDesc& op, const void* in, void* out) {
  c.beginOp(op);
  const int me = c.rank();
  const int n = c.size();
  const uint64_t s = c.treeSteps();  // gather; s + 1 releases
  c.writeHeader(op, s, Algo::kTree);

  const size_t count = op.kind == OpKind::kBarrier ? 0 : op.count;
  // Note [Tree allreduce]: 16-bit types travel and combine as float32.
  const bool widened = sixteenBit(op.dtype);
  const DataType acc = widened ? DataType::kFloat32 : op.dtype;
  const size_t partBytes = count * elementSize(acc);
  const size_t resultBytes = count * elementSize(op.dtype);
  const bool partInline = partBytes <= kTreeInlineBytes;
  const bool resultInline = resultBytes <= kTreeInlineBytes;
  uint8_t* scratch = c.scratch();  // 2 slots; the widened input needs one

  // The status: 0, or 1 + the rank that found the first error in this subtree.
  uint64_t status = op.localError.empty() ? 0 : static_cast<uint64_t>(me) + 1;
  std::string why = op.localError;
  const void* srcs[1 + kTreeRadix];
  int nsrcs = 0;
  srcs[nsrcs++] = widened ? static_cast<const void*>(scratch) : in;
  const int first = kTreeRadix * me + 1;
  const int last = static_cast<int>(std::min<int64_t>(n, int64_t(first) + kTreeRadix));
  for (int child = first; child < last; ++child) {
    // Every child, even after an error: the release must find every rank
    // past its gather step (Note [Tree slots]).
    waitFor(c, child, s, s);
    if (status != 0) continue;
    try {
      // The header first: a flat rank's line holds no status of this op.
      c.checkHeader(op, child, s);
    } catch (const Error& e) {
      status = static_cast<uint64_t>(me) + 1;
      why = e.what();
      continue;
    }
    if (const uint64_t theirs = statusIn(c, child)) {
      status = theirs;
      continue;
    }
    srcs[nsrcs++] = partInline ? c.line(child) + sizeof(uint64_t) : c.slot(child, s);
  }

  const ReduceOp kop = kernelOp(op.redop);
  if (me != 0) {
    if (status == 0 && count > 0) {
      if (widened) reduce::widen(static_cast<const uint16_t*>(in), reinterpret_cast<float*>(scratch),
                                 count, op.dtype, false);
      uint8_t* part = partInline ? c.line(me) + sizeof(uint64_t) : c.slot(me, s);
      reduce::reduceN(acc, kop, part, srcs, nsrcs, count);
    }
    if (status == static_cast<uint64_t>(me) + 1) c.setTreeError(s, why);
    setStatus(c, status);
    c.publish(s);
    waitFor(c, 0, s + 1, s);
    status = statusIn(c, 0);
    if (status == 0) {
      copyBytes(out, resultInline ? c.line(0) + sizeof(uint64_t) : c.slot(0, s + 1), resultBytes);
    } else if (status != static_cast<uint64_t>(me) + 1) {
      // Read before publishing s + 1: the finder writes its control area
      // again only once every rank has (Note [Tree slots]).
      const char* text = c.treeErrorText(static_cast<int>(status - 1), s);
      why.assign(text, strnlen(text, Communicator::kTreeErrorBytes));
    }
    c.publish(s + 1);
  } else {
    if (status == 0 && count > 0) {
      uint8_t* result = resultInline ? c.line(0) + sizeof(uint64_t) : c.slot(0, s + 1);
      if (widened) {
        // Widened input and float32 total in place, then one rounding.
        auto* total = reinterpret_cast<float*>(scratch);
        reduce::widen(static_cast<const uint16_t*>(in), total, count, op.dtype, false);
        reduce::reduceN(acc, kop, total, srcs, nsrcs, count);
        reduce::narrowDivided(total, reinterpret_cast<uint16_t*>(result), count, 1.0f, op.dtype);
      } else {
        reduce::reduceN(acc, kop, result, srcs, nsrcs, count);
      }
      if (op.redop == ReduceOp::kAvg) reduce::divide(op.dtype, result, result, n, count);
      copyBytes(out, result, resultBytes);
    }
    if (status != 0 && status != 1) {
      // Read before the release, after which the finder may write it again.
      const char* text = c.treeErrorText(static_cast<int>(status - 1), s);
      why.assign(text, strnlen(text, Communicator::kTreeErrorBytes));
    }
    c.treeRelease(s + 1, status, why);
  }
  if (status == 0) {
    c.treeDone(s + 1);
    return;
  }
  // Note [Op headers]: a rank that failed its own checks says so, as on the
  // flat path; the others name the rank that found the difference.
  if (!op.localError.empty()) throw Error(op.localError);
  if (status == static_cast<uint64_t>(me) + 1) throw Error(why);
  BRAID_THROW(Error, opName(op.kind), me, "rank ", status - 1, " found the ranks' ops differ: ",
              why);
}

}  // namespace collectives
}  // namespace braid
