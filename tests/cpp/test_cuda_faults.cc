// The simulators' injectable failures (Note [Injected device failures] in
// tests/sim/device/faulty_device.h, Note [Injected NCCL failures] in
// tests/sim/nccl/faulty_nccl.h), each checked on its own, and what they
// catch: an exception out of teardown (Note [No exception out of teardown]
// in cuda/teardown.h) and a communicator destroyed without a bounded
// finalize (Note [Tearing a communicator down] in cuda/nccl/nccl_executor.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/teardown.h"
#include "nccl_sim_ranks.h"
#include "sim/device/faulty_device.h"
#include "sim/nccl/faulty_nccl.h"
#include "timing.h"

namespace braid {
namespace cuda {
namespace {

using braid::testing::MemoryStore;
using braid::testing::runRanks;
using braid::testing::timedOut;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using namespace braid::cuda::testing;  // NOLINT


bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- the device ----

TEST(DeviceFaults, TheNthCallFailsWithCudasText) {
  FaultyDevice d(dev());
  DeviceFault f;
  f.call = "hostAlloc";
  f.nth = 2;
  d.inject(f);
  void* a = d.hostAlloc(64);
  const std::string what = errorOf([&] { d.hostAlloc(64); });
  EXPECT_TRUE(contains(what, "braid: hostAlloc(64 bytes) failed: an illegal memory access was "
                             "encountered (700 cudaErrorIllegalAddress)"))
      << what;
  void* b = d.hostAlloc(64);  // the third succeeds: not `every`, not sticky
  d.hostFree(a);
  d.hostFree(b);
  EXPECT_EQ(d.failures(), 1);
  EXPECT_EQ(d.calls("hostAlloc"), 3);
  EXPECT_EQ(d.failedCalls(), std::vector<std::string>{"hostAlloc"});
}

TEST(DeviceFaults, EveryCallFromTheNthOnFailsAndOthersDoNot) {
  FaultyDevice d(dev());
  DeviceFault f;
  f.call = "eventCreate";
  f.nth = 2;
  f.every = true;
  f.code = 2;
  f.errorName = "cudaErrorMemoryAllocation";
  f.message = "out of memory";
  d.inject(f);
  Event e = d.eventCreate(0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(contains(errorOf([&] { d.eventCreate(0); }), "cudaErrorMemoryAllocation"));
  }
  d.eventDestroy(e);  // other calls work
  Stream s = d.streamCreate(1);
  d.streamDestroy(s);
  EXPECT_EQ(d.failures(), 3);
  d.clear();
  d.eventDestroy(d.eventCreate(0));
}

// After a sticky error every call fails the same way, the frees included.
TEST(DeviceFaults, AStickyErrorFailsEveryLaterCall) {
  FaultyDevice d(dev());
  Stream s = d.streamCreate(0);
  void* p = d.hostAlloc(128);
  DeviceFault f;
  f.call = "streamSynchronize";
  f.sticky = true;
  d.inject(f);
  EXPECT_TRUE(contains(errorOf([&] { d.streamSynchronize(s); }), "cudaErrorIllegalAddress"));
  const std::vector<std::function<void()>> later = {
      [&] { d.hostFree(p); }, [&] { d.streamDestroy(s); }, [&] { d.getDevice(); },
      [&] { d.eventCreate(0); }, [&] { d.deviceFree(nullptr); }};
  for (const auto& call : later) {
    EXPECT_TRUE(contains(errorOf(call), "(700 cudaErrorIllegalAddress) [injected]"));
  }
  EXPECT_EQ(d.failures(), 6);
  EXPECT_EQ(d.name(), "faulty(" + dev().name() + ")");  // no CUDA call
  d.clear();
  d.hostFree(p);
  d.streamDestroy(s);
}

// The rule's self-test: a destructor that lets a failed free escape (what
// PinnedPool's did) terminates the process; one that goes through
// ignoreTeardownError does not.
struct LeakyHolder {
  DeviceApi& d;
  void* p;
  ~LeakyHolder() { d.hostFree(p); }  // deliberately wrong: may throw from a destructor
};
struct CarefulHolder {
  DeviceApi& d;
  void* p;
  ~CarefulHolder() {
    ignoreTeardownError("freeing CarefulHolder's block", -1, [&] { d.hostFree(p); });
  }
};

[[noreturn]] void dropAfterStickyError(bool careful) {
  FaultyDevice d(dev());
  void* p = d.hostAlloc(64);
  DeviceFault f;
  f.call = "hostFree";
  f.sticky = true;
  d.inject(f);
  if (careful) {
    CarefulHolder h{d, p};
  } else {
    LeakyHolder h{d, p};
  }
  std::exit(teardownErrors() == 1 ? 0 : 3);
}

TEST(DeviceFaultsDeathTest, AThrowingFreeInADestructorTerminatesAndTheCarefulOneDoesNot) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(dropAfterStickyError(false), "terminate called");
  EXPECT_EXIT(dropAfterStickyError(true), ::testing::ExitedWithCode(0), "");
}

// ---- NCCL ----

NcclOp allreduce(DeviceBuffer& b) { return op(NcclOpKind::kAllreduce, b.p, b.p, b.n, b.type); }

// Every rank's op has completed before any rank tears down: an abort breaks
// the clique, and a peer whose task is still ending would fail with it.
void meet(std::atomic<int>& arrived, int n) {
  ++arrived;
  while (arrived.load() < n) std::this_thread::yield();
}

TEST(NcclFaults, TheNthCallFailsWithItsResultAndText) {
  SimulatedNccl sim(dev());
  FaultyNccl nccl(sim);
  NcclFault f;
  f.call = "allReduce";
  f.nth = 3;  // each rank makes one call per allreduce: rank 0 or 1 fails the second op
  nccl.inject(f);
  MemoryStore store;
  std::vector<std::string> errors(2);
  runRanks(2, [&](int rank) {
    NcclExecutor ex(nccl, dev(), store, options(rank, 2));
    DeviceBuffer b(DataType::kFloat32, 16);
    for (int i = 0; i < 2; ++i) {
      try {
        ex.run(allreduce(b))->wait();
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        return;
      }
    }
  });
  EXPECT_EQ(nccl.failures(), 1);
  const int failed = contains(errors[0], "ncclSystemError") ? 0 : 1;
  EXPECT_TRUE(contains(errors[failed], "ncclSystemError")) << errors[failed];
  EXPECT_TRUE(contains(errors[failed], "a NIC went away")) << errors[failed];
  EXPECT_FALSE(errors[1 - failed].empty());  // the peer learns of it (the abort)
  EXPECT_EQ(sim.commsLive(), 0);
}

// A sticky fault: every later call answers the same, whatever it is.
TEST(NcclFaults, AStickyFaultFailsEveryLaterCall) {
  SimulatedNccl sim(dev());
  FaultyNccl nccl(sim);
  NcclUniqueId id;
  ASSERT_EQ(nccl.getUniqueId(&id), kNcclSuccess);
  NcclFault f;
  f.call = "groupStart";
  f.sticky = true;
  f.result = kNcclUnhandledCudaError;
  nccl.inject(f);
  EXPECT_EQ(nccl.groupStart(), kNcclUnhandledCudaError);
  EXPECT_EQ(nccl.groupEnd(), kNcclUnhandledCudaError);
  EXPECT_EQ(nccl.getUniqueId(&id), kNcclUnhandledCudaError);
  NcclComm comm = nullptr;
  EXPECT_EQ(nccl.commInitRank(&comm, 1, id, 0, false), kNcclUnhandledCudaError);
  EXPECT_EQ(nccl.failures(), 4);
  nccl.clear();
  EXPECT_EQ(nccl.getUniqueId(&id), kNcclSuccess);
  EXPECT_EQ(nccl.groupStart(), kNcclSuccess);
  EXPECT_EQ(nccl.groupEnd(), kNcclSuccess);
}

TEST(NcclFaults, AnAsyncErrorFailsTheNextOp) {
  SimulatedNccl sim(dev());
  FaultyNccl nccl(sim);
  MemoryStore store;
  std::atomic<int> ready{0};
  std::atomic<bool> injected{false};
  runRanks(2, [&](int rank) {
    NcclExecutor ex(nccl, dev(), store, options(rank, 2));
    DeviceBuffer b(DataType::kFloat32, 16);
    ex.run(allreduce(b))->wait();
    if (++ready == 2) {
      nccl.asyncError(kNcclRemoteError, "injected: peer 1 is gone");
      injected = true;
    }
    while (!injected.load()) std::this_thread::yield();
    std::string what;
    try {
      ex.run(allreduce(b))->wait();
    } catch (const std::exception& e) {
      what = e.what();
    }
    EXPECT_TRUE(contains(what, "ncclRemoteError")) << what;
  });
  EXPECT_EQ(sim.commsLive(), 0);
}

// Each communicator: finalize, then destroy, never a destroy alone.
TEST(NcclFaults, TeardownFinalizesThenDestroys) {
  SimulatedNccl sim(dev());
  FaultyNccl nccl(sim);
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(nccl, dev(), store, options(rank, 2));
    DeviceBuffer b(DataType::kInt32, 8);
    for (size_t i = 0; i < b.n; ++i) b.set(i, rank + 1);
    ex.run(allreduce(b))->wait();
    EXPECT_EQ(b.get(7), 3);
    ex.shutdown();
  });
  const auto log = nccl.teardown();
  ASSERT_EQ(log.size(), 4u);
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].call != "commFinalize") continue;
    size_t j = i + 1;
    while (j < log.size() && log[j].comm != log[i].comm) ++j;
    ASSERT_LT(j, log.size()) << "no destroy after the finalize";
    EXPECT_EQ(log[j].call, "commDestroy");
  }
  int finalizes = 0, destroys = 0;
  for (const auto& t : log) {
    finalizes += t.call == "commFinalize";
    destroys += t.call == "commDestroy";
  }
  EXPECT_EQ(finalizes, 2);
  EXPECT_EQ(destroys, 2);
  EXPECT_EQ(sim.commsLive(), 0);
}

// A peer that died or hangs: the finalize never completes. The teardown
// waits for it only up to the group's timeout, then aborts.
TEST(NcclFaults, AFinalizeThatNeverCompletesIsAbortedAtTheBound) {
  SimulatedNccl sim(dev());
  FaultyNccl nccl(sim);
  MemoryStore store;
  const milliseconds timeout(1000);
  std::vector<Clock::duration> took(2);
  std::atomic<int> arrived{0};
  runRanks(2, [&](int rank) {
    NcclExecutor ex(nccl, dev(), store, options(rank, 2, static_cast<int>(timeout.count())));
    DeviceBuffer b(DataType::kInt32, 8);
    ex.run(allreduce(b))->wait();
    meet(arrived, 2);
    nccl.hangFinalize();
    const auto t0 = Clock::now();
    ex.shutdown();
    took[rank] = Clock::now() - t0;
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(timedOut(took[r], timeout)) << "rank " << r;
  int finalizes = 0, aborts = 0, destroys = 0;
  for (const auto& t : nccl.teardown()) {
    finalizes += t.call == "commFinalize";
    aborts += t.call == "commAbort";
    destroys += t.call == "commDestroy";
  }
  EXPECT_EQ(finalizes, 2);
  EXPECT_EQ(aborts, 2);
  EXPECT_EQ(destroys, 0);
  EXPECT_EQ(sim.commsLive(), 0);
}

// A finalize that fails: abort, not destroy.
TEST(NcclFaults, AFailedFinalizeAborts) {
  SimulatedNccl sim(dev());
  FaultyNccl nccl(sim);
  NcclFault f;
  f.call = "commFinalize";
  f.every = true;
  nccl.inject(f);
  MemoryStore store;
  std::atomic<int> arrived{0};
  runRanks(2, [&](int rank) {
    NcclExecutor ex(nccl, dev(), store, options(rank, 2));
    DeviceBuffer b(DataType::kInt32, 8);
    ex.run(allreduce(b))->wait();
    meet(arrived, 2);
    ex.shutdown();
  });
  int aborts = 0, destroys = 0;
  for (const auto& t : nccl.teardown()) {
    aborts += t.call == "commAbort";
    destroys += t.call == "commDestroy";
  }
  EXPECT_EQ(aborts, 2);
  EXPECT_EQ(destroys, 0);
  EXPECT_EQ(sim.commsLive(), 0);
}

}  // namespace
}  // namespace cuda
}  // namespace braid
