#include "collectives/hier/pipeline.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/thread_name.h"

namespace braid {
namespace collectives {
namespace hier {

// Runs tasks one after another on a thread of its own; the destructor runs
// what is still queued, then joins.
class SerialThread {
 public:
  SerialThread() : thread_([this] { loop(); }) { named(thread_, "braid-hier"); }
  ~SerialThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::future<void> submit(std::function<void()> f) {
    std::packaged_task<void()> task(std::move(f));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
    return done;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // its exception goes to its future
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool closed_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

namespace {

// The first TCP stage still pending that fails, within kLossGrace, because a
// peer was lost or timed out; null if none does.
constexpr auto kLossGrace = std::chrono::milliseconds(500);
std::exception_ptr crossLoss(std::vector<std::future<void>>& crossed) {
  const auto until = std::chrono::steady_clock::now() + kLossGrace;
  for (auto& f : crossed) {
    if (!f.valid()) continue;
    if (f.wait_until(until) != std::future_status::ready) return nullptr;
    try {
      f.get();
    } catch (const TimeoutError&) {
      return std::current_exception();
    } catch (const PeerLostError&) {
      return std::current_exception();
    } catch (...) {
    }
  }
  return nullptr;
}

}  // namespace

CrossStages::CrossStages(size_t pieces, transport::Transport& cross)
    : crossed_(pieces), cross_(cross), thread_(std::make_unique<SerialThread>()) {}

CrossStages::~CrossStages() = default;

void CrossStages::submit(size_t i, std::function<void()> stage) {
  crossed_.at(i) = thread_->submit(std::move(stage));
}

void CrossStages::wait(size_t i) {
  try {
    crossed_.at(i).get();
  } catch (...) {
    crossError_ = true;
    throw;
  }
}

void CrossStages::fail(std::exception_ptr error) {
  // A host that goes away fails this rank's TCP stage, and may fail its
  // shared-memory stage first, through a local peer that saw it and left:
  // report the cause, not the echo.
  if (!crossError_) {
    if (std::exception_ptr lost = crossLoss(crossed_)) error = lost;
  }
  std::string why = "a stage failed";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
  }
  cross_.abort(why);
  std::rethrow_exception(error);
}

void acrossThenWithin(size_t pieces, transport::Transport& cross, const PieceStage& across,
                      const PieceStage& within) {
  if (pieces == 1) {
    across(0);
    within(0);
    return;
  }
  CrossStages tcp(pieces, cross);
  try {
    for (size_t i = 0; i < pieces; ++i) tcp.submit(i, [&across, i] { across(i); });
    for (size_t i = 0; i < pieces; ++i) {
      tcp.wait(i);
      within(i);
    }
  } catch (...) {
    tcp.fail(std::current_exception());
  }
}

void withinThenAcross(size_t pieces, transport::Transport& cross, const PieceStage& within,
                      const PieceStage& across) {
  if (pieces == 1) {
    within(0);
    across(0);
    return;
  }
  CrossStages tcp(pieces, cross);
  try {
    for (size_t i = 0; i < pieces; ++i) {
      within(i);
      tcp.submit(i, [&across, i] { across(i); });
    }
    for (size_t i = 0; i < pieces; ++i) tcp.wait(i);
  } catch (...) {
    tcp.fail(std::current_exception());
  }
}

}  // namespace hier
}  // namespace collectives
}  // namespace braid
