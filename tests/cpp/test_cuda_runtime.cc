// cudaRuntime() on a real GPU: streams, events, copies in every direction,
// and every reduce kernel against the CPU's bits. Where no CUDA runtime or
// GPU loads, every test skips with the reason (or fails, when
// BRAID_EXPECT_GPU=1 says a GPU was expected: tools/gpu_check.sh sets it).
// CudaRuntimeFake.* run everywhere: cudaRuntimeOver a fake function table.
//
// CudaRuntimeErrors.FailedCallsNameTheCall makes CUDA calls fail on purpose;
// it skips itself under compute-sanitizer, which counts every failed call.
// A C++ program has no torch to load libcudart first: set
// BRAID_CUDART_LIBRARY to its path when it is not on the loader's path
// (a pip wheel keeps it in site-packages/nvidia/cu13/lib).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cudart.h"
#include "cuda/device_api.h"
#include "cuda/host_kernels.h"
#include "cuda/on_device.h"
#include "math/reduce.h"

namespace braid {
namespace cuda {
namespace {

DeviceApi* loadRuntime(std::string* why) {
  try {
    return &cudaRuntime();
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
}

// A host function in stream order, standing in for a user's kernel
// (cudaLaunchHostFunc; braid itself never launches one). It must not call CUDA.
void launchHostFunc(Stream s, std::function<void()> fn) {
  auto call = std::make_unique<std::function<void()>>(std::move(fn));
  BRAID_CUDART(rt::runtime().f.launchHostFunc(
                   s,
                   [](void* p) {
                     std::unique_ptr<std::function<void()>> f(
                         static_cast<std::function<void()>*>(p));
                     (*f)();
                   },
                   call.get()),
               "cudaLaunchHostFunc(stream=", s, ")");
  call.release();  // the host function deletes it
}

#define BRAID_NEED_GPU()                                                             \
  std::string why_;                                                                  \
  DeviceApi* api = loadRuntime(&why_);                                               \
  if (api == nullptr) {                                                              \
    const char* expect_ = std::getenv("BRAID_EXPECT_GPU");                           \
    if (expect_ != nullptr && std::string(expect_) == "1") FAIL() << why_;           \
    GTEST_SKIP() << "no CUDA runtime or GPU here: " << why_;                         \
  }                                                                                  \
  DeviceApi& d = *api;                                                               \
  d.setDevice(0)

constexpr DataType kAllTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                  DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                                  DataType::kInt16,    DataType::kInt32,   DataType::kInt64,
                                  DataType::kBool};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

// Random bytes for `type`: any bit pattern for integers and a quarter of the
// floats (NaN, inf, subnormals included), ordinary values for the rest.
std::vector<uint8_t> randomBytes(DataType type, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t size = elementSize(type);
  std::vector<uint8_t> bytes(count * size + 8);
  for (size_t i = 0; i < count; ++i) {
    uint64_t r = rng();
    if (isFloating(type) && rng() % 4 != 0) {
      const float v = static_cast<float>(static_cast<int64_t>(r % 4001) - 2000) / 64.f;
      if (type == DataType::kFloat64) {
        const double dv = v;
        std::memcpy(&r, &dv, 8);
      } else if (type == DataType::kFloat32) {
        std::memcpy(&r, &v, 4);
      } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        r = u >> 16;  // bf16 truncation; for fp16 just some bit pattern
      }
    }
    std::memcpy(bytes.data() + i * size, &r, size);
  }
  return bytes;
}

// The first element where `got` differs from `want`, or -1. A NaN matches
// any NaN: a GPU's arithmetic returns its canonical NaN where x86 passes an
// input's payload on (Note [NaN payloads] in kernels.cuh); everything else,
// the sign of zero included, must be the same bits.
long firstDifference(DataType t, const uint8_t* want, const uint8_t* got, size_t n) {
  const size_t size = elementSize(t);
  auto isNan = [t](const uint8_t* p) {
    uint64_t u = 0;
    std::memcpy(&u, p, elementSize(t));
    switch (t) {
      case DataType::kFloat32: return (u & 0x7fffffffu) > 0x7f800000u;
      case DataType::kFloat64: return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
      case DataType::kFloat16: return (u & 0x7fffu) > 0x7c00u;
      case DataType::kBFloat16: return (u & 0x7fffu) > 0x7f80u;
      default: return false;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* w = want + i * size;
    const uint8_t* g = got + i * size;
    if (std::memcmp(w, g, size) != 0 && !(isNan(w) && isNan(g))) return static_cast<long>(i);
  }
  return -1;
}

// compute-sanitizer reports every failed CUDA call, deliberate ones included.
bool underComputeSanitizer() {
  const char* nvtx = std::getenv("NVTX_INJECTION64_PATH");
  return std::getenv("NV_SANITIZER_INJECTION_PORT_BASE") != nullptr ||
         (nvtx != nullptr && std::string(nvtx).find("sanitizer") != std::string::npos);
}

TEST(CudaRuntime, Identity) {
  BRAID_NEED_GPU();
  EXPECT_FALSE(d.simulated());
  EXPECT_NE(d.name().find("cuda runtime"), std::string::npos) << d.name();
  std::printf("%s, %d device(s)\n", d.name().c_str(), d.deviceCount());
  ASSERT_GE(d.deviceCount(), 1);
  EXPECT_EQ(d.getDevice(), 0);
  const std::string uuid = d.deviceUuid(0);
  std::printf("device 0 uuid %s\n", uuid.c_str());
  ASSERT_EQ(uuid.size(), 32u);
  EXPECT_EQ(uuid.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(d.deviceUuid(0), uuid);
  for (int i = 1; i < d.deviceCount(); ++i) EXPECT_NE(d.deviceUuid(i), uuid);
}

// Note [Kernel images] in cuda/kernel_images.h: every device here runs the
// build's kernels (the GPU machine's are in the default list), and says so
// without a launch; a build without nvcc says why not.
TEST(CudaRuntime, KernelsLoadOnEveryDevice) {
  BRAID_NEED_GPU();
  for (int i = 0; i < d.deviceCount(); ++i) {
    const int cc = d.computeCapability(i);
    std::printf("device %d: sm_%d\n", i, cc);
    EXPECT_GE(cc, 30);
    const std::string why = d.kernelLoadError(i);
    if (haveKernels()) {
      EXPECT_EQ(why, "") << "device " << i << " (sm_" << cc << ")";
    } else {
      EXPECT_NE(why.find("built without nvcc"), std::string::npos) << why;
    }
    EXPECT_EQ(d.kernelLoadError(i), why);  // remembered
  }
  EXPECT_EQ(d.getDevice(), 0);  // asking about device 1 left the thread on 0
}

// Note [A current device per thread] in cuda/on_device.h: asking whether a
// device's primary context exists creates none, and OnDevice on a thread that
// set no device switches back only to a device that has a context. Runs
// before any case that uses a device other than 0 (ctest runs each case in a
// process of its own anyway).
TEST(CudaRuntime, PrimaryContextQueryCreatesNothing) {
  BRAID_NEED_GPU();
  EXPECT_TRUE(d.primaryContextActive(0));  // setDevice(0) made it
  for (int i = 1; i < d.deviceCount(); ++i) {
    EXPECT_FALSE(d.primaryContextActive(i)) << i;
    EXPECT_FALSE(d.primaryContextActive(i)) << i << ": the first query made a context";
  }
  if (d.deviceCount() < 2) return;
  std::thread([&] {
    {
      OnDevice on(d, 1);
      EXPECT_EQ(d.getDevice(), 1);
    }
    EXPECT_EQ(d.getDevice(), 0);  // device 0 has a context: back to it
  }).join();
  EXPECT_TRUE(d.primaryContextActive(1));
}

TEST(CudaRuntime, StreamsAndEvents) {
  BRAID_NEED_GPU();
  Stream s = d.streamCreate(0), t = d.streamCreate(0);
  Event e = d.eventCreate(0);
  EXPECT_TRUE(d.eventQuery(e));  // never recorded
  EXPECT_TRUE(d.streamQuery(s));
  // A host function holds s back; t waits on an event recorded behind it.
  std::atomic<int> step{0};
  launchHostFunc(s, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    step = 1;
  });
  d.eventRecord(e, s);
  d.streamWaitEvent(t, e);
  int seen = -1;
  launchHostFunc(t, [&] { seen = step.load(); });
  EXPECT_FALSE(d.streamQuery(s));
  EXPECT_FALSE(d.eventQuery(e));
  d.streamSynchronize(t);
  EXPECT_EQ(seen, 1);
  d.eventSynchronize(e);
  EXPECT_TRUE(d.eventQuery(e));
  d.eventDestroy(e);
  d.streamDestroy(s);
  d.streamDestroy(t);
}

// H2D, D2D, D2H, ordered across streams by an event; the producer is held
// back by a host function so that a missing wait would read old data.
TEST(CudaRuntime, CopiesInEveryDirection) {
  BRAID_NEED_GPU();
  const size_t bytes = (64 << 20) + 3;
  Stream producer = d.streamCreate(0), consumer = d.streamCreate(0);
  Event ready = d.eventCreate(0);
  auto* host = static_cast<uint8_t*>(d.hostAlloc(bytes));
  auto* back = static_cast<uint8_t*>(d.hostAlloc(bytes));
  void* d1 = d.deviceAlloc(0, bytes);
  void* d2 = d.deviceAlloc(0, bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  std::memset(back, 0, bytes);
  d.memcpyAsync(d2, back, bytes, consumer);  // d2 = zeros
  d.streamSynchronize(consumer);
  launchHostFunc(producer, [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  d.memcpyAsync(d1, host, bytes, producer);  // H2D
  d.eventRecord(ready, producer);
  d.streamWaitEvent(consumer, ready);
  d.memcpyAsync(d2, d1, bytes, consumer);    // D2D
  d.memcpyAsync(back, d2, bytes, consumer);  // D2H
  d.streamSynchronize(consumer);
  EXPECT_EQ(std::memcmp(host, back, bytes), 0);
  // Pageable host memory works too (cudaMemcpyDefault), on the null stream.
  std::vector<uint8_t> pageable(4096, 0);
  d.memcpyAsync(pageable.data(), d1, pageable.size(), nullptr);
  d.streamSynchronize(nullptr);
  EXPECT_EQ(std::memcmp(pageable.data(), host, pageable.size()), 0);
  d.hostFree(host);
  d.hostFree(back);
  d.deviceFree(d1);
  d.deviceFree(d2);
  d.eventDestroy(ready);
  d.streamDestroy(producer);
  d.streamDestroy(consumer);
}

// Every kernel against the CPU's bits (hostReduce, which test_cuda_kernels
// checks against reduce::reduceN), out of place and in place, over counts
// that cover a partial block and a capped, grid-strided grid.
TEST(CudaRuntime, ReduceKernelsMatchTheCpu) {
  BRAID_NEED_GPU();
  if (!haveKernels()) GTEST_SKIP() << "this build has no CUDA kernels (built without nvcc)";
  Stream s = d.streamCreate(0);
  const size_t counts[] = {1, 255, 1001, (size_t{3} << 20) + 5};
  const size_t maxBytes = counts[3] * 8;
  void* dDst = d.deviceAlloc(0, maxBytes);
  void* dSrc = d.deviceAlloc(0, maxBytes);
  auto* pinned = static_cast<uint8_t*>(d.hostAlloc(maxBytes));
  int checked = 0;
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kOps) {
      if (!reduce::supported(t, op)) continue;
      for (size_t n : counts) {
        const size_t bytes = n * elementSize(t);
        const auto a = randomBytes(t, n, n + 11 * static_cast<int>(t));
        const auto b = randomBytes(t, n, n + 13 * static_cast<int>(op) + 5);
        d.memcpyAsync(dDst, a.data(), bytes, s);
        d.memcpyAsync(dSrc, b.data(), bytes, s);
        d.reduceAsync(t, op, dDst, dSrc, n, s);
        d.memcpyAsync(pinned, dDst, bytes, s);
        d.streamSynchronize(s);
        std::vector<uint8_t> want = a;
        hostReduce(t, op, want.data(), b.data(), n);
        ASSERT_EQ(firstDifference(t, want.data(), pinned, n), -1)
            << toString(t) << " " << toString(op) << " n=" << n;

        d.reduceAsync(t, op, dSrc, dSrc, n, s);  // in place
        d.memcpyAsync(pinned, dSrc, bytes, s);
        d.streamSynchronize(s);
        want = b;
        hostReduce(t, op, want.data(), want.data(), n);
        ASSERT_EQ(firstDifference(t, want.data(), pinned, n), -1)
            << "in place " << toString(t) << " " << toString(op) << " n=" << n;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 58 * 4);
  // The null stream, and a count of 0 (launches nothing).
  d.reduceAsync(DataType::kInt32, ReduceOp::kSum, dDst, dSrc, 0, nullptr);
  d.reduceAsync(DataType::kInt32, ReduceOp::kSum, dDst, dSrc, 100, nullptr);
  d.streamSynchronize(nullptr);
  d.hostFree(pinned);
  d.deviceFree(dDst);
  d.deviceFree(dSrc);
  d.streamDestroy(s);
}

// Closed forms through the GPU: a = i % 11, b = 3 + i % 5, int32 and fp32.
TEST(CudaRuntime, ReduceClosedForms) {
  BRAID_NEED_GPU();
  if (!haveKernels()) GTEST_SKIP() << "this build has no CUDA kernels (built without nvcc)";
  const size_t n = 100003;
  std::vector<int32_t> a(n), b(n), out(n);
  std::vector<float> fa(n), fb(n), fout(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<int32_t>(i % 11);
    b[i] = static_cast<int32_t>(3 + i % 5);
    fa[i] = static_cast<float>(a[i]);
    fb[i] = static_cast<float>(b[i]);
  }
  void* da = d.deviceAlloc(0, n * 4);
  void* db = d.deviceAlloc(0, n * 4);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kBxor}) {
    d.memcpyAsync(da, a.data(), n * 4, nullptr);
    d.memcpyAsync(db, b.data(), n * 4, nullptr);
    d.reduceAsync(DataType::kInt32, op, da, db, n, nullptr);
    d.memcpyAsync(out.data(), da, n * 4, nullptr);
    const bool fl = op != ReduceOp::kBxor;
    if (fl) {
      d.memcpyAsync(da, fa.data(), n * 4, nullptr);
      d.memcpyAsync(db, fb.data(), n * 4, nullptr);
      d.reduceAsync(DataType::kFloat32, op, da, db, n, nullptr);
      d.memcpyAsync(fout.data(), da, n * 4, nullptr);
    }
    d.streamSynchronize(nullptr);
    for (size_t i = 0; i < n; ++i) {
      const int32_t x = a[i], y = b[i];
      const int32_t want = op == ReduceOp::kSum       ? x + y
                           : op == ReduceOp::kProduct ? x * y
                           : op == ReduceOp::kMin     ? std::min(x, y)
                           : op == ReduceOp::kMax     ? std::max(x, y)
                                                      : x ^ y;
      ASSERT_EQ(out[i], want) << toString(op) << " i=" << i;
      if (fl) {
        ASSERT_EQ(fout[i], static_cast<float>(want)) << toString(op) << " i=" << i;
      }
    }
  }
  d.deviceFree(da);
  d.deviceFree(db);
}

// A stream of device 1 used from a thread whose current device is 0: the
// launch goes to device 1 and the thread is back on device 0 afterwards.
TEST(CudaRuntime, SecondDevice) {
  BRAID_NEED_GPU();
  if (d.deviceCount() < 2) GTEST_SKIP() << "one GPU";
  if (!haveKernels()) GTEST_SKIP() << "this build has no CUDA kernels (built without nvcc)";
  Stream s1 = d.streamCreate(1);
  EXPECT_EQ(d.getDevice(), 0);
  int32_t host[4] = {1, 2, 3, 4};
  void* p = d.deviceAlloc(1, sizeof(host));
  EXPECT_EQ(d.getDevice(), 0);
  d.memcpyAsync(p, host, sizeof(host), s1);
  d.reduceAsync(DataType::kInt32, ReduceOp::kSum, p, p, 4, s1);
  d.memcpyAsync(host, p, sizeof(host), s1);
  d.streamSynchronize(s1);
  EXPECT_EQ(d.getDevice(), 0);
  EXPECT_EQ(host[3], 8);
  d.deviceFree(p);
  d.streamDestroy(s1);
}

TEST(CudaRuntime, ThreadsWithTheirOwnStreams) {
  BRAID_NEED_GPU();
  if (!haveKernels()) GTEST_SKIP() << "this build has no CUDA kernels (built without nvcc)";
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      d.setDevice(0);  // as a worker thread should (Note [The current device])
      Stream s = d.streamCreate(0);
      std::vector<int64_t> v(1 << 16, r), out(v.size());
      void* p = d.deviceAlloc(0, v.size() * 8);
      d.memcpyAsync(p, v.data(), v.size() * 8, s);
      for (int k = 0; k < 10; ++k) d.reduceAsync(DataType::kInt64, ReduceOp::kSum, p, p, v.size(), s);
      d.memcpyAsync(out.data(), p, v.size() * 8, s);
      d.streamSynchronize(s);
      for (int64_t x : out) failures += x != r * 1024;
      d.deviceFree(p);
      d.streamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// Calls that fail inside CUDA on purpose (see the header about the sanitizer).
TEST(CudaRuntimeErrors, FailedCallsNameTheCall) {
  BRAID_NEED_GPU();
  if (underComputeSanitizer()) GTEST_SKIP() << "under compute-sanitizer, which counts these errors";
  int local = 0;
  try {
    d.deviceFree(&local);
    FAIL() << "cudaFree of a stack address succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaFree"), std::string::npos) << e.what();
  }
  EXPECT_THROW(d.setDevice(d.deviceCount()), Error);
  EXPECT_THROW(d.streamCreate(d.deviceCount()), Error);
  EXPECT_EQ(d.getDevice(), 0);
  // The runtime still works after those.
  Stream s = d.streamCreate(0);
  d.streamSynchronize(s);
  d.streamDestroy(s);
}

// Here, without a GPU: the reason is a braid::Error that says what is missing.
TEST(CudaRuntimeErrors, NoRuntimeSaysWhy) {
  std::string why;
  if (loadRuntime(&why) != nullptr) GTEST_SKIP() << "a CUDA runtime and GPU are present";
  EXPECT_NE(why.find("braid"), std::string::npos) << why;
  std::string again;
  loadRuntime(&again);
  EXPECT_EQ(why, again);  // the same reason every time
  std::printf("cudaRuntime(): %s\n", why.c_str());
}

// ---- cudaRuntimeOver a fake table: no GPU needed ----
// A runtime before CUDA 12.8 has no cudaStreamGetDevice. The fake table
// models the current device per process (one test thread) and records the
// device current when braid loads or launches a kernel: that is the device
// the launch goes to (Note [A stream's device] in cuda/cuda_runtime.cc).
namespace fake {
int current = 0;
std::vector<int> switches;  // setDevice's arguments, in order
int launchedOn = -1;        // current device at cudaLaunchKernel or cudaLibraryLoadData
uintptr_t nextStream = 0x1000;
rt::Status getDevice(int* d) { *d = current; return rt::kSuccess; }
rt::Status setDevice(int d) {
  current = d;
  switches.push_back(d);
  return rt::kSuccess;
}
rt::Status getDeviceCount(int* n) { *n = 2; return rt::kSuccess; }
const char* errorString(rt::Status) { return "fake error"; }
const char* errorName(rt::Status) { return "cudaErrorFake"; }
rt::Status getLastError() { return rt::kSuccess; }
rt::Status streamCreate(rt::StreamT* s, unsigned) {
  *s = reinterpret_cast<rt::StreamT>(nextStream += 0x10);
  return rt::kSuccess;
}
rt::Status streamDestroy(rt::StreamT) { return rt::kSuccess; }
// Fails, so that braid's kernel cache keeps no fake library.
rt::Status libraryLoadData(rt::LibraryT*, const void*, void*, void**, unsigned, void*, void**,
                           unsigned) {
  launchedOn = current;
  return 999;
}
rt::Status libraryGetKernel(rt::KernelT*, rt::LibraryT, const char*) { return 999; }
rt::Status launchKernel(const void*, rt::Dim3, rt::Dim3, void**, size_t, rt::StreamT) {
  launchedOn = current;  // (when a real runtime in this process cached the kernels already)
  return rt::kSuccess;
}

rt::Runtime table() {
  rt::Runtime r;
  std::memset(&r.f, 0, sizeof(r.f));
  r.f.getDevice = getDevice;
  r.f.setDevice = setDevice;
  r.f.getDeviceCount = getDeviceCount;
  r.f.getErrorString = errorString;
  r.f.getErrorName = errorName;
  r.f.getLastError = getLastError;
  r.f.streamCreateWithFlags = streamCreate;
  r.f.streamDestroy = streamDestroy;
  r.f.libraryLoadData = libraryLoadData;
  r.f.libraryGetKernel = libraryGetKernel;
  r.f.launchKernel = launchKernel;
  r.f.streamGetDevice = nullptr;  // CUDA before 12.8
  r.soname = "fake";
  r.version = 12040;
  return r;
}
}  // namespace fake

// Launches `launch` with the thread on device 0 and returns the device its
// kernel went to (the one current at the launch); the thread is back on 0.
int launchDevice(DeviceApi& d, const std::function<void()>& launch) {
  d.setDevice(0);
  fake::switches.clear();
  fake::launchedOn = -1;
  try {
    launch();
  } catch (const Error&) {
    // The fake's library load fails after the switch (no kernel is cached).
  }
  EXPECT_EQ(fake::current, 0) << "the thread's own device afterwards";
  if (!haveKernels()) {
    // No kernels to load: the launch fails before the table sees it, after
    // the switch, so the switches tell the device.
    return fake::switches.empty() ? 0 : fake::switches.front();
  }
  return fake::launchedOn;
}

TEST(CudaRuntimeFake, WithoutStreamGetDeviceALaunchGoesToItsOwnStreamsDevice) {
  const rt::Runtime r = fake::table();
  std::unique_ptr<DeviceApi> d = cudaRuntimeOver(r);
  d->setDevice(0);
  Stream s1 = d->streamCreate(1);
  ASSERT_EQ(fake::current, 0);
  int32_t buf[4] = {};
  EXPECT_EQ(launchDevice(*d, [&] { d->reduceAsync(DataType::kInt32, ReduceOp::kSum, buf, buf, 4,
                                                  s1); }),
            1);
  const void* srcs[] = {buf};
  EXPECT_EQ(launchDevice(*d, [&] { d->reduceMultiAsync(DataType::kInt32, ReduceOp::kSum, buf,
                                                       srcs, 1, 1.0, 4, s1); }),
            1);
  d->streamDestroy(s1);
}

// A stream braid did not create (torch's): the caller names its device.
TEST(CudaRuntimeFake, WithoutStreamGetDeviceALaunchGoesToTheNamedDevice) {
  const rt::Runtime r = fake::table();
  std::unique_ptr<DeviceApi> d = cudaRuntimeOver(r);
  Stream torchs = reinterpret_cast<Stream>(uintptr_t{0xabc0});
  int32_t buf[4] = {};
  const void* srcs[] = {buf};
  EXPECT_EQ(launchDevice(*d, [&] { d->reduceMultiAsyncOn(1, DataType::kInt32, ReduceOp::kSum,
                                                         buf, srcs, 1, 1.0, 4, torchs); }),
            1);
  // The null stream is the current device's.
  EXPECT_EQ(launchDevice(*d, [&] { d->reduceAsync(DataType::kInt32, ReduceOp::kSum, buf, buf, 4,
                                                  nullptr); }),
            0);
}

// Note [Graph capture] in cuda/device_api.h: the capture calls go to
// cudaStreamIsCapturing and cudaThreadExchangeStreamCaptureMode with CUDA's
// values; a table without them answers "not capturing" and keeps the mode.
namespace fakecap {
rt::StreamT capturing = reinterpret_cast<rt::StreamT>(uintptr_t{0xca0});
int mode = 0;  // cudaStreamCaptureModeGlobal
rt::Status isCapturing(rt::StreamT s, int* status) {
  *status = s == capturing ? 1 : 0;  // cudaStreamCaptureStatusActive / None
  return rt::kSuccess;
}
rt::Status exchange(int* m) {
  std::swap(mode, *m);
  return rt::kSuccess;
}
}  // namespace fakecap

TEST(CudaRuntimeFake, CaptureCallsReachTheRuntime) {
  rt::Runtime r = fake::table();
  {
    std::unique_ptr<DeviceApi> d = cudaRuntimeOver(r);
    EXPECT_FALSE(d->streamIsCapturing(fakecap::capturing));
    EXPECT_EQ(d->exchangeCaptureMode(DeviceApi::CaptureMode::kRelaxed),
              DeviceApi::CaptureMode::kRelaxed);
  }
  r.f.streamIsCapturing = fakecap::isCapturing;
  r.f.threadExchangeStreamCaptureMode = fakecap::exchange;
  std::unique_ptr<DeviceApi> d = cudaRuntimeOver(r);
  EXPECT_TRUE(d->streamIsCapturing(fakecap::capturing));
  EXPECT_FALSE(d->streamIsCapturing(nullptr));
  {
    RelaxedCaptureMode relaxed(*d);
    EXPECT_EQ(fakecap::mode, 2);  // cudaStreamCaptureModeRelaxed
  }
  EXPECT_EQ(fakecap::mode, 0);  // back to global
}

}  // namespace
}  // namespace cuda
}  // namespace braid
