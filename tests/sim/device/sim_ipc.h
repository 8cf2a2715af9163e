// CUDA IPC on the simulated device: memory and events that other processes
// on the host can open (DeviceApi::ipc*, Note [Same-GPU collectives] in
// cuda/shared_gpu/same_gpu.h), so that ranks sharing a simulated GPU run braid's
// same-GPU collectives across processes in CI.
//
// Note [Simulated IPC]
// - Shareable memory is a transport::shm::SharedRegion (Note [Shared
//   regions]): a memfd that another process maps through /proc/<pid>/fd/<fd>,
//   nothing left in /dev/shm, stale handles refused.
// - A shareable event is two counters in such memory: `latest`, the last
//   generation recorded, and `done`, the last one the recording stream
//   reached. Only the creator records it, on one stream at a time, so
//   generations complete in order and two counters say everything (an
//   in-process SimEvent keeps a set). A wait captures `latest` at the call,
//   as cudaStreamWaitEvent does, and its task polls `done`.
// - IPC as CUDA has it (issue 42): a wait is only ever on the exporter's
//   `done` counter. It does not end when the waiter destroys its opened
//   event, nor when the exporter dies before recording: like a GPU stream
//   waiting on an event a killed process never records, it waits forever
//   (Note [A stream never waits on a dead peer] in
//   csrc/cuda/shared_gpu/same_gpu.h says how braid never does that).
// - Memory: an IPC handle names an allocation's base only; it is not opened
//   in the process that exported it, nor twice in one process (CUDA refuses
//   both). Threads of one test process count as distinct processes only
//   where the test says so (sim::setThreadProcess in sim_device.h); a thread
//   no test marked (an executor's own) that opens such a simulated
//   process's handle is checked only against opening its own export.
// - Memory its exporter freed while a peer still maps it: the peer's next
//   copy or kernel touching it fails its stream with an illegal address, as
//   the peer's context would (sticky: the stream fails from then on).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cuda/device_api.h"
#include "sim/device/sim_stream.h"
#include "transport/shm/shared_region.h"

namespace braid {
namespace cuda {
namespace sim {

// The memfd regions of the transport (Note [Shared regions]); a handle is
// exactly a CUDA IPC handle's size.
using SharedRegion = transport::shm::SharedRegion;
static_assert(transport::shm::kRegionHandleBytes == kIpcHandleBytes,
              "a shared region's handle stands in for a CUDA IPC handle");

class SharedEvent {
 public:
  // A new shareable event (its creator records it).
  explicit SharedEvent(int device);
  // Another process's event, from its handle().
  SharedEvent(int device, const std::string& handle);
  int device() const { return device_; }
  bool owner() const { return owner_; }
  std::string handle() const { return region_->handle(); }
  pid_t exporter() const { return region_->exporter(); }

  // eventRecord on `s` (the creator only).
  void record(const std::shared_ptr<SimStream>& s);
  // streamWaitEvent: `s` waits for the latest record as of this call.
  void waitOn(const std::shared_ptr<SimStream>& s);
  bool query();
  void synchronize();

 private:
  // Polls until `generation` is done, however long that is.
  static void waitFor(const std::shared_ptr<SharedRegion>& region, uint64_t generation);
  static std::atomic<uint64_t>* latestOf(const SharedRegion& r);
  static std::atomic<uint64_t>* doneOf(const SharedRegion& r);

  const int device_;
  const bool owner_;
  std::shared_ptr<SharedRegion> region_;
};

}  // namespace sim
}  // namespace cuda
}  // namespace braid
