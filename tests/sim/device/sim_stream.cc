#include "sim/device/sim_stream.h"

#include <utility>

#include "common/error.h"

namespace braid {
namespace cuda {
namespace sim {

SimStream::SimStream(int device, std::string label)
    : device_(device), label_(std::move(label)), thread_([this] { run(); }) {
  worker_ = thread_.get_id();
}

SimStream::~SimStream() { shutdown(); }

void SimStream::enqueue(std::string what, std::function<void()> fn, bool work) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) {
    throw Error(strCat("braid simulated device: ", what, " on ", label_,
                       ", which was destroyed"));
  }
  if (capturing_) {
    captured_.push_back(Task{std::move(what), std::move(fn), work, delay_});
    return;
  }
  queue_.push_back(Task{std::move(what), std::move(fn), work, delay_});
  ++enqueued_;
  wake_.notify_one();
}

void SimStream::beginCapture() {
  std::lock_guard<std::mutex> lk(mu_);
  capturing_ = true;
  captured_.clear();
}

size_t SimStream::endCapture() {
  std::lock_guard<std::mutex> lk(mu_);
  capturing_ = false;
  const size_t n = captured_.size();
  captured_.clear();
  return n;
}

bool SimStream::capturing() {
  std::lock_guard<std::mutex> lk(mu_);
  return capturing_;
}

void SimStream::throwIfFailedLocked() {
  if (!error_.empty()) throw Error(error_);
}

void SimStream::synchronize() {
  if (std::this_thread::get_id() == worker_) {
    // A task waiting for its own stream to drain would wait for itself.
    throw Error(strCat("braid simulated device: synchronize of ", label_,
                       " from a task running on it would never return"));
  }
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t target = enqueued_;
  idle_.wait(lk, [&] { return done_ >= target; });
  throwIfFailedLocked();
}

bool SimStream::query() {
  std::lock_guard<std::mutex> lk(mu_);
  if (done_ < enqueued_) return false;
  throwIfFailedLocked();
  return true;
}

void SimStream::setDelay(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lk(mu_);
  delay_ = delay;
}

std::string SimStream::error() {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

void SimStream::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;  // already shut down (or shutting down on another thread)
    stop_ = true;
    wake_.notify_one();
  }
  if (std::this_thread::get_id() == worker_) {
    // Destroyed from one of its own tasks: the thread finishes the queue and
    // exits on its own; joining would wait for ourselves.
    thread_.detach();
  } else {
    thread_.join();
  }
}

void SimStream::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = task.work && !error_.empty();
    lk.unlock();
    bool failed = false;
    std::string why;
    if (!skip) {
      if (task.delay.count() > 0) std::this_thread::sleep_for(task.delay);
      try {
        task.fn();
      } catch (const std::exception& e) {
        failed = true;
        why = e.what();
      } catch (...) {
        failed = true;
        why = "an exception that is not a std::exception";
      }
    }
    task.fn = nullptr;  // release what the task captured before reporting it done
    lk.lock();
    if (failed && error_.empty()) {
      error_ = strCat("braid simulated device: ", task.what, " on ", label_, " failed: ", why,
                      " (sticky: the stream skips later work and every synchronize throws)");
    }
    ++done_;
    idle_.notify_all();
  }
}

uint64_t SimEvent::beginRecord(const std::shared_ptr<SimStream>& stream) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t g = ++latest_;
  pending_.insert(g);
  stream_ = stream;
  return g;
}

void SimEvent::complete(uint64_t generation) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.erase(generation);
  cv_.notify_all();
}

uint64_t SimEvent::latest() {
  std::lock_guard<std::mutex> lk(mu_);
  return latest_;
}

bool SimEvent::done(uint64_t generation) {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_.count(generation) == 0;
}

void SimEvent::waitFor(uint64_t generation) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return pending_.count(generation) == 0; });
}

std::shared_ptr<SimStream> SimEvent::lastStream() {
  std::lock_guard<std::mutex> lk(mu_);
  return stream_.lock();
}

}  // namespace sim
}  // namespace cuda
}  // namespace braid
