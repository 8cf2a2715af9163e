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
//   after it has finished reading that half. So two barriers per chunk.
// - Ordering with the caller is the executor's (its comm stream waits on the
//   caller's event first; the end event follows the last copy).
#pragma once

#include "cuda/device_api.h"
#include "cuda/nccl_api.h"

namespace braid {
namespace cuda {

// The same-GPU collectives on `dev` (one per DeviceApi, for the process).
NcclApi& sameGpuCollectives(DeviceApi& dev);

}  // namespace cuda
}  // namespace braid
