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
    cv_.notify_all();
  }
  if (cb && !DeferredCallbacks::queue(cb, error)) cb(error);
}

namespace {
thread_local DeferredCallbacks* innermost = nullptr;
}  // namespace

DeferredCallbacks::DeferredCallbacks() : outer_(innermost) { innermost = this; }

DeferredCallbacks::~DeferredCallbacks() { innermost = outer_; }

bool DeferredCallbacks::queue(Request::Callback& cb, std::exception_ptr error) {
  if (!innermost) return false;
  innermost->calls_.emplace_back(std::move(cb), std::move(error));
  return true;
}

}  // namespace transport
}  // namespace braid
