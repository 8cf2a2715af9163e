// The simulator's injectable device failures (Note [Injected device
// failures] in tests/sim/device/faulty_device.h), checked on their own, and
// what they catch: an exception out of teardown (Note [No exception out of
// teardown] in cuda/teardown.h).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/teardown.h"
#include "sim/device/faulty_device.h"
#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {
namespace {

SimulatedDevice& dev() { return simulatedDevice(4); }

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

}  // namespace
}  // namespace cuda
}  // namespace braid
