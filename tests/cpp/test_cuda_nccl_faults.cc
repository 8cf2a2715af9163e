// NcclExecutor's failures over the simulated NCCL (Note [NCCL failures] in
// nccl_work.cc): NCCL's async errors, timeouts, hangs, abort() and
// shutdown(), each of which must end promptly and say what happened.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "common/error.h"
#include "nccl_sim_ranks.h"
#include "timing.h"

namespace braid {
namespace cuda {
namespace {

using namespace testing;  // NOLINT
using braid::testing::MemoryStore;
using braid::testing::endedByTimeout;
using braid::testing::endedEarly;
using braid::testing::runRanks;
using braid::testing::timedOut;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Bounds set by each op's timeout: Note [Timing bounds in tests] in tests/cpp/timing.h.
Clock::duration since(Clock::time_point t) { return Clock::now() - t; }

// Runs `fn` and returns the braid::Error it throws, by kind.
template <typename E, typename F>
std::string errorOf(F fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error kind: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

NcclOp allreduce(DeviceBuffer& b) { return op(NcclOpKind::kAllreduce, b.p, b.p, b.n, b.type); }

TEST(CudaNcclFaults, AsyncErrorFailsTheOpAndAbortsTheGroup) {
  const int n = 3;
  SimulatedNccl sim(dev());
  MemoryStore store;
  std::atomic<int> firstDone{0};
  runRanks(n, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, n));
    DeviceBuffer b(DataType::kFloat32, 16);
    ex.run(allreduce(b))->wait();
    // Every rank has seen its first op succeed before the error comes.
    ++firstDone;
    while (firstDone.load() < n) std::this_thread::yield();
    if (rank == 1) sim.injectAsyncError(1, kNcclSystemError, "injected: NIC went away");
    std::string what;
    if (rank == 1) {
      // Rank 1's own NCCL error: an Error naming the op, the rank and NCCL's text.
      what = errorOf<Error>([&] { ex.run(allreduce(b))->wait(); });
      EXPECT_TRUE(contains(what, "allreduce (rank 1)")) << what;
      EXPECT_TRUE(contains(what, "ncclSystemError")) << what;
      EXPECT_TRUE(contains(what, "NIC went away")) << what;
    } else {
      // The others learn of it when rank 1 aborts: a peer failed.
      what = errorOf<PeerLostError>([&] { ex.run(allreduce(b))->wait(); });
      EXPECT_TRUE(contains(what, strCat("allreduce (rank ", rank, ")"))) << what;
      EXPECT_TRUE(contains(what, "ncclRemoteError")) << what;
    }
    // Later ops fail at once with the first error; nothing is enqueued.
    auto t0 = Clock::now();
    std::string later = errorOf<Error>([&] { ex.run(allreduce(b)); });
    EXPECT_TRUE(endedEarly(since(t0), options(rank, n).timeout));
    EXPECT_TRUE(contains(later, "earlier error")) << later;
    EXPECT_TRUE(contains(later, what)) << later;
  });
  EXPECT_EQ(sim.commsLive(), 0);  // every communicator was aborted
}

TEST(CudaNcclFaults, MissingPeerTimesOutWithinTheDeadline) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2, 300));
    DeviceBuffer b(DataType::kInt32, 8);
    ex.run(allreduce(b))->wait();  // both: the communicator exists
    if (rank == 1) return;         // rank 1 skips the second op
    auto t0 = Clock::now();
    auto w = ex.run(allreduce(b));
    std::string what = errorOf<TimeoutError>([&] { w->wait(); });
    EXPECT_TRUE(timedOut(since(t0), milliseconds(300), milliseconds(290)));
    EXPECT_TRUE(contains(what, "allreduce (rank 0): op 2")) << what;
    EXPECT_TRUE(contains(what, "300 ms")) << what;
    EXPECT_THROW(w->done(), TimeoutError);
    EXPECT_NE(w->error(), nullptr);
  });
}

TEST(CudaNcclFaults, WatchdogFailsOpsNobodyWaitsFor) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2, 200));
    DeviceBuffer b(DataType::kInt32, 8);
    ex.run(allreduce(b))->wait();
    if (rank == 1) return;
    std::promise<std::string> failed;
    auto w = ex.run(allreduce(b));
    w->onDone([&](std::exception_ptr e) {
      try {
        if (e) std::rethrow_exception(e);
        failed.set_value("succeeded");
      } catch (const TimeoutError& t) {
        failed.set_value(t.what());
      } catch (...) {
        failed.set_value("another error");
      }
    });
    auto f = failed.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(3)), std::future_status::ready);
    EXPECT_TRUE(contains(f.get(), "timeout of 200 ms")) << f.get();
  });
}

TEST(CudaNcclFaults, HungKernelTimesOutOnEveryRank) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  std::atomic<int> timeouts{0};
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2, 250));
    DeviceBuffer b(DataType::kFloat64, 8);
    ex.run(allreduce(b))->wait();
    if (rank == 0) sim.injectHang(0);  // rank 0's next task never finishes
    auto t0 = Clock::now();
    // Each rank times out, or learns first that the other one aborted.
    try {
      ex.run(allreduce(b))->wait();
      ADD_FAILURE() << "rank " << rank << ": the hung op succeeded";
    } catch (const TimeoutError& e) {
      EXPECT_TRUE(contains(e.what(), "within its timeout of 250 ms")) << e.what();
      ++timeouts;
    } catch (const PeerLostError& e) {
      EXPECT_TRUE(contains(e.what(), "ncclRemoteError")) << e.what();
    }
    EXPECT_TRUE(endedByTimeout(since(t0), milliseconds(250))) << "rank " << rank;
  });
  EXPECT_GE(timeouts.load(), 1);
}

TEST(CudaNcclFaults, AbortEndsAHangingOpPromptly) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2, 60000));
    DeviceBuffer b(DataType::kFloat32, 8);
    ex.run(allreduce(b))->wait();
    if (rank == 1) return;  // never joins the second op
    auto w = ex.run(allreduce(b));
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(50));
      auto t0 = Clock::now();
      ex.abort("the test gives up");
      EXPECT_TRUE(endedEarly(since(t0), milliseconds(60000)));
    });
    auto t0 = Clock::now();
    std::string what = errorOf<PeerLostError>([&] { w->wait(); });
    EXPECT_TRUE(endedEarly(since(t0), milliseconds(60000)));
    aborter.join();
    EXPECT_TRUE(contains(what, "allreduce (rank 0)")) << what;
    EXPECT_TRUE(contains(what, "the test gives up")) << what;
    auto t1 = Clock::now();
    ex.shutdown();  // nothing left to drain (its drain would be the 60 s timeout)
    EXPECT_TRUE(endedEarly(since(t1), milliseconds(60000)));
  });
}

TEST(CudaNcclFaults, InitWithAMissingRankTimesOut) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  NcclExecutor ex(sim, dev(), store, options(0, 2, 200));  // rank 1 never comes
  DeviceBuffer b(DataType::kFloat32, 8);
  auto t0 = Clock::now();
  std::string what = errorOf<TimeoutError>([&] { ex.run(allreduce(b)); });
  EXPECT_TRUE(endedByTimeout(since(t0), milliseconds(200)));
  EXPECT_TRUE(contains(what, "making the NCCL communicator")) << what;
  EXPECT_TRUE(contains(what, "did not join")) << what;
  EXPECT_EQ(sim.commsLive(), 0);
}

TEST(CudaNcclFaults, NoUniqueIdFromRank0TimesOut) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  NcclExecutor ex(sim, dev(), store, options(1, 2, 150));
  DeviceBuffer b(DataType::kFloat32, 8);
  std::string what = errorOf<TimeoutError>([&] { ex.run(allreduce(b)); });
  EXPECT_TRUE(contains(what, "rank 0 did not publish the NCCL unique id")) << what;
  EXPECT_TRUE(contains(what, "test/nccl/0/uid")) << what;
}

TEST(CudaNcclFaults, AbortDuringInitReturnsPromptly) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  NcclExecutor ex(sim, dev(), store, options(0, 2, 60000));
  DeviceBuffer b(DataType::kFloat32, 8);
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    ex.abort("init abandoned");
  });
  auto t0 = Clock::now();
  std::string what = errorOf<PeerLostError>([&] { ex.run(allreduce(b)); });
  aborter.join();
  EXPECT_TRUE(endedEarly(since(t0), milliseconds(60000)));
  EXPECT_TRUE(contains(what, "init abandoned")) << what;
}

TEST(CudaNcclFaults, ShutdownDrainsThenDestroys) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2));
    DeviceBuffer b(DataType::kInt64, 1024);
    for (size_t i = 0; i < b.n; ++i) b.set(i, rank);
    std::vector<std::shared_ptr<NcclWork>> works;
    for (int i = 0; i < 4; ++i) works.push_back(ex.run(allreduce(b)));
    ex.shutdown();  // waits for the four, then destroys the communicator
    for (auto& w : works) EXPECT_TRUE(w->done());
    EXPECT_EQ(b.get(5), 8);  // 1 -> 2 -> 4 -> 8
    std::string what = errorOf<Error>([&] { ex.run(allreduce(b)); });
    EXPECT_TRUE(contains(what, "shut down")) << what;
    ex.shutdown();  // idempotent
  });
  EXPECT_EQ(sim.commsLive(), 0);
}

TEST(CudaNcclFaults, ShutdownWithAHangingOpAbortsWithinTheDrain) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2, 60000));
    DeviceBuffer b(DataType::kInt32, 8);
    ex.run(allreduce(b))->wait();
    if (rank == 1) return;
    auto w = ex.run(allreduce(b));
    auto t0 = Clock::now();
    ex.shutdown(milliseconds(100));
    EXPECT_TRUE(timedOut(since(t0), milliseconds(100)));  // the drain's
    std::string what = errorOf<PeerLostError>([&] { w->wait(); });
    EXPECT_TRUE(contains(what, "still running")) << what;
  });
  EXPECT_EQ(sim.commsLive(), 0);
}

TEST(CudaNcclFaults, MismatchedOpsFailEveryRank) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2));
    DeviceBuffer b(DataType::kFloat32, 8);
    NcclOp o = allreduce(b);
    o.count = rank == 0 ? 8 : 4;  // a bug in the caller: the sizes differ
    std::string what = errorOf<Error>([&] { ex.run(o)->wait(); });
    EXPECT_TRUE(contains(what, "ncclInvalidUsage")) << what;
  });
}

}  // namespace
}  // namespace cuda
}  // namespace braid
