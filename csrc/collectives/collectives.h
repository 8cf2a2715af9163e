// The collectives, over raw bytes, one file per algorithm. Every function is
// collective: all ranks of the Communicator call it with agreeing OpDescs
// (checked, see Note [Op headers]). Buffers are plain host memory; inputs and
// outputs may be the same buffer where noted.
//
// ReduceOp::kAvg divides by the group size; kPremulSum must be turned into
// kSum by the caller after scaling the input.
#pragma once

#include "collectives/communicator.h"

namespace braid {
namespace collectives {

// out[i] = op over ranks of in[i]; in == out allowed. Picks one-shot or
// reduce-scatter + allgather by size (BRAID_ALLREDUCE_ONESHOT_MAX).
void allreduce(Communicator& c, const OpDesc& op, const void* in, void* out);
void allreduceOneShot(Communicator& c, const OpDesc& op, const void* in, void* out);
void allreduceRsAg(Communicator& c, const OpDesc& op, const void* in, void* out);

// buf: input on the root, output elsewhere.
void broadcast(Communicator& c, const OpDesc& op, void* buf);

// out (root only) = op over ranks of in; in == out allowed on the root.
void reduce(Communicator& c, const OpDesc& op, const void* in, void* out);

// outs[r] receives rank r's in; op.count elements each.
void allgather(Communicator& c, const OpDesc& op, const void* in, void* const* outs);

// Like allgather, outs used on the root only.
void gather(Communicator& c, const OpDesc& op, const void* in, void* const* outs);

// The root's ins[r] goes to rank r's out; ins used on the root only.
void scatter(Communicator& c, const OpDesc& op, const void* const* ins, void* out);

// out = op over ranks of their ins[rank]; op.count elements per section.
void reduceScatter(Communicator& c, const OpDesc& op, const void* const* ins, void* out);

// ins[j] (op.sendBytes[j] bytes) goes to rank j's outs[me] (its recvBytes[me]).
void alltoall(Communicator& c, const OpDesc& op, const void* const* ins, void* const* outs);

void barrier(Communicator& c, const OpDesc& op);

// The op's header step alone, for a rank that failed its argument checks:
// tells the peers, then throws op.localError. See Note [Op headers].
void failOp(Communicator& c, const OpDesc& op);

}  // namespace collectives
}  // namespace braid
