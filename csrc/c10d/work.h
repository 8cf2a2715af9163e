// The Work returned by every braid op, and its Future.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "c10d/compat.h"
#include "engine/engine.h"

namespace braid {

class WorkBraid : public c10d::Work {
 public:
  // `devices`: the CUDA device of an op on CUDA tensors, for its Future
  // (empty for the CPU).
  WorkBraid(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
            std::vector<c10::Device> devices = {});

  // An op on CUDA tensors (Note [The staged CUDA executor] in c10d/cuda/cuda_op.h):
  // wait() and synchronize() make the caller's current stream wait on `end`,
  // and the Future completes on `futureStream` after it. With `recorded`,
  // `end` is on the device already (the NCCL path): wait() returns without
  // waiting for the op on the host (Note [The NCCL path in the backend]).
  void setCuda(std::shared_ptr<void> end, c10::Stream futureStream, bool recorded = false);

  // Called from the thread that ran the op. Completes the future with the
  // output tensors (what DDP's reducer reads) or with the error. Calls after
  // the first are ignored: a waiter may have given the op up (Note [A stalled
  // progress thread]).
  void markDone(std::exception_ptr error, int sourceRank = -1);

  // The job that completes this Work, which wait() may run itself: see
  // Note [Running a job on the waiting thread] in engine/engine.h.
  // `deadline` and `op` serve Note [A job that cannot start]; `expiry`
  // receives the error text when wait() gives the job up (its `run` reads it).
  void setJob(Engine::QueuePtr queue, uint64_t id, transport::Clock::time_point deadline,
              std::chrono::milliseconds timeout, const char* op,
              std::shared_ptr<std::string> expiry);
  // A send or receive: see Note [A stalled progress thread] in transport/shm/p2p_engine.h.
  void setP2P(collectives::PointToPoint::CallbackClock inCallbackSince,
              transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
              const char* op);
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  void synchronize() override;

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> sourceRank_{-1};
  Engine::QueuePtr queue_;
  uint64_t jobId_ = 0;
  transport::Clock::time_point deadline_;
  std::chrono::milliseconds timeout_{0};
  const char* op_ = "op";
  std::string title_;  // the op's name for wait(timeout)'s error on the NCCL path
  std::shared_ptr<std::string> expiry_;

  collectives::PointToPoint::CallbackClock p2pStall_;
  std::atomic<bool> done_{false};
  std::shared_ptr<void> cudaEnd_;  // null for a CPU op
  bool endRecorded_ = false;       // cudaEnd_ was recorded at launch
  std::optional<c10::Stream> futureStream_;
  void blockCurrentStream();
  // wait(timeout) on the NCCL path: see Note [wait(timeout) on the NCCL path].
  void waitRecorded(std::chrono::milliseconds timeout);

  // Polls for the op's end for Queue::waiterSpin (at most `timeout`, if not
  // 0) before wait() sleeps.
  void pollForEnd(std::chrono::milliseconds timeout);
  // Gives the job up if it has not started by its deadline.
  void failIfNotStarted();
  // Gives a send or receive up once past its deadline while the progress
  // thread is stuck in a callback.
  void failIfStalled();
};

}  // namespace braid
