// The Work returned by every braid op, and its Future.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>

#include "backend/compat.h"
#include "backend/engine.h"

namespace braid {

class WorkBraid : public c10d::Work {
 public:
  WorkBraid(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs);

  // Called once, from the thread that ran the op. Completes the future with
  // the output tensors (what DDP's reducer reads) or with the error.
  void markDone(std::exception_ptr error, int sourceRank = -1);

  // The job that completes this Work, which wait() may run itself: see
  // Note [Running a job on the waiting thread] in backend/engine.h.
  void setJob(Engine::QueuePtr queue, uint64_t id);
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> sourceRank_{-1};
  Engine::QueuePtr queue_;
  uint64_t jobId_ = 0;
};

}  // namespace braid
