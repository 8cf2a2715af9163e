// A current device per thread, a context per process and device (Note [A
// current device per thread] in csrc/cuda/on_device.h, Note [Simulated
// contexts] in tests/sim/device/sim_device.h): the simulated device's rules,
// a deliberately wrong use that they catch, and braid's executors on threads
// that never set a device, which must leave no context on device 0.
//
// Contexts are per process, so each case starts from none (forgetContexts)
// and runs its CUDA calls on fresh threads, whose device was never set, with
// every rank on device 1: a context on device 0 can only be a leak.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda/on_device.h"
#include "cuda/staged.h"
#include "memory_store.h"
#include "nccl_sim_ranks.h"
#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {
namespace {

using testing::dev;  // 4 simulated devices
using Contexts = std::vector<int>;

// `fn` on a thread of its own, which never set a device.
template <typename F>
void onFreshThread(F fn) {
  std::thread(fn).join();
}

TEST(CudaContexts, GetDeviceAndTheContextQueryCreateNothing) {
  dev().forgetContexts();
  onFreshThread([] {
    EXPECT_EQ(dev().getDevice(), 0);  // "no device" reads as 0, as cudaGetDevice
    for (int d = 0; d < 4; ++d) EXPECT_FALSE(dev().primaryContextActive(d)) << d;
    EXPECT_EQ(dev().deviceCount(), 4);
    dev().deviceUuid(2);
  });
  EXPECT_EQ(dev().contexts(), Contexts{});
}

TEST(CudaContexts, SetDeviceMakesThatDevicesContextOnly) {
  dev().forgetContexts();
  onFreshThread([] {
    dev().setDevice(2);
    EXPECT_EQ(dev().getDevice(), 2);
    EXPECT_TRUE(dev().primaryContextActive(2));
    Event e = dev().eventCreate(2);
    EXPECT_TRUE(dev().eventQuery(e));
    dev().eventDestroy(e);
  });
  EXPECT_EQ(dev().contexts(), Contexts{2});
}

// The self-test: the bug the rule is about. A thread that never set its
// device queries an event of device 1 (torchcomms's watchdog did): CUDA 12+
// makes device 0's context, and so does the simulated device.
TEST(CudaContexts, ACallOnAThreadWithNoDeviceMakesDevice0sContext) {
  dev().forgetContexts();
  Event e = nullptr;
  onFreshThread([&] {
    dev().setDevice(1);
    e = dev().eventCreate(1);
  });
  ASSERT_EQ(dev().contexts(), Contexts{1});
  onFreshThread([&] {
    EXPECT_TRUE(dev().eventQuery(e));
    EXPECT_EQ(dev().getDevice(), 0);  // and device 0 is now current there
  });
  EXPECT_EQ(dev().contexts(), (Contexts{0, 1}));
  onFreshThread([&] { dev().eventDestroy(e); });
}

// Calls that take a device switch to it as braid's CUDA runtime does: its
// context only, and the thread stays there when the device it had (none, so
// "0") has no context.
TEST(CudaContexts, CallsTakingADeviceMakeOnlyThatDevicesContext) {
  dev().forgetContexts();
  onFreshThread([] {
    Stream s = dev().streamCreate(3);
    EXPECT_EQ(dev().getDevice(), 3);
    void* p = dev().deviceAlloc(3, 64);
    dev().streamSynchronize(s);
    dev().deviceFree(p);
    dev().streamDestroy(s);
  });
  EXPECT_EQ(dev().contexts(), Contexts{3});
}

// A guard that saves getDevice()'s "0" on a fresh thread and restores it with
// a plain setDevice makes device 0's context (the old DeviceSwitch and the NCCL
// executor's DeviceGuard); OnDevice does not.
TEST(CudaContexts, OnDeviceRestoresNoDeviceWithoutMakingAContext) {
  dev().forgetContexts();
  onFreshThread([] {
    const int previous = dev().getDevice();
    dev().setDevice(1);
    dev().setDevice(previous);
  });
  EXPECT_EQ(dev().contexts(), (Contexts{0, 1}));

  dev().forgetContexts();
  onFreshThread([] {
    {
      OnDevice on(dev(), 1);
      EXPECT_EQ(dev().getDevice(), 1);
    }
    EXPECT_EQ(dev().getDevice(), 1);  // stays: "0" has no context
  });
  EXPECT_EQ(dev().contexts(), Contexts{1});

  // Back to a device that has a context.
  onFreshThread([] {
    dev().setDevice(2);
    {
      OnDevice on(dev(), 1);
      EXPECT_EQ(dev().getDevice(), 1);
    }
    EXPECT_EQ(dev().getDevice(), 2);
  });
  EXPECT_EQ(dev().contexts(), (Contexts{1, 2}));
}

// The staged executor's op on a worker thread that never set its device.
TEST(CudaContexts, StagedOpOnAFreshWorkerLeavesDevice0Alone) {
  static constexpr int kDevice = 1;
  static constexpr size_t kBytes = 256;
  dev().forgetContexts();
  Stream comm = nullptr;
  void* buf = nullptr;
  void* pinned = nullptr;
  std::vector<Event> pool;  // the events, made in advance as CudaContext's pool has them
  onFreshThread([&] {       // the caller, on its device
    dev().setDevice(kDevice);
    comm = dev().streamCreate(kDevice);
    buf = dev().deviceAlloc(kDevice, kBytes);
    pinned = dev().hostAlloc(kBytes);
    for (int i = 0; i < 4; ++i) pool.push_back(dev().eventCreate(kDevice));
  });
  std::vector<Event> idle = pool;
  onFreshThread([&] {  // the worker
    StagedOp::Env env;
    env.api = &dev();
    env.device = kDevice;
    env.comm = comm;
    env.event = [&idle] {
      Event e = idle.back();
      idle.pop_back();
      return SharedEvent(e, [](void*) {});
    };
    StagedOp op(std::move(env));
    op.stageIn(pinned, buf, kBytes);
    op.run([&] { op.copyBack(buf, pinned, kBytes); }, [](Event e) { dev().eventSynchronize(e); });
    EXPECT_TRUE(op.ended());
  });
  onFreshThread([&] {
    dev().setDevice(kDevice);
    for (Event e : pool) dev().eventDestroy(e);
    dev().hostFree(pinned);
    dev().deviceFree(buf);
    dev().streamDestroy(comm);
  });
  EXPECT_EQ(dev().contexts(), Contexts{kDevice});
}

// The NCCL executor: two ranks (threads that set their device, as a user's
// do) on device 1; its watchdog, a thread of its own, queries the ops' end
// events. Then an abort, or a shutdown, from a thread that never set its
// device (the simulated NCCL switches to the communicator's device and back
// with a plain set, as NCCL's teardown does).
void ncclOpsThen(bool abort) {
  using testing::DeviceBuffer;
  using testing::op;
  using testing::options;
  constexpr int kDevice = 1, kRanks = 2;
  constexpr size_t kCount = 33;
  dev().forgetContexts();
  SimulatedNccl sim(dev());
  braid::testing::MemoryStore store;
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      dev().setDevice(kDevice);
      NcclExecutor ex(sim, dev(), store, options(r, kRanks));
      DeviceBuffer in(DataType::kFloat32, kCount, kDevice),
          out(DataType::kFloat32, kCount, kDevice);
      for (size_t i = 0; i < kCount; ++i) in.set(i, r + 1.0);
      for (int k = 0; k < 3; ++k) {
        NcclOp o = op(NcclOpKind::kAllreduce, in.p, out.p, kCount, DataType::kFloat32);
        o.device = kDevice;
        auto w = ex.run(o);
        // The watchdog polls every pending op as soon as it is listed.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        w->wait();
        for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(out.get(i), 3.0) << i;
      }
      std::thread([&] {
        if (abort) ex.abort("the test aborts");
        ex.shutdown();
      }).join();
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(dev().contexts(), Contexts{kDevice});
}

TEST(CudaContexts, NcclExecutorWatchdogAndAbortLeaveDevice0Alone) { ncclOpsThen(true); }
TEST(CudaContexts, NcclExecutorShutdownLeavesDevice0Alone) { ncclOpsThen(false); }

}  // namespace
}  // namespace cuda
}  // namespace braid
