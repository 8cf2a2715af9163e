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

#include "collectives/communicator.h"
#include "collectives/p2p.h"

namespace braid {

// Runs a call that may block on the worker thread (joining it). The Python
// module installs a wrapper that releases the GIL around it: see Note
// [Releasing the GIL on destruction] in backend/module_py.cc.
using BlockingCallWrapper = void (*)(const std::function<void()>&);
void setBlockingCallWrapper(BlockingCallWrapper w);

class Engine {
 public:
  struct Job {
    std::function<void()> run;                     // on the worker
    std::function<void(std::exception_ptr)> fail;  // if it never runs
  };

  Engine(std::unique_ptr<transport::Window> window, std::chrono::milliseconds timeout);
  ~Engine();

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  collectives::Communicator& comm() { return *comm_; }  // worker thread only
  collectives::P2PEngine& p2p();                        // started on first use

  void submit(Job job);
  // Aborts waits, fails queued jobs, joins the threads. Idempotent.
  void shutdown();

 private:
  void loop();

  std::unique_ptr<collectives::Communicator> comm_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::atomic<size_t> queued_{0};
  bool stop_ = false;
  std::once_flag p2pOnce_;
  std::unique_ptr<collectives::P2PEngine> p2p_;
  std::thread worker_;
};

}  // namespace braid
