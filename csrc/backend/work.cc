#include "backend/work.h"

#include "common/error.h"

namespace braid {

WorkBraid::WorkBraid(int rank, c10d::OpType type, const char* title,
                     std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void WorkBraid::markDone(std::exception_ptr error, int sourceRank) {
  sourceRank_.store(sourceRank);
  error = compat::asTorchError(error);
  // finish() first so that a future callback that inspects the work (or
  // waits on it) sees it complete.
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

void WorkBraid::setJob(Engine::QueuePtr queue, uint64_t id) {
  queue_ = std::move(queue);
  jobId_ = id;
}

bool WorkBraid::wait(std::chrono::milliseconds timeout) {
  if (queue_ && !isCompleted()) Engine::runHereIfNext(queue_, jobId_);
  return c10d::Work::wait(timeout);
}

int WorkBraid::sourceRank() const {
  int r = sourceRank_.load();
  if (r < 0) throw Error("braid: sourceRank() is only defined for a completed receive");
  return r;
}

}  // namespace braid
