#include "engine/engine.h"

#include <sched.h>

#include "common/cpu_cores.h"
#include "common/cpu_relax.h"
#include "common/error.h"
#include "common/exit_guard.h"
#include "common/logging.h"
#include "common/settings.h"
#include "common/thread_name.h"

namespace braid {

// BRAID_WORKER_SPIN_US is declared with the policy that sets its default
// (Note [How long to spin] in common/cpu_cores.h). Off unless every rank has
// spare cores: with one core per rank, a worker polling for the next op takes
// the core from the thread that is about to submit it. Measured with 2 ranks
// on 2 cores, 4-byte allreduce: 14 us with 0, 32-44 us with 20 us of polling
// (benchmarks/collectives.py --env BRAID_WORKER_SPIN_US=0,20,100).

namespace {
std::atomic<BlockingCallWrapper> blockingWrapper{nullptr};

std::exception_ptr shutDownError() {
  return std::make_exception_ptr(Error("braid: the group was shut down"));
}
}  // namespace

void setBlockingCallWrapper(BlockingCallWrapper w) { blockingWrapper.store(w); }

Engine::Engine(std::unique_ptr<collectives::Group> group, std::chrono::milliseconds timeout)
    : group_(std::move(group)), timeout_(timeout) {
  // The group's ranks on this host: all of them for a group on one host; a
  // group across hosts counts more than are here, which only errs towards
  // the short spins.
  const SpinPolicy policy = spinPolicyFor(group_->size(), group_->rank());
  workerIdle_ = policy.workerIdle;
  q_->waiterSpin = policy.workerIdle;  // a caller spins only where the worker has its own core
  worker_ = std::thread([this] { loop(); });
  named(worker_, "braid-worker");
}

Engine::~Engine() { shutdown(); }

uint64_t Engine::submit(Job job) {
  Queue& q = *q_;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.stop) {
      if (job.finish) job.finish(shutDownError());
      return 0;
    }
    id = job.id = ++q.lastId;
    q.jobs.push_back(std::move(job));
    q.queued.fetch_add(1, std::memory_order_release);
  }
  q.cv.notify_all();
  return id;
}

namespace {
// With q.mu held: takes the front job and marks this thread as running it.
Engine::Job takeFront(Engine::Queue& q) {
  Engine::Job job = std::move(q.jobs.front());
  q.jobs.pop_front();
  q.queued.fetch_sub(1, std::memory_order_release);
  q.running = true;
  q.runner = std::this_thread::get_id();
  q.finishingSince.store(0, std::memory_order_relaxed);
  return job;
}

// Runs a job taken with takeFront; unless `nested`, then lets the next one go.
// `boost`: Note [Spinning for a blocked rank] in common/cpu_cores.h.
void runTaken(Engine::Queue& q, Engine::Job& job, bool nested, const std::atomic<int>* boost) {
  std::exception_ptr error;
  {
    SpinBoost spin(boost);
    error = job.run();
  }
  if (job.finish) {
    if (!nested) {  // for the message of Note [A job that cannot start]
      q.finishingSince.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                             std::memory_order_relaxed);
    }
    job.finish(error);
  }
  if (nested) return;
  bool wake;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.running = false;
    // The worker waits for a next job, drain() and shutdown() for this one to
    // end. Nobody else: waking the idle worker after every op a caller ran
    // itself cost a context switch per op (Note [Running a job on the
    // waiting thread]).
    wake = !q.jobs.empty() || q.idleWaiters > 0 || q.stop;
  }
  if (wake) q.cv.notify_all();
}
}  // namespace

bool Engine::runHereIfNext(const QueuePtr& qp, uint64_t id) {
  Queue& q = *qp;
  Job job;
  bool nested;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.stop || q.jobs.empty() || q.jobs.front().id != id) return false;
    if (q.running && q.runner != std::this_thread::get_id()) return false;
    nested = q.running;
    job = takeFront(q);
  }
  // This thread waits for the op anyway: its waits may spin long.
  runTaken(q, job, nested, SpinBoost::always());
  return true;
}

bool Engine::expireIfQueued(const QueuePtr& qp, uint64_t id,
                            const std::function<void()>& onExpired) {
  Queue& q = *qp;
  std::lock_guard<std::mutex> lock(q.mu);
  if (q.stop) return false;  // shutdown fails it
  for (auto& j : q.jobs) {
    if (j.id != id) continue;
    j.finish = nullptr;
    onExpired();
    return true;
  }
  return false;
}

void Engine::loop() {
  Queue& q = *q_;
  const auto spin = workerIdle_;
  for (;;) {
    // See Note [Spin, then sleep]: a short poll catches back-to-back ops
    // without a wake-up.
    auto until = std::chrono::steady_clock::now() + spin;
    while (q.queued.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 32; ++i) cpuRelax();
    }
    Job job;
    {
      std::unique_lock<std::mutex> lock(q.mu);
      q.cv.wait(lock, [&] { return q.stop || (!q.jobs.empty() && !q.running); });
      if (q.stop && q.jobs.empty()) return;
      job = takeFront(q);
    }
    // Long spins only while a caller waits for the op (Note [Spinning for a
    // blocked rank]): DDP computes backward beside the worker's allreduces.
    runTaken(q, job, false, &q.waiters);
    dropOrLeak(job);  // Note [Dropping Python objects at exit]
  }
}

void Engine::drain() {
  Queue& q = *q_;
  auto waitEmpty = [&q] {
    std::unique_lock<std::mutex> lock(q.mu);
    if (q.running && q.runner == std::this_thread::get_id()) return;
    ++q.idleWaiters;
    {
      Queue::Waiting waiting(&q.waiters);  // Note [Spinning for a blocked rank]
      q.cv.wait(lock, [&] { return q.stop || (q.jobs.empty() && !q.running); });
    }
    --q.idleWaiters;
  };
  if (auto wrap = blockingWrapper.load()) {
    wrap(waitEmpty);
  } else {
    waitEmpty();
  }
}

// Note [Leaving quietly]
// Aborting a group tells the peers this rank is gone (a goodbye frame on each
// TCP socket, Note [Saying why on the way out]) and fails what they still
// wait for from it. That is right for a rank that leaves in the middle of an
// op. But a rank that finished its last op and shuts down (destroy_process_group)
// may be ahead of a peer that has still to take this rank's last messages
// (Note [Messages that outlive their sender]): the goodbye would fail that
// peer's last op ("it left: the group was shut down", 4 runs in 30 of two
// hosts ending 50 small allreduces). So an idle group is only closed: its
// sockets end cleanly, the peers take what was sent, and a peer that still
// waits for more fails at once, naming this rank ("closed its connections
// (it left: ...)").
void Engine::shutdown() {
  Queue& q = *q_;
  std::deque<Job> dropped;
  bool busy;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (q.stop && !worker_.joinable()) return;
    q.stop = true;
    dropped.swap(q.jobs);
    q.queued.store(0);
    busy = q.running || !dropped.empty();
  }
  q.cv.notify_all();
  // Note [Leaving quietly]: only a group with work left is aborted.
  if (busy) group_->abort();  // a job stuck waiting for a peer returns now
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
  {
    // A job a caller took (Note [Running a job on the waiting thread]) uses
    // the communicator: wait until it returned, unless this thread runs it.
    // Its completion may run Python callbacks, so wait without the GIL.
    auto waitIdle = [&q] {
      std::unique_lock<std::mutex> lock(q.mu);
      if (q.runner == std::this_thread::get_id()) return;
      ++q.idleWaiters;
      q.cv.wait(lock, [&] { return !q.running; });
      --q.idleWaiters;
    };
    if (auto wrap = blockingWrapper.load()) {
      wrap(waitIdle);
    } else {
      waitIdle();
    }
  }
  for (auto& j : dropped) {
    if (j.finish) j.finish(shutDownError());
  }
  group_->close();
}

}  // namespace braid
