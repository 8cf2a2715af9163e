#include "transport/transport.h"

#include <utility>

#include "common/error.h"

namespace braid {
namespace transport {

Request::Request(std::string what, Callback callback)
    : what_(std::move(what)), callback_(std::move(callback)) {}

void Request::wait(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return done_; })) {
    throw TimeoutError(what_ + ": timed out");
  }
  throwError();
}

bool Request::test() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) throwError();
  return done_;
}

void Request::throwError() const {
  switch (errorKind_) {
    case ErrorKind::kNone: return;
    case ErrorKind::kTimeout: throw TimeoutError(errorText_);
    case ErrorKind::kPeerLost: throw PeerLostError(errorText_);
    case ErrorKind::kError: throw Error(errorText_);
  }
}

void Request::complete(std::exception_ptr error) {
  if (DeferredCompletions::defer(*this, error)) return;
  ErrorKind kind = ErrorKind::kNone;
  std::string text;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const TimeoutError& e) {
      kind = ErrorKind::kTimeout, text = e.what();
    } catch (const PeerLostError& e) {
      kind = ErrorKind::kPeerLost, text = e.what();
    } catch (const std::exception& e) {
      kind = ErrorKind::kError, text = e.what();
    } catch (...) {
      kind = ErrorKind::kError, text = what_ + ": unknown error";
    }
  }
  Callback cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    errorKind_ = kind;
    errorText_ = std::move(text);
    cb = std::move(callback_);
  }
  // After unlocking: a waiter woken under the lock would only block on it
  // again (one more futex round trip per completion). The Request outlives
  // this call: every completer reaches it through a shared_ptr it holds.
  cv_.notify_all();
  if (driver_) driver_->completed();
  if (cb && !DeferredCallbacks::queue(cb, error)) cb(error);
}

namespace {
thread_local DeferredCallbacks* innermost = nullptr;
thread_local DeferredCompletions* innermostCompletions = nullptr;
}  // namespace

DeferredCompletions::DeferredCompletions() : outer_(innermostCompletions) {
  innermostCompletions = this;
}

DeferredCompletions::~DeferredCompletions() {
  run();
  innermostCompletions = outer_;
}

void DeferredCompletions::run() {
  // What completes now is not recorded here again (it goes to the outer one,
  // or happens at once), so one pass empties calls_.
  DeferredCompletions* const active = innermostCompletions;
  innermostCompletions = outer_;
  auto calls = std::move(calls_);
  calls_.clear();
  for (auto& [req, error] : calls) req->complete(std::move(error));
  innermostCompletions = active;
}

bool DeferredCompletions::defer(Request& r, std::exception_ptr& error) {
  if (!innermostCompletions) return false;
  std::shared_ptr<Request> owned = r.weak_from_this().lock();
  if (!owned) return false;
  innermostCompletions->calls_.emplace_back(std::move(owned), std::move(error));
  return true;
}

DeferredCallbacks::DeferredCallbacks() : outer_(innermost) { innermost = this; }

DeferredCallbacks::~DeferredCallbacks() { innermost = outer_; }

bool DeferredCallbacks::queue(Request::Callback& cb, std::exception_ptr error) {
  if (!innermost) return false;
  innermost->calls_.emplace_back(std::move(cb), std::move(error));
  return true;
}

}  // namespace transport
}  // namespace braid
