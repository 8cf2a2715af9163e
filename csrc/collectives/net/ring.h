// Ring steps shared by the net collectives, and the working type of the
// reducing ones (Note [Collectives over messages]).
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/net/net_comm.h"

namespace braid {
namespace collectives {
namespace net {

// Bytes per message of a ring step (ringReduceScatter); equal on every rank
// by construction.
constexpr size_t kSegmentBytes = 1 << 20;

// The type partial results travel in: float32 for float16/bfloat16 SUM, AVG
// and PRODUCT (rounded once at the end), else the op's own type.
struct WorkType {
  DataType type;
  ReduceOp kernelOp;  // AVG runs as SUM
  bool widened;
  size_t elem() const { return elementSize(type); }
};
WorkType workTypeOf(const OpDesc& op);

// Copies `count` elements of op.dtype at src into dst in w.type (widening).
void toWork(const WorkType& w, DataType dtype, void* dst, const void* src, size_t count);
// Finishes a fully reduced block: AVG divides by n; then writes it to dst
// in dtype (rounding once when widened). dst may equal src (a widened block
// then shrinks into its own start).
void finishBlock(const WorkType& w, DataType dtype, ReduceOp redop, int n, void* dst, void* src,
                 size_t count);

// Ring reduce-scatter over n blocks (in w.type) of `counts` elements: on
// return rank me's blocks[me] holds the op over every rank's blocks[me]
// (AVG not yet divided); the other blocks hold partial results. Uses steps
// step0 .. step0 + n - 2.
void ringReduceScatter(NetComm& c, const WorkType& w, uint8_t* const* blocks, const size_t* counts,
                       uint32_t step0);
// Ring allgather: rank r's blocks[r] (elemBytes each element) reaches every
// rank's blocks[r]. Uses steps step0 .. step0 + n - 2.
void ringAllgather(NetComm& c, size_t elemBytes, uint8_t* const* blocks, const size_t* counts,
                   uint32_t step0);

// Rank order reduction of n inputs into dst (AVG divided), as the shm path.
void reduceAll(const OpDesc& op, void* dst, const void* const* srcs, int n, size_t count);

}  // namespace net
}  // namespace collectives
}  // namespace braid
