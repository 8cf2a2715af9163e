// braid's same-GPU collectives (Note [Same-GPU collectives] in
// cuda/same_gpu.h) under the NcclExecutor, on the simulated device: ranks as
// threads, all on device 0, the IPC handles opened for real (memfds through
// /proc, Note [Simulated IPC]). Every op and dtype against closed forms at 2
// to 4 ranks with ops split into chunks, the reduce ops (fp16/bf16 rounded
// once), PREMUL_SUM, ordering (a slow rank), the BRAID_CUDA_SAME_GPU_BYTES
// check, and a rank that never comes. Across processes:
// tests/python/test_cuda_sim_same_gpu.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cuda/same_gpu.h"
#include "nccl_sim_ranks.h"

namespace braid {
namespace cuda {
namespace {

using namespace testing;  // NOLINT
using braid::testing::MemoryStore;
using braid::testing::runRanks;

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

TEST_F(SameGpu, EveryOpAndDtype2Ranks) { checkAllOps(2); }
TEST_F(SameGpu, EveryOpAndDtype3Ranks) { checkAllOps(3); }
TEST_F(SameGpu, EveryOpAndDtype4Ranks) { checkAllOps(4); }

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

TEST_F(SameGpu, GatherScatterAllToAll2Ranks) { checkGatherScatterAllToAll(2); }
TEST_F(SameGpu, GatherScatterAllToAll3Ranks) { checkGatherScatterAllToAll(3); }
TEST_F(SameGpu, GatherScatterAllToAll4Ranks) { checkGatherScatterAllToAll(4); }
TEST_F(SameGpu, GatherScatterAllToAll5Ranks) { checkGatherScatterAllToAll(5); }

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
    NcclExecutor ex(sameGpuCollectives(dev()), dev(), store, options(rank, 2, 800));
    DeviceBuffer in(DataType::kFloat32, 64), out(DataType::kFloat32, 64);
    ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, 64, DataType::kFloat32))->wait();
    if (rank == 1) return;  // rank 0's second op meets nobody
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(ex.run(op(NcclOpKind::kAllreduce, in.p, out.p, 64, DataType::kFloat32))->wait(),
                 Error);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  });
}

}  // namespace
}  // namespace cuda
}  // namespace braid
