// Note [Allreduce on a narrower wire] in collectives.h.
#include <algorithm>
#include <vector>

#include "collectives/shm/collectives.h"
#include "common/error.h"
#include "math/cast.h"
#include "math/reduce.h"

namespace braid {
namespace collectives {

namespace {

uint16_t* wireAt(Communicator& c, int rank, uint64_t step, size_t elem) {
  return reinterpret_cast<uint16_t*>(c.slot(rank, step)) + elem;
}

}  // namespace

// The steps of allreduceRsAg (Note [Pipelined reduce-scatter + allgather]),
// with 16-bit values in the slots: (A) every rank rounds its whole chunk into
// its slot; (B) each reduces its 1/n share of the chunk from every rank's
// slot into its next slot; then all widen every share into their output.
void allreduceNarrowed(Communicator& c, const OpDesc& op, const void* in, void* out) {
  const char* name = opName(op.kind);
  BRAID_ENFORCE(op.kind == OpKind::kAllreduce && op.dtype == DataType::kFloat32 &&
                    op.redop == ReduceOp::kSum &&
                    (op.wire == DataType::kBFloat16 || op.wire == DataType::kFloat16),
                name, c.rank(), "a narrowed allreduce sums float32 buffers as float16 or "
                "bfloat16; got ", toString(op.dtype), " as ", toString(op.wire), " with ",
                toString(op.redop));
  c.beginOp(op);
  const int n = c.size();
  const int me = c.rank();
  constexpr size_t kWireBytes = 2;
  const size_t align = 64 / kWireBytes;
  const size_t chunkElems = c.chunkBytes() / kWireBytes;
  const size_t total = op.count;
  const auto* x = static_cast<const float*>(in);
  auto* y = static_cast<float*>(out);
  std::vector<const void*> srcs(n);
  size_t done = 0;
  bool first = true;
  while (first || done < total) {
    const size_t ck = std::min(chunkElems, total - done);
    const uint64_t sa = c.nextStep();
    if (first) c.writeHeader(op, sa, Algo::kNarrowed);
    if (ck) reduce::narrowDivided(x + done, wireAt(c, me, sa, 0), ck, op.wireDivisor, op.wire);
    c.chunkStep(op, sa, first);
    first = false;
    size_t b, e;
    partition(ck, n, me, align, &b, &e);
    const uint64_t sb = c.nextStep();
    if (e > b) {
      for (int r = 0; r < n; ++r) srcs[r] = wireAt(c, r, sa, b);
      reduce::reduceN(op.wire, ReduceOp::kSum, wireAt(c, me, sb, b), srcs.data(), n, e - b);
    }
    c.publish(sb);
    c.inArrivalOrder(sb, [&](int r) {  // Note [Arrival order]
      partition(ck, n, r, align, &b, &e);
      if (e > b) reduce::widen(wireAt(c, r, sb, b), y + done + b, e - b, op.wire, false);
    });
    done += ck;
  }
}

}  // namespace collectives
}  // namespace braid
