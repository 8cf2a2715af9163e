// braid's hierarchical CUDA collectives: ranks that share several GPUs,
// behind the NcclApi seam, so that the NcclExecutor (lazy communicators,
// non-blocking init, async error polling, timeouts, abort) runs them as it
// runs NCCL and the same-GPU collectives. Torch-free.
//
// Note [Hierarchical CUDA collectives]
// NCCL refuses a communicator with a GPU twice, so 4 ranks on 2 GPUs would
// stage through host memory. Instead, as the CPU path's hierarchical
// collectives do between hosts, they run in two levels:
// - The layout (HierLayout, from the exchanged CudaRankInfo list, so the same
//   on every rank): ranks grouped by device UUID, GPUs numbered by their
//   lowest rank, which is the GPU's leader. Every GPU holds the same number
//   of ranks k (Note [Choosing a CUDA executor]: an uneven layout is staged).
// - A communicator is two: braid's same-GPU collectives (Note [Same-GPU
//   collectives] in same_gpu.h) over the k ranks of this rank's GPU (local
//   rank: its position there, the leader 0), and, on leaders only, the
//   leaders' NCCL communicator (NCCL rank: the GPU's number), whose GPUs are
//   distinct by construction. The executor's unique id (rank 0's
//   getUniqueId) is only a nonce: commInitRank publishes each GPU's same-GPU
//   id (its leader makes it) and the leaders' NCCL id (rank 0 makes it)
//   through the group's store under <prefix>hier/<nonce>/..., waits for its
//   own (up to the timeout), and inits both non-blocking; the executor polls
//   commGetAsyncError, which reports the first error of either level (a
//   peer's exit or abort inside a GPU, NCCL's remote error between GPUs),
//   and aborting or destroying the communicator does both.
// - allreduce: reduce within each GPU to its leader (same-GPU reduce, into
//   the output), allreduce among the leaders in place (NCCL), broadcast
//   within each GPU from the leader (same-GPU), all in order on the one comm
//   stream. broadcast from root R on GPU g: broadcast within g from R, among
//   the leaders from g's, then within every other GPU from its leader.
//   groupStart/groupEnd are not passed on: a grouped NCCL call would run
//   only at groupEnd, after the same-GPU steps that must follow it.
// - A leader waits on the host for its NCCL step to run (an event, NCCL's
//   async error, the timeout) before it enters the broadcast within its GPU:
//   an NCCL kernel that a peer's abort ends returns without an error on the
//   stream, and the GPU's other ranks, whose own communicators saw nothing
//   wrong, would then read a partial result as success. So a leader's
//   enqueue blocks for the op's first two steps (its caller's thread with
//   it); the other ranks' do not. A device-side flag would avoid that; not
//   done.
// - Reductions: SUM, PROD, MIN, MAX at both levels. AVG (floats): AVG within
//   each GPU (divided by k) and AVG among the leaders (divided by the number
//   of GPUs): equal to the sum over n ranks divided by n because every GPU
//   holds k ranks. PREMUL_SUM: this rank's factor within its GPU, SUM among
//   the leaders. AVG of integers is not run here (the same-GPU kernels
//   divide floats only): reduces() says so and the backend stages it.
// - Rounding: each level accumulates in fp32 for fp16/bf16 and rounds once
//   (the CPU path's rule), so the result is rounded twice, not once: after
//   the GPU's partial sum and after the leaders' sum. The error bound is
//   therefore u * (sum over GPUs of |partial|) + u * |result| (u = 2^-8 for
//   bf16, 2^-11 for fp16, 2^-24 for fp32), which for inputs of one sign is
//   2u relative to the exact result; MAX and MIN are exact. Bit-for-bit
//   equality with the flat executors holds only where the partials are
//   exact (small integers, as most tests use).
// - reduce, allgather and reduce_scatter: two levels likewise, Note
//   [Hierarchical reduce, allgather and reduce_scatter] below.
// - send/recv, gather, scatter and alltoall are not run here (hasCore and
//   supports say so, Note [Collectives NCCL lacks] in nccl_api.h): the
//   backend stages them, the same on every rank.
// - Failure: a dead peer inside a GPU is seen by the same-GPU barrier (its
//   process gone, or its slot aborted) and the peers on that GPU fail naming
//   it; the executor then aborts this communicator, which aborts the leader's
//   NCCL communicator, whose peers see NCCL's remote error and abort theirs,
//   which ends their GPUs' barriers: every rank fails within the timeout.
//
// Note [Hierarchical reduce, allgather and reduce_scatter]
// G GPUs of k ranks; GPU g's ranks (ranksOn[g], ascending) need not be
// contiguous in rank order (ranks 0 and 2 on one GPU, 1 and 3 on the other),
// while NCCL's allgather and reduce_scatter lay blocks out by NCCL rank, that
// is by GPU. So the leaders work in "GPU order" (block g * k + local) and
// permute to or from rank order with k * G device copies, skipped where the
// layout is contiguous (GPU g holds ranks g*k .. g*k+k-1: the two orders
// agree). The caller's buffers are written only where the op writes them:
// steps that need room elsewhere use the rank's scratch (Note
// [Hierarchical scratch arena]).
// - reduce to root R on GPU g: every GPU reduces within to its leader (into
//   the output when the leader is R, else scratch: a non-root's buffer is
//   its input, which NCCL's reduce leaves alone too), NCCL reduces among the
//   leaders to g's; when R is not g's leader, a same-GPU broadcast from the
//   leader moves the result to R (g's other ranks receive it into their
//   scratch: the same-GPU collectives have no point-to-point step, and this
//   is one chunked copy). AVG and PREMUL_SUM as allreduce's.
// - allgather: a same-GPU gather to the leader of the k blocks, in GPU
//   order (into the output, or scratch where the orders differ); NCCL
//   allgather among the leaders in place (k blocks each); the leader copies
//   the blocks to rank order in the output; a same-GPU broadcast of the whole
//   output from the leader.
// - reduce_scatter: a same-GPU reduce of all n blocks to the leader's
//   scratch (rank order); the leader copies them to GPU order (a second
//   scratch half) unless the orders agree; NCCL reduce_scatter among the
//   leaders in place leaves GPU g's k reduced blocks, in local order, at the
//   leader; a same-GPU scatter from the leader gives each rank its block.
// - The leader's host wait (above) comes before every same-GPU step that
//   reads its NCCL result: allgather, reduce_scatter, and reduce on the
//   root's GPU. Rounding as allreduce: once per level.
// - Tested with threads as ranks and the simulated NCCL
//   (tests/cpp/test_cuda_multi_gpu.cc), and with processes as ranks, where the
//   same-GPU collectives stand in for NCCL between the leaders
//   (sameGpuCollectivesAsNccl in same_gpu.h; test_cuda_sim_multi_gpu.py): the
//   simulated NCCL meets its communicators in one process only.
//
// Note [Hierarchical scratch arena]
// The scratch is one arena per rank, BRAID_CUDA_SCRATCH_BYTES (64 MiB by
// default), reserved when the communicator is created and freed at destroy
// or abort after the stream drains. It was grown on demand, mid-op, on the
// caller's thread: a streamSynchronize, a cudaFree (an implicit device-wide
// sync that stalls every stream) and a cudaMalloc, which fails once torch's
// caching allocator holds the free memory. Now no op allocates or frees
// device memory. reduce is elementwise, so one larger than the arena runs
// as consecutive reduces of arena-sized chunks (the same on every rank,
// since the setting must be). allgather (interleaved layouts only) and
// reduce_scatter need n blocks at the leader at once: one whose leader needs
// more than the arena fails with an error naming the op, the rank, both
// sizes and the setting (the group then fails, as after any NCCL error).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "cuda/device_api.h"
#include "cuda/nccl/executor_choice.h"
#include "cuda/nccl/nccl_api.h"
#include "transport/store.h"

namespace braid {
namespace cuda {

// The hierarchical collectives of one group: `leaders` is the NCCL that pairs
// with `dev` (ncclLibrary() or a SimulatedNccl); `store` (the group's) must
// outlive the result, as must `leaders` and `dev`; `timeout` bounds the waits
// for the sub-communicators' ids.
std::unique_ptr<NcclApi> hierarchicalCollectives(DeviceApi& dev, NcclApi& leaders,
                                                 transport::Store& store, std::string storePrefix,
                                                 HierLayout layout,
                                                 std::chrono::milliseconds timeout);

}  // namespace cuda
}  // namespace braid
