// braid's collectives for ranks that share one GPU, behind the NcclApi seam,
// so that the NcclExecutor (lazy communicators, the unique id through the
// store, non-blocking init, async error polling, timeouts, abort) runs them
// as it runs NCCL. Torch-free.
//
// Note [Same-GPU collectives]
// NCCL refuses a communicator with a GPU twice, and staging through host
// memory is bound by host bandwidth. Ranks on one GPU can instead read each
// other's device memory directly (CUDA IPC), at device bandwidth:
// - A communicator: each rank allocates one device buffer (two halves of
//   BRAID_CUDA_SAME_GPU_BYTES / 2) and one interprocess event, and publishes
//   their IPC handles in a small control block of host shared memory that
//   rank 0 makes in getUniqueId (its handle is the unique id: no name in
//   /dev/shm, nothing left behind). Every rank opens every peer's buffer and
//   event once; they are closed at destroy or abort.
// - A barrier: a rank records its event on its stream, then publishes the
//   barrier's number in its slot of the control block; it waits on the host
//   until every peer has published the same number (that is, has recorded
//   its event for it), then makes its stream wait on each peer's event. The
//   wait captures the peer's latest record, which may be a later barrier's:
//   that waits longer, never less. The host wait is bounded by the group's
//   timeout (setTimeout) and ends early when a peer's process has exited or
//   the peer aborted.
//   A stream waits on a peer's event only once its record has run (Note [A
//   stream never waits on a dead peer]).
// - allreduce, per chunk of half a buffer: copy the input into this rank's
//   half; barrier; reduce slice r of the chunk from every rank's half with one
//   kernel (Note [Multi-source reduce] in kernels.cuh) into this rank's half;
//   barrier; copy every rank's reduced slice into the output. reduce_scatter
//   reduces straight into the output; allgather and broadcast copy out of
//   the peers' halves; reduce gathers at the root only. gather, scatter and
//   alltoall (equal splits), which NCCL lacks (Note [Collectives NCCL lacks]
//   in nccl_api.h), copy likewise: Note [Same-GPU gather, scatter and
//   alltoall] in same_gpu.cc.
// - Halves alternate between chunks (and ops): a rank overwrites a half only
//   after the first barrier of the next chunk, which every peer reaches only
//   after it has finished reading that half. The reduced slice is written
//   into the half that the peers then read, hence two barriers per chunk;
//   small messages take one (Note [Same-GPU small messages]).
// - Ordering with the caller is the executor's (its comm stream waits on the
//   caller's event first; the end event follows the last copy).
//
// Note [A stream never waits on a dead peer]
// On a GPU, a stream that waits on an interprocess event whose record never
// runs waits forever: the exporter's death does not end the wait, nor does
// destroying the opened event (an abort), and the caller's next
// torch.cuda.synchronize() hangs with it. A peer's published barrier number
// says only that its record is enqueued; a peer SIGKILLed before its stream
// reached the record never records it. So in barrier k a rank waits on the
// host, after the peer published k, until eventQuery of the peer's event
// says its latest record has run, checking on the way, as for the
// published number, the group timeout, this rank's abort and whether the
// peer aborted or its process exited (an error naming the op's barrier, this
// rank's peer and why). Only then does it enqueue the stream wait, which can
// no longer block. The latest record may be barrier k + 1's (a peer is at
// most one barrier ahead); that one needs only this rank's barrier-k record,
// already enqueued, so the wait ends. The cost: the host follows the peers'
// streams to each barrier rather than running ahead of them; the device
// work is ordered exactly as before. abort() therefore has nothing to undo
// on the device. The simulated device keeps CUDA's rule (Note [Simulated
// IPC] in tests/sim/device/sim_ipc.h), and
// test_a_peer_killed_before_its_record_ran_leaves_no_stream_waiting in
// tests/python/test_cuda_sim_same_gpu.py kills a peer in that window.
//
// Note [Exported buffers outlive their mappings]
// Memory freed by its exporter while a peer maps it is undefined behaviour
// on CUDA (in practice a sticky illegal-address error in the peer, whose
// kernels may still read it after an abort). A rank's slot says whether it
// may map the peers' buffers: kPublished from before it opens them until
// close() has closed them, then kClosed. A rank frees its own buffer only
// once every peer's slot is not kPublished or its process has exited; it
// waits for that up to 2 s at destroy, and only 0.5 s after an abort (the
// peers are failing too and close at once when they abort with it, but one
// may be stuck for as long as its own timeout, and an abort must end
// promptly). A buffer some peer may still map is
// kept, deliberately (logged): every later close() in this process frees
// the kept buffers no peer maps any more, and the rest stay until this
// process exits, when the driver frees them; a peer's access after that
// faults in a context that is failing anyway, rather than into memory this
// process reuses. A rank whose
// stream does not drain keeps its slot kPublished, since it still maps the
// peers' buffers.
//
// Note [Same-GPU small messages]
// A small allreduce is bound by its steps, not its bytes: two barriers (each
// an event record, a host wait on the control block and stream waits on the
// peers' events) and n + 1 launches. At most BRAID_CUDA_SAME_GPU_SMALL_BYTES
// (64 KiB by default; and at most a half), allreduce and reduce instead
// copy the input into this rank's half, run ONE barrier, and ONE kernel in
// which each rank (the root only, for reduce) reduces the WHOLE message from
// every rank's half straight into its output. Each rank reads n times the
// message instead of once, which at 64 KiB is far cheaper than a barrier.
// - Bits: the multi-source kernel over the same sources in rank order
//   (fp16/bf16 accumulated in fp32, rounded once); it is elementwise, so the
//   whole message gives what the sliced path's n slices give.
// - Why one barrier suffices: nobody writes a half after the barrier, only
//   before it, and halves alternate. A rank writes half h again two ops (or
//   chunks) later, after the barrier of the op between them, whose event
//   record each peer enqueues after it enqueued its reads of half h; that
//   barrier's stream wait orders the write after those reads. This holds for
//   any sequence of small and chunked ops, since every op or chunk has a
//   barrier and reads a half only before the next one's.
// - Why not one kernel that spins on flags in device memory (the issue's
//   first idea): kernels of different processes do not run concurrently on
//   a GPU without MPS (time slicing between contexts, NVIDIA/nccl#32; see
//   shared/c10d-cuda-and-newer-torch.md §4). A kernel that spins until a
//   peer's kernel sets a flag holds the GPU while that peer's kernel cannot
//   start: at best it spins out its time slice every op, at worst the pair
//   never progresses. The host barrier orders the ranks' streams through
//   interprocess events instead, which the GPU schedules without either
//   kernel waiting inside the device. So: one host barrier, one kernel.
// - The threshold picks how many barriers an op runs, so the ranks must
//   agree on it: each publishes it in its control-block slot beside the
//   buffer size, and a mismatch fails the communicator at init naming both
//   values (Note [Settings that shape an op]).
// - broadcast, allgather, reduce_scatter, gather, scatter and alltoall run
//   one barrier per chunk already (they read the peers' halves and write
//   only their own outputs after the barrier).
#pragma once

#include "cuda/device_api.h"
#include "cuda/nccl/nccl_api.h"

namespace braid {
namespace cuda {

// The same-GPU collectives on `dev` (one per DeviceApi and version, for the
// process). A `reportedVersion` other than 0 is what version() answers, so
// that the collectives can stand where an NCCL is expected: the simulated
// NCCL's cross-process stand-in (tests/sim/nccl/same_gpu_as_nccl.h) is the
// one user.
NcclApi& sameGpuCollectives(DeviceApi& dev, int reportedVersion = 0);

}  // namespace cuda
}  // namespace braid
