// The device-independent front end's hook for CUDA tensors: each op issued on
// a thread opens an OpScope; its argument checks note each tensor's device,
// and the op's CUDA tensors are staged through a CudaOp.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <optional>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "c10d/cuda/cuda_context.h"
#include "cuda/staged.h"

namespace braid {

class WorkBraid;

// Note [The staged CUDA executor]
// A CUDA op runs braid's CPU collective on page-locked host copies of its
// tensors ("shadows"), as gloo's CUDA path does, with CUDA's stream rules:
//   1. On the caller's thread, the front end checks the arguments and swaps
//      each CUDA tensor for a shadow (Staged::in/out); launch() records an
//      event on the caller's current stream, after the kernels that produce
//      the inputs (launchFor).
//   2. On the worker, braid's comm stream waits on that event, copies the
//      inputs device-to-host into their shadows, and the worker waits on the
//      host for those copies (before); then the CPU collective runs on the
//      shadows, unchanged.
//   3. Each output's shadow is copied back host-to-device on the comm stream
//      (copyBack), the end event is recorded there, and the worker waits for
//      it before the Work completes (after): so the flight recorder's
//      "completed" means the device is done, and the shadows and the user's
//      tensors can be let go.
//   4. Work::wait() and synchronize() make the caller's current stream wait
//      on the end event, and the Future, built with the device, completes on
//      a pool stream that waited on it (ProcessGroupNCCL's contract), so the
//      caller's later kernels see the results without further host syncs.
// Every device call goes through cuda::DeviceApi, so in CI the same code runs
// on the simulated device, where a stream is a thread: leaving out the wait
// of step 2 or the end event of step 3 makes tests/python/test_cuda_sim.py's
// ordering tests read stale data. Steps 2 and 3 are cuda::StagedOp's
// (cuda/staged.h, torch-free, which tests/cpp/test_cuda_sim.cc drives with
// threads as ranks); it counts the op and the bytes its copies move (Note
// [Counting what an executor moved] in cuda/staged.h).
class CudaOp {
 public:
  CudaOp(std::shared_ptr<CudaContext> ctx, int rank, const char* op);

  // Caller's thread. A shadow filled from `user` before the op runs.
  at::Tensor stageIn(const at::Tensor& user);
  // Caller's thread. A shadow for an output; copyBack() sends it to `user`.
  at::Tensor stageOut(const at::Tensor& user);
  // Worker: enqueues user <- shadow on the comm stream.
  void copyBack(const at::Tensor& user, const at::Tensor& shadow);
  // Caller's thread, at launch: marks the point on the caller's current
  // stream after which the op may read and write its tensors, and makes
  // `work` order its waiters after the op's end event (steps 1 and 4).
  void launchFor(WorkBraid& work);
  // Worker: runs `body` (the CPU op on the shadows) between the copies.
  void run(const std::function<void()>& body, std::chrono::steady_clock::time_point deadline,
           std::chrono::milliseconds timeout);

  c10::Device device() const { return ctx_->device(); }

 private:
  std::shared_ptr<CudaContext> ctx_;
  const int rank_;
  const char* op_;
  cuda::StagedOp steps_;
  std::vector<at::Tensor> keep_;  // users and shadows, until the end event
};

// The op being issued on this thread, from its first argument check to
// launch(). Opened by ProcessGroupBraid::guarded() and sendRecv().
class OpScope {
 public:
  OpScope(CudaBinding& binding, int rank, const char* op);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  static OpScope* current();
  // Every tensor of one call is on one device: the CPU, or the group's CUDA
  // device; CUDA tensors are contiguous (as NCCL requires).
  void noteDevice(const at::Tensor& t, const char* op);
  // The op's CUDA plan, made at its first CUDA tensor.
  std::shared_ptr<CudaOp> cuda(const at::Tensor& t);
  // For launch(): the plan (null for a CPU op), moved out.
  std::shared_ptr<CudaOp> take() { return std::move(cuda_); }

 private:
  CudaBinding& binding_;
  const int rank_;
  const char* op_;
  std::optional<c10::Device> device_;
  std::shared_ptr<CudaOp> cuda_;
  OpScope* prev_;
};

}  // namespace braid
