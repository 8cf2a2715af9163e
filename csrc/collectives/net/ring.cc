#include "collectives/net/ring.h"

#include <algorithm>

#include "collectives/reduce_share.h"
#include "math/half.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {
namespace net {

WorkType workTypeOf(const OpDesc& op) {
  WorkType w{op.dtype, kernelOp(op.redop), false};
  const bool half = op.dtype == DataType::kFloat16 || op.dtype == DataType::kBFloat16;
  const bool arith = w.kernelOp == ReduceOp::kSum || w.kernelOp == ReduceOp::kProduct;
  if (half && arith) {
    w.type = DataType::kFloat32;
    w.widened = true;
  }
  return w;
}

void toWork(const WorkType& w, DataType dtype, void* dst, const void* src, size_t count) {
  if (!w.widened) {
    copyBytes(dst, src, count * elementSize(dtype));
    return;
  }
  auto* s = static_cast<const uint16_t*>(src);
  auto* d = static_cast<float*>(dst);
  if (dtype == DataType::kFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = reduce::halfToFloat(s[i]);
  } else {
    for (size_t i = 0; i < count; ++i) d[i] = reduce::bf16ToFloat(s[i]);
  }
}

void finishBlock(const WorkType& w, DataType dtype, ReduceOp redop, int n, void* dst, void* src,
                 size_t count) {
  if (count == 0) return;
  if (redop == ReduceOp::kAvg) reduce::divide(w.type, src, src, n, count);
  if (!w.widened) {
    if (dst != src) copyBytes(dst, src, count * elementSize(dtype));
    return;
  }
  auto* s = static_cast<const float*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DataType::kFloat16) {
    for (size_t i = 0; i < count; ++i) d[i] = reduce::floatToHalf(s[i]);
  } else {
    for (size_t i = 0; i < count; ++i) d[i] = reduce::floatToBf16(s[i]);
  }
}

// Step s: send block (me - 1 - s) to the right, receive block (me - 2 - s)'s
// partial from the left and combine it with this rank's own; the last step
// receives block me. Each block's partial starts at its owner's right
// neighbour and goes once around the ring.
// Each block travels as segments of kSegmentBytes (a fixed size: the ranks
// must cut alike, since a receive's size must equal its message's), and a
// segment is reduced as soon as it has arrived, while the next ones are on the
// wire: the reduction hides behind the transfer instead of following it.
void ringReduceScatter(NetComm& c, const WorkType& w, uint8_t* const* blocks, const size_t* counts,
                       uint32_t step0) {
  const int n = c.size(), me = c.rank();
  if (n == 1) return;
  const size_t es = w.elem();
  const size_t seg = std::max<size_t>(1, kSegmentBytes / es);
  const size_t most = *std::max_element(counts, counts + n);
  uint8_t* tmp = c.scratch(most * es);
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int sendIdx = ((me - 1 - s) % n + n) % n;
    const int recvIdx = ((me - 2 - s) % n + n) % n;
    const size_t first = c.posted();
    for (size_t off = 0; off < counts[recvIdx]; off += seg) {
      c.recv(left, step0 + s, tmp + off * es, std::min(seg, counts[recvIdx] - off) * es);
    }
    for (size_t off = 0; off < counts[sendIdx]; off += seg) {
      c.send(right, step0 + s, blocks[sendIdx] + off * es,
             std::min(seg, counts[sendIdx] - off) * es);
    }
    size_t k = first;
    for (size_t off = 0; off < counts[recvIdx]; off += seg, ++k) {
      const size_t len = std::min(seg, counts[recvIdx] - off);
      c.waitPosted(k);
      uint8_t* mine = blocks[recvIdx] + off * es;
      const void* srcs[2] = {mine, tmp + off * es};
      reduce::reduceN(w.type, w.kernelOp, mine, srcs, 2, len);
    }
    c.wait();
  }
}

// Step s: send block (me - s) to the right, receive block (me - 1 - s) from
// the left straight into place.
void ringAllgather(NetComm& c, size_t elemBytes, uint8_t* const* blocks, const size_t* counts,
                   uint32_t step0) {
  const int n = c.size(), me = c.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int sendIdx = ((me - s) % n + n) % n;
    const int recvIdx = ((me - 1 - s) % n + n) % n;
    c.recv(left, step0 + s, blocks[recvIdx], counts[recvIdx] * elemBytes);
    c.send(right, step0 + s, blocks[sendIdx], counts[sendIdx] * elemBytes);
    c.wait();
  }
}

void reduceAll(const OpDesc& op, void* dst, const void* const* srcs, int n, size_t count) {
  reduceShare(op, dst, srcs, n, count);
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
