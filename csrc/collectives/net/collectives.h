// The collectives over a message transport, over raw bytes, one file per
// algorithm (Note [Collectives over messages] in net_comm.h). The signatures
// and buffer rules are those of collectives/shm/collectives.h: every function is
// collective, all ranks pass agreeing OpDescs (checked in the header
// exchange), kAvg divides by the group size, kPremulSum must be turned into
// kSum by the caller after scaling the input (as the backend does today).
#pragma once

#include "collectives/net/net_comm.h"

namespace braid {
namespace collectives {
namespace net {

// out[i] = op over ranks of in[i]; in == out allowed. Ring from
// config().allreduceRingMin bytes, else a direct exchange.
void allreduce(NetComm& c, const OpDesc& op, const void* in, void* out);
void allreduceRing(NetComm& c, const OpDesc& op, const void* in, void* out);
void allreducePair(NetComm& c, const OpDesc& op, const void* in, void* out);  // 2 ranks
void allreduceDirect(NetComm& c, const OpDesc& op, const void* in, void* out);

// buf: input on the root, output elsewhere. Binomial tree, or a pipelined
// chain where chainBroadcast (Note [Broadcast across hosts]).
void broadcast(NetComm& c, const OpDesc& op, void* buf);
bool chainBroadcast(int n, uint64_t bytes);

// out (root only) = op over ranks of in; in == out allowed on the root.
void reduce(NetComm& c, const OpDesc& op, const void* in, void* out);

// outs[r] receives rank r's in; op.count elements each. Ring.
void allgather(NetComm& c, const OpDesc& op, const void* in, void* const* outs);
// Like allgather, outs used on the root only. Straight to the root.
void gather(NetComm& c, const OpDesc& op, const void* in, void* const* outs);
// The root's ins[r] goes to rank r's out; ins used on the root only.
void scatter(NetComm& c, const OpDesc& op, const void* const* ins, void* out);

// out = op over ranks of their ins[rank]; op.count elements per section.
void reduceScatter(NetComm& c, const OpDesc& op, const void* const* ins, void* out);

// ins[j] (op.sendBytes[j] bytes) goes to rank j's outs[me] (its recvBytes[me]).
void alltoall(NetComm& c, const OpDesc& op, const void* const* ins, void* const* outs);

void barrier(NetComm& c, const OpDesc& op);

// The header exchange alone, for a rank that failed its argument checks:
// tells the peers, then throws op.localError.
void failOp(NetComm& c, const OpDesc& op);

}  // namespace net
}  // namespace collectives
}  // namespace braid
