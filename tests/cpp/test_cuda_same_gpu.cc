// braid's same-GPU collectives (Note [Same-GPU collectives] in
// cuda/shared_gpu/same_gpu.h) under the NcclExecutor, on the simulated device: ranks as
// threads, all on device 0, the IPC handles opened for real (memfds through
// /proc, Note [Simulated IPC]). Every op and dtype against closed forms at 2
// to 4 ranks with ops split into chunks, the reduce ops (fp16/bf16 rounded
// once), PREMUL_SUM, ordering (a slow rank), the BRAID_CUDA_SAME_GPU_BYTES
// check, and a rank that never comes. Small messages (Note [Same-GPU small
// messages]): every dtype and reduce op at 1 to 4 ranks around the
// threshold, one barrier each, the chunked path's bits, a slow rank, and the
// BRAID_CUDA_SAME_GPU_SMALL_BYTES check. Across processes:
// tests/python/test_cuda_sim_same_gpu.py.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cuda/host_kernels.h"
#include "cuda/shared_gpu/same_gpu.h"
#include "cuda/shared_gpu/same_gpu_comm.h"
#include "nccl_sim_ranks.h"
#include "sim/device/sim_device.h"
#include "timing.h"

namespace braid {
namespace cuda {
namespace {

using namespace testing;  // NOLINT
using braid::testing::MemoryStore;

// Runs fn(rank) on `size` threads, each counted as its own process by the
// simulated device's IPC rules (Note [Simulated IPC]: CUDA opens no handle in
// the process that exported it; sim::setThreadProcess).
void runRanks(int size, const std::function<void(int)>& fn) {
  braid::testing::runRanks(size, [&](int rank) {
    sim::setThreadProcess(rank + 1);
    fn(rank);
    sim::setThreadProcess(0);
  });
}

// A half of 4 KiB: a few hundred elements per chunk, so every op here runs
// in several chunks and alternates halves.
class SameGpu : public ::testing::Test {
 protected:
  void SetUp() override { setenv("BRAID_CUDA_SAME_GPU_BYTES", "8192", 1); }
  void TearDown() override { unsetenv("BRAID_CUDA_SAME_GPU_BYTES"); }
};

void checkAllOps(int n) {
  MemoryStore store;
  const size_t count = 1500;  // several chunks of every dtype
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                            DataType::kInt32, DataType::kInt64};
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    for (DataType t : types) {
      SCOPED_TRACE(strCat(n, " ranks, rank ", rank, ", ", toString(t)));
      DeviceBuffer in(t, count * n, 0), out(t, count * n, 0);
      auto run = [&](NcclOp o) { ex.run(o)->wait(); };
      for (size_t i = 0; i < count * n; ++i) in.set(i, x(t, rank, i));
      run(op(NcclOpKind::kAllreduce, in.p, out.p, count, t));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), sumX(t, n, i)) << i;
      for (size_t i = 0; i < count; ++i) out.set(i, 0);
      run(op(NcclOpKind::kReduce, in.p, out.p, count, t, ReduceOp::kSum, n - 1));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out.get(i), rank == n - 1 ? sumX(t, n, i) : 0) << i;
      }
      run(op(NcclOpKind::kReduceScatter, in.p, out.p, count, t));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), sumX(t, n, rank * count + i)) << i;
      for (size_t i = 0; i < count; ++i) out.set(i, x(t, rank, i));
      run(op(NcclOpKind::kBroadcast, nullptr, out.p, count, t, ReduceOp::kSum, n / 2));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), x(t, n / 2, i)) << i;
      run(op(NcclOpKind::kAllgather, in.p, out.p, count, t));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(r * count + i), x(t, r, i));
      }
      // in place: allreduce with in == out
      run(op(NcclOpKind::kAllreduce, in.p, in.p, count, t));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(in.get(i), sumX(t, n, i)) << i;
    }
    EXPECT_EQ(ex.communicatorsCreated(), 1);
    ex.shutdown();
  });
}

// The world sizes of a test that runs at several (its instantiation).
class SameGpuRanks : public SameGpu, public ::testing::WithParamInterface<int> {};
std::string ranksName(const ::testing::TestParamInfo<int>& p) { return strCat(p.param, "Ranks"); }

class SameGpuEveryOp : public SameGpuRanks {};
TEST_P(SameGpuEveryOp, EveryOpAndDtype) { checkAllOps(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Ranks, SameGpuEveryOp, ::testing::Values(2, 3, 4), ranksName);

// MAX, MIN, PROD, AVG and PREMUL_SUM at 3 ranks; fp16 sums accumulate in
// fp32 and round once: 2048 + 1 + 1 is 2050 so, where rounding after each
// add gives 2048 (2049 is not a float16).
TEST_F(SameGpu, ReduceOpsAndRoundingOnce) {
  MemoryStore store;
  const int n = 3;
  const size_t count = 700;
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    DeviceBuffer in(DataType::kFloat32, count), out(DataType::kFloat32, count);
    for (size_t i = 0; i < count; ++i) in.set(i, (rank + 1) * (1.0 + i % 5));
    auto expect = [&](ReduceOp o, double factor, auto f) {
      NcclOp p = op(NcclOpKind::kAllreduce, in.p, out.p, count, DataType::kFloat32, o);
      p.premulFactor = factor;
      ex.run(p)->wait();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_FLOAT_EQ(out.get(i), f(1.0 + i % 5)) << toString(o) << " element " << i;
      }
    };
    expect(ReduceOp::kMax, 1, [](double v) { return 3 * v; });
    expect(ReduceOp::kMin, 1, [](double v) { return v; });
    expect(ReduceOp::kProduct, 1, [](double v) { return 6 * v * v * v; });
    expect(ReduceOp::kAvg, 1, [](double v) { return 2 * v; });
    expect(ReduceOp::kPremulSum, 0.5, [](double v) { return 3 * v; });
    DeviceBuffer h(DataType::kFloat16, 4), ho(DataType::kFloat16, 4);
    for (size_t i = 0; i < 4; ++i) h.set(i, rank == 0 ? 2048 : 1);
    ex.run(op(NcclOpKind::kAllreduce, h.p, ho.p, 4, DataType::kFloat16))->wait();
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ho.get(i), 2050) << "rounded once";
    ex.shutdown();
  });
}

// A rank whose stream is slow: its peers' copies out must wait for its
// reduced slice (the barriers), or they read stale values.
TEST_F(SameGpu, PeersWaitForASlowRanksStream) {
  MemoryStore store;
  const int n = 2;
  const size_t count = 900;
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    DeviceBuffer in(DataType::kFloat32, count), out(DataType::kFloat32, count);
    for (size_t i = 0; i < count; ++i) in.set(i, 1);
    ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, count, DataType::kFloat32))->wait();
    if (rank == 1) dev().setStreamDelay(ex.commStream(0), std::chrono::milliseconds(20));
    for (size_t i = 0; i < count; ++i) in.set(i, rank + 2);
    ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, count, DataType::kFloat32))->wait();
    if (rank == 1) dev().setStreamDelay(ex.commStream(0), std::chrono::microseconds(0));
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), 5) << i;
    ex.shutdown();
  });
}

// gather, scatter and alltoall (Note [Same-GPU gather, scatter and alltoall]
// in same_gpu.cc). Element i of the block that rank `from` holds for rank
// `to`: distinct per (from, to, i) and exact in every dtype (the narrow ones
// wrap at 61, the wide ones do not wrap at all, so a block or chunk put at
// the wrong offset shows).
double blockValue(DataType t, int from, int to, size_t i) {
  if (elementSize(t) >= 4 && t != DataType::kFloat32) {
    return from * 1000000.0 + to * 100000.0 + static_cast<double>(i);
  }
  if (t == DataType::kFloat32) return from * 100000.0 + to * 10000.0 + static_cast<double>(i);
  return static_cast<double>((from * 31 + to * 7 + i) % 61);
}

// Counts: none, one, odd, and (for the largest) several chunks of a half
// at every dtype and group size here (4 KiB halves: 1024 float32, 512 per
// block at 2 ranks).
void checkGatherScatterAllToAll(int n) {
  MemoryStore store;
  const size_t counts[] = {0, 1, 7, 2501};
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                            DataType::kInt8, DataType::kInt64};
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    EXPECT_TRUE(ex.supports(NcclOpKind::kGather));
    EXPECT_TRUE(ex.supports(NcclOpKind::kScatter));
    EXPECT_TRUE(ex.supports(NcclOpKind::kAllToAll));
    for (DataType t : types) {
      for (size_t count : counts) {
        SCOPED_TRACE(strCat(n, " ranks, rank ", rank, ", ", toString(t), ", count ", count));
        auto run = [&](const NcclOp& o) { ex.run(o)->wait(); };
        // alltoall, then in place
        DeviceBuffer in(t, count * n), out(t, count * n);
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) in.set(q * count + i, blockValue(t, rank, q, i));
        }
        run(op(NcclOpKind::kAllToAll, in.p, out.p, count, t));
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out.get(q * count + i), blockValue(t, q, rank, i)) << "block " << q << " " << i;
          }
        }
        run(op(NcclOpKind::kAllToAll, in.p, in.p, count, t));
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(in.get(q * count + i), blockValue(t, q, rank, i)) << "in place, block " << q;
          }
        }
        for (int root : {0, n - 1}) {
          SCOPED_TRACE(strCat("root ", root));
          // gather: the root's outputs are separate buffers, as torch's list
          std::vector<std::unique_ptr<DeviceBuffer>> bufs;
          for (int q = 0; q < n; ++q) bufs.emplace_back(new DeviceBuffer(t, count));
          DeviceBuffer mine(t, count);
          for (size_t i = 0; i < count; ++i) mine.set(i, blockValue(t, rank, root, i));
          NcclOp g = op(NcclOpKind::kGather, mine.p, nullptr, count, t, ReduceOp::kSum, root);
          if (rank == root) {
            for (auto& b : bufs) g.outs.push_back(b->p);
          }
          run(g);
          if (rank == root) {
            for (int q = 0; q < n; ++q) {
              for (size_t i = 0; i < count; ++i) {
                ASSERT_EQ(bufs[q]->get(i), blockValue(t, q, root, i)) << "gathered " << q;
              }
            }
          }
          // scatter: rank q receives the root's buffer q
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < count; ++i) bufs[q]->set(i, blockValue(t, root, q, i));
          }
          for (size_t i = 0; i < count; ++i) mine.set(i, -1);
          NcclOp sc = op(NcclOpKind::kScatter, nullptr, mine.p, count, t, ReduceOp::kSum, root);
          if (rank == root) {
            for (auto& b : bufs) sc.ins.push_back(b->p);
          }
          run(sc);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(mine.get(i), blockValue(t, root, rank, i)) << "scattered " << i;
          }
        }
      }
    }
    EXPECT_EQ(ex.communicatorsCreated(), 1);
    ex.shutdown();
  });
}

class SameGpuRooted : public SameGpuRanks {};
TEST_P(SameGpuRooted, GatherScatterAllToAll) { checkGatherScatterAllToAll(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Ranks, SameGpuRooted, ::testing::Values(2, 3, 4, 5), ranksName);

// A slow stream on one rank: the peers' reads of its half (alltoall, a
// gather at it, a scatter from it) must wait for its copies in (the
// barriers), or they read stale values of the previous op.
TEST_F(SameGpu, GatherScatterAllToAllWaitForASlowRank) {
  MemoryStore store;
  const int n = 3;
  const size_t count = 900;  // several chunks
  const DataType t = DataType::kFloat32;
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    DeviceBuffer in(t, count * n), out(t, count * n);
    ex.run(op(NcclOpKind::kAllToAll, in.p, out.p, count, t))->wait();  // makes the comm
    for (int round = 0; round < 2; ++round) {
      if (rank == 1) dev().setStreamDelay(ex.commStream(0), std::chrono::milliseconds(5));
      for (size_t i = 0; i < count * n; ++i) in.set(i, blockValue(t, rank, round, i));
      ex.run(op(NcclOpKind::kAllToAll, in.p, out.p, count, t))->wait();
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out.get(q * count + i), blockValue(t, q, round, rank * count + i)) << i;
        }
      }
      NcclOp sc = op(NcclOpKind::kScatter, nullptr, out.p, count, t, ReduceOp::kSum, 1);
      if (rank == 1) {
        for (int q = 0; q < n; ++q) sc.ins.push_back(static_cast<char*>(in.p) + q * count * 4);
      }
      ex.run(sc)->wait();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out.get(i), blockValue(t, 1, round, rank * count + i)) << i;
      }
      NcclOp g = op(NcclOpKind::kGather, in.p, nullptr, count, t, ReduceOp::kSum, 0);
      if (rank == 0) {
        for (int q = 0; q < n; ++q) g.outs.push_back(static_cast<char*>(out.p) + q * count * 4);
      }
      ex.run(g)->wait();
      if (rank == 0) {
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out.get(q * count + i), blockValue(t, q, round, i)) << q << " " << i;
          }
        }
      }
      if (rank == 1) dev().setStreamDelay(ex.commStream(0), std::chrono::microseconds(0));
    }
    ex.shutdown();
  });
}

// NCCL (here the simulated one) has none of them: the executor says so, so
// that the backend takes the staged path, and refuses such an op before it
// enqueues anything or fails the group.
TEST_F(SameGpu, AnNcclApiWithoutThemRefusesThemClearly) {
  SimulatedNccl sim(dev());
  MemoryStore store;
  dev().setDevice(0);
  NcclExecutor ex(sim, dev(), store, options(0, 2));
  EXPECT_TRUE(ex.supports(NcclOpKind::kAllgather));
  for (NcclOpKind k : {NcclOpKind::kGather, NcclOpKind::kScatter, NcclOpKind::kAllToAll}) {
    EXPECT_FALSE(ex.supports(k)) << ncclOpName(k);
    DeviceBuffer a(DataType::kFloat32, 8), b(DataType::kFloat32, 8);
    NcclOp o = op(k, a.p, b.p, 4, DataType::kFloat32);
    o.outs = {b.p, b.p};
    o.ins = {a.p, a.p};
    try {
      ex.run(o);
      ADD_FAILURE() << ncclOpName(k) << " ran";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(ncclOpName(k)), std::string::npos) << m;
      EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
      EXPECT_NE(m.find("staged path"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(ex.opsIssued(), 0u);
  EXPECT_EQ(ex.communicatorsCreated(), 0);
  // NCCL averages integers; the same-GPU kernels divide floats only, so the
  // backend stages integer AVG there (NcclApi::reduces).
  EXPECT_TRUE(ex.supportsReduction(NcclOpKind::kAllreduce, DataType::kInt32, ReduceOp::kAvg));
  NcclExecutor same(sameGpuCollectives(dev()), dev(), store, options(0, 2));
  EXPECT_FALSE(same.supportsReduction(NcclOpKind::kAllreduce, DataType::kInt32, ReduceOp::kAvg));
  EXPECT_TRUE(same.supportsReduction(NcclOpKind::kAllreduce, DataType::kFloat16, ReduceOp::kAvg));
  EXPECT_TRUE(same.supportsReduction(NcclOpKind::kReduce, DataType::kInt32, ReduceOp::kMax));
}

// The buffer size chunks every op: ranks that disagree fail when the
// communicator is made, naming both values (here through the NcclApi, one
// thread making both ranks' communicators, each with its own setting).
TEST_F(SameGpu, RanksMustAgreeOnTheBufferSize) {
  NcclApi& api = sameGpuCollectives(dev());
  dev().setDevice(0);
  NcclUniqueId id;
  ASSERT_EQ(api.getUniqueId(&id), kNcclSuccess);
  NcclComm c0 = nullptr, c1 = nullptr;
  setenv("BRAID_CUDA_SAME_GPU_BYTES", "8192", 1);
  ASSERT_EQ(api.commInitRank(&c0, 2, id, 0, /*blocking=*/false), kNcclInProgress);
  setenv("BRAID_CUDA_SAME_GPU_BYTES", "16384", 1);
  ASSERT_EQ(api.commInitRank(&c1, 2, id, 1, /*blocking=*/false), kNcclInProgress);
  NcclResult e0 = kNcclSuccess, e1 = kNcclSuccess;
  api.commGetAsyncError(c0, &e0);
  api.commGetAsyncError(c1, &e1);
  EXPECT_EQ(e0, kNcclInvalidUsage);
  EXPECT_EQ(e1, kNcclInvalidUsage);
  EXPECT_NE(api.lastError(c0).find("rank 1 with 16384"), std::string::npos) << api.lastError(c0);
  EXPECT_NE(api.lastError(c1).find("rank 0 with 8192"), std::string::npos) << api.lastError(c1);
  api.commAbort(c0);
  api.commAbort(c1);
}

TEST_F(SameGpu, ARankThatNeverComesIsATimeoutNotAHang) {
  MemoryStore store;
  runRanks(2, [&](int rank) {
    dev().setDevice(0);
    const std::chrono::milliseconds timeout(800);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store,
                    options(rank, 2, int(timeout.count())));
    DeviceBuffer in(DataType::kFloat32, 64), out(DataType::kFloat32, 64);
    ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, 64, DataType::kFloat32))->wait();
    if (rank == 1) return;  // rank 0's second op meets nobody
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, 64, DataType::kFloat32))->wait(),
                 Error);
    // Note [Timing bounds in tests] in tests/cpp/timing.h
    EXPECT_TRUE(braid::testing::endedByTimeout(std::chrono::steady_clock::now() - start, timeout));
  });
}

// ---- Small messages (Note [Same-GPU small messages] in same_gpu.h) ----------

constexpr size_t kSmall = 256;  // BRAID_CUDA_SAME_GPU_SMALL_BYTES here; halves of 4 KiB

class SameGpuSmall : public SameGpu {
 protected:
  void SetUp() override {
    SameGpu::SetUp();
    setenv("BRAID_CUDA_SAME_GPU_SMALL_BYTES", "256", 1);
  }
  void TearDown() override {
    unsetenv("BRAID_CUDA_SAME_GPU_SMALL_BYTES");
    SameGpu::TearDown();
  }
};

// Rank r's element i: 1 or 2, so that sums, products (at most 2^4), minima
// and maxima over 4 ranks are exact in every dtype.
double smallX(int r, size_t i) { return 1 + static_cast<double>((r + i) % 2); }

// The kernel's bits for `o` over the n ranks' inputs in rank order (AVG and
// PREMUL_SUM as the same-GPU collectives compose them), on the host.
std::vector<uint8_t> kernelBits(DataType t, ReduceOp o, int n, size_t count, double premul) {
  const size_t es = elementSize(t);
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * es));
  std::vector<const void*> srcs;
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < count; ++i) setValue(t, in[q].data(), i, smallX(q, i));
    if (o == ReduceOp::kPremulSum) {
      const void* one[] = {in[q].data()};
      std::vector<uint8_t> scaled(count * es);
      hostReduceMulti(t, ReduceOp::kSum, scaled.data(), one, 1, 1.0 / premul, count);
      in[q] = scaled;
    }
    srcs.push_back(in[q].data());
  }
  std::vector<uint8_t> out(count * es);
  const ReduceOp k = o == ReduceOp::kAvg || o == ReduceOp::kPremulSum ? ReduceOp::kSum : o;
  hostReduceMulti(t, k, out.data(), srcs.data(), n, o == ReduceOp::kAvg ? n : 1.0, count);
  return out;
}

// Every dtype and reduce op at counts 0, 1, odd, and just below, at and
// just above the threshold (above: the chunked path, the same results),
// allreduce out of and in place, and reduce to the last rank.
void checkSmall(int n) {
  MemoryStore store;
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                            DataType::kInt32, DataType::kInt64};
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    for (DataType t : types) {
      const size_t at = kSmall / elementSize(t);
      std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                                   ReduceOp::kMax};
      if (isFloating(t)) {
        ops.push_back(ReduceOp::kAvg);
        ops.push_back(ReduceOp::kPremulSum);
      }
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, at - 1, at, at + 1}) {
        DeviceBuffer in(t, count), out(t, count);
        for (ReduceOp o : ops) {
          SCOPED_TRACE(strCat(n, " ranks, rank ", rank, ", ", toString(t), " ", toString(o),
                              ", count ", count));
          for (size_t i = 0; i < count; ++i) {
            in.set(i, smallX(rank, i));
            out.set(i, 0);
          }
          NcclOp p = op(NcclOpKind::kAllreduce, in.p, out.p, count, t, o);
          p.premulFactor = 0.5;
          ex.run(p)->wait();
          const std::vector<uint8_t> bits = kernelBits(t, o, n, count, 0.5);
          ASSERT_EQ(std::memcmp(out.p, bits.data(), bits.size()), 0) << "the kernel's bits";
          for (size_t i = 0; i < count; ++i) {
            double sum = 0, prod = 1, mn = 9, mx = 0;
            for (int q = 0; q < n; ++q) {
              sum += smallX(q, i);
              prod *= smallX(q, i);
              mn = std::min(mn, smallX(q, i));
              mx = std::max(mx, smallX(q, i));
            }
            const double want = o == ReduceOp::kSum       ? sum
                                : o == ReduceOp::kProduct ? prod
                                : o == ReduceOp::kMin     ? mn
                                : o == ReduceOp::kMax     ? mx
                                : o == ReduceOp::kAvg     ? sum / n
                                                          : 0.5 * sum;
            ASSERT_NEAR(out.get(i), want, want * std::ldexp(1.0, -8)) << i;  // bf16's u
            if (o != ReduceOp::kAvg) {
              ASSERT_EQ(out.get(i), want) << i;  // exact
            }
          }
        }
        // In place, then reduce to the last rank (the others' outputs untouched).
        for (size_t i = 0; i < count; ++i) in.set(i, smallX(rank, i));
        ex.run(op(NcclOpKind::kAllreduce, in.p, in.p, count, t))->wait();
        const std::vector<uint8_t> sum = kernelBits(t, ReduceOp::kSum, n, count, 1);
        ASSERT_EQ(std::memcmp(in.p, sum.data(), sum.size()), 0) << "in place, count " << count;
        for (size_t i = 0; i < count; ++i) {
          in.set(i, smallX(rank, i));
          out.set(i, 0);
        }
        ex.run(op(NcclOpKind::kReduce, in.p, out.p, count, t, ReduceOp::kSum, n - 1))->wait();
        if (rank == n - 1) {
          ASSERT_EQ(std::memcmp(out.p, sum.data(), sum.size()), 0) << "reduce, count " << count;
        } else {
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(i), 0) << "reduce, non-root " << i;
        }
      }
    }
    EXPECT_EQ(ex.communicatorsCreated(), 1);
    ex.shutdown();
  });
}

class SameGpuSmallRanks : public SameGpuSmall, public ::testing::WithParamInterface<int> {};
TEST_P(SameGpuSmallRanks, EveryDtypeAndOp) { checkSmall(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Ranks, SameGpuSmallRanks, ::testing::Values(1, 2, 3, 4), ranksName);

// Through the NcclApi, where the communicator's barrier count shows: one
// barrier for an allreduce or reduce at or below the threshold, two above
// it; the small path's fp16/bf16 bits equal the chunked path's (the same
// inputs, one element more to cross the threshold), with values that round.
TEST_F(SameGpuSmall, OneBarrierAndTheChunkedPathsBits) {
  NcclApi& api = sameGpuCollectives(dev());
  const int n = 3;
  NcclUniqueId id;
  dev().setDevice(0);
  ASSERT_EQ(api.getUniqueId(&id), kNcclSuccess);
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclComm comm = nullptr;
    ASSERT_EQ(api.commInitRank(&comm, n, id, rank, /*blocking=*/true), kNcclSuccess);
    auto& c = *static_cast<samegpu::Comm*>(comm);
    Stream s = dev().streamCreate(0);
    for (auto [t, nt] : {std::pair<DataType, NcclDataType>{DataType::kFloat16, kNcclFloat16},
                         {DataType::kBFloat16, kNcclBfloat16},
                         {DataType::kFloat32, kNcclFloat32}}) {
      SCOPED_TRACE(strCat("rank ", rank, ", ", toString(t)));
      const size_t at = kSmall / elementSize(t);
      DeviceBuffer in(t, at + 1), small(t, at + 1), chunked(t, at + 1);
      for (size_t i = 0; i <= at; ++i) in.set(i, 1.0 + ((rank * 37 + i * 11) % 97) / 97.0);
      uint64_t before = c.barriers();
      ASSERT_EQ(api.allReduce(in.p, small.p, at, nt, kNcclSum, comm, s), kNcclSuccess);
      EXPECT_EQ(c.barriers() - before, 1u) << "at the threshold";
      before = c.barriers();
      ASSERT_EQ(api.allReduce(in.p, chunked.p, at + 1, nt, kNcclSum, comm, s), kNcclSuccess);
      EXPECT_EQ(c.barriers() - before, 2u) << "above it";
      before = c.barriers();
      ASSERT_EQ(api.reduce(in.p, in.p, at, nt, kNcclSum, 0, comm, s), kNcclSuccess);
      EXPECT_EQ(c.barriers() - before, 1u) << "reduce at the threshold";
      dev().streamSynchronize(s);
      EXPECT_EQ(std::memcmp(small.p, chunked.p, at * elementSize(t)), 0) << "the same bits";
    }
    dev().streamDestroy(s);
    api.commDestroy(comm);
  });
}

// A slow rank's stream, many small allreduces enqueued back to back with
// fresh buffers each: the one barrier must order a rank's copy into a half
// after the slow peer's reads of it two ops earlier, and every peer's reads
// after the slow rank's copy in.
TEST_F(SameGpuSmall, OneBarrierStillOrdersASlowRank) {
  MemoryStore store;
  const int n = 3;
  const size_t count = 33;
  const int rounds = 6;
  runRanks(n, [&](int rank) {
    dev().setDevice(0);
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, n));
    std::vector<std::unique_ptr<DeviceBuffer>> ins, outs;
    std::vector<std::shared_ptr<NcclWork>> works;
    DeviceBuffer warm(DataType::kFloat32, count);
    ex.run(op(NcclOpKind::kAllreduce, warm.p, warm.p, count, DataType::kFloat32))->wait();
    if (rank == 1) dev().setStreamDelay(ex.commStream(0), std::chrono::milliseconds(2));
    for (int k = 0; k < rounds; ++k) {
      ins.emplace_back(new DeviceBuffer(DataType::kFloat32, count));
      outs.emplace_back(new DeviceBuffer(DataType::kFloat32, count));
      for (size_t i = 0; i < count; ++i) ins.back()->set(i, 100 * k + rank + i);
      works.push_back(ex.run(op(NcclOpKind::kAllreduce, ins.back()->p, outs.back()->p, count,
                                DataType::kFloat32)));
    }
    for (auto& w : works) w->wait();
    if (rank == 1) dev().setStreamDelay(ex.commStream(0), std::chrono::microseconds(0));
    for (int k = 0; k < rounds; ++k) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(outs[k]->get(i), n * (100.0 * k + i) + n * (n - 1) / 2) << k << " " << i;
      }
    }
    ex.shutdown();
  });
}

// The threshold picks one barrier or two: ranks that disagree fail when the
// communicator is made, naming both values.
TEST_F(SameGpu, RanksMustAgreeOnTheSmallMessageThreshold) {
  NcclApi& api = sameGpuCollectives(dev());
  dev().setDevice(0);
  NcclUniqueId id;
  ASSERT_EQ(api.getUniqueId(&id), kNcclSuccess);
  NcclComm c0 = nullptr, c1 = nullptr;
  setenv("BRAID_CUDA_SAME_GPU_SMALL_BYTES", "1024", 1);
  ASSERT_EQ(api.commInitRank(&c0, 2, id, 0, /*blocking=*/false), kNcclInProgress);
  setenv("BRAID_CUDA_SAME_GPU_SMALL_BYTES", "0", 1);
  ASSERT_EQ(api.commInitRank(&c1, 2, id, 1, /*blocking=*/false), kNcclInProgress);
  unsetenv("BRAID_CUDA_SAME_GPU_SMALL_BYTES");
  NcclResult e0 = kNcclSuccess, e1 = kNcclSuccess;
  api.commGetAsyncError(c0, &e0);
  api.commGetAsyncError(c1, &e1);
  EXPECT_EQ(e0, kNcclInvalidUsage);
  EXPECT_EQ(e1, kNcclInvalidUsage);
  for (NcclComm c : {c0, c1}) {
    const std::string m = api.lastError(c);
    EXPECT_NE(m.find("BRAID_CUDA_SAME_GPU_SMALL_BYTES"), std::string::npos) << m;
  }
  EXPECT_NE(api.lastError(c0).find("(0) runs with 1024, rank 1 with 0"), std::string::npos)
      << api.lastError(c0);
  EXPECT_NE(api.lastError(c1).find("(1) runs with 0, rank 0 with 1024"), std::string::npos)
      << api.lastError(c1);
  api.commAbort(c0);
  api.commAbort(c1);
}

// ---- Note [Simulated IPC]: IPC as CUDA has it. Each rule with a deliberately
// wrong use that must fail. One test thread plays two processes by switching
// its simulated process (sim::setThreadProcess).

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

struct AsProcess {
  explicit AsProcess(int id) { sim::setThreadProcess(id); }
  ~AsProcess() { sim::setThreadProcess(0); }
};

TEST(SimIpc, AHandleIsOnlyForAnAllocationsBase) {
  AsProcess p1(1);
  dev().setDevice(0);
  char* p = static_cast<char*>(dev().deviceAllocShareable(0, 4096));
  EXPECT_NO_THROW(dev().ipcMemHandle(p));
  const std::string e = errorOf([&] { dev().ipcMemHandle(p + 256); });
  EXPECT_NE(e.find("256 bytes into the allocation at"), std::string::npos) << e;
  EXPECT_NE(e.find("a handle is only for an allocation's base"), std::string::npos) << e;
  dev().deviceFree(p);
}

TEST(SimIpc, AHandleDoesNotOpenInTheProcessThatExportedIt) {
  AsProcess p1(1);
  dev().setDevice(0);
  void* p = dev().deviceAllocShareable(0, 4096);
  Event ev = dev().eventCreateShareable(0);
  const std::string mem = dev().ipcMemHandle(p), evh = dev().ipcEventHandle(ev);
  std::string e = errorOf([&] { dev().ipcOpenMem(mem); });
  EXPECT_NE(e.find("ipcOpenMem: the handle was exported by this process"), std::string::npos)
      << e;
  e = errorOf([&] { dev().ipcOpenEvent(evh); });
  EXPECT_NE(e.find("ipcOpenEvent: the handle was exported by this process"), std::string::npos)
      << e;
  sim::setThreadProcess(2);  // another process opens both
  void* q = dev().ipcOpenMem(mem);
  Event opened = dev().ipcOpenEvent(evh);
  dev().ipcCloseMem(q);
  dev().eventDestroy(opened);
  sim::setThreadProcess(1);
  dev().eventDestroy(ev);
  dev().deviceFree(p);
}

TEST(SimIpc, AHandleOpensOncePerProcess) {
  AsProcess p1(1);
  dev().setDevice(0);
  void* p = dev().deviceAllocShareable(0, 4096);
  const std::string mem = dev().ipcMemHandle(p);
  sim::setThreadProcess(2);
  void* q = dev().ipcOpenMem(mem);
  const std::string e = errorOf([&] { dev().ipcOpenMem(mem); });
  EXPECT_NE(e.find("ipcOpenMem: the handle is already open in this process"), std::string::npos)
      << e;
  dev().ipcCloseMem(q);
  void* again = dev().ipcOpenMem(mem);  // closed, it opens again
  dev().ipcCloseMem(again);
  sim::setThreadProcess(1);
  dev().deviceFree(p);
}

// A stream that waits on an opened event whose record has not run waits on,
// though the waiter destroys its handle: what an abort cannot undo on a GPU.
TEST(SimIpc, DestroyingAnOpenedEventDoesNotEndAWaitOnIt) {
  AsProcess p1(1);
  dev().setDevice(0);
  Stream a = dev().streamCreate(0);
  Event ev = dev().eventCreateShareable(0);
  std::atomic<bool> gate{false};
  dev().launchHostFunc(a, [&] {
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  dev().eventRecord(ev, a);
  const std::string h = dev().ipcEventHandle(ev);
  sim::setThreadProcess(2);
  Stream b = dev().streamCreate(0);
  Event opened = dev().ipcOpenEvent(h);
  dev().streamWaitEvent(b, opened);
  dev().eventDestroy(opened);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(dev().streamQuery(b)) << "destroying the opened event ended the wait on it";
  gate = true;  // the record runs: the wait ends
  dev().streamSynchronize(b);
  EXPECT_TRUE(dev().streamQuery(b));
  dev().streamDestroy(b);
  sim::setThreadProcess(1);
  dev().streamSynchronize(a);
  dev().eventDestroy(ev);
  dev().streamDestroy(a);
}

// Memory its exporter freed while mapped here: the next copy that touches it
// is an illegal address, and the stream stays failed.
TEST(SimIpc, MemoryFreedByItsExporterWhileMappedIsAnIllegalAddress) {
  AsProcess p1(1);
  dev().setDevice(0);
  void* p = dev().deviceAllocShareable(0, 4096);
  const std::string mem = dev().ipcMemHandle(p);
  sim::setThreadProcess(2);
  Stream b = dev().streamCreate(0);
  void* q = dev().ipcOpenMem(mem);
  void* local = dev().deviceAlloc(0, 4096);
  dev().memcpyAsync(local, q, 4096, b);
  EXPECT_NO_THROW(dev().streamSynchronize(b));
  sim::setThreadProcess(1);
  dev().deviceFree(p);  // wrong: process 2 still maps it
  sim::setThreadProcess(2);
  dev().memcpyAsync(local, q, 4096, b);
  std::string e = errorOf([&] { dev().streamSynchronize(b); });
  EXPECT_NE(e.find("an illegal memory access was encountered (cudaErrorIllegalAddress): IPC "
                   "memory at"), std::string::npos) << e;
  EXPECT_NE(e.find("was freed by its exporter (pid " + std::to_string(getpid()) +
                   ") while mapped here"), std::string::npos) << e;
  dev().memcpyAsync(local, static_cast<char*>(local) + 2048, 1024, b);  // sticky
  e = errorOf([&] { dev().streamSynchronize(b); });
  EXPECT_NE(e.find("cudaErrorIllegalAddress"), std::string::npos) << e;
  dev().ipcCloseMem(q);
  dev().deviceFree(local);
  dev().streamDestroy(b);
}

// Note [Exported buffers outlive their mappings]: a rank that aborts while a
// peer still maps its buffer keeps it, so the peer's copies out of it (still
// enqueued in a real abort) do not touch freed memory, which the simulated
// device makes an illegal address (Note [Simulated IPC]).
TEST(SameGpuAbort, AnAbortingRankKeepsTheBufferAPeerMaps) {
  setenv("BRAID_CUDA_SAME_GPU_BYTES", "8192", 1);
  NcclApi& api = sameGpuCollectives(dev());
  AsProcess p1(1);
  dev().setDevice(0);
  NcclUniqueId id;
  ASSERT_EQ(api.getUniqueId(&id), kNcclSuccess);
  NcclComm c0 = nullptr, c1 = nullptr;
  ASSERT_EQ(api.commInitRank(&c0, 2, id, 0, /*blocking=*/false), kNcclInProgress);
  sim::setThreadProcess(2);
  ASSERT_EQ(api.commInitRank(&c1, 2, id, 1, /*blocking=*/false), kNcclInProgress);
  NcclResult e = kNcclInProgress;
  ASSERT_EQ(api.commGetAsyncError(c1, &e), kNcclSuccess);
  ASSERT_EQ(e, kNcclSuccess) << api.lastError(c1);  // rank 1 maps rank 0's buffer
  sim::setThreadProcess(1);
  ASSERT_EQ(api.commGetAsyncError(c0, &e), kNcclSuccess);
  ASSERT_EQ(e, kNcclSuccess) << api.lastError(c0);
  api.commAbort(c0);
  sim::setThreadProcess(2);
  auto* comm1 = static_cast<samegpu::Comm*>(c1);
  Stream s = dev().streamCreate(0);
  void* local = dev().deviceAlloc(0, 4096);
  dev().memcpyAsync(local, comm1->half(0), 4096, s);
  const std::string err = errorOf([&] { dev().streamSynchronize(s); });
  EXPECT_EQ(err, "no error") << "rank 1 read rank 0's buffer after rank 0 aborted";
  dev().deviceFree(local);
  dev().streamDestroy(s);
  api.commDestroy(c1);
  unsetenv("BRAID_CUDA_SAME_GPU_BYTES");
}

}  // namespace
}  // namespace cuda
}  // namespace braid
