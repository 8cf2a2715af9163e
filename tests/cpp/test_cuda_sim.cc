// The simulated device (tests/sim/device/sim_device.cc): CUDA's ordering rules on
// the CPU, which the CUDA executors' tests rely on to fail where a GPU would.
// Shared state between host functions and the test thread is atomic or
// ordered by the device's own synchronization, so that the suite is TSan-clean.
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
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

// Threads as ranks, each with its own streams, running the staged executor's
// steps: the caller's stream produces, the comm stream waits on its event,
// copies to pinned memory, the ranks sum on the CPU, the result is copied
// back and the caller's stream waits on the end event before reading it.
TEST(CudaSim, StagedPatternWithThreadsAsRanks) {
  static constexpr int kRanks = 4;
  static constexpr size_t kN = 4096;
  std::vector<std::vector<float>> staged(kRanks, std::vector<float>(kN));
  std::promise<void> allStaged[kRanks];
  std::shared_future<void> staged_f[kRanks];
  for (int r = 0; r < kRanks; ++r) staged_f[r] = allStaged[r].get_future().share();
  std::vector<std::thread> ranks;
  std::atomic<int> failures{0};
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      SimulatedDevice& d = dev();
      d.setDevice(r % 2);
      Stream caller = d.streamCreate(r % 2), comm = d.streamCreate(r % 2);
      Event start = d.eventCreate(r % 2), end = d.eventCreate(r % 2);
      auto* buf = static_cast<float*>(d.deviceAlloc(r % 2, kN * sizeof(float)));
      auto* pinned = static_cast<float*>(d.hostAlloc(kN * sizeof(float)));
      d.setStreamDelay(caller, milliseconds(10));
      d.launchHostFunc(caller, [buf, r] {
        for (size_t i = 0; i < kN; ++i) buf[i] = static_cast<float>(r + i);
      });
      d.eventRecord(start, caller);
      d.streamWaitEvent(comm, start);
      d.memcpyAsync(pinned, buf, kN * sizeof(float), comm);
      d.streamSynchronize(comm);
      std::memcpy(staged[r].data(), pinned, kN * sizeof(float));
      allStaged[r].set_value();
      for (auto& f : staged_f) f.wait();
      for (size_t i = 0; i < kN; ++i) {
        float sum = 0;
        for (int q = 0; q < kRanks; ++q) sum += staged[q][i];
        pinned[i] = sum;
      }
      d.memcpyAsync(buf, pinned, kN * sizeof(float), comm);
      d.eventRecord(end, comm);
      d.streamWaitEvent(caller, end);
      std::vector<float> result(kN);
      d.memcpyAsync(result.data(), buf, kN * sizeof(float), caller);
      d.streamSynchronize(caller);
      for (size_t i = 0; i < kN; ++i) {
        if (result[i] != static_cast<float>(kRanks * i + kRanks * (kRanks - 1) / 2)) ++failures;
      }
      d.hostFree(pinned);
      d.deviceFree(buf);
      d.eventDestroy(start);
      d.eventDestroy(end);
      d.streamDestroy(caller);
      d.streamDestroy(comm);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace cuda
}  // namespace braid
