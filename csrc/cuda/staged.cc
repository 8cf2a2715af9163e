#include "cuda/staged.h"

#include <exception>
#include <utility>

#include "cuda/on_device.h"

namespace braid {
namespace cuda {


StagedCounts StagedCounters::snapshot() const {
  StagedCounts c;
  c.ops = ops_.load(std::memory_order_relaxed);
  c.d2hBytes = d2h_.load(std::memory_order_relaxed);
  c.h2dBytes = h2d_.load(std::memory_order_relaxed);
  return c;
}

StagedOp::StagedOp(Env env) : env_(std::move(env)), end_(env_.event()) {}

void StagedOp::stageIn(void* shadow, const void* user, size_t bytes) {
  if (bytes > 0) ins_.push_back(Copy{shadow, user, bytes});
}

void StagedOp::copyBack(void* user, const void* shadow, size_t bytes) {
  if (bytes == 0) return;
  env_.api->memcpyAsync(user, shadow, bytes, env_.comm);
  if (env_.counters) env_.counters->h2d_.fetch_add(bytes, std::memory_order_relaxed);
}

void StagedOp::before(const HostWait& wait) {
  DeviceApi& api = *env_.api;
  if (caller_) api.streamWaitEvent(env_.comm, caller_.get());
  caller_.reset();  // the wait took the event's state: it may be reused
  if (ins_.empty()) return;
  size_t bytes = 0;
  for (const Copy& c : ins_) {
    api.memcpyAsync(c.dst, c.src, c.bytes, env_.comm);
    bytes += c.bytes;
  }
  if (env_.counters) env_.counters->d2h_.fetch_add(bytes, std::memory_order_relaxed);
  staged_ = env_.event();
  api.eventRecord(staged_.get(), env_.comm);
  wait(staged_.get());
}

void StagedOp::run(const std::function<void()>& body, const HostWait& wait) {
  // The worker (or a caller running the job itself, Note [Running a job on the
  // waiting thread]) issues device calls on the op's device; a worker thread
  // never set one (Note [A current device per thread] in cuda/on_device.h).
  OnDevice on(*env_.api, env_.device);
  if (env_.counters) env_.counters->ops_.fetch_add(1, std::memory_order_relaxed);
  std::exception_ptr error;
  try {
    before(wait);
    body();
  } catch (...) {
    error = std::current_exception();
  }
  // Whatever failed, the copies already enqueued are fenced by the end event
  // before the memory they touch can go.
  try {
    env_.api->eventRecord(end_.get(), env_.comm);
    wait(end_.get());
    ended_ = true;
  } catch (...) {
    if (!error) throw;  // else the first error is the one to report
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace cuda
}  // namespace braid
