// How the reducing collectives apply an op to one share of a buffer:
// AVG runs as SUM, then divides by the group size.
#pragma once

#include "collectives/shm/communicator.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {

inline ReduceOp kernelOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

// dst = op over srcs[0..n); for AVG, the sum divided by n.
inline void reduceShare(const OpDesc& op, void* dst, const void* const* srcs, int n,
                        size_t count) {
  if (count == 0) return;
  reduce::reduceN(op.dtype, kernelOp(op.redop), dst, srcs, n, count);
  if (op.redop == ReduceOp::kAvg) reduce::divide(op.dtype, dst, dst, n, count);
}

}  // namespace collectives
}  // namespace braid
