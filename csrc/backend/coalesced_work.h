// The Work that endCoalescing() returns: it completes when every op issued
// between startCoalescing() and endCoalescing() has (Note [Coalescing]).
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

#include "backend/compat.h"

namespace braid {

// Note [Coalescing]
// torch 2.x batches ops between Backend::startCoalescing() and
// endCoalescing() (batch_isend_irecv, _coalescing_manager with a device;
// NCCL turns them into one ncclGroupStart/End). braid's ops already run as
// soon as they are issued, in order, and never wait for a later op, so
// nothing needs batching: coalescing only collects the Works issued in the
// window, and endCoalescing() returns one Work for all of them. Its wait()
// rethrows the first error; its future holds every op's outputs in issue
// order, or the first error.
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace braid
