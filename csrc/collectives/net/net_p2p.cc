#include "collectives/net/net_p2p.h"

#include "common/error.h"
#include "common/thread_name.h"

namespace braid {
namespace collectives {
namespace net {

NetP2P::NetP2P(transport::Transport& t) : t_(t), rank_(t.rank()) {
  thread_ = std::thread([this] { loop(); });
  named(thread_, "braid-p2p");
}

NetP2P::~NetP2P() { shutdown(); }

void NetP2P::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Runs on whichever thread completes the request (Note [A stalled progress
// thread] reads the clock).
transport::Request::Callback NetP2P::wrap(Done done, int source) {
  return [done = std::move(done), source, since = inCallback_](std::exception_ptr e) mutable {
    runDone(since, done, e, source);
  };
}

void NetP2P::postSend(int dst, int tag, const void* data, size_t bytes,
                      transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
                      Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    BRAID_ENFORCE(!stop_, "send", rank_, "the group was shut down");
  }
  watch(t_.isend(dst, tagOf(tag), data, bytes, wrap(std::move(done), rank_)), deadline, timeout);
}

void NetP2P::postRecv(int src, int tag, void* data, size_t bytes,
                      transport::Clock::time_point deadline, std::chrono::milliseconds timeout,
                      Done done) {
  BRAID_ENFORCE(src != kAnySource, "recv", rank_,
                "a receive from any source is not supported in a group across hosts (its "
                "messages are matched per sender); name the source rank");
  {
    std::lock_guard<std::mutex> lock(mu_);
    BRAID_ENFORCE(!stop_, "recv", rank_, "the group was shut down");
  }
  watch(t_.irecv(src, tagOf(tag), data, bytes, wrap(std::move(done), src)), deadline, timeout);
}

// Wakes the watcher only when this deadline comes before its own next
// wake-up: waking it for every op cost each small send or receive a thread
// hand-off (the watcher also sweeps finished ops off the list on its own,
// every 200 ms).
void NetP2P::watch(const std::shared_ptr<transport::Request>& req,
                   transport::Clock::time_point deadline, std::chrono::milliseconds timeout) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.push_back({req, deadline, timeout});
    wake = deadline < sleepsUntil_;
  }
  if (wake) cv_.notify_all();
}

// Note [Point-to-point across hosts]: an op past its deadline aborts the
// transport.
void NetP2P::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    auto next = transport::Clock::time_point::max();
    const auto now = transport::Clock::now();
    std::string expired;
    for (auto it = watched_.begin(); it != watched_.end();) {
      auto req = it->req.lock();
      bool done = !req;
      if (req) {
        try {
          done = req->test();
        } catch (...) {
          done = true;
        }
      }
      if (done) {
        it = watched_.erase(it);
        continue;
      }
      if (it->deadline <= now && expired.empty()) {
        expired = errorText("p2p", rank_, req->what(), " timed out after ", it->timeout.count(),
                            " ms; a transport cannot take back a posted op, so the group is "
                            "aborted (Note [Point-to-point across hosts])");
      }
      next = std::min(next, it->deadline);
      ++it;
    }
    if (!expired.empty()) {
      // Fails every pending op of the transport, these included: none is
      // left to watch.
      watched_.clear();
      sleepsUntil_ = transport::Clock::time_point::min();
      lock.unlock();
      t_.abort(expired);
      lock.lock();
      continue;
    }
    // Poll finished requests off the list now and then even without deadlines.
    auto until = std::min(next, now + std::chrono::milliseconds(200));
    sleepsUntil_ = until;
    cv_.wait_until(lock, until);
    sleepsUntil_ = transport::Clock::time_point::min();
  }
}

}  // namespace net
}  // namespace collectives
}  // namespace braid
