// The executor choice (Note [Choosing a CUDA executor]) and how braid's
// dtypes and reduce ops map to NCCL's (Note [NCCL types and ops]).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "cuda/nccl/executor_choice.h"
#include "cuda/nccl/nccl_api.h"
#include "math/half.h"

namespace braid {
namespace cuda {
namespace {

CudaRankInfo info(const char* uuid, int nccl = 22809, const char* setting = "auto") {
  CudaRankInfo i;
  i.setting = setting;
  i.ncclVersion = nccl;
  i.uuid = uuid;
  return i;
}

std::string errorOf(const std::vector<CudaRankInfo>& ranks) {
  try {
    chooseCudaExecutor(ranks, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CudaExecutorChoice, DistinctGpusRunNccl) {
  auto c = chooseCudaExecutor({info("GPU-a"), info("GPU-b"), info("GPU-c")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kNccl);
  EXPECT_TRUE(contains(c.reason, "NCCL 2.28.9")) << c.reason;
  EXPECT_EQ(chooseCudaExecutor({info("GPU-a")}, 0).kind, CudaExecutorKind::kNccl);
}

TEST(CudaExecutorChoice, OneSharedGpuRunsSameGpuCollectives) {
  auto c = chooseCudaExecutor({info("GPU-a"), info("GPU-a"), info("GPU-a")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kSameGpu);
  EXPECT_TRUE(contains(c.reason, "all 3 ranks share GPU GPU-a")) << c.reason;
  EXPECT_EQ(chooseCudaExecutor({info("a", 0), info("a", 0)}, 0).kind, CudaExecutorKind::kSameGpu)
      << "needs no NCCL";
  EXPECT_EQ(chooseCudaExecutor({info("a", 22809, "staged"), info("a", 22809, "staged")}, 0).kind,
            CudaExecutorKind::kStaged);
  // same-gpu where the ranks do not share one GPU is an error, not a fallback.
  std::string e = errorOf({info("a", 22809, "same-gpu"), info("b", 22809, "same-gpu")});
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=same-gpu, but the ranks do not all share one GPU"))
      << e;
}

// Note [Thread ranks on one GPU] in executor_choice.h: ranks of one process
// cannot open each other's IPC handles.
TEST(CudaExecutorChoice, ThreadRanksOnOneGpuAreRefusedTheSameGpuCollectives) {
  auto ranks = [](const char* setting, int64_t p0, int64_t p1, int64_t p2) {
    std::vector<CudaRankInfo> v = {info("GPU-a", 22809, setting), info("GPU-a", 22809, setting),
                                   info("GPU-a", 22809, setting)};
    v[0].process = p0;
    v[1].process = p1;
    v[2].process = p2;
    return v;
  };
  std::string e = errorOf(ranks("same-gpu", 100, 200, 200));
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=same-gpu, but ranks 1 and 2 share GPU GPU-a and "
                          "are threads of one process (200), and CUDA IPC, which the same-GPU "
                          "collectives need, does not open a handle in the process that "
                          "exported it")) << e;
  auto c = chooseCudaExecutor(ranks("auto", 7, 100, 7), 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "ranks 0 and 2 share GPU GPU-a and are threads of one process "
                                 "(7)")) << c.reason;
  EXPECT_EQ(chooseCudaExecutor(ranks("auto", 1, 2, 3), 0).kind, CudaExecutorKind::kSameGpu);
  EXPECT_EQ(chooseCudaExecutor(ranks("auto", 0, 0, 0), 0).kind, CudaExecutorKind::kSameGpu)
      << "0: unknown";
  // One process, a GPU each: NCCL, which needs no IPC.
  std::vector<CudaRankInfo> own = {info("GPU-a"), info("GPU-b")};
  own[0].process = own[1].process = 9;
  EXPECT_EQ(chooseCudaExecutor(own, 0).kind, CudaExecutorKind::kNccl);
  // Hierarchical: two threads of one process on GPU-b.
  std::vector<CudaRankInfo> hier = {info("GPU-a", 22809, "hier"), info("GPU-a", 22809, "hier"),
                                    info("GPU-b", 22809, "hier"), info("GPU-b", 22809, "hier")};
  for (int r = 0; r < 4; ++r) hier[r].process = r == 3 ? 3 : r + 1;
  e = errorOf(hier);
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=hier, but ranks 2 and 3 share GPU GPU-b and are "
                          "threads of one process (3)")) << e;
}

TEST(CudaExecutorChoice, SharedGpuIsStaged) {
  auto c = chooseCudaExecutor({info("GPU-a"), info("GPU-b"), info("GPU-a")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "ranks 0 and 2 share GPU GPU-a")) << c.reason;
  EXPECT_TRUE(contains(c.reason, "Duplicate GPU detected")) << c.reason;
}

// Note [Hierarchical CUDA collectives]: several GPUs, each shared by the
// same number of ranks.
TEST(CudaExecutorChoice, EvenSharedGpusRunHierarchically) {
  auto c = chooseCudaExecutor({info("a"), info("a"), info("b"), info("b")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kHier);
  EXPECT_TRUE(contains(c.reason, "4 ranks on 2 GPUs, 2 per GPU")) << c.reason;
  EXPECT_TRUE(contains(c.reason, "NCCL 2.28.9 between the GPUs' leaders (ranks 0, 2)")) << c.reason;
  // Interleaved ranks and three GPUs: leaders are each GPU's lowest rank.
  c = chooseCudaExecutor({info("a"), info("b"), info("c"), info("a"), info("b"), info("c")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kHier);
  EXPECT_TRUE(contains(c.reason, "6 ranks on 3 GPUs, 2 per GPU")) << c.reason;
  EXPECT_TRUE(contains(c.reason, "(ranks 0, 1, 2)")) << c.reason;
  HierLayout l = hierLayoutOf({info("a"), info("b"), info("c"), info("a"), info("b"), info("c")});
  EXPECT_EQ(l.gpuOf, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(l.ranksOn, (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  // Only the leaders need NCCL.
  EXPECT_EQ(chooseCudaExecutor({info("a"), info("a", 0), info("b"), info("b", 0)}, 0).kind,
            CudaExecutorKind::kHier);
  // The other layouts keep their executors.
  EXPECT_EQ(chooseCudaExecutor({info("a"), info("a"), info("a"), info("a")}, 0).kind,
            CudaExecutorKind::kSameGpu);
  EXPECT_EQ(chooseCudaExecutor({info("a"), info("b"), info("c"), info("d")}, 0).kind,
            CudaExecutorKind::kNccl);
  EXPECT_EQ(chooseCudaExecutor({info("a", 22809, "staged"), info("a", 22809, "staged"),
                                info("b", 22809, "staged"), info("b", 22809, "staged")}, 0).kind,
            CudaExecutorKind::kStaged);
  EXPECT_EQ(chooseCudaExecutor({info("a", 22809, "hier"), info("a", 22809, "hier"),
                                info("b", 22809, "hier"), info("b", 22809, "hier")}, 0).kind,
            CudaExecutorKind::kHier);
  EXPECT_STREQ(toString(CudaExecutorKind::kHier), "hier");
}

TEST(CudaExecutorChoice, UnevenOrNcclLessLayoutsAreStagedWithTheReason) {
  auto c = chooseCudaExecutor({info("a"), info("a"), info("a"), info("b")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "ranks 0 and 1 share GPU a")) << c.reason;
  EXPECT_TRUE(contains(c.reason, "the same number of ranks on every GPU, and GPU a holds 3 (rank 0 "
                                 "first) where GPU b holds 1 (rank 3 first)")) << c.reason;
  // A leader without NCCL.
  c = chooseCudaExecutor({info("a"), info("a"), info("b", 0), info("b")}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "rank 2, the leader of GPU b, cannot load NCCL")) << c.reason;
  c = chooseCudaExecutor({info("a"), info("a"), info("b", 22703), info("b", 22703)}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "rank 0 NCCL 2.28.9, rank 2 NCCL 2.27.3")) << c.reason;
  // =hier where it cannot run is an error saying why.
  auto hier = [](const char* uuid) { return info(uuid, 22809, "hier"); };
  std::string e = errorOf({hier("a"), hier("a"), hier("a"), hier("b")});
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=hier, but the hierarchical executor needs the same "
                          "number of ranks on every GPU")) << e;
  e = errorOf({hier("a"), hier("b")});
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=hier, but every rank has its own GPU")) << e;
  e = errorOf({hier("a"), hier("a")});
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=hier, but all 2 ranks share GPU a")) << e;
}

TEST(CudaExecutorChoice, NoNcclOrMismatchedVersionsIsStaged) {
  auto c = chooseCudaExecutor({info("a"), info("b", 0)}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "rank 1 cannot load NCCL")) << c.reason;
  c = chooseCudaExecutor({info("a"), info("b", 22703)}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "NCCL 2.28.9 and rank 1 NCCL 2.27.3")) << c.reason;
}

TEST(CudaExecutorChoice, SettingOverrides) {
  EXPECT_EQ(chooseCudaExecutor({info("a", 22809, "staged"), info("b", 22809, "staged")}, 0).kind,
            CudaExecutorKind::kStaged);
  EXPECT_EQ(chooseCudaExecutor({info("a", 22809, "nccl"), info("b", 22809, "nccl")}, 0).kind,
            CudaExecutorKind::kNccl);
  // "nccl" where it cannot run is an error saying why, not a fallback.
  std::string e = errorOf({info("a", 22809, "nccl"), info("a", 22809, "nccl")});
  EXPECT_TRUE(contains(e, "init (rank 1)")) << e;
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=nccl, but ranks 0 and 1 share GPU a")) << e;
}

TEST(CudaExecutorChoice, RanksMustAgreeOnTheSetting) {
  std::string e = errorOf({info("a"), info("b", 22809, "staged")});
  EXPECT_TRUE(contains(e, "rank 0 runs with 'auto', rank 1 with 'staged'")) << e;
  e = errorOf({info("a", 22809, "fast")});
  EXPECT_TRUE(contains(e, "'fast', not one of auto, nccl, same-gpu, hier, staged")) << e;
}

TEST(CudaExecutorChoice, InfoRoundTripsThroughTheStore) {
  CudaRankInfo i = info("GPU-12;34", 22809, "nccl");  // a ';' in the uuid survives
  i.device = 3;
  i.cc = 75;
  i.kernels = "no kernel image; (209)";  // and in the kernels' report
  i.process = (int64_t{4242} << 16) + 3;  // a simulated process id is wider than a pid
  CudaRankInfo j = CudaRankInfo::decode(i.encode(), 3);
  EXPECT_EQ(j.process, (int64_t{4242} << 16) + 3);
  EXPECT_EQ(j.setting, "nccl");
  EXPECT_EQ(j.ncclVersion, 22809);
  EXPECT_EQ(j.uuid, "GPU-12;34");
  EXPECT_EQ(j.device, 3);
  EXPECT_EQ(j.cc, 75);
  EXPECT_EQ(j.kernels, "no kernel image; (209)");
  j = CudaRankInfo::decode(info("GPU-a").encode(), 0);
  EXPECT_EQ(j.uuid, "GPU-a");
  EXPECT_EQ(j.kernels, "");
  EXPECT_THROW(CudaRankInfo::decode("auto", 3), Error);
  EXPECT_THROW(CudaRankInfo::decode("auto;x;u", 3), Error);
  EXPECT_THROW(CudaRankInfo::decode("auto;22809;0;90;x;u", 3), Error);
  std::string e;
  try {
    CudaRankInfo::decode("auto;22809;0;90;4242;99;short", 3);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_TRUE(contains(e, "a kernel report of 99 bytes")) << e;
}

// Note [Kernel images]: the same-GPU and hierarchical executors launch
// braid's kernels, so a rank whose device cannot run them (or a build
// without them) makes the group stage, saying which device and why; NCCL
// needs none of them.
CudaRankInfo noKernels(const char* uuid, int device, int cc, const char* setting = "auto") {
  CudaRankInfo i = info(uuid, 22809, setting);
  i.device = device;
  i.cc = cc;
  i.kernels = "no kernel image is available for execution on the device (209 "
              "cudaErrorNoKernelImageForDevice)";
  return i;
}

TEST(CudaExecutorChoice, KernelsThatDoNotLoadOnARanksDeviceStage) {
  // One shared GPU, sm_75: staged (NCCL refuses the GPU twice).
  auto c = chooseCudaExecutor({noKernels("a", 0, 75), noKernels("a", 0, 75)}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "all 2 ranks share GPU a, but the same-GPU collectives cannot run "
                                 "there: braid's kernels do not load on device 0 (sm_75) of rank "
                                 "0: no kernel image is available for execution on the device"))
      << c.reason;
  // A build without kernels: every rank says so.
  CudaRankInfo bare = info("a");
  bare.cc = 90;
  bare.kernels = "this braid was built without nvcc, so it has no CUDA kernels";
  c = chooseCudaExecutor({bare, bare, bare}, 1);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "device 0 (sm_90) of rank 0: this braid was built without nvcc"))
      << c.reason;
  // Two GPUs, two ranks each, the second GPU sm_75: staged, naming it.
  c = chooseCudaExecutor({info("a"), info("a"), noKernels("b", 1, 75), noKernels("b", 1, 75)}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kStaged);
  EXPECT_TRUE(contains(c.reason, "ranks 0 and 1 share GPU a")) << c.reason;
  EXPECT_TRUE(contains(c.reason, "; and braid's kernels do not load on device 1 (sm_75) of rank 2: "
                                 "no kernel image")) << c.reason;
  // Every rank on its own GPU: NCCL, whatever braid's kernels do.
  c = chooseCudaExecutor({noKernels("a", 0, 75), noKernels("b", 1, 75)}, 0);
  EXPECT_EQ(c.kind, CudaExecutorKind::kNccl);
  // Asked for by name, an error saying why.
  std::string e = errorOf({noKernels("a", 0, 75, "same-gpu"), noKernels("a", 0, 75, "same-gpu")});
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=same-gpu, but braid's kernels do not load on device "
                          "0 (sm_75) of rank 0")) << e;
  CudaRankInfo hier = info("a", 22809, "hier");
  e = errorOf({hier, hier, noKernels("b", 1, 75, "hier"), noKernels("b", 1, 75, "hier")});
  EXPECT_TRUE(contains(e, "BRAID_CUDA_EXECUTOR=hier, but braid's kernels do not load on device 1 "
                          "(sm_75) of rank 2")) << e;
  // Where they load everywhere, nothing changes.
  CudaRankInfo ok = info("a");
  ok.cc = 86;
  EXPECT_EQ(chooseCudaExecutor({ok, ok}, 0).kind, CudaExecutorKind::kSameGpu);
}

TEST(CudaExecutorChoice, SettingFromTheEnvironment) {
  unsetenv("BRAID_CUDA_EXECUTOR");
  EXPECT_EQ(cudaExecutorSetting(0), "auto");
  setenv("BRAID_CUDA_EXECUTOR", "staged", 1);
  EXPECT_EQ(cudaExecutorSetting(0), "staged");
  setenv("BRAID_CUDA_EXECUTOR", "gpu", 1);
  EXPECT_THROW(cudaExecutorSetting(0), Error);
  unsetenv("BRAID_CUDA_EXECUTOR");
}

TEST(NcclTypes, MoveOpsTakeEveryDtype) {
  auto b = ncclBytesTypeFor(DataType::kInt16, 10);
  EXPECT_EQ(b.type, kNcclInt8);
  EXPECT_EQ(b.count, 20u);
  b = ncclBytesTypeFor(DataType::kBool, 10);
  EXPECT_EQ(b.type, kNcclUint8);
  EXPECT_EQ(b.count, 10u);
  EXPECT_EQ(ncclBytesTypeFor(DataType::kBFloat16, 3).type, kNcclBfloat16);
  EXPECT_EQ(ncclBytesTypeFor(DataType::kFloat16, 3).type, kNcclFloat16);
  EXPECT_EQ(ncclBytesTypeFor(DataType::kInt64, 3).type, kNcclInt64);
}

TEST(NcclTypes, Reductions) {
  auto r = ncclReductionFor(DataType::kFloat32, ReduceOp::kAvg, 5, "allreduce", 0);
  EXPECT_EQ(r.type, kNcclFloat32);
  EXPECT_EQ(r.op, kNcclAvg);
  EXPECT_FALSE(r.premulSum);
  r = ncclReductionFor(DataType::kBFloat16, ReduceOp::kPremulSum, 5, "allreduce", 0);
  EXPECT_TRUE(r.premulSum);
  r = ncclReductionFor(DataType::kBool, ReduceOp::kSum, 5, "allreduce", 0);
  EXPECT_EQ(r.type, kNcclUint8);
  EXPECT_EQ(r.op, kNcclMax);
  r = ncclReductionFor(DataType::kBool, ReduceOp::kBand, 5, "allreduce", 0);
  EXPECT_EQ(r.op, kNcclMin);
  EXPECT_EQ(ncclReductionFor(DataType::kInt64, ReduceOp::kAvg, 5, "x", 0).op, kNcclAvg);
  // What NCCL cannot run, for every dtype.
  int supported = 0;
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (int o = 0; o < kNumReduceOps; ++o) supported += ncclSupports(DataType(t), ReduceOp(o));
  }
  // floats: 6 ops each; 4 integer types: 5; bool: 6; int16: none
  EXPECT_EQ(supported, 4 * 6 + 4 * 5 + 6);
  try {
    ncclReductionFor(DataType::kInt16, ReduceOp::kMax, 5, "reduce_scatter", 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "braid reduce_scatter (rank 2): reduce op MAX on int16"))
        << e.what();
  }
}

TEST(NcclTypes, PremulScalars) {
  unsigned char buf[8];
  ncclScalarOf(DataType::kFloat16, 0.25, buf);
  uint16_t h;
  std::memcpy(&h, buf, 2);
  EXPECT_EQ(reduce::halfToFloat(h), 0.25f);
  ncclScalarOf(DataType::kBFloat16, 0.5, buf);
  std::memcpy(&h, buf, 2);
  EXPECT_EQ(reduce::bf16ToFloat(h), 0.5f);
  ncclScalarOf(DataType::kFloat64, 0.1, buf);
  double d;
  std::memcpy(&d, buf, 8);
  EXPECT_EQ(d, 0.1);
  EXPECT_THROW(ncclScalarOf(DataType::kInt32, 1.0, buf), Error);
}

TEST(NcclTypes, ResultNames) {
  EXPECT_STREQ(ncclResultName(kNcclRemoteError), "ncclRemoteError");
  EXPECT_STREQ(ncclResultName(kNcclInProgress), "ncclInProgress");
}

}  // namespace
}  // namespace cuda
}  // namespace braid
