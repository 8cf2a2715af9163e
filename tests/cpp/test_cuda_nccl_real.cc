// The real NCCL (ncclLibrary(), dlopened) on the real CUDA runtime, one rank
// (one GPU): allreduce, broadcast and allgather of every dtype, through the
// stream dance the backend does (copy in on the caller's stream, event, op on
// the comm stream, caller waits on the end event, copy out). Skips, saying
// why, where there is no CUDA runtime, no GPU or no libnccl.so.2
// (BRAID_NCCL_LIBRARY names one that is not on the loader's path).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "common/error.h"
#include "cuda/device_api.h"
#include "cuda/nccl/nccl_api.h"
#include "cuda/nccl/nccl_executor.h"
#include "memory_store.h"
#include "nccl_sim_ranks.h"  // getValue/setValue

namespace braid {
namespace cuda {
namespace {

using braid::testing::MemoryStore;
using testing::getValue;
using testing::setValue;

// The NCCL library alone needs no GPU: it loads, resolves every symbol and
// reports its version, or says why not.
TEST(CudaNcclReal, LoadsOrSaysWhy) {
  try {
    NcclApi& nccl = ncclLibrary();
    std::printf("loaded %s\n", nccl.name().c_str());
    EXPECT_GE(nccl.version(), 21400);
    EXPECT_FALSE(nccl.simulated());
    EXPECT_STREQ(nccl.getErrorString(kNcclSuccess), "no error");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libnccl.so.2"), std::string::npos) << e.what();
    GTEST_SKIP() << e.what();
  }
}

struct Real {
  DeviceApi* dev = nullptr;
  NcclApi* nccl = nullptr;
  std::string why;
};

Real loadReal() {
  Real r;
  try {
    r.dev = &cudaRuntime();
    if (r.dev->deviceCount() < 1) r.why = "the CUDA runtime sees no GPU";
  } catch (const std::exception& e) {
    r.why = std::string("no CUDA runtime: ") + e.what();
    return r;
  }
  if (!r.why.empty()) return r;
  try {
    r.nccl = &ncclLibrary();
  } catch (const std::exception& e) {
    r.why = std::string("no NCCL: ") + e.what();
  }
  return r;
}

// One rank's op through the backend's stream dance; returns the output.
std::vector<double> runOne(DeviceApi& dev, NcclExecutor& ex, NcclOp o,
                           const std::vector<double>& in, size_t outCount) {
  const size_t es = elementSize(o.dtype);
  const size_t inBytes = in.size() * es, outBytes = outCount * es;
  void* hostIn = dev.hostAlloc(inBytes + 1);
  void* hostOut = dev.hostAlloc(outBytes + 1);
  void* dIn = dev.deviceAlloc(0, inBytes + 1);
  void* dOut = o.kind == NcclOpKind::kBroadcast ? dIn : dev.deviceAlloc(0, outBytes + 1);
  for (size_t i = 0; i < in.size(); ++i) setValue(o.dtype, hostIn, i, in[i]);
  Stream caller = dev.streamCreate(0);
  Event ready = dev.eventCreate(0);
  dev.memcpyAsync(dIn, hostIn, inBytes, caller);
  dev.eventRecord(ready, caller);
  o.in = dIn;
  o.out = dOut;
  o.ready = ready;
  auto w = ex.run(o);
  dev.streamWaitEvent(caller, w->endEvent());
  dev.memcpyAsync(hostOut, dOut, outBytes, caller);
  dev.streamSynchronize(caller);
  EXPECT_TRUE(w->done());
  std::vector<double> out(outCount);
  for (size_t i = 0; i < outCount; ++i) out[i] = getValue(o.dtype, hostOut, i);
  dev.eventDestroy(ready);
  dev.streamDestroy(caller);
  if (dOut != dIn) dev.deviceFree(dOut);
  dev.deviceFree(dIn);
  dev.hostFree(hostOut);
  dev.hostFree(hostIn);
  return out;
}

void checkWorld1(bool blocking) {
  Real r = loadReal();
  if (!r.why.empty()) GTEST_SKIP() << r.why;
  std::printf("%s, %s, %s communicator\n", r.dev->name().c_str(), r.nccl->name().c_str(),
              blocking ? "blocking" : "non-blocking");
  MemoryStore store;
  NcclExecutor::Options opt;
  opt.storePrefix = blocking ? "real/blocking/" : "real/nonblocking/";
  opt.timeout = std::chrono::milliseconds(120000);
  opt.blockingComm = blocking;
  NcclExecutor ex(*r.nccl, *r.dev, store, opt);
  auto t0 = std::chrono::steady_clock::now();
  {
    NcclOp first;
    first.count = 1;
    EXPECT_EQ(runOne(*r.dev, ex, first, {1.0}, 1), std::vector<double>{1.0});
  }
  std::printf(
      "the first op (making the communicator) took %.1f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  const size_t count = 1000;
  const DataType types[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                            DataType::kInt16,    DataType::kInt32,   DataType::kInt64,
                            DataType::kBool};
  for (DataType t : types) {
    SCOPED_TRACE(toString(t));
    std::vector<double> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = t == DataType::kBool ? i % 2 : double(i % 100);
    NcclOp o;
    o.dtype = t;
    o.count = count;
    o.kind = NcclOpKind::kAllreduce;
    if (ncclSupports(t, ReduceOp::kSum)) {
      EXPECT_EQ(runOne(*r.dev, ex, o, in, count), in);
    } else {
      EXPECT_THROW(runOne(*r.dev, ex, o, in, count), Error);
    }
    if (isFloating(t)) {
      o.redop = ReduceOp::kAvg;
      EXPECT_EQ(runOne(*r.dev, ex, o, in, count), in);
      o.redop = ReduceOp::kPremulSum;
      o.premulFactor = 0.5;
      std::vector<double> half(in);
      for (double& v : half) v *= 0.5;
      EXPECT_EQ(runOne(*r.dev, ex, o, in, count), half);
      o.redop = ReduceOp::kSum;
    }
    o.kind = NcclOpKind::kBroadcast;
    EXPECT_EQ(runOne(*r.dev, ex, o, in, count), in);
    o.kind = NcclOpKind::kAllgather;
    EXPECT_EQ(runOne(*r.dev, ex, o, in, count), in);
  }
  EXPECT_EQ(ex.communicatorsCreated(), 1);
  ex.shutdown();
}

// abort() on a live communicator (ncclCommAbort), then shutdown(): both
// return, and later ops fail at once.
TEST(CudaNcclReal, World1AbortThenShutdown) {
  Real r = loadReal();
  if (!r.why.empty()) GTEST_SKIP() << r.why;
  MemoryStore store;
  NcclExecutor::Options opt;
  opt.storePrefix = "real/abort/";
  NcclExecutor ex(*r.nccl, *r.dev, store, opt);
  NcclOp o;
  o.count = 256;
  EXPECT_EQ(runOne(*r.dev, ex, o, std::vector<double>(256, 2.0), 256),
            std::vector<double>(256, 2.0));
  using Ms = std::chrono::duration<double, std::milli>;
  auto t0 = std::chrono::steady_clock::now();
  ex.abort("the test aborts");
  auto t1 = std::chrono::steady_clock::now();
  o.count = 0;  // no buffers: only the group's state is checked
  EXPECT_THROW(ex.run(o), PeerLostError);
  ex.shutdown();
  std::printf("abort took %.1f ms, shutdown %.1f ms\n", Ms(t1 - t0).count(),
              Ms(std::chrono::steady_clock::now() - t1).count());
}

TEST(CudaNcclReal, World1NonBlocking) { checkWorld1(false); }
TEST(CudaNcclReal, World1Blocking) { checkWorld1(true); }

}  // namespace
}  // namespace cuda
}  // namespace braid
