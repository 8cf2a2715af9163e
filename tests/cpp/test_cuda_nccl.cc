// NcclExecutor over the simulated NCCL on the simulated device (threads as
// ranks): every op and dtype against closed forms at 1-4 ranks, the reduce
// ops, stream ordering, failures (async errors, timeouts, abort), and the
// communicator's lifetime. The executor choice and the NCCL type mapping are
// in test_cuda_nccl_choice.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "nccl_sim_ranks.h"

namespace braid {
namespace cuda {
namespace {

using namespace testing;  // NOLINT
using braid::testing::MemoryStore;
using braid::testing::runRanks;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const DataType kAllTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                              DataType::kInt16,    DataType::kInt32,   DataType::kInt64,
                              DataType::kBool};

// Every data-moving op at `n` ranks for every dtype (reductions with SUM,
// except int16, which NCCL cannot reduce), on one executor per rank.
void checkAllOps(int n) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  const size_t count = 37;
  runRanks(n, [&](int rank) {
    const int device = rank % 4;
    NcclExecutor ex(sim, dev(), store, options(rank, n));
    for (DataType t : kAllTypes) {
      SCOPED_TRACE(strCat(n, " ranks, rank ", rank, ", ", toString(t)));
      DeviceBuffer in(t, count * n, device), out(t, count * n, device);
      auto run = [&](NcclOp o) {
        o.device = device;
        ex.run(o)->wait();
      };
      for (size_t i = 0; i < count * n; ++i) in.set(i, x(t, rank, i));
      const bool reducible = t != DataType::kInt16;
      if (reducible) {
        run(op(NcclOpKind::kAllreduce, in.p, out.p, count, t));
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), sumX(t, n, i)) << i;
        // reduce to the last rank; the others' outputs stay as they were
        for (size_t i = 0; i < count; ++i) out.set(i, 0);
        run(op(NcclOpKind::kReduce, in.p, out.p, count, t, ReduceOp::kSum, n - 1));
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out.get(i), rank == n - 1 ? sumX(t, n, i) : 0) << i;
        }
        // reduce_scatter: block b of rank r's input is x(r, b * count + i)
        run(op(NcclOpKind::kReduceScatter, in.p, out.p, count, t));
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), sumX(t, n, rank * count + i));
      } else {
        EXPECT_THROW(ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, count, t)), Error);
      }
      // broadcast from rank n / 2, in place
      for (size_t i = 0; i < count; ++i) out.set(i, x(t, rank, i));
      run(op(NcclOpKind::kBroadcast, nullptr, out.p, count, t, ReduceOp::kSum, n / 2));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), x(t, n / 2, i)) << i;
      run(op(NcclOpKind::kAllgather, in.p, out.p, count, t));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(r * count + i), x(t, r, i));
      }
      // a ring: send to the next rank, receive from the previous, one group
      NcclOp s = op(NcclOpKind::kSend, in.p, nullptr, count, t, ReduceOp::kSum, (rank + 1) % n);
      NcclOp v =
          op(NcclOpKind::kRecv, nullptr, out.p, count, t, ReduceOp::kSum, (rank + n - 1) % n);
      s.device = v.device = device;
      ex.runGroup({s, v})->wait();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), x(t, (rank + n - 1) % n, i));
    }
    EXPECT_EQ(ex.communicatorsCreated(), 1);
    ex.shutdown();
  });
  EXPECT_EQ(sim.commsCreated(), n);
  EXPECT_EQ(sim.commsLive(), 0);
}

TEST(CudaNccl, EveryOpAndDtype1Rank) { checkAllOps(1); }
TEST(CudaNccl, EveryOpAndDtype2Ranks) { checkAllOps(2); }
TEST(CudaNccl, EveryOpAndDtype3Ranks) { checkAllOps(3); }
TEST(CudaNccl, EveryOpAndDtype4Ranks) { checkAllOps(4); }

// Rank r's element i for the reduce-op tests: 1 or 2 (products stay small).
double y(int r, size_t i) { return 1 + (r + i) % 2; }

// v rounded to dtype t, as a double.
double inType(DataType t, double v) {
  uint64_t cell = 0;
  setValue(t, &cell, 0, v);
  return getValue(t, &cell, 0);
}

TEST(CudaNccl, ReduceOpsOfEveryDtype) {
  const int n = 3;
  const size_t count = 10;
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(n, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, n));
    for (DataType t : kAllTypes) {
      for (int k = 0; k < kNumReduceOps; ++k) {
        const ReduceOp r = static_cast<ReduceOp>(k);
        if (!ncclSupports(t, r)) continue;
        SCOPED_TRACE(strCat("rank ", rank, ", ", toString(t), " ", toString(r)));
        DeviceBuffer in(t, count), out(t, count);
        for (size_t i = 0; i < count; ++i)
          in.set(i, t == DataType::kBool ? y(rank, i) - 1 : y(rank, i));
        NcclOp o = op(NcclOpKind::kAllreduce, in.p, out.p, count, t, r);
        o.premulFactor = 0.5;
        ex.run(o)->wait();
        for (size_t i = 0; i < count; ++i) {
          double s = 0, p = 1, mn = 1e9, mx = -1e9;
          for (int q = 0; q < n; ++q) {
            double v = t == DataType::kBool ? y(q, i) - 1 : y(q, i);
            s += v, p *= v, mn = std::min(mn, v), mx = std::max(mx, v);
          }
          double want = s;
          if (t == DataType::kBool) {
            want =
                (r == ReduceOp::kProduct || r == ReduceOp::kMin || r == ReduceOp::kBand) ? mn : mx;
          } else if (r == ReduceOp::kProduct) {
            want = p;
          } else if (r == ReduceOp::kMin) {
            want = mn;
          } else if (r == ReduceOp::kMax) {
            want = mx;
          } else if (r == ReduceOp::kAvg) {
            want = isFloating(t) ? inType(t, s / n) : std::trunc(s / n);
          } else if (r == ReduceOp::kPremulSum) {
            want = s * 0.5;
          }
          // Inputs 1 and 2 at 3 ranks: sums, products, extremes and halves are exact in
          // every dtype; AVG is s / 3 rounded as the division rounds it (IEEE, in float32
          // then narrowed for 16-bit types), which inType repeats. Every value is exact.
          ASSERT_EQ(out.get(i), want) << i;
        }
      }
    }
  });
}

TEST(CudaNccl, UnsupportedPairsFailBeforeAnythingRuns) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  NcclExecutor ex(sim, dev(), store, options(0, 1));
  DeviceBuffer a(DataType::kInt32, 4), b(DataType::kInt32, 4);
  auto expectError = [&](DataType t, ReduceOp r, const char* text) {
    try {
      ex.run(op(NcclOpKind::kAllreduce, a.p, b.p, 1, t, r));
      FAIL() << "no error for " << toString(t) << " " << toString(r);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("allreduce (rank 0)"), std::string::npos) << e.what();
    }
  };
  expectError(DataType::kInt16, ReduceOp::kSum, "no int16");
  expectError(DataType::kInt32, ReduceOp::kBand, "no bitwise");
  expectError(DataType::kInt32, ReduceOp::kPremulSum, "float type");
  expectError(DataType::kBool, ReduceOp::kBxor, "or/and only");
  expectError(DataType::kBool, ReduceOp::kAvg, "or/and only");
  // Nothing was made for them, and the group still works.
  EXPECT_EQ(ex.communicatorsCreated(), 0);
  ex.run(op(NcclOpKind::kAllreduce, a.p, b.p, 4, DataType::kInt32))->wait();
  EXPECT_EQ(ex.communicatorsCreated(), 1);
}

// The comm stream must wait for the caller's event: the inputs are written
// by a slow "kernel" on the caller's stream. Without the wait the op reads
// zeros (this test fails when the executor's streamWaitEvent is removed).
TEST(CudaNccl, WaitsForTheCallersEvent) {
  const int n = 2;
  const size_t count = 64;
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(n, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, n));
    DeviceBuffer in(DataType::kFloat32, count, rank), out(DataType::kFloat32, count, rank);
    Stream caller = dev().streamCreate(rank);
    Event ready = dev().eventCreate(rank);
    for (int iter = 0; iter < 3; ++iter) {
      for (size_t i = 0; i < count; ++i) in.set(i, 0);
      dev().setStreamDelay(caller, std::chrono::microseconds(30000));
      void* p = in.p;
      const double v = rank + 1 + iter;
      dev().launchHostFunc(caller, [p, v, count] {
        for (size_t i = 0; i < count; ++i) setValue(DataType::kFloat32, p, i, v);
      });
      dev().setStreamDelay(caller, std::chrono::microseconds(0));
      dev().eventRecord(ready, caller);
      NcclOp o = op(NcclOpKind::kAllreduce, in.p, out.p, count, DataType::kFloat32);
      o.device = rank;
      o.ready = ready;
      auto w = ex.run(o);
      // The caller's stream reads the output after the end event, as the
      // backend's Work::synchronize orders it.
      dev().streamWaitEvent(caller, w->endEvent());
      std::atomic<double> seen{-1};
      void* q = out.p;
      dev().launchHostFunc(caller, [q, &seen] { seen = getValue(DataType::kFloat32, q, 7); });
      dev().streamSynchronize(caller);
      EXPECT_TRUE(w->done());
      EXPECT_EQ(seen.load(), 3 + 2 * iter) << "iteration " << iter;
    }
    dev().eventDestroy(ready);
    dev().streamDestroy(caller);
  });
}

// NCCL may answer kNcclInProgress and enqueue the kernel later: the end
// event must be recorded after it is enqueued, or wait() returns too early.
TEST(CudaNccl, EndEventFollowsAnEnqueueInProgress) {
  const int n = 2;
  SimulatedNccl sim(dev());
  sim.setInitDelay(milliseconds(20));
  sim.setEnqueueDelay(milliseconds(30));
  MemoryStore store;
  runRanks(n, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, n));
    DeviceBuffer buf(DataType::kInt64, 8);
    for (int iter = 0; iter < 3; ++iter) {
      for (size_t i = 0; i < 8; ++i) buf.set(i, rank + iter);
      ex.run(op(NcclOpKind::kAllreduce, buf.p, buf.p, 8, DataType::kInt64))->wait();
      for (size_t i = 0; i < 8; ++i) ASSERT_EQ(buf.get(i), 1 + 2 * iter);
    }
  });
}

TEST(CudaNccl, OneCommunicatorPerDevice) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  runRanks(2, [&](int rank) {
    NcclExecutor ex(sim, dev(), store, options(rank, 2));
    DeviceBuffer a(DataType::kFloat32, 4, 0), b(DataType::kFloat32, 4, 1);
    for (int i = 0; i < 5; ++i) {
      NcclOp o = op(NcclOpKind::kAllreduce, a.p, a.p, 4, DataType::kFloat32);
      ex.run(o)->wait();
    }
    EXPECT_EQ(ex.communicatorsCreated(), 1);
    EXPECT_NE(ex.commStream(0), nullptr);
    EXPECT_EQ(ex.commStream(1), nullptr);
    NcclOp o = op(NcclOpKind::kAllreduce, b.p, b.p, 4, DataType::kFloat32);
    o.device = 1;
    ex.run(o)->wait();
    EXPECT_EQ(ex.communicatorsCreated(), 2);
  });
  EXPECT_EQ(sim.commsCreated(), 4);
  EXPECT_EQ(sim.commsLive(), 0);  // the executors' destructors released them
}

}  // namespace
}  // namespace cuda
}  // namespace braid
