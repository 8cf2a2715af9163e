#include "backend/engine.h"

#include <sched.h>

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "transport/shm/futex.h"

namespace braid {

BRAID_SETTING_INT(kWorkerSpinUs, "BRAID_WORKER_SPIN_US", 20,
                  "Microseconds the worker polls for the next op before sleeping; "
                  "saves a thread wake-up between back-to-back small ops.");

namespace {
std::atomic<BlockingCallWrapper> blockingWrapper{nullptr};
}  // namespace

void setBlockingCallWrapper(BlockingCallWrapper w) { blockingWrapper.store(w); }

Engine::Engine(std::unique_ptr<transport::Window> window, std::chrono::milliseconds timeout)
    : comm_(std::make_unique<collectives::Communicator>(std::move(window))), timeout_(timeout) {
  worker_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

collectives::P2PEngine& Engine::p2p() {
  std::call_once(p2pOnce_, [this] { p2p_ = std::make_unique<collectives::P2PEngine>(comm_->window()); });
  return *p2p_;
}

void Engine::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      auto fail = std::move(job.fail);
      if (fail) fail(std::make_exception_ptr(Error("braid: the group was shut down")));
      return;
    }
    queue_.push_back(std::move(job));
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
}

void Engine::loop() {
  const auto spin = std::chrono::microseconds(kWorkerSpinUs.get());
  for (;;) {
    // See Note [Spin, then sleep]: a short poll catches back-to-back ops
    // without a wake-up.
    auto until = std::chrono::steady_clock::now() + spin;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 32; ++i) transport::shm::cpuRelax();
    }
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    job.run();  // catches its own exceptions and completes its Work
  }
}

void Engine::shutdown() {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !worker_.joinable()) return;
    stop_ = true;
    dropped.swap(queue_);
    queued_.store(0);
  }
  cv_.notify_all();
  comm_->window().abort();  // a job stuck waiting for a peer returns now
  if (worker_.joinable()) {
    // The last reference can drop inside a future callback on the worker.
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();
    } else if (auto wrap = blockingWrapper.load()) {
      wrap([this] { worker_.join(); });
    } else {
      worker_.join();
    }
  }
  for (auto& j : dropped) {
    if (j.fail) j.fail(std::make_exception_ptr(Error("braid: the group was shut down")));
  }
  if (p2p_) p2p_->shutdown();
  comm_->window().markClosed();
}

}  // namespace braid
