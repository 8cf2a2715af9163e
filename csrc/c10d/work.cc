#include "c10d/work.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "c10d/cuda/cuda_context.h"
#include "common/cpu_relax.h"
#include "common/error.h"
#include "cuda/on_device.h"

namespace braid {

WorkBraid::WorkBraid(int rank, c10d::OpType type, const char* title,
                     std::vector<at::Tensor> outputs, std::vector<c10::Device> devices)
    : c10d::Work(rank, type, title),
      outputs_(std::move(outputs)),
      // A Future that knows its devices records an event on them when it
      // completes, and makes its waiters' streams wait on it.
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::move(devices))),
      // "braid:allreduce" -> "allreduce", as the other errors name ops.
      title_(title == nullptr ? "op"
             : std::strncmp(title, "braid:", 6) == 0 ? title + 6
                                                       : title) {}

void WorkBraid::setCuda(std::shared_ptr<void> end, c10::Stream futureStream, bool recorded) {
  cudaEnd_ = std::move(end);
  endRecorded_ = recorded;
  futureStream_ = futureStream;
  if (!recorded) return;
  // Note [The NCCL path's Future]
  // As ProcessGroupNCCL's: the Future completes now, on the caller's thread,
  // once the op is enqueued, with its events recorded on the future stream
  // after the op's end event. Its callbacks run on the thread that adds them
  // (or here), ordered after the op by those events, never on the watchdog,
  // whose polling for errors and timeouts a slow callback would delay. The
  // op's outcome reaches the Work (isCompleted(), wait(timeout), the group's
  // next op) when the watchdog sees it; the Future holds no error, as
  // ProcessGroupNCCL's does not.
  cuda::OnDevice on(cudaApi(), futureStream_->device_index());
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  impl.block(cudaEnd_.get(), *futureStream_);
  c10::OptionalStreamGuard onFutureStream;
  onFutureStream.reset_stream(*futureStream_);
  future_->markCompleted(c10::IValue(outputs_));
}

void WorkBraid::blockCurrentStream() {
  if (!cudaEnd_) return;
  // torch's block switches back to the thread's device with a plain set:
  // the stream's device is made current first (Note [A current device per
  // thread] in cuda/on_device.h).
  cuda::OnDevice on(cudaApi(), futureStream_->device_index());
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  impl.block(cudaEnd_.get(), impl.getStream(futureStream_->device()));
}

void WorkBraid::synchronize() { blockCurrentStream(); }

void WorkBraid::markDone(std::exception_ptr error, int sourceRank) {
  if (done_.exchange(true)) return;
  sourceRank_.store(sourceRank);
  error = compat::asTorchError(error);
  // A worker, the NCCL watchdog or a point-to-point thread, whose device may
  // never have been set: torch's block, the stream guard and the Future's
  // event records each restore the thread's device with a plain set, which
  // on such a thread would create device 0's context. The future stream's
  // device is made current first, and stays so past them (Note [A current
  // device per thread] in cuda/on_device.h).
  std::optional<cuda::OnDevice> onDevice;
  c10::OptionalStreamGuard onFutureStream;
  if (cudaEnd_ && !error && !endRecorded_) {
    onDevice.emplace(cudaApi(), futureStream_->device_index());
    // The Future records its own events on the stream current here: make
    // that one follow the op's end event.
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    impl.block(cudaEnd_.get(), *futureStream_);
    onFutureStream.reset_stream(*futureStream_);
  }
  // finish() first so that a future callback that inspects the work (or
  // waits on it) sees it complete.
  finish(error);
  if (endRecorded_) return;  // completed at launch (Note [The NCCL path's Future])
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

void WorkBraid::setJob(Engine::QueuePtr queue, uint64_t id, transport::Clock::time_point deadline,
                       std::chrono::milliseconds timeout, const char* op,
                       std::shared_ptr<std::string> expiry) {
  queue_ = std::move(queue);
  jobId_ = id;
  deadline_ = deadline;
  timeout_ = timeout;
  op_ = op;
  expiry_ = std::move(expiry);
}

void WorkBraid::setP2P(collectives::PointToPoint::CallbackClock inCallbackSince,
                       transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
                       const char* op) {
  p2pStall_ = std::move(inCallbackSince);
  deadline_ = deadline;
  timeout_ = timeout;
  op_ = op;
}

bool WorkBraid::wait(std::chrono::milliseconds timeout) {
  if (endRecorded_ && !isCompleted()) {
    // The device orders what follows; the host goes on (an error the op
    // meets later reaches the Future, isCompleted() and the group's next op).
    blockCurrentStream();
    if (timeout.count() > 0) waitRecorded(timeout);
    return true;
  }
  if (p2pStall_ && timeout.count() == 0 && !isCompleted()) failIfStalled();
  // While this caller is blocked on the worker's op, the worker's waits may
  // spin long: this thread's core is idle (Note [Spinning for a blocked rank]
  // in common/cpu_cores.h).
  Engine::Queue::Waiting waiting(queue_ && !isCompleted() ? &queue_->waiters : nullptr);
  if (queue_ && !isCompleted()) {
    Engine::runHereIfNext(queue_, jobId_);
    pollForEnd(timeout);
    // A wait without a timeout of its own ends by the op's deadline if the job
    // never started (Note [A job that cannot start] in engine/engine.h).
    if (timeout.count() == 0 && !isCompleted()) failIfNotStarted();  // 0: kNoTimeout
  }
  bool done = c10d::Work::wait(timeout);
  if (done) blockCurrentStream();
  return done;
}

// Note [wait(timeout) on the NCCL path]
// Without a timeout, wait() on an op already on the device only orders the
// caller's stream after it (as ProcessGroupNCCL's does). With one, the caller
// asked for a bound on the host as well, as ProcessGroupNCCL gives it: the
// host waits until the op has completed (the watchdog saw its end event, and
// the header check passed), and past the timeout raises a TimeoutError that
// names the op, the rank and the timeout. The op itself is not failed: it
// keeps its own deadline (the group's timeout), and a later wait() may still
// see it complete.
void WorkBraid::waitRecorded(std::chrono::milliseconds timeout) {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
      lock.unlock();
      std::rethrow_exception(compat::asTorchError(std::make_exception_ptr(TimeoutError(
          errorText(title_.c_str(), rank_, "wait(timeout=", timeout.count(),
                    " ms) timed out: the op has not completed on the device")))));
    }
    error = exception_;
  }
  if (error) std::rethrow_exception(error);
}

void WorkBraid::pollForEnd(std::chrono::milliseconds timeout) {
  // Saves the worker's wake-up of this thread where the worker has a core of
  // its own (Queue::waiterSpin is 0 elsewhere: Note [How long to spin]); never
  // past the caller's own timeout (0: none).
  auto spin = std::chrono::duration_cast<std::chrono::microseconds>(queue_->waiterSpin);
  if (timeout.count() > 0) spin = std::min<std::chrono::microseconds>(spin, timeout);
  if (spin.count() <= 0) return;
  const auto until = std::chrono::steady_clock::now() + spin;
  while (!done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 32; ++i) cpuRelax();
  }
}

namespace {
// Milliseconds from `ticks` (a steady_clock time_since_epoch().count(), as
// Engine::Queue::finishingSince and P2PEngine::inCallbackSince hold) to now.
int64_t msSince(int64_t ticks) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             transport::Clock::now().time_since_epoch() - transport::Clock::duration(ticks))
      .count();
}
}  // namespace

void WorkBraid::failIfNotStarted() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Normally the op completes (or fails by its own deadline) first: one
    // wake-up, as before.
    cv_.wait_until(lock, deadline_, [this] { return completed_; });
    if (completed_) return;
  }
  std::string why;
  bool expired = Engine::expireIfQueued(queue_, jobId_, [&] {
    const int64_t since = queue_->finishingSince.load(std::memory_order_relaxed);
    std::string busy = "the op before it on this rank has not returned";
    if (since != 0) {
      busy += strCat(" (the callbacks of its future have run for ", msSince(since),
                     " ms: a callback that blocks holds the group's worker)");
    }
    why = errorText(op_, rank_, "Timed out after ", timeout_.count(),
                    " ms before this op started: ", busy);
    *expiry_ = why;
  });
  if (expired) markDone(std::make_exception_ptr(TimeoutError(why)));
}

void WorkBraid::failIfStalled() {
  // The progress thread fails an op by its deadline within a few ms (a
  // receive still streaming from a live sender may take longer): give up only
  // when it has been in one callback for a while.
  constexpr auto kStalled = std::chrono::milliseconds(100);
  int64_t since = 0;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (cv_.wait_until(lock, deadline_, [this] { return completed_; })) return;
    for (;;) {
      since = p2pStall_->load(std::memory_order_relaxed);
      if (since != 0 && msSince(since) >= kStalled.count()) break;
      if (cv_.wait_for(lock, kStalled, [this] { return completed_; })) return;
    }
  }
  markDone(std::make_exception_ptr(TimeoutError(errorText(
      op_, rank_, "Timed out after ", timeout_.count(),
      " ms: the point-to-point progress thread has run a completion callback for ", msSince(since),
      " ms (a callback that blocks holds every send and receive of the group)"))));
}

int WorkBraid::sourceRank() const {
  int r = sourceRank_.load();
  if (r < 0) throw Error("braid: sourceRank() is only defined for a completed receive");
  return r;
}

}  // namespace braid
