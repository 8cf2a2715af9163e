// The backend's Engine (Note [Running a job on the waiting thread]): jobs run
// once each, in submission order, one at a time, whether the worker or a
// waiting caller runs them; a completion callback may run the next job.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "collectives/shm/shm_group.h"
#include "core_group.h"

namespace braid {
namespace {

using testing::MemoryStore;

std::unique_ptr<Engine> soloEngine(MemoryStore& store) {
  transport::shm::WindowOptions o;
  o.controlBytes = collectives::Communicator::controlBytesFor(1);
  o.slotBytes = 4096;
  o.channelBytes = 4096;
  o.timeout = std::chrono::seconds(20);
  return std::make_unique<Engine>(
      std::make_unique<collectives::ShmGroup>(transport::shm::ShmWindow::create(store, 0, 1, o)),
      std::chrono::seconds(20));
}

struct Log {
  std::mutex mu;
  std::vector<int> ran, finished;
  std::vector<std::thread::id> threads;
};

Engine::Job job(Log& log, int i, std::function<void()> after = nullptr) {
  Engine::Job j;
  j.run = [&log, i]() -> std::exception_ptr {
    std::lock_guard<std::mutex> lock(log.mu);
    log.ran.push_back(i);
    log.threads.push_back(std::this_thread::get_id());
    return nullptr;
  };
  j.finish = [&log, i, after](std::exception_ptr) {
    {
      std::lock_guard<std::mutex> lock(log.mu);
      log.finished.push_back(i);
    }
    if (after) after();
  };
  return j;
}

void waitFor(Log& log, size_t n) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(log.mu);
      if (log.finished.size() >= n) return;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "jobs did not finish";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(Engine, WaitersRunOnlyTheNextJobAndOrderHolds) {
  MemoryStore store;
  auto e = soloEngine(store);
  Log log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 200; ++i) ids.push_back(e->submit(job(log, i)));
  // Waiters on every job, from several threads, racing the worker.
  std::vector<std::thread> waiters;
  std::atomic<int> tookOne{0};
  for (int t = 0; t < 4; ++t) {
    waiters.emplace_back([&, t] {
      for (size_t k = t; k < ids.size(); k += 4) {
        if (Engine::runHereIfNext(e->queue(), ids[k])) tookOne.fetch_add(1);
      }
    });
  }
  for (auto& w : waiters) w.join();
  waitFor(log, ids.size());
  std::vector<int> want(ids.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<int>(i);
  EXPECT_EQ(log.ran, want);  // each once, in submission order
  EXPECT_EQ(log.finished, want);
  // A job already run (or gone) cannot be taken again.
  EXPECT_FALSE(Engine::runHereIfNext(e->queue(), ids[0]));
  e->shutdown();
}

TEST(Engine, CallerRunsItsJobWhenTheWorkerIsBusy) {
  MemoryStore store;
  auto e = soloEngine(store);
  Log log;
  std::promise<void> release;
  auto gate = release.get_future().share();
  // Job 0 holds the worker; job 1 is then next in line and the caller takes it.
  Engine::Job blocker;
  blocker.run = [gate]() -> std::exception_ptr {
    gate.wait();
    return nullptr;
  };
  e->submit(std::move(blocker));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the worker took job 0
  uint64_t id = e->submit(job(log, 1));
  // Not while job 0 runs: one job at a time.
  EXPECT_FALSE(Engine::runHereIfNext(e->queue(), id));
  release.set_value();
  // Either this thread takes it, or the worker ran it first.
  bool here = Engine::runHereIfNext(e->queue(), id);
  waitFor(log, 1);
  if (here) {
    EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  }
  e->shutdown();
}

// A completion callback that waits on the next op (as user code on a future
// may) runs it on the same thread instead of deadlocking against itself.
TEST(Engine, CompletionCallbackMayRunTheNextJob) {
  MemoryStore store;
  auto e = soloEngine(store);
  Log log;
  std::atomic<uint64_t> second{0};
  std::atomic<bool> nestedRan{false};
  uint64_t first = e->submit(job(log, 0, [&] {
    while (second.load() == 0) std::this_thread::yield();
    nestedRan = Engine::runHereIfNext(e->queue(), second.load());
  }));
  second = e->submit(job(log, 1));
  Engine::runHereIfNext(e->queue(), first);
  waitFor(log, 2);
  EXPECT_EQ(log.ran, (std::vector<int>{0, 1}));
  EXPECT_TRUE(nestedRan.load());
  e->shutdown();
}

TEST(Engine, QueuedJobsFailAtShutdownAndLaterSubmitsFailAtOnce) {
  MemoryStore store;
  auto e = soloEngine(store);
  std::promise<void> release;
  auto gate = release.get_future().share();
  Engine::Job blocker;
  blocker.run = [gate]() -> std::exception_ptr {
    gate.wait_for(std::chrono::seconds(5));
    return nullptr;
  };
  e->submit(std::move(blocker));
  std::atomic<int> failed{0};
  for (int i = 0; i < 3; ++i) {
    Engine::Job j;
    j.run = []() -> std::exception_ptr { return nullptr; };
    j.finish = [&](std::exception_ptr err) {
      if (err) failed.fetch_add(1);
    };
    e->submit(std::move(j));
  }
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    release.set_value();
  });
  e->shutdown();
  releaser.join();
  EXPECT_EQ(failed.load(), 3);
  Engine::Job late;
  late.run = []() -> std::exception_ptr { return nullptr; };
  late.finish = [&](std::exception_ptr err) {
    if (err) failed.fetch_add(1);
  };
  EXPECT_EQ(e->submit(std::move(late)), 0u);
  EXPECT_EQ(failed.load(), 4);
}

}  // namespace
}  // namespace braid
