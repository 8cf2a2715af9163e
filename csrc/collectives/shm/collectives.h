// The collectives, over raw bytes, one file per algorithm. Every function is
// collective: all ranks of the Communicator call it with agreeing OpDescs
// (checked, see Note [Op headers]). Buffers are plain host memory; inputs and
// outputs may be the same buffer where noted.
//
// ReduceOp::kAvg divides by the group size; kPremulSum must be turned into
// kSum by the caller after scaling the input.
#pragma once

#include "collectives/shm/communicator.h"

namespace braid {
namespace collectives {

// out[i] = op over ranks of in[i]; in == out allowed. Picks one-shot,
// reduce-scatter + allgather or direct reads with plan() (plan.h).
void allreduce(Communicator& c, const OpDesc& op, const void* in, void* out);
void allreduceOneShot(Communicator& c, const OpDesc& op, const void* in, void* out);
void allreduceRsAg(Communicator& c, const OpDesc& op, const void* in, void* out);

// Note [Allreduce on a narrower wire]
// DDP's fp16/bf16 compression hooks divide each float32 bucket by the world
// size, round it to 16 bits, allreduce those, and widen the sum back into the
// bucket: on one host, where the wire is memory, that is two passes over the
// bucket and a third over the 16-bit copy on top of the allreduce, and they
// made the bf16 hook slower than no hook (issue 31). When op.narrowed(), the
// allreduce does the same arithmetic inside its own steps instead: each rank
// rounds its float32 chunk straight into its slot, reduces its share of the
// 16-bit slots with the same kernel and order as a 16-bit allreduce (float32
// accumulation in rank order, one rounding: Note [Reduced-precision
// accumulation]), and widens the reduced shares straight out of the slots.
// The bucket is read once and written once, and only 16-bit values cross
// between ranks; the result is bit for bit the unfused hook's. The wire type
// and divisor travel in the op header, so ranks whose hooks differ fail
// together. in == out allowed; op.dtype is kFloat32.
void allreduceNarrowed(Communicator& c, const OpDesc& op, const void* in, void* out);

// buf: input on the root, output elsewhere.
void broadcast(Communicator& c, const OpDesc& op, void* buf);

// out (root only) = op over ranks of in; in == out allowed on the root.
// One-shot or reduce-scatter + gather, by plan() (plan.h).
void reduce(Communicator& c, const OpDesc& op, const void* in, void* out);
void reduceOneShot(Communicator& c, const OpDesc& op, const void* in, void* out);
void reducePipelined(Communicator& c, const OpDesc& op, const void* in, void* out);

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

// Note [Direct transfers]
// Where the OS lets the ranks of a group read each other's memory
// (process_vm_readv: same user, no ptrace restrictions; probed when the group
// is created), ops of BRAID_DIRECT_MIN_BYTES and more named in
// BRAID_DIRECT_OPS skip shared memory (plan() in plan.h decides):
// the header step publishes each rank's buffer addresses, and each rank then
// copies what it needs straight from its peers' buffers, once, instead of
// twice through a slot. Reductions read a peer's share into a cache-sized
// scratch buffer and combine it with their own input straight into their
// output. A final step keeps every rank in the op until its peers have
// finished reading its buffers, so the caller can reuse them at once.
void allreduceDirect(Communicator& c, const OpDesc& op, const void* in, void* out);
void broadcastDirect(Communicator& c, const OpDesc& op, void* buf);
void allgatherDirect(Communicator& c, const OpDesc& op, const void* in, void* const* outs,
                     bool everyone);
void scatterDirect(Communicator& c, const OpDesc& op, const void* const* ins, void* out);
void reduceScatterDirect(Communicator& c, const OpDesc& op, const void* const* ins, void* out);
// alltoall's direct path after its header step s0 (Note [Alltoall's path]).
void alltoallDirect(Communicator& c, const OpDesc& op, uint64_t s0, const void* const* ins,
                    void* const* outs);

// The op's header step alone, for a rank that failed its argument checks:
// tells the peers, then throws op.localError. See Note [Op headers].
void failOp(Communicator& c, const OpDesc& op);

}  // namespace collectives
}  // namespace braid
