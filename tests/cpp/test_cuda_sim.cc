// The simulated device (tests/sim/device/sim_device.cc): CUDA's ordering rules on
// the CPU, which the CUDA executors' tests rely on to fail where a GPU would.
// Shared state between host functions and the test thread is atomic or
// ordered by the device's own synchronization, so that the suite is TSan-clean.
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cuda/staged.h"
#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

SimulatedDevice& dev() { return simulatedDevice(2); }

// Owns a stream or event for one test.
struct StreamHolder {
  Stream s;
  explicit StreamHolder(int device = 0) : s(dev().streamCreate(device)) {}
  ~StreamHolder() { dev().streamDestroy(s); }
};
struct EventHolder {
  Event e;
  explicit EventHolder(int device = 0) : e(dev().eventCreate(device)) {}
  ~EventHolder() { dev().eventDestroy(e); }
};

int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Blocks a stream until released (a stand-in for a long kernel).
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  void block(Stream s) {
    auto f = opened;
    dev().launchHostFunc(s, [f] { f.wait(); });
  }
};

TEST(CudaSim, Identity) {
  EXPECT_TRUE(dev().simulated());
  EXPECT_EQ(dev().deviceCount(), 2);
  EXPECT_EQ(dev().name(), "simulated (2 devices)");
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  ASSERT_FALSE(boot.empty());
  EXPECT_EQ(dev().deviceUuid(1), "sim-" + boot + "-1");
  EXPECT_THROW(dev().deviceUuid(2), Error);
  EXPECT_EQ(&simulatedDevice(7), &dev());  // the first call fixed the count
}

// Note [Simulated graph capture] in sim/device/sim_device.h: what each mode
// prohibits, on which threads, and that a prohibited call invalidates the capture.
using Mode = DeviceApi::CaptureMode;

// Runs `fn` on a fresh thread (mode kGlobal, as CUDA starts every thread);
// returns the error it threw, or "".
std::string onOtherThread(const std::function<void()>& fn) {
  std::string err;
  std::thread([&] {
    try {
      fn();
    } catch (const std::exception& e) {
      err = e.what();
    }
  }).join();
  return err;
}

std::string endError(Stream s, size_t* tasks = nullptr) {
  try {
    size_t n = dev().endCapture(s);
    if (tasks) *tasks = n;
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(CudaSimCapture, RecordsTasksInsteadOfRunningThem) {
  StreamHolder s;
  std::atomic<int> ran{0};
  dev().beginCapture(s.s, Mode::kGlobal);
  EXPECT_TRUE(dev().streamIsCapturing(s.s));
  dev().launchHostFunc(s.s, [&] { ran++; });
  dev().launchHostFunc(s.s, [&] { ran++; });
  size_t tasks = 99;
  EXPECT_EQ(endError(s.s, &tasks), "");
  EXPECT_EQ(tasks, 2u);
  EXPECT_FALSE(dev().streamIsCapturing(s.s));
  dev().streamSynchronize(s.s);
  EXPECT_EQ(ran.load(), 0);  // captured, never run
  dev().launchHostFunc(s.s, [&] { ran++; });
  dev().streamSynchronize(s.s);
  EXPECT_EQ(ran.load(), 1);
}

TEST(CudaSimCapture, GlobalModeProhibitsQueriesOnOtherThreads) {
  // The deliberately wrong use: a query on another thread, in global mode.
  StreamHolder s, other;
  EventHolder e;
  dev().beginCapture(s.s, Mode::kGlobal);
  const std::string err = onOtherThread([&] { dev().eventQuery(e.e); });
  EXPECT_NE(err.find("eventQuery is prohibited while a CUDA graph is captured"),
            std::string::npos) << err;
  EXPECT_NE(err.find("(global mode)"), std::string::npos) << err;
  const std::string end = endError(s.s);
  EXPECT_NE(end.find("invalidated by eventQuery on another thread "
                     "(cudaErrorStreamCaptureInvalidated)"),
            std::string::npos) << end;
  // Each prohibited call does the same.
  for (const char* call : {"streamQuery", "streamSynchronize", "hostAlloc", "deviceAlloc"}) {
    dev().beginCapture(s.s, Mode::kGlobal);
    const std::string what = call;
    const std::string err2 = onOtherThread([&] {
      if (what == "streamQuery") dev().streamQuery(other.s);
      if (what == "streamSynchronize") dev().streamSynchronize(other.s);
      if (what == "hostAlloc") dev().hostFree(dev().hostAlloc(64));
      if (what == "deviceAlloc") dev().deviceFree(dev().deviceAlloc(0, 64));
    });
    EXPECT_NE(err2.find(what + " is prohibited"), std::string::npos) << err2;
    EXPECT_NE(endError(s.s).find("invalidated by " + what), std::string::npos) << what;
  }
}

TEST(CudaSimCapture, GlobalModeAllowsARelaxedThread) {
  StreamHolder s, other;
  EventHolder e;
  dev().beginCapture(s.s, Mode::kGlobal);
  const std::string err = onOtherThread([&] {
    EXPECT_EQ(dev().exchangeCaptureMode(Mode::kRelaxed), Mode::kGlobal);
    dev().eventQuery(e.e);
    dev().streamQuery(other.s);
    dev().hostFree(dev().hostAlloc(64));
    EXPECT_EQ(dev().exchangeCaptureMode(Mode::kGlobal), Mode::kRelaxed);
  });
  EXPECT_EQ(err, "");
  EXPECT_EQ(endError(s.s), "");
}

TEST(CudaSimCapture, ThreadLocalModeProhibitsOnlyTheCapturingThread) {
  StreamHolder s;
  EventHolder e;
  dev().beginCapture(s.s, Mode::kThreadLocal);
  EXPECT_EQ(onOtherThread([&] { dev().eventQuery(e.e); }), "");
  EXPECT_EQ(endError(s.s), "");
  dev().beginCapture(s.s, Mode::kThreadLocal);
  EXPECT_THROW(dev().eventQuery(e.e), Error);
  EXPECT_NE(endError(s.s).find("invalidated by eventQuery on the capturing thread"),
            std::string::npos);
}

TEST(CudaSimCapture, RelaxedModeProhibitsNothing) {
  StreamHolder s;
  EventHolder e;
  dev().beginCapture(s.s, Mode::kRelaxed);
  EXPECT_EQ(onOtherThread([&] { dev().eventQuery(e.e); }), "");
  dev().eventQuery(e.e);
  dev().hostFree(dev().hostAlloc(64));
  EXPECT_EQ(endError(s.s), "");
}

TEST(CudaSim, SetDeviceIsPerThread) {
  dev().setDevice(1);
  EXPECT_EQ(dev().getDevice(), 1);
  int other = -1;
  std::thread([&] { other = dev().getDevice(); }).join();
  EXPECT_EQ(other, 0);
  EXPECT_THROW(dev().setDevice(2), Error);
  dev().setDevice(0);
}

TEST(CudaSim, StreamRunsTasksInOrder) {
  StreamHolder s;
  std::vector<int> order;  // touched only by the stream's thread until synchronize
  for (int i = 0; i < 2000; ++i) dev().launchHostFunc(s.s, [&order, i] { order.push_back(i); });
  dev().streamSynchronize(s.s);
  ASSERT_EQ(order.size(), 2000u);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(order[i], i);
}

TEST(CudaSim, QueryAndSynchronize) {
  StreamHolder s;
  EXPECT_TRUE(dev().streamQuery(s.s));
  Gate gate;
  gate.block(s.s);
  EXPECT_FALSE(dev().streamQuery(s.s));
  gate.open.set_value();
  dev().streamSynchronize(s.s);
  EXPECT_TRUE(dev().streamQuery(s.s));
}

TEST(CudaSim, NullStreamIsThePerDeviceDefault) {
  std::atomic<int> ran{0};
  dev().launchHostFunc(nullptr, [&] { ++ran; });
  dev().streamSynchronize(nullptr);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_THROW(dev().streamDestroy(nullptr), Error);
}

// The executor's pattern: a consumer stream waits for a producer's event. The
// producer is slowed down, so without the wait the consumer would read the
// old value (CudaSim.WithoutTheWaitTheConsumerReadsStaleData shows it does).
TEST(CudaSim, StreamWaitEventOrdersTheConsumer) {
  StreamHolder producer, consumer;
  EventHolder ready;
  int* src = static_cast<int*>(dev().hostAlloc(sizeof(int)));
  int* buf = static_cast<int*>(dev().deviceAlloc(0, sizeof(int)));
  int* out = static_cast<int*>(dev().hostAlloc(sizeof(int)));
  *src = 42;
  *buf = 0;
  *out = -1;
  dev().setStreamDelay(producer.s, milliseconds(30));
  dev().memcpyAsync(buf, src, sizeof(int), producer.s);
  dev().eventRecord(ready.e, producer.s);
  dev().streamWaitEvent(consumer.s, ready.e);
  dev().memcpyAsync(out, buf, sizeof(int), consumer.s);
  dev().streamSynchronize(consumer.s);
  EXPECT_EQ(*out, 42);
  dev().streamSynchronize(producer.s);
  dev().hostFree(src);
  dev().deviceFree(buf);
  dev().hostFree(out);
}

// The control for the test above (atomics, so that the deliberate missing
// order is not a data race): without the wait the consumer runs first. A
// gate instead of a delay makes that certain on a loaded machine.
TEST(CudaSim, WithoutTheWaitTheConsumerReadsStaleData) {
  StreamHolder producer, consumer;
  std::atomic<int> value{0};
  int seen = -1;
  Gate gate;
  gate.block(producer.s);
  dev().launchHostFunc(producer.s, [&] { value = 42; });
  dev().launchHostFunc(consumer.s, [&] { seen = value.load(); });
  dev().streamSynchronize(consumer.s);
  EXPECT_EQ(seen, 0);
  gate.open.set_value();
  dev().streamSynchronize(producer.s);
}

TEST(CudaSim, SetStreamDelayDelaysEveryLaterTask) {
  StreamHolder s;
  dev().launchHostFunc(s.s, [] {});  // enqueued before the delay: not delayed
  dev().setStreamDelay(s.s, milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) dev().launchHostFunc(s.s, [] {});
  dev().streamSynchronize(s.s);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(60));
  dev().setStreamDelay(s.s, microseconds(0));
}

TEST(CudaSim, EventNeverRecordedIsComplete) {
  EventHolder e;
  StreamHolder s;
  EXPECT_TRUE(dev().eventQuery(e.e));
  dev().eventSynchronize(e.e);
  dev().streamWaitEvent(s.s, e.e);  // no-op
  dev().streamSynchronize(s.s);
}

TEST(CudaSim, EventQueryAndSynchronizeFollowTheLastRecord) {
  StreamHolder s;
  EventHolder e;
  Gate gate;
  gate.block(s.s);
  dev().eventRecord(e.e, s.s);
  EXPECT_FALSE(dev().eventQuery(e.e));
  gate.open.set_value();
  dev().eventSynchronize(e.e);
  EXPECT_TRUE(dev().eventQuery(e.e));
}

// A wait captures the record as of the call: a later re-record neither
// extends it nor releases it early.
TEST(CudaSim, WaitCapturesTheRecordAtTheCall) {
  StreamHolder a, b, waiter;
  EventHolder e;
  // 1. Not extended: record on a (done), wait on waiter, then re-record
  //    behind a gate. The waiter must not wait for the second record.
  dev().eventRecord(e.e, a.s);
  dev().streamSynchronize(a.s);
  Gate gate;
  dev().streamWaitEvent(waiter.s, e.e);
  gate.block(a.s);
  dev().eventRecord(e.e, a.s);
  std::atomic<bool> passed{false};
  dev().launchHostFunc(waiter.s, [&] { passed = true; });
  dev().streamSynchronize(waiter.s);
  EXPECT_TRUE(passed.load());
  EXPECT_FALSE(dev().eventQuery(e.e));
  gate.open.set_value();
  dev().eventSynchronize(e.e);

  // 2. Not released early: record behind a gate on a, wait on waiter, then
  //    re-record on b, which completes at once. The waiter still waits for a.
  Gate gate2;
  gate2.block(a.s);
  std::atomic<int> aDone{0};
  dev().launchHostFunc(a.s, [&] { aDone = 1; });
  dev().eventRecord(e.e, a.s);
  dev().streamWaitEvent(waiter.s, e.e);
  dev().eventRecord(e.e, b.s);
  dev().streamSynchronize(b.s);
  int seen = -1;
  dev().launchHostFunc(waiter.s, [&] { seen = aDone.load(); });
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(dev().streamQuery(waiter.s));
  gate2.open.set_value();
  dev().streamSynchronize(waiter.s);
  EXPECT_EQ(seen, 1);
}

TEST(CudaSim, EventOfAnotherDeviceCannotBeRecorded) {
  StreamHolder s(0);
  EventHolder e(1);
  EXPECT_THROW(dev().eventRecord(e.e, s.s), Error);
}

TEST(CudaSim, MemcpyChain) {
  StreamHolder s;
  const size_t n = 1 << 20;
  auto* host = static_cast<uint8_t*>(dev().hostAlloc(n));
  auto* d1 = static_cast<uint8_t*>(dev().deviceAlloc(0, n));
  auto* d2 = static_cast<uint8_t*>(dev().deviceAlloc(1, n));
  auto* back = static_cast<uint8_t*>(dev().hostAlloc(n));
  for (auto* p : {host, d1, d2, back}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memset(back, 0, n);
  dev().memcpyAsync(d1, host, n, s.s);      // H2D
  dev().memcpyAsync(d2, d1, n, s.s);        // D2D
  dev().memcpyAsync(back, d2, n - 3, s.s);  // D2H, odd size
  dev().memcpyAsync(back, host, 0, s.s);    // nothing
  dev().streamSynchronize(s.s);
  EXPECT_EQ(std::memcmp(back, host, n - 3), 0);
  EXPECT_EQ(back[n - 1], 0);
  EXPECT_THROW(dev().memcpyAsync(nullptr, host, 1, s.s), Error);
  dev().hostFree(host);
  dev().hostFree(back);
  dev().deviceFree(d1);
  dev().deviceFree(d2);
}

TEST(CudaSim, AllocationsAreTracked) {
  void* h = dev().hostAlloc(100);
  void* d = dev().deviceAlloc(1, 100);
  EXPECT_THROW(dev().deviceFree(h), Error);  // wrong kind
  EXPECT_THROW(dev().hostFree(d), Error);
  dev().hostFree(h);
  dev().deviceFree(d);
  EXPECT_THROW(dev().hostFree(h), Error);  // double free
  EXPECT_THROW(dev().deviceFree(d), Error);
  int local = 0;
  EXPECT_THROW(dev().hostFree(&local), Error);  // never allocated
  dev().hostFree(nullptr);
  dev().deviceFree(nullptr);
  EXPECT_EQ(dev().hostAlloc(0), nullptr);
  EXPECT_THROW(dev().deviceAlloc(2, 8), Error);
}

TEST(CudaSim, UnknownHandlesThrow) {
  int x = 0;
  EXPECT_THROW(dev().streamSynchronize(&x), Error);
  EXPECT_THROW(dev().eventQuery(&x), Error);
  Stream s = dev().streamCreate(0);
  dev().streamDestroy(s);
  EXPECT_THROW(dev().streamDestroy(s), Error);
  Event e = dev().eventCreate(0);
  dev().eventDestroy(e);
  EXPECT_THROW(dev().eventDestroy(e), Error);
}

TEST(CudaSim, ErrorsAreStickyAndNameTheTask) {
  StreamHolder s, other;
  EventHolder e;
  std::atomic<int> later{0};
  dev().launchHostFunc(s.s, [] { throw std::runtime_error("boom"); });
  dev().launchHostFunc(s.s, [&] { later = 1; });  // skipped: the stream failed
  dev().eventRecord(e.e, s.s);                     // still completes
  for (int i = 0; i < 2; ++i) {
    try {
      dev().streamSynchronize(s.s);
      FAIL() << "no error";
    } catch (const Error& err) {
      const std::string what = err.what();
      EXPECT_NE(what.find("launchHostFunc"), std::string::npos) << what;
      EXPECT_NE(what.find("boom"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(later.load(), 0);
  EXPECT_THROW(dev().eventSynchronize(e.e), Error);
  EXPECT_THROW(dev().eventQuery(e.e), Error);
  EXPECT_THROW(dev().streamQuery(s.s), Error);
  dev().streamWaitEvent(other.s, e.e);  // ordering still works elsewhere
  dev().launchHostFunc(other.s, [&] { later = 2; });
  dev().streamSynchronize(other.s);
  EXPECT_EQ(later.load(), 2);
}

TEST(CudaSim, DestroyDrainsAndJoins) {
  const int before = threadCount();
  std::atomic<int> ran{0};
  std::vector<Stream> streams;
  for (int i = 0; i < 32; ++i) streams.push_back(dev().streamCreate(i % 2));
  EXPECT_EQ(threadCount(), before + 32);
  for (Stream s : streams) {
    dev().setStreamDelay(s, microseconds(200));
    for (int k = 0; k < 5; ++k) dev().launchHostFunc(s, [&] { ++ran; });
  }
  for (Stream s : streams) dev().streamDestroy(s);
  EXPECT_EQ(ran.load(), 32 * 5);
  EXPECT_EQ(threadCount(), before);
}

TEST(CudaSim, DestroyingAnEventWithPendingWorkIsSafe) {
  StreamHolder a, b;
  Gate gate;
  gate.block(a.s);
  Event e = dev().eventCreate(0);
  dev().eventRecord(e, a.s);
  dev().streamWaitEvent(b.s, e);
  dev().eventDestroy(e);
  gate.open.set_value();
  dev().streamSynchronize(b.s);
}

// A chain through 64 streams, each waiting on the previous one's event: the
// value travels through all of them in order.
TEST(CudaSim, ManyStreamsChainedByEvents) {
  constexpr int kStreams = 64;
  std::vector<Stream> streams;
  std::vector<Event> events;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(dev().streamCreate(0));
    events.push_back(dev().eventCreate(0));
  }
  std::vector<int> trail;  // each step appends; ordered by the events
  for (int i = 0; i < kStreams; ++i) {
    if (i > 0) dev().streamWaitEvent(streams[i], events[i - 1]);
    if (i % 7 == 0) dev().setStreamDelay(streams[i], microseconds(500));
    dev().launchHostFunc(streams[i], [&trail, i] { trail.push_back(i); });
    dev().eventRecord(events[i], streams[i]);
  }
  dev().eventSynchronize(events.back());
  ASSERT_EQ(trail.size(), static_cast<size_t>(kStreams));
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(trail[i], i);
  for (int i = 0; i < kStreams; ++i) {
    dev().streamDestroy(streams[i]);
    dev().eventDestroy(events[i]);
  }
}

TEST(CudaSim, ReduceAsyncRunsTheKernelInStreamOrder) {
  StreamHolder s;
  const size_t n = 1001;
  auto* a = static_cast<int32_t*>(dev().deviceAlloc(0, n * 4));
  auto* b = static_cast<int32_t*>(dev().deviceAlloc(0, n * 4));
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<int32_t>(i);
    b[i] = 1000;
  }
  dev().setStreamDelay(s.s, milliseconds(5));
  dev().reduceAsync(DataType::kInt32, ReduceOp::kSum, a, b, n, s.s);
  dev().reduceAsync(DataType::kInt32, ReduceOp::kMax, a, a, n, s.s);  // in place: no change
  dev().reduceAsync(DataType::kInt32, ReduceOp::kSum, a, a, n, s.s);  // doubles
  dev().streamSynchronize(s.s);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], 2 * (static_cast<int32_t>(i) + 1000));
  EXPECT_THROW(dev().reduceAsync(DataType::kInt32, ReduceOp::kAvg, a, b, n, s.s), Error);
  EXPECT_THROW(dev().reduceAsync(DataType::kFloat32, ReduceOp::kBxor, a, b, n, s.s), Error);
  EXPECT_THROW(dev().reduceAsync(DataType::kInt32, ReduceOp::kSum, a + 1, a, n, s.s), Error);
  EXPECT_THROW(dev().reduceAsync(DataType::kInt64, ReduceOp::kSum, a + 1, b, 2, s.s), Error);
  dev().reduceAsync(DataType::kInt32, ReduceOp::kSum, nullptr, nullptr, 0, s.s);
  dev().deviceFree(a);
  dev().deviceFree(b);
}

// A pooled-event stand-in for StagedOp::Env::event: a fresh event, destroyed
// with its last reference.
SharedEvent sharedEvent(int device) {
  return SharedEvent(dev().eventCreate(device), [](void* e) { dev().eventDestroy(e); });
}

StagedOp::Env stagedEnv(int device, Stream comm, StagedCounters* counters) {
  StagedOp::Env env;
  env.api = &dev();
  env.device = device;
  env.comm = comm;
  env.event = [device] { return sharedEvent(device); };
  env.counters = counters;
  return env;
}

void hostWait(Event e) { dev().eventSynchronize(e); }

// Ranks meet here (threads as ranks), as the host collective's steps would.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    const int gen = gen_;
    if (++in_ == n_) {
      in_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int in_ = 0, gen_ = 0;
};

// Threads as ranks, each with its own streams, through braid's staged
// executor (cuda::StagedOp, the steps of Note [The staged CUDA executor] in
// c10d/cuda/cuda_op.h): the caller's stream produces late (10 ms), the op's
// comm stream must wait on the caller's event before it copies the input to
// pinned memory, the ranks sum the shadows on the CPU, the sum is copied
// back, and the caller's stream waits on the op's end event before reading
// it. The counters show one op and the bytes of one copy each way.
TEST(CudaSim, StagedExecutorWithThreadsAsRanks) {
  static constexpr int kRanks = 4;
  static constexpr size_t kN = 4096;
  static constexpr size_t kBytes = kN * sizeof(float);
  std::vector<const float*> shadows(kRanks);
  Barrier barrier(kRanks);
  std::vector<StagedCounters> counters(kRanks);
  std::vector<int> failures(kRanks, 0), ended(kRanks, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      SimulatedDevice& d = dev();
      const int device = r % 2;
      Stream caller = d.streamCreate(device), comm = d.streamCreate(device);
      auto* buf = static_cast<float*>(d.deviceAlloc(device, kBytes));
      auto* pinned = static_cast<float*>(d.hostAlloc(kBytes));
      std::memset(pinned, 0, kBytes);
      {
        StagedOp op(stagedEnv(device, comm, &counters[r]));
        op.stageIn(pinned, buf, kBytes);
        d.setStreamDelay(caller, milliseconds(10));
        d.launchHostFunc(caller, [buf, r] {
          for (size_t i = 0; i < kN; ++i) buf[i] = static_cast<float>(r + i);
        });
        d.setStreamDelay(caller, microseconds(0));
        SharedEvent start = sharedEvent(device);
        d.eventRecord(start.get(), caller);
        op.setCallerEvent(start);
        std::vector<float> sum(kN, 0.f);
        op.run(
            [&] {
              // The host collective on the shadows: every rank's input has
              // reached its shadow before run() calls the body.
              shadows[r] = pinned;
              barrier.arrive();
              for (int q = 0; q < kRanks; ++q) {
                for (size_t i = 0; i < kN; ++i) sum[i] += shadows[q][i];
              }
              barrier.arrive();  // no shadow is overwritten while a peer reads it
              std::memcpy(pinned, sum.data(), kBytes);
              op.copyBack(buf, pinned, kBytes);
            },
            hostWait);
        ended[r] = op.ended();
        d.streamWaitEvent(caller, op.endEvent().get());
      }
      std::vector<float> result(kN);
      d.memcpyAsync(result.data(), buf, kBytes, caller);
      d.streamSynchronize(caller);
      for (size_t i = 0; i < kN; ++i) {
        if (result[i] != static_cast<float>(kRanks * i + kRanks * (kRanks - 1) / 2)) ++failures[r];
      }
      d.hostFree(pinned);
      d.deviceFree(buf);
      d.streamDestroy(caller);
      d.streamDestroy(comm);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(failures[r], 0) << "rank " << r << ": elements off the closed form";
    EXPECT_TRUE(ended[r]) << "rank " << r;
    const StagedCounts c = counters[r].snapshot();
    EXPECT_EQ(c.ops, 1u) << "rank " << r;
    EXPECT_EQ(c.d2hBytes, kBytes) << "rank " << r;
    EXPECT_EQ(c.h2dBytes, kBytes) << "rank " << r;
  }
}

// A body that fails after enqueuing its copy back: the end event is still
// recorded after that copy (so the memory may go once it completes), and the
// body's error is the one run() throws. An end event the host gives up on
// leaves ended() false: the caller keeps the memory (CudaContext::retire).
TEST(CudaSim, StagedExecutorFencesItsCopiesWhenTheOpFails) {
  StreamHolder comm;
  constexpr size_t kBytes = 1000;
  auto* buf = static_cast<uint8_t*>(dev().deviceAlloc(0, kBytes));
  auto* pinned = static_cast<uint8_t*>(dev().hostAlloc(kBytes));
  std::memset(buf, 1, kBytes);
  std::memset(pinned, 7, kBytes);
  StagedCounters counters;
  {
    StagedOp op(stagedEnv(0, comm.s, &counters));
    op.stageIn(pinned, buf, 0);  // an empty tensor: nothing to copy, nothing counted
    dev().setStreamDelay(comm.s, milliseconds(20));
    try {
      op.run(
          [&] {
            op.copyBack(buf, pinned, kBytes);
            throw std::runtime_error("boom");
          },
          hostWait);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "boom");
    }
    dev().setStreamDelay(comm.s, microseconds(0));
    EXPECT_TRUE(op.ended());
    EXPECT_TRUE(dev().eventQuery(op.endEvent().get()));
    EXPECT_EQ(buf[0], 7);  // the copy back ran before the end event
    EXPECT_EQ(buf[kBytes - 1], 7);
  }
  StagedCounts c = counters.snapshot();
  EXPECT_EQ(c.ops, 1u);
  EXPECT_EQ(c.d2hBytes, 0u);
  EXPECT_EQ(c.h2dBytes, kBytes);
  {
    StagedOp op(stagedEnv(0, comm.s, &counters));
    op.stageIn(pinned, buf, kBytes);
    Gate gate;
    gate.block(comm.s);
    int waits = 0;
    try {
      op.run([] {},
             [&](Event e) {
               if (++waits == 2) throw std::runtime_error("deadline");  // the end event's wait
               gate.open.set_value();
               hostWait(e);
             });
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "deadline");
    }
    EXPECT_FALSE(op.ended());
    dev().streamSynchronize(comm.s);
  }
  c = counters.snapshot();
  EXPECT_EQ(c.ops, 2u);
  EXPECT_EQ(c.d2hBytes, kBytes);
  EXPECT_EQ(c.h2dBytes, kBytes);
  dev().deviceFree(buf);
  dev().hostFree(pinned);
}

}  // namespace
}  // namespace cuda
}  // namespace braid
