// The staged executor's device steps, torch-free: an op's inputs copied
// device-to-host into shadows on the comm stream after the caller's stream,
// the host collective on the shadows, the outputs copied back host-to-device,
// and the end event (Note [The staged CUDA executor] in c10d/cuda/cuda_op.h,
// whose CudaOp runs every staged CUDA op through a StagedOp). Torch-free, so
// that tests/cpp/test_cuda_sim.cc drives these very steps on the simulated
// device, ranks as threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cuda/device_api.h"

namespace braid {
namespace cuda {

// Note [Counting what an executor moved]
// Every CUDA executor counts the ops it ran and the bytes they moved through
// the device, so that a test sees which path an op took, and how much of it:
// an op that silently falls back to the CPU moves nothing through the
// executor it was meant for. The staged executor counts one op per run() and
// the bytes its copies move: device-to-host into the shadows (the inputs; an
// empty tensor moves nothing), host-to-device back into the outputs. The NCCL
// executor (NCCL, and braid's same-GPU and hierarchical collectives behind
// its seam) counts one op per run() or runGroup() and, per op, the bytes of
// the op's larger buffer on this rank (NcclExecutor::bytesIssued in
// nccl/nccl_executor.h). Counted when enqueued, so a test reads them at once
// after wait(); torch_braid's ProcessGroupBraid._cuda_executor_stats() shows
// both per group.
struct StagedCounts {
  uint64_t ops = 0;
  uint64_t d2hBytes = 0;  // into the shadows, before the host collective
  uint64_t h2dBytes = 0;  // back into the outputs, after it
};

// One group's counts; any thread.
class StagedCounters {
 public:
  StagedCounts snapshot() const;

 private:
  friend class StagedOp;
  std::atomic<uint64_t> ops_{0}, d2h_{0}, h2d_{0};
};

// An event that goes back to its owner (a pool, or eventDestroy) with the
// last reference.
using SharedEvent = std::shared_ptr<void>;

class StagedOp {
 public:
  struct Env {
    DeviceApi* api = nullptr;
    int device = 0;
    Stream comm = nullptr;                // the group's comm stream on `device`
    std::function<SharedEvent()> event;   // a fresh event of `device`
    StagedCounters* counters = nullptr;   // null: not counted
  };
  // Waits on the host for an event (at most until the op's deadline), or
  // throws.
  using HostWait = std::function<void(Event)>;

  // Takes the end event from env.event.
  explicit StagedOp(Env env);

  // Caller's thread, before run(): `bytes` from `user` (device) to `shadow`
  // (pinned host memory), copied before the body runs.
  void stageIn(void* shadow, const void* user, size_t bytes);
  // Caller's thread, at launch: an event recorded on the caller's current
  // stream, after which the op may read and write the user's buffers.
  void setCallerEvent(SharedEvent caller) { caller_ = std::move(caller); }
  // Recorded on the comm stream after the op's last copy: the caller's
  // stream waits on it before it touches the buffers again.
  const SharedEvent& endEvent() const { return end_; }

  // On the worker, from the body: `bytes` from `shadow` back to `user`, on
  // the comm stream.
  void copyBack(void* user, const void* shadow, size_t bytes);
  // On the worker, on the env's device (switched to, and back after): the
  // comm stream waits on the caller's event, copies the inputs in and the
  // host waits for them; then `body` (the host collective on the shadows,
  // which calls copyBack); then the end event is recorded and the host waits
  // for it. Whatever fails, the end event is recorded after the copies
  // already enqueued; the first error is rethrown.
  void run(const std::function<void()>& body, const HostWait& wait);
  // After run(): whether the end event was seen complete. If not (run threw
  // while waiting for it), copies may still run, and the memory they touch
  // must be kept until the end event completes.
  bool ended() const { return ended_; }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  void before(const HostWait& wait);

  Env env_;
  std::vector<Copy> ins_;
  SharedEvent caller_, staged_, end_;
  bool ended_ = false;
};

}  // namespace cuda
}  // namespace braid
