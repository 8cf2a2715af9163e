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
  if (error_) std::rethrow_exception(error_);
}

bool Request::test() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && error_) std::rethrow_exception(error_);
  return done_;
}

void Request::complete(std::exception_ptr error) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    error_ = error;
    cb = std::move(callback_);
    cv_.notify_all();
  }
  if (cb) cb(error);
}

}  // namespace transport
}  // namespace braid
