// The device seam: every CUDA runtime call braid makes goes through DeviceApi.
// Torch-free, so that the executors' ordering logic runs in plain C++ tests.
//
// Note [The device seam]
// braid never links the CUDA runtime. Two implementations stand behind one
// interface:
//   - cudaRuntime(): the CUDA runtime that torch already loaded (libcudart.so.N,
//     found by soname at first use), so that braid and torch share one runtime
//     and one primary context. Loading torch_braid on a machine without CUDA
//     touches none of it.
//   - the simulated device (tests/sim/device/sim_device.h: test-only, never
//     shipped): a CPU stand-in with CUDA's ordering rules. A stream is a
//     worker thread with a FIFO of tasks; an event is a flag that a task on
//     the recording stream sets; streamWaitEvent enqueues a task that blocks
//     until the flag is set; "device memory" is host memory. So an executor
//     that forgets to order a stream after another reads stale data in a test,
//     exactly as it would on a GPU. Tests can slow a stream down
//     (SimulatedDevice::setStreamDelay) to widen such races until they always
//     show.
// Handles are opaque: a Stream is a cudaStream_t or a simulated stream, an
// Event a cudaEvent_t or a simulated event; they never cross implementations.
// Every call throws braid::Error naming the call and the runtime's message.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"

namespace braid {
namespace cuda {

using Stream = void*;
using Event = void*;

constexpr size_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t, cudaIpcEventHandle_t

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;

  // "cuda runtime 13.0 (libcudart.so.13)" or "simulated (N devices)".
  virtual std::string name() const = 0;
  virtual bool simulated() const = 0;

  virtual int deviceCount() = 0;
  // The calling thread's current device; 0 on a thread that never set one
  // (and asking creates no context). Note [A current device per thread] in
  // cuda/on_device.h.
  virtual int getDevice() = 0;
  // Makes `device` current on the calling thread, creating its primary
  // context in this process if it has none (CUDA 12+).
  virtual void setDevice(int device) = 0;
  // Whether this process has `device`'s primary context (the driver's
  // cuDevicePrimaryCtxGetState); creates nothing. true also when the driver
  // cannot be asked, so that a caller only ever skips a switch it knows
  // would create a context.
  virtual bool primaryContextActive(int device) = 0;
  // A stable identity of the physical device, the same in every process on
  // the host that sees it (cudaDeviceProp::uuid as 32 hex digits; the
  // simulated device: "sim-<boot id>-<device>"). Ranks that share a GPU have
  // equal UUIDs (Note [Choosing a CUDA executor] in cuda/nccl/executor_choice.h).
  virtual std::string deviceUuid(int device) = 0;
  // The device's compute capability as major * 10 + minor (75: sm_75).
  // Creates no context.
  virtual int computeCapability(int device) = 0;
  // "" when braid's kernels (reduceAsync, reduceMultiAsync) load on `device`;
  // else why not, with CUDA's text (Note [Kernel images] in
  // cuda/kernel_images.h). Loads them into `device`'s context, and no other's.
  // Does not throw for a kernel that cannot load: that is the answer.
  virtual std::string kernelLoadError(int device) = 0;

  // A stream on `device` that does not synchronize with the legacy default
  // stream (cudaStreamNonBlocking).
  virtual Stream streamCreate(int device) = 0;
  virtual void streamDestroy(Stream s) = 0;
  virtual void streamSynchronize(Stream s) = 0;
  // true when all work enqueued so far on `s` has run.
  virtual bool streamQuery(Stream s) = 0;

  // Note [Graph capture]
  // A stream may be capturing a CUDA graph (cudaStreamBeginCapture): work
  // enqueued on it is recorded into the graph, not run, so an event recorded
  // there never completes as far as a host query is concerned. braid refuses
  // a collective whose caller's current stream is capturing before it
  // enqueues anything (c10d/cuda/cuda_op.cc). A capture also restricts other
  // calls, per its mode: in kGlobal mode, eventQuery, streamQuery,
  // synchronize and the allocations are illegal on every thread whose own
  // mode is not kRelaxed, and such a call invalidates the capture (the
  // user's graph fails at cudaStreamEndCapture); in kThreadLocal mode only on
  // the capturing thread; kRelaxed prohibits nothing. braid's background
  // threads (the NCCL watchdog, the staged executor's host waits, the pools)
  // therefore run their calls under RelaxedCaptureMode (cuda/on_device.h), as
  // ProcessGroupNCCL's watchdog does. Values are cudaStreamCaptureMode's.
  enum class CaptureMode : int { kGlobal = 0, kThreadLocal = 1, kRelaxed = 2 };
  // Whether `s` is capturing (cudaStreamIsCapturing: active, or invalidated
  // and not yet ended).
  virtual bool streamIsCapturing(Stream s) = 0;
  // Sets the calling thread's capture mode and returns the previous one
  // (cudaThreadExchangeStreamCaptureMode).
  virtual CaptureMode exchangeCaptureMode(CaptureMode mode) = 0;

  // Events without timing (cudaEventDisableTiming).
  virtual Event eventCreate(int device) = 0;
  virtual void eventDestroy(Event e) = 0;
  virtual void eventRecord(Event e, Stream s) = 0;
  // Later work on `s` starts after the last record of `e` (as of this call).
  virtual void streamWaitEvent(Stream s, Event e) = 0;
  // true when the last record of `e` has completed (or `e` was never recorded).
  virtual bool eventQuery(Event e) = 0;
  virtual void eventSynchronize(Event e) = 0;

  // Copies in stream order; either side may be device or pinned host memory
  // (cudaMemcpyDefault).
  virtual void memcpyAsync(void* dst, const void* src, size_t bytes, Stream s) = 0;

  // Page-locked host memory (cudaHostAlloc, portable) and device memory.
  virtual void* hostAlloc(size_t bytes) = 0;
  virtual void hostFree(void* p) = 0;
  virtual void* deviceAlloc(int device, size_t bytes) = 0;
  virtual void deviceFree(void* p) = 0;

  // dst[i] = op(dst[i], src[i]) for i < count, in stream order, with the
  // CPU path's rules (Note [Reduced-precision accumulation] in
  // math/reduce.h): one kernel from cuda/kernels.cuh.
  virtual void reduceAsync(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                           Stream s) = 0;

  // dst[i] = op(srcs[0][i], ..., srcs[n-1][i]), divided by `divisor` (1: not;
  // float types only), for i < count, in stream order: one kernel (Note
  // [Multi-source reduce] in cuda/kernels.cuh). The sources may be another
  // process's memory opened with ipcOpenMem; dst may be one of them.
  virtual void reduceMultiAsync(DataType type, ReduceOp op, void* dst, const void* const* srcs,
                                int n, double divisor, size_t count, Stream s) = 0;
  // reduceMultiAsync on `s`, a stream of `device` that braid may not have
  // made (torch's): the caller names the stream's device, so that a runtime
  // that cannot ask a stream for it still launches there and not on the
  // calling thread's current device (Note [A stream's device] in
  // cuda/cuda_runtime.cc). The default ignores `device`: an implementation
  // that knows every stream's device (the simulated one) needs no hint.
  virtual void reduceMultiAsyncOn(int device, DataType type, ReduceOp op, void* dst,
                                  const void* const* srcs, int n, double divisor, size_t count,
                                  Stream s) {
    (void)device;
    reduceMultiAsync(type, op, dst, srcs, n, divisor, count, s);
  }

  // CUDA IPC (Note [Same-GPU collectives] in cuda/shared_gpu/same_gpu.h): memory and
  // events that another process on the host can open. Handles are opaque
  // bytes (kIpcHandleBytes), valid while the exporter keeps the object.
  // Device memory another process may open (cudaMalloc: all of it can be; the
  // simulated device backs this kind with shareable memory). Freed with
  // deviceFree.
  virtual void* deviceAllocShareable(int device, size_t bytes) = 0;
  virtual std::string ipcMemHandle(void* p) = 0;  // p: from deviceAllocShareable
  // The exporter's allocation, mapped here; closed with ipcCloseMem.
  virtual void* ipcOpenMem(const std::string& handle) = 0;
  virtual void ipcCloseMem(void* p) = 0;
  // An event other processes can wait on (cudaEventInterprocess |
  // cudaEventDisableTiming), destroyed with eventDestroy. Recorded by its
  // creator only, on one stream at a time.
  virtual Event eventCreateShareable(int device) = 0;
  virtual std::string ipcEventHandle(Event e) = 0;
  // The exporter's event, here: streamWaitEvent/eventQuery on it see the
  // exporter's records; eventDestroy closes it.
  virtual Event ipcOpenEvent(const std::string& handle) = 0;
  // Which process IPC counts this caller as (getpid(); a test's simulated
  // device may count threads as processes): ranks with the same one cannot
  // open each other's handles (Note [Thread ranks on one GPU] in
  // cuda/nccl/executor_choice.h).
  virtual int64_t processId() { return static_cast<int64_t>(getpid()); }
};

// The CUDA runtime torch loaded; throws braid::Error saying why when there is
// none (no libcudart, no driver, no device).
DeviceApi& cudaRuntime();
}  // namespace cuda
}  // namespace braid
