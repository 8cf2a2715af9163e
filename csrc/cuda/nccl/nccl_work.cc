// NcclWork, the watchdog and the group's failure (Note [NCCL streams] in
// nccl_executor.h).
//
// Note [NCCL failures]
// - What fails a group: NCCL's async error on a communicator (polled with
//   ncclCommGetAsyncError by the watchdog and by every done()/wait()), an op
//   not done by its deadline (run() time plus the timeout: the time waiting
//   for the caller's stream counts, as in torch's NCCL backend), an error
//   from the device while querying an end event, a failed NCCL call in
//   run(), and abort().
// - The first failure is kept. Every pending op fails: the one that showed it
//   with the full text, the others "not completed: <that text>", all of the
//   same class (TimeoutError, PeerLostError for ncclRemoteError and abort(),
//   else Error). Then every communicator is aborted, so the kernels return
//   and the end events complete: a caller's stream that waits on them goes
//   on (over outputs that are not valid, which the op's error says). Every
//   later run() throws at once, naming the first error: the ranks are out of
//   step, and NCCL cannot resume an aborted communicator.
// - An end event that completed is a success only if NCCL shows no error
//   after it and the group has not failed: an aborted kernel also completes
//   its event (and once aborted, a communicator can no longer be asked).
// - Nothing waits on the device without a deadline: done() and the
//   watchdog query events; wait() polls done() with a short sleep; abort()
//   takes the NCCL call lock for at most a second (a blocking communicator
//   stuck inside NCCL is then left, not aborted, and logged). ncclCommAbort
//   itself took about 1 s on NCCL 2.28.9 (H100, one rank), so abort() and a
//   failing op return within about a second, not at once.
#include <algorithm>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "cuda/nccl/nccl_executor_state.h"
#include "cuda/on_device.h"

namespace braid {
namespace cuda {

std::exception_ptr makeError(FailKind kind, const std::string& text) {
  switch (kind) {
    case FailKind::kTimeout:
      return std::make_exception_ptr(TimeoutError(text));
    case FailKind::kPeerLost:
      return std::make_exception_ptr(PeerLostError(text));
    case FailKind::kError:
      break;
  }
  return std::make_exception_ptr(Error(text));
}

FailKind failKindOf(NcclResult r) {
  return r == kNcclRemoteError ? FailKind::kPeerLost : FailKind::kError;
}

NcclWork::NcclWork(std::shared_ptr<NcclExecutorState> state, std::string what, Event end,
                   Stream stream, int device, std::chrono::milliseconds timeout)
    : state_(std::move(state)),
      what_(std::move(what)),
      end_(end),
      stream_(stream),
      device_(device),
      timeout_(timeout),
      deadline_(Clock::now() + timeout) {}

NcclWork::~NcclWork() {
  // CUDA releases an event still pending once it completes; the simulated
  // device's records hold their own reference.
  try {
    if (end_) state_->dev.eventDestroy(end_);
  } catch (const std::exception& e) {
    BRAID_LOG(kWarn, "nccl", state_->opt.rank) << "destroying an end event: " << e.what();
  }
}

bool NcclWork::done() {
  state_->poll(*this);
  std::lock_guard<std::mutex> lock(state_->mu);
  if (error_) std::rethrow_exception(error_);
  return resolved_;
}

bool NcclWork::waitUntil(Clock::time_point deadline) {
  auto sleep = std::chrono::microseconds(20);
  const auto maxSleep = std::max(state_->opt.pollInterval, std::chrono::microseconds(20));
  for (;;) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, maxSleep);
  }
}

void NcclWork::wait() {
  // The op's own deadline fails it (poll), so this returns or throws by then.
  waitUntil(Clock::time_point::max());
}

std::exception_ptr NcclWork::error() {
  std::lock_guard<std::mutex> lock(state_->mu);
  return error_;
}

void NcclWork::onDone(std::function<void(std::exception_ptr)> cb) {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!resolved_) {
      callbacks_.push_back(std::move(cb));
      return;
    }
    e = error_;
  }
  cb(e);
}

void NcclExecutorState::finish(NcclWork& w, std::exception_ptr e) {
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu);
    // Once the group failed, an end event that completes may be an aborted
    // kernel's: fail() resolves every pending work with the error.
    if (w.resolved_ || (!e && failed)) return;
    w.resolved_ = true;
    w.error_ = e;
    callbacks.swap(w.callbacks_);
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [&](const std::shared_ptr<NcclWork>& p) { return p.get() == &w; }),
                  pending.end());
  }
  for (auto& cb : callbacks) cb(e);
}

NcclResult NcclExecutorState::asyncError(int device, std::string* text) {
  std::unique_lock<TimedLock> lock(callMu, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::milliseconds(10))) return kNcclSuccess;
  auto it = comms.find(device);
  if (it == comms.end() || !it->second.comm) return kNcclSuccess;
  NcclResult err = kNcclSuccess;
  NcclResult r = nccl.commGetAsyncError(it->second.comm, &err);
  if (r != kNcclSuccess) err = r;
  if (err != kNcclSuccess && err != kNcclInProgress) {
    *text = strCat(ncclResultName(err), " (", nccl.getErrorString(err), ")");
    std::string last = nccl.lastError(it->second.comm);
    if (!last.empty()) *text += ": " + last;
  }
  return err;
}

bool NcclExecutorState::poll(NcclWork& w) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (w.resolved_) return true;
  }
  // The watchdog thread never set a device, and the work's completion
  // (torch's guards in WorkBraid::markDone) runs here too (Note [A current
  // device per thread] in cuda/on_device.h).
  std::optional<OnDevice> on;
  bool finished = false;
  try {
    on.emplace(dev, w.device_);
    // As ProcessGroupNCCL's watchdog: Note [Graph capture] in cuda/device_api.h.
    RelaxedCaptureMode relaxed(dev);
    finished = dev.eventQuery(w.end_);
  } catch (const std::exception& e) {
    fail(FailKind::kError, strCat(w.what_, ": the device failed: ", e.what()), &w);
    return true;
  }
  std::string text;
  NcclResult err = asyncError(w.device_, &text);
  if (err != kNcclSuccess && err != kNcclInProgress) {
    fail(failKindOf(err),
         strCat(w.what_, ": NCCL reported ", text,
                err == kNcclRemoteError ? " (a peer failed or aborted)" : ""),
         &w);
    return true;
  }
  if (finished) {
    finish(w, nullptr);
    return true;
  }
  if (Clock::now() >= w.deadline_) {
    fail(FailKind::kTimeout,
         strCat(w.what_, ": not done on the device within its timeout of ", w.timeout_.count(),
                " ms (a peer did not join the op, or it hangs)"),
         &w);
    return true;
  }
  return false;
}

void NcclExecutorState::fail(FailKind kind, const std::string& cause, NcclWork* culprit) {
  std::vector<std::pair<std::shared_ptr<NcclWork>, std::exception_ptr>> failing;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) {
      first = true;
      failed = true;
      failKind = kind;
      failText = cause;
    }
    for (auto& w : pending) {
      const bool mine = w.get() == culprit;
      failing.emplace_back(
          w, makeError(kind, mine ? cause : strCat(w->what_, ": not completed: ", cause)));
    }
  }
  if (culprit) {
    bool listed = false;
    for (auto& f : failing) listed = listed || f.first.get() == culprit;
    if (!listed) finish(*culprit, makeError(kind, cause));
  }
  if (first) {
    BRAID_LOG(kWarn, "nccl", opt.rank) << cause << "; aborting the group's NCCL communicators";
  }
  // Abort first: a work's failure callback may release its buffers, which
  // the kernels must no longer touch.
  abortComms();
  for (auto& f : failing) finish(*f.first, f.second);
}

void NcclExecutorState::abortComms() {
  std::unique_lock<TimedLock> lock(callMu, std::defer_lock);
  if (!lock.try_lock_for(std::chrono::seconds(1))) {
    BRAID_LOG(kError, "nccl", opt.rank)
        << "an NCCL call has been running for over a second (a blocking communicator?): "
           "its communicators are left as they are, not aborted";
    return;
  }
  for (auto& kv : comms) {
    if (!kv.second.comm) continue;
    // ncclCommAbort switches to the communicator's device and back to the
    // thread's with a plain set (Note [A current device per thread]).
    OnDevice on(dev, kv.first, std::nothrow);
    NcclResult r = nccl.commAbort(kv.second.comm);
    if (r != kNcclSuccess) {
      BRAID_LOG(kWarn, "nccl", opt.rank)
          << "ncclCommAbort on device " << kv.first << ": " << ncclResultName(r);
    }
    kv.second.comm = nullptr;
  }
}

void NcclExecutorState::startWatchdog() {
  if (watchdog.joinable()) return;
  watchdog = std::thread([this] { watchdogLoop(); });
}

void NcclExecutorState::watchdogLoop() {
  std::unique_lock<std::mutex> lock(mu);
  while (!stopWatchdog) {
    if (pending.empty()) {
      cv.wait(lock);
      continue;
    }
    std::vector<std::shared_ptr<NcclWork>> works = pending;
    lock.unlock();
    for (auto& w : works) poll(*w);
    works.clear();  // a work's last reference may go here, not under mu
    lock.lock();
    if (!pending.empty() && !stopWatchdog) cv.wait_for(lock, opt.pollInterval);
  }
}

void NcclExecutorState::throwFailedLocked(const char* op, int rank) {
  std::rethrow_exception(
      makeError(failKind, errorText(op, rank,
                                    "the group's NCCL communicators were aborted after "
                                    "an earlier error: ",
                                    failText)));
}

}  // namespace cuda
}  // namespace braid
