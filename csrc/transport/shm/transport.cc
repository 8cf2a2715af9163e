#include "transport/shm/transport.h"

#include <utility>

#include "common/error.h"

namespace braid {
namespace transport {
namespace shm {
namespace {

// The transport whose completion this thread is running (its engine thread
// inside a callback): abort() there must not join that thread.
thread_local const ShmTransport* completing = nullptr;

// The engine's error with the request's words in front, of the same kind.
std::exception_ptr restate(const std::string& what, std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& x) {
    return std::make_exception_ptr(TimeoutError(what + ": " + x.what()));
  } catch (const PeerLostError& x) {
    return std::make_exception_ptr(PeerLostError(what + ": " + x.what()));
  } catch (const std::exception& x) {
    return std::make_exception_ptr(Error(what + ": " + x.what()));
  }
}

}  // namespace

std::unique_ptr<Transport> connect(Store& store, int rank, int size, const WindowOptions& options) {
  BRAID_ENFORCE(size >= 1 && rank >= 0 && rank < size, "shm connect", rank, "rank ", rank,
                " is not in a group of ", size);
  return std::make_unique<ShmTransport>(ShmWindow::create(store, rank, size, options),
                                        options.logRank, options.directMin);
}

ShmTransport::ShmTransport(std::unique_ptr<ShmWindow> window, int logRank, size_t directMin)
    : window_(std::move(window)),
      logRank_(logRank >= 0 ? logRank : window_->rank()),
      engine_(std::make_unique<P2PEngine>(*window_, directMin)) {}

ShmTransport::~ShmTransport() { close(); }

std::string ShmTransport::peerName(int rank) const {
  return strCat(window_->who(rank), " (shared memory)");
}

void ShmTransport::checkArgs(const char* op, int peer, const void* data, size_t bytes) const {
  BRAID_ENFORCE(peer >= 0 && peer < size(), op, logRank_, "peer rank ", peer,
                " is not in the group of ", size());
  BRAID_ENFORCE(data || bytes == 0, op, logRank_, "null buffer for ", bytes, " bytes");
}

P2PEngine::Done ShmTransport::finisher(const std::shared_ptr<Request>& req) {
  return [this, req](std::exception_ptr e, int) {
    if (e) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_) why = abortWhy_;
      }
      // An abort's own shutdown fails what was pending: say why it happened.
      e = why.empty() ? restate(req->what(), e)
                      : std::make_exception_ptr(Error(req->what() + ": aborted: " + why));
    }
    const ShmTransport* outer = completing;
    completing = this;
    req->complete(e);  // runs the caller's callback here, on the engine's thread
    completing = outer;
  };
}

template <typename Post>
std::shared_ptr<Request> ShmTransport::submit(std::string what, Request::Callback done,
                                              Post post) {
  auto req = std::make_shared<Request>(std::move(what), std::move(done));
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) refused = "aborted: " + abortWhy_;
    else if (closed_) refused = "the transport is closed";
  }
  if (refused.empty()) {
    try {
      post(finisher(req));
      return req;
    } catch (const std::exception& e) {
      refused = e.what();  // the engine stopped between the check and the post
    }
  }
  req->complete(std::make_exception_ptr(Error(req->what() + ": " + refused)));
  return req;
}

// No deadline: a Request waits as long as its caller's wait() allows, and
// the op stays posted after that (the contract of transport.h).
std::shared_ptr<Request> ShmTransport::isend(int dst, uint64_t tag, const void* data, size_t bytes,
                                             Request::Callback done) {
  checkArgs("shm send", dst, data, bytes);
  // Without a callback of the caller's, it may complete on this thread (Note
  // [Sends from the posting thread]).
  const bool here = !done;
  return submit(
      errorText("shm send", logRank_, "to ", peerName(dst), ", tag ", tag, ", ", bytes, " bytes"),
      std::move(done), [&](P2PEngine::Done fin) {
        engine_->postSend(dst, static_cast<int64_t>(tag), data, bytes, Clock::time_point::max(),
                          std::chrono::milliseconds(0), std::move(fin), here);
      });
}

std::shared_ptr<Request> ShmTransport::irecv(int src, uint64_t tag, void* data, size_t bytes,
                                             Request::Callback done) {
  checkArgs("shm recv", src, data, bytes);
  return submit(
      errorText("shm recv", logRank_, "from ", peerName(src), ", tag ", tag, ", ", bytes, " bytes"),
      std::move(done), [&](P2PEngine::Done fin) {
        engine_->postRecv(src, static_cast<int64_t>(tag), data, bytes, Clock::time_point::max(),
                          std::chrono::milliseconds(0), std::move(fin));
      });
}

void ShmTransport::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ || closed_) return;
    aborted_ = true;
    abortWhy_ = why;
  }
  window_->markClosed();  // the peers' pending ops with this rank fail now
  if (completing != this) engine_->shutdown();  // fails this rank's pending ops
}

void ShmTransport::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  // Gone before the engine hands pending sends' buffers back (Note [Messages
  // read in place]).
  window_->markClosed();
  engine_->shutdown();
}

}  // namespace shm
}  // namespace transport
}  // namespace braid
