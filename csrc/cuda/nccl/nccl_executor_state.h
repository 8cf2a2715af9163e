// NcclExecutor's shared state: the executor, its works and its watchdog hold
// it, so a work outlives neither its event nor the errors it reports.
// Shared by nccl_executor.cc (communicators, run) and nccl_work.cc (works,
// watchdog, failure).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/nccl/nccl_executor.h"

namespace braid {
namespace cuda {

using Clock = std::chrono::steady_clock;

struct DeviceComm {
  NcclComm comm = nullptr;  // null once aborted or destroyed
  Stream stream = nullptr;
};

enum class FailKind { kError, kTimeout, kPeerLost };

// A mutex with try_lock_for, as std::timed_mutex, built on a mutex and a
// condition variable: libstdc++'s timed_mutex locks through
// pthread_mutex_clocklock, which TSan does not intercept (it then reports
// every unlock as one of an unlocked mutex).
class TimedLock {
 public:
  void lock() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !held_; });
    held_ = true;
  }
  template <typename Duration>
  bool try_lock_for(Duration d) {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, d, [&] { return !held_; })) return false;
    held_ = true;
    return true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> l(mu_);
      held_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
};

struct NcclExecutorState {
  NcclExecutorState(NcclApi& n, DeviceApi& d, transport::Store& s, NcclExecutor::Options o)
      : nccl(n), dev(d), store(s), opt(std::move(o)) {}

  NcclApi& nccl;
  DeviceApi& dev;
  transport::Store& store;
  const NcclExecutor::Options opt;

  // Lock order: enqueueMu, then callMu, then mu (never the other way).
  // One run() at a time: makes communicators, enqueues; may wait (a
  // communicator's init, an in-progress call) while holding it.
  std::mutex enqueueMu;
  // Every NCCL call on a communicator, and `comms`; held only briefly (a
  // non-blocking communicator never blocks inside NCCL).
  TimedLock callMu;
  std::map<int, DeviceComm> comms;
  int created = 0;

  // Works, failure and the watchdog.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<NcclWork>> pending;
  bool failed = false;
  FailKind failKind = FailKind::kError;
  std::string failText;  // the first error's text
  bool closed = false;   // shutdown() began: no more run()
  bool stopWatchdog = false;
  uint64_t opSeq = 0;
  uint64_t bytes = 0;  // NcclExecutor::bytesIssued
  std::thread watchdog;  // started by the first op

  // ---- nccl_work.cc ----
  // Resolves `w` (success when `e` is null) unless it already is; runs its
  // callbacks on this thread.
  void finish(NcclWork& w, std::exception_ptr e);
  // Looks at `w` once: end event, NCCL's async error, deadline. true once
  // resolved (failing the group where needed).
  bool poll(NcclWork& w);
  // The group's failure (Note [NCCL failures]): the first one is kept; every
  // pending work fails (`culprit` with `cause` itself, the others naming it),
  // then every communicator is aborted.
  void fail(FailKind kind, const std::string& cause, NcclWork* culprit = nullptr);
  // NCCL's async error of `device`'s communicator with its text, or
  // kNcclSuccess (also when callMu is busy or the communicator is gone).
  NcclResult asyncError(int device, std::string* text);
  // ncclCommAbort on every communicator (callMu taken for at most a second).
  void abortComms();
  void startWatchdog();  // under mu
  void watchdogLoop();
  // Throws the group's failure for `op` (under mu, failed).
  [[noreturn]] void throwFailedLocked(const char* op, int rank);
};

std::exception_ptr makeError(FailKind kind, const std::string& text);
FailKind failKindOf(NcclResult r);

}  // namespace cuda
}  // namespace braid
