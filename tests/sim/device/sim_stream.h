// The simulated device's streams and events (Note [The device seam] in
// device_api.h): a stream is a worker thread running a FIFO of tasks, an
// event is a set of pending record generations that tasks complete.
//
// Note [Simulated ordering]
// - A task runs after every task enqueued before it on the same stream, on
//   that stream's thread, one at a time (a CUDA stream's FIFO order).
// - eventRecord(e, s) gives e a new generation g and enqueues "g is done" on
//   s. streamWaitEvent(s2, e) captures e's latest generation *at the call*
//   and enqueues a task that blocks s2 until that generation is done; records
//   made after the call do not affect it, as on CUDA. An event never recorded
//   counts as done.
// - Generations are tracked individually (a set of pending ones), not as a
//   counter: an event re-recorded on another stream may finish its later
//   generation first, and a wait for the earlier one must still wait.
// - A task that throws makes the stream's error sticky: later work tasks on
//   that stream are skipped (as kernels after a CUDA fault never run), but
//   event records and waits still run so that nothing that waits on them
//   hangs; every later synchronize/query of the stream, and synchronize of an
//   event last recorded there, throws the error, naming what failed.
// All shared state is under mutexes and condition variables (TSan-clean).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace braid {
namespace cuda {
namespace sim {

class SimStream {
 public:
  // Starts the worker thread. `label` names the stream in errors.
  SimStream(int device, std::string label);
  // shutdown().
  ~SimStream();
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  int device() const { return device_; }
  const std::string& label() const { return label_; }

  // Enqueues fn, to run after everything enqueued before. `what` names it in
  // the sticky error if it throws. Work tasks are skipped once the stream has
  // failed; ordering tasks (event records and waits) always run.
  void enqueue(std::string what, std::function<void()> fn, bool work = true);
  // Blocks until every task enqueued so far has run; throws the sticky error.
  void synchronize();
  // true when every task enqueued so far has run; throws the sticky error
  // once it has.
  bool query();
  // Graph capture (Note [Simulated graph capture] in sim_device.h): while
  // capturing, enqueue records a task instead of running it; endCapture
  // returns how many were recorded.
  void beginCapture();
  size_t endCapture();
  bool capturing();
  // Every task enqueued from now on first sleeps for `delay`.
  void setDelay(std::chrono::microseconds delay);
  // The sticky error's text, or "" while the stream has not failed.
  std::string error();
  // Runs what is queued, then joins the thread; later enqueues throw. Called
  // by streamDestroy, so that the thread is gone when it returns, whoever
  // else still holds the stream. Idempotent.
  void shutdown();

 private:
  struct Task {
    std::string what;
    std::function<void()> fn;
    bool work;
    std::chrono::microseconds delay;
  };
  void run();
  void throwIfFailedLocked();

  const int device_;
  const std::string label_;
  std::mutex mu_;
  std::condition_variable wake_;  // queue non-empty or stopping
  std::condition_variable idle_;  // done_ advanced
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;  // tasks ever enqueued
  uint64_t done_ = 0;      // tasks finished (or skipped)
  bool stop_ = false;
  bool capturing_ = false;
  std::vector<Task> captured_;
  std::chrono::microseconds delay_{0};
  std::string error_;
  std::thread thread_;  // after the members run() uses: it starts in the constructor
  // thread_'s id, kept apart because join() changes thread_ while other
  // threads may be asking whether they are the worker.
  std::thread::id worker_;
};

class SimEvent {
 public:
  explicit SimEvent(int device) : device_(device) {}
  int device() const { return device_; }

  // A new generation, pending until complete(g) runs; `stream` is where it
  // was recorded (for sticky errors; held weakly, so that an event does not
  // keep a destroyed stream alive).
  uint64_t beginRecord(const std::shared_ptr<SimStream>& stream);
  void complete(uint64_t generation);
  // The latest generation recorded so far (0: never recorded).
  uint64_t latest();
  bool done(uint64_t generation);
  void waitFor(uint64_t generation);
  // The stream of the latest record (null when never recorded or destroyed).
  std::shared_ptr<SimStream> lastStream();

 private:
  const int device_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t latest_ = 0;
  std::set<uint64_t> pending_;
  std::weak_ptr<SimStream> stream_;
};

}  // namespace sim
}  // namespace cuda
}  // namespace braid
