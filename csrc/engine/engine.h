// The Engine runs one group's ops: collectives in submission order on one
// worker thread, point-to-point messages on the P2P progress thread.
// Torch-free, so the threading can be tested on its own.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "collectives/group.h"

namespace braid {

// Runs a call that may block on the worker thread (joining it). The Python
// module installs a wrapper that releases the GIL around it: see Note
// [Releasing the GIL on destruction] in python/module_py.cc.
using BlockingCallWrapper = void (*)(const std::function<void()>&);
void setBlockingCallWrapper(BlockingCallWrapper w);

// Note [Running a job on the waiting thread]
// A blocking collective costs two thread hand-offs on top of the op itself: the
// caller wakes the worker, and the worker wakes the caller. On a machine with
// one core per rank each wake-up is a trip through the scheduler (a 4-byte
// allreduce at 2 ranks measured 12 us, most of it hand-offs). So when a caller
// waits on a Work whose job is next in line and nothing is running, the caller
// takes the job and runs it itself; the worker, woken by submit(), finds the
// queue empty and sleeps again. Jobs still run one at a time and in submission
// order: a job is taken only from the front, and only while no other job runs,
// except by the thread that runs the current one (a completion callback that
// waits on the next op), which would otherwise wait for itself.
//
// Note [A job that cannot start]
// A job starts only once the one before it has returned, its `finish`
// included, and `finish` completes a Future whose callbacks (user code, e.g.
// `work.get_future().then(cb)`) run inline on that thread. A callback that
// never returns therefore stalls the queue, and the ops behind it never reach
// the transport, whose waits are where deadlines are enforced: a caller
// waiting for one would wait for ever. So WorkBraid::wait gives a job that has
// not started by its op's deadline up: its Work fails with a timeout that
// names the op and what it waited behind. The job stays queued with its
// `finish` dropped; when a thread reaches it, its `run` marks the group
// broken instead of running the op, since the peers ran it without this rank
// or timed out waiting for it. (The peers' ops time out at their deadlines as
// usual: the callback holds this rank's worker, not theirs.)
class Engine {
 public:
  struct Job {
    // Runs the op and returns its error, if any (on the worker or on a waiting
    // caller); then `finish` completes the Work with it. `finish` alone runs
    // with the group's error when the job never runs.
    std::function<std::exception_ptr()> run;
    std::function<void(std::exception_ptr)> finish;
    uint64_t id = 0;
  };
  // What a Work needs to run its own job: shared, so that it outlives the
  // Engine (Works may outlive their group).
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    std::atomic<size_t> queued{0};
    uint64_t lastId = 0;
    bool stop = false;
    bool running = false;
    int idleWaiters = 0;  // drain() and shutdown() waiting for !running
    std::thread::id runner;
    // steady_clock ticks when the running job's `finish` began, 0 before.
    std::atomic<int64_t> finishingSince{0};
    // Callers blocked on a job of this queue (WorkBraid::wait, drain()):
    // while there are any, the worker's waits may spin long (Note [Spinning
    // for a blocked rank] in common/cpu_cores.h).
    std::atomic<int> waiters{0};
    // Counts the calling thread in `waiters` while it lives (null: nothing).
    class Waiting {
     public:
      explicit Waiting(std::atomic<int>* waiters) : n_(waiters) {
        if (n_) n_->fetch_add(1, std::memory_order_relaxed);
      }
      ~Waiting() {
        if (n_) n_->fetch_sub(1, std::memory_order_relaxed);
      }
      Waiting(const Waiting&) = delete;
      Waiting& operator=(const Waiting&) = delete;

     private:
      std::atomic<int>* const n_;
    };
    // How long such a caller polls for its op's end before sleeping: only
    // where the worker has a core of its own (SpinPolicy::workerIdle), else 0.
    std::chrono::microseconds waiterSpin{0};
  };
  using QueuePtr = std::shared_ptr<Queue>;

  Engine(std::unique_ptr<collectives::Group> group, std::chrono::milliseconds timeout);
  ~Engine();

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  collectives::Group& group() { return *group_; }  // on the thread running a job only
  collectives::PointToPoint& p2p() { return group_->p2p(); }  // started on first use
  // The group's registered regions (Note [Registered buffers]); any thread.
  std::shared_ptr<collectives::RegionTable> regionTable() { return group_->regionTable(); }
  const QueuePtr& queue() const { return q_; }

  // Returns the job's id (0 if it was failed at once: the group is shut down).
  uint64_t submit(Job job);
  // See Note [A job that cannot start]: if job `id` is still queued, drops
  // its `finish` (the caller fails its Work) and runs `onExpired` under the
  // queue's lock, so that the job's `run` knows when a thread takes it later.
  // Returns whether it did.
  static bool expireIfQueued(const QueuePtr& q, uint64_t id, const std::function<void()>& onExpired);
  // See Note [Running a job on the waiting thread]: runs job `id` on this
  // thread if it may; returns whether it did.
  static bool runHereIfNext(const QueuePtr& q, uint64_t id);
  // Waits until every submitted job has run (each ends by its own deadline),
  // without the GIL. A no-op on the thread running a job, which would wait
  // for itself.
  void drain();
  // Aborts waits, fails queued jobs, joins the threads. Idempotent, and safe
  // from any thread.
  void shutdown();

 private:
  void loop();

  std::unique_ptr<collectives::Group> group_;
  std::chrono::milliseconds timeout_;
  QueuePtr q_ = std::make_shared<Queue>();
  std::chrono::microseconds workerIdle_{0};  // SpinPolicy::workerIdle
  std::thread worker_;
};

}  // namespace braid
