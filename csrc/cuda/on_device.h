// OnDevice: run CUDA calls on a device from any thread without creating a
// context on another one.
//
// Note [A current device per thread]
// CUDA keeps a current device per host thread, and one primary context per
// process and device (hundreds of MiB on that GPU: what nvidia-smi
// --query-compute-apps lists). On CUDA 12+ a thread that never called
// cudaSetDevice has no context: cudaGetDevice answers 0 and creates nothing,
// but the first call there that needs a context (a stream, event, memory,
// kernel or IPC call, whatever device its handle is on) initializes device
// 0's primary context in this process, and cudaSetDevice(d) initializes d's.
// So a rank on GPU r that makes a CUDA call on a thread whose device was never
// set takes memory on GPU 0: every rank of a node does, 8 ranks run GPU 0 out
// of memory, and in EXCLUSIVE_PROCESS mode the call fails (torchcomms's
// watchdog had exactly this bug; ProcessGroupNCCL guards its watchdog's event
// query with the event's device). A guard that saved getDevice()'s 0 on such a
// thread and restores it with a plain setDevice(0) creates the context too.
// The rule: every braid thread that calls CUDA (the staged worker, the NCCL
// executor's callers and watchdog, whoever completes a Work: a worker, the
// watchdog, a point-to-point thread) first makes the op's device current with
// OnDevice, which switches back afterwards only to a device whose primary
// context already exists (DeviceApi::primaryContextActive creates nothing);
// otherwise the thread stays on the op's device, which has a context anyway.
// torch's guards (VirtualGuardImpl::block and record, a StreamGuard) restore
// with a plain set, so braid makes the stream's device current before it
// calls them: they then switch to the device that is current already, and
// back to it. The simulated device enforces the rule, and tests read each
// process's contexts (SimulatedDevice::contexts in tests/sim/device/
// sim_device.h).
#pragma once

#include <new>

#include "cuda/device_api.h"

namespace braid {
namespace cuda {

class OnDevice {
 public:
  // Throws what getDevice or setDevice throws.
  OnDevice(DeviceApi& api, int device) : api_(api) { switchTo(device); }
  // For teardown, which must not throw: a failed switch leaves the thread as
  // it was, and the calls that follow report the bad device.
  OnDevice(DeviceApi& api, int device, std::nothrow_t) noexcept : api_(api) {
    try {
      switchTo(device);
    } catch (...) {
    }
  }
  ~OnDevice() {
    if (!switched_) return;
    try {
      // Note [A current device per thread]: "no device" reads as 0, and
      // setting 0 would create its context.
      if (api_.primaryContextActive(prev_)) api_.setDevice(prev_);
    } catch (...) {
      // The thread stays on the op's device, which the next call reports if bad.
    }
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  void switchTo(int device) {
    prev_ = api_.getDevice();
    if (prev_ != device) {
      api_.setDevice(device);
      switched_ = true;
    }
  }

  DeviceApi& api_;
  int prev_ = 0;
  bool switched_ = false;
};

// The calling thread in relaxed capture mode for its scope, as
// ProcessGroupNCCL's watchdog is: a query or allocation made in it can never
// invalidate a CUDA graph that another thread is capturing in global mode
// (Note [Graph capture] in cuda/device_api.h). Never throws: a runtime that
// cannot exchange modes leaves the thread as it was.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(DeviceApi& api) : api_(api) {
    try {
      prev_ = api_.exchangeCaptureMode(DeviceApi::CaptureMode::kRelaxed);
      set_ = true;
    } catch (...) {
    }
  }
  ~RelaxedCaptureMode() {
    if (!set_) return;
    try {
      api_.exchangeCaptureMode(prev_);
    } catch (...) {
    }
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  DeviceApi& api_;
  DeviceApi::CaptureMode prev_ = DeviceApi::CaptureMode::kGlobal;
  bool set_ = false;
};

}  // namespace cuda
}  // namespace braid
