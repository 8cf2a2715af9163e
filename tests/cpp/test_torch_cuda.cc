// The backend's CUDA path on the simulated device (Note [Simulated CUDA in
// tests] in tests/sim/torch/sim_cuda.h), ranks as threads over a HashStore: both
// executors, chosen per group (Note [Choosing a CUDA executor]), with the
// simulated NCCL (tests/sim/nccl/nccl_sim.h) standing in for NCCL. Rank r uses
// simulated device r, so NCCL can serve the group. Each test checks what the
// executors counted (Note [Counting what an executor moved] in cuda/staged.h)
// against what its ops imply, so that an op that takes another path fails.
#include <gtest/gtest.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "c10d/compat.h"
#include "c10d/cuda/cuda_context.h"
#include "c10d/process_group.h"
#include "cuda/teardown.h"
#include "sim/torch/sim_cuda.h"
#include "sim/device/faulty_device.h"
#include "sim/nccl/nccl_sim.h"
#include "reducer/ddp.h"
#include "timing.h"
#include "torch_group.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

namespace {

using PG = braid_test::PG;
constexpr std::chrono::milliseconds kTimeout{20000};  // every group's
constexpr int kDevices = 4;

// What a test expects the group's CUDA executors to count: the staged
// executor's ops and bytes each way, the NCCL executor's ops and bytes.
struct Counts {
  uint64_t stagedOps = 0, d2h = 0, h2d = 0, ncclOps = 0, ncclBytes = 0;
  // One op whose inputs are `in` bytes and outputs `out` bytes on this rank,
  // staged or on NCCL (there its larger buffer counts).
  void op(bool nccl, uint64_t in, uint64_t out) {
    if (nccl) {
      ++ncclOps;
      ncclBytes += std::max(in, out);
    } else {
      ++stagedOps;
      d2h += in;
      h2d += out;
    }
  }
};

braid::CudaExecutorStats statsOf(braid::ProcessGroupBraid& pg) {
  auto ctx = pg.cudaContext();
  return ctx ? ctx->stats() : braid::CudaExecutorStats();
}

// The executor is `executor` and the counts moved by exactly `want` since
// `before`.
void expectCounts(braid::ProcessGroupBraid& pg, const braid::CudaExecutorStats& before,
                  const Counts& want, const std::string& executor, const std::string& what) {
  const braid::CudaExecutorStats now = statsOf(pg);
  const std::string who = what + " (rank " + std::to_string(pg.getRank()) + ")";
  EXPECT_EQ(now.executor, executor) << who;
  EXPECT_EQ(now.staged.ops - before.staged.ops, want.stagedOps) << who << ": staged ops";
  EXPECT_EQ(now.staged.d2hBytes - before.staged.d2hBytes, want.d2h) << who << ": staged d2h bytes";
  EXPECT_EQ(now.staged.h2dBytes - before.staged.h2dBytes, want.h2d) << who << ": staged h2d bytes";
  EXPECT_EQ(now.ncclOps - before.ncclOps, want.ncclOps) << who << ": NCCL executor ops";
  EXPECT_EQ(now.ncclBytes - before.ncclBytes, want.ncclBytes) << who << ": NCCL executor bytes";
}

// Every task of the group's comm streams from now on first sleeps `d`.
void delayCommStreams(braid::ProcessGroupBraid& pg, std::chrono::microseconds d) {
  for (braid::cuda::Stream s : pg.cudaContext()->commStreams())
    braid::sim::device().setStreamDelay(s, d);
}

class CudaBackend : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() {
    braid::sim::install(kDevices, &braid::setDeviceApiForTesting);
    static braid::cuda::SimulatedNccl nccl(braid::sim::device());
    braid::setNcclApiForTesting(&nccl);
  }
  void SetUp() override { setenv("BRAID_CUDA_EXECUTOR", GetParam(), 1); }
  void TearDown() override { unsetenv("BRAID_CUDA_EXECUTOR"); }

  static std::vector<PG> makeGroup(int n) { return braid_test::makeGroup(n, kTimeout); }
  template <typename F>
  static void onRanks(int n, F fn) {
    braid_test::onRanks(n, [&](int r) {
      // Each rank's thread works on its own device, as a process would.
      c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA)
          .setDevice(c10::Device(c10::DeviceType::CUDA, r));
      fn(r);
    });
  }
  static at::Tensor onDevice(const at::Tensor& host, int device) {
    at::Tensor t = braid::sim::empty(host.sizes(), host.scalar_type(), device);
    braid::sim::write(t, host);
    return t;
  }
};

TEST_P(CudaBackend, CollectivesMatchClosedForms) {
  const int n = 3;
  auto pgs = makeGroup(n);
  const bool nccl = std::string(GetParam()) == "nccl";
  onRanks(n, [&](int r) {
    const int64_t count = 1000;
    const braid::CudaExecutorStats before = statsOf(*pgs[r]);
    Counts want;
    want.op(nccl, 4 * count, 4 * count);  // allreduce SUM of floats
    want.op(false, 8 * count, 8 * count);  // BOR: NCCL lacks it, staged in any group
    want.op(nccl, 4 * count, 4 * count);  // broadcast (every rank stages in and copies back)
    want.op(nccl, 8 * count, 8 * n * count);  // allgather of doubles
    want.op(nccl, 8 * n * count, 8 * count);  // reduce_scatter of doubles
    // allreduce SUM, then a bitwise op NCCL lacks (the staged path in an NCCL group)
    std::vector<at::Tensor> t{onDevice(at::full({count}, float(r + 1)), r)};
    pgs[r]->allreduce(t)->wait();
    EXPECT_TRUE(braid::sim::read(t[0]).equal(at::full({count}, 6.f)));
    std::vector<at::Tensor> b{onDevice(at::full({count}, int64_t(1) << r, at::kLong), r)};
    c10d::AllreduceOptions bor;
    bor.reduceOp = c10d::ReduceOp::BOR;
    pgs[r]->allreduce(b, bor)->wait();
    EXPECT_TRUE(braid::sim::read(b[0]).equal(at::full({count}, 7, at::kLong)));
    // broadcast from rank 1
    std::vector<at::Tensor> c{onDevice(at::arange(count).to(at::kFloat) * (r + 1), r)};
    c10d::BroadcastOptions bo;
    bo.rootRank = 1;
    pgs[r]->broadcast(c, bo)->wait();
    EXPECT_TRUE(braid::sim::read(c[0]).equal(at::arange(count).to(at::kFloat) * 2));
    // all_gather_into_tensor and reduce_scatter_tensor
    at::Tensor in = onDevice(at::full({count}, double(r), at::kDouble), r);
    at::Tensor out = braid::sim::empty({n * count}, at::kDouble, r);
    pgs[r]->_allgather_base(out, in)->wait();
    std::vector<at::Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(at::full({count}, double(q), at::kDouble));
    EXPECT_TRUE(braid::sim::read(out).equal(at::cat(parts)));
    at::Tensor rsIn = onDevice(at::arange(n * count).to(at::kDouble), r);
    at::Tensor rsOut = braid::sim::empty({count}, at::kDouble, r);
    pgs[r]->_reduce_scatter_base(rsOut, rsIn)->wait();
    EXPECT_TRUE(braid::sim::read(rsOut).equal(at::arange(r * count, (r + 1) * count)
                                                  .to(at::kDouble) * n));
    expectCounts(*pgs[r], before, want, GetParam(), "the collectives");
  });
}

TEST_P(CudaBackend, FutureKnowsItsDeviceAndTheExecutorIsShown) {
  const int n = 2;
  auto pgs = makeGroup(n);
  onRanks(n, [&](int r) {
    std::vector<at::Tensor> t{onDevice(at::ones({8}), r)};
    auto work = pgs[r]->allreduce(t);
    auto fut = work->getFuture();
    fut->wait();
    ASSERT_EQ(fut->devices().size(), 1u);
    EXPECT_EQ(fut->devices()[0], c10::Device(c10::DeviceType::CUDA, r));
    EXPECT_TRUE(braid::sim::read(fut->value().toTensorVector()[0]).equal(at::full({8}, 2.f)));
    const std::string how = pgs[r]->cudaContext()->executorDescription();
    EXPECT_EQ(how.rfind(GetParam(), 0), 0u) << how;
    Counts want;
    want.op(std::string(GetParam()) == "nccl", 32, 32);
    expectCounts(*pgs[r], braid::CudaExecutorStats(), want, GetParam(), "one allreduce");
  });
}

TEST_P(CudaBackend, CommStreamWaitsForTheCallersStream) {
  const int n = 2;
  auto pgs = makeGroup(n);
  onRanks(n, [&](int r) {
    const int64_t count = 1 << 14;
    std::vector<at::Tensor> t{onDevice(at::zeros({count}), r)};
    pgs[r]->allreduce(t)->wait();
    const braid::CudaExecutorStats before = statsOf(*pgs[r]);
    // A slow producer on the caller's stream: its write lands 50 ms later.
    braid::sim::delayCurrentStream(r, std::chrono::microseconds(50000));
    braid::sim::write(t[0], at::full({count}, float(r + 1)));
    braid::sim::delayCurrentStream(r, std::chrono::microseconds(0));
    pgs[r]->allreduce(t)->wait();
    EXPECT_TRUE(braid::sim::read(t[0]).equal(at::full({count}, 3.f)));
    Counts want;
    want.op(std::string(GetParam()) == "nccl", 4 * count, 4 * count);
    expectCounts(*pgs[r], before, want, GetParam(), "the allreduce after a slow write");
  });
}

TEST_P(CudaBackend, AbortEndsAnOpWhosePeerNeverCame) {
  const int n = 2;
  auto pgs = makeGroup(n);
  const bool nccl = std::string(GetParam()) == "nccl";
  onRanks(n, [&](int r) {
    std::vector<at::Tensor> t{onDevice(at::ones({4}), r)};
    pgs[r]->allreduce(t)->wait();  // the executor exists on both ranks
    Counts want;
    want.op(nccl, 16, 16);
    expectCounts(*pgs[r], braid::CudaExecutorStats(), want, GetParam(), "the first allreduce");
  });
  // Rank 0 alone issues an op; rank 1 aborts it from another thread.
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(c10::Device(c10::DeviceType::CUDA, 0));
  std::vector<at::Tensor> t{onDevice(at::ones({4}), 0)};
  const braid::CudaExecutorStats before = statsOf(*pgs[0]);
  auto work = pgs[0]->allreduce(t);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    pgs[0]->abort();
  });
  auto start = std::chrono::steady_clock::now();
  // wait(timeout) waits on the host on both paths and throws the outcome.
  // The staged path's Future carries it too; the NCCL path's completed at
  // launch, as ProcessGroupNCCL's (Note [The NCCL path's Future] in c10d/work.cc).
  EXPECT_THROW(work->wait(std::chrono::seconds(30)), std::exception);
  if (!nccl) {
    work->getFuture()->wait();  // the Future's error follows the Work's
    EXPECT_TRUE(work->getFuture()->hasError());
  }
  aborter.join();
  // Not at the op's deadline (makeGroup's timeout; Note [Timing bounds in tests]
  // in tests/cpp/timing.h).
  EXPECT_TRUE(braid::testing::endedEarly(std::chrono::steady_clock::now() - start, kTimeout));
  // The op went to its executor (on the NCCL path, at once; staged, on the
  // worker, which may have been aborted before it started) and nothing came
  // back to the device.
  const braid::CudaExecutorStats now = statsOf(*pgs[0]);
  EXPECT_EQ(now.executor, GetParam());
  EXPECT_EQ(now.ncclOps - before.ncclOps, nccl ? 1u : 0u);
  EXPECT_EQ(now.ncclBytes - before.ncclBytes, nccl ? 16u : 0u);
  EXPECT_LE(now.staged.ops - before.staged.ops, nccl ? 0u : 1u);
  EXPECT_LE(now.staged.d2hBytes - before.staged.d2hBytes, nccl ? 0u : 16u);
  EXPECT_EQ(now.staged.h2dBytes, before.staged.h2dBytes);
  pgs[1]->abort();
}

TEST_P(CudaBackend, RanksThatDisagreeFailWithTheMismatchNotAHang) {
  const int n = 2;
  auto pgs = makeGroup(n);
  onRanks(n, [&](int r) {
    std::vector<at::Tensor> t{onDevice(at::ones({4}), r)};
    pgs[r]->allreduce(t)->wait();
    // Rank 1 passes twice as many elements.
    std::vector<at::Tensor> u{onDevice(at::ones({r == 0 ? 8 : 16}), r)};
    const braid::CudaExecutorStats before = statsOf(*pgs[r]);
    auto start = std::chrono::steady_clock::now();
    try {
      auto work = pgs[r]->allreduce(u);
      // With a timeout the NCCL path's wait() waits on the host too (Note
      // [wait(timeout) on the NCCL path] in c10d/work.cc).
      work->wait(std::chrono::seconds(30));
      ADD_FAILURE() << "rank " << r << ": a count mismatch went through";
    } catch (const std::exception& e) {
      // braid's header check names both shapes (NCCL itself would hang or
      // read past the shorter buffer; the simulated one only says "aborted").
      const std::string what = e.what();
      EXPECT_NE(what.find("passed shape [" + std::to_string(r == 0 ? 16 : 8) + "]"),
                std::string::npos) << what;
    }
    EXPECT_TRUE(braid::testing::endedEarly(std::chrono::steady_clock::now() - start, kTimeout))
        << "rank " << r;
    // The op went to its executor; the staged one copied its input in and
    // nothing back (the header check failed between the two).
    const uint64_t bytes = 4 * (r == 0 ? 8 : 16);
    Counts want;
    want.op(std::string(GetParam()) == "nccl", bytes, 0);
    expectCounts(*pgs[r], before, want, GetParam(), "the mismatched allreduce");
  });
}

// Note [The NCCL path in the backend]: wait() orders the caller's stream after
// the op and returns; the host does not wait for the device. (The staged
// path's wait() waits for its host collective, as gloo's does.)
TEST_P(CudaBackend, NcclWaitOrdersTheStreamAndLeavesTheHostFree) {
  if (std::string(GetParam()) != "nccl") GTEST_SKIP() << "the staged path waits on the host";
  const int n = 2;
  auto pgs = makeGroup(n);
  onRanks(n, [&](int r) {
    const int64_t count = 1 << 12;
    std::vector<at::Tensor> t{onDevice(at::zeros({count}), r)};
    pgs[r]->allreduce(t)->wait();  // the communicator exists from here
    const braid::CudaExecutorStats before = statsOf(*pgs[r]);
    braid::sim::write(t[0], at::full({count}, float(r + 1)));
    delayCommStreams(*pgs[r], std::chrono::milliseconds(300));
    auto work = pgs[r]->allreduce(t);
    work->wait();
    // 300 ms of device time are still queued: a wait() that waited on the
    // host would have seen the op complete.
    EXPECT_FALSE(work->isCompleted()) << "rank " << r << ": wait() waited for the device";
    delayCommStreams(*pgs[r], std::chrono::microseconds(0));
    // Reading on the caller's stream waits for the op: its result is there.
    EXPECT_TRUE(braid::sim::read(t[0]).equal(at::full({count}, 3.f)));
    // The Future completed at launch (Note [The NCCL path's Future]); wait(timeout)
    // waits on the host for the op itself.
    EXPECT_TRUE(work->getFuture()->completed());
    EXPECT_TRUE(work->wait(std::chrono::seconds(30)));
    EXPECT_TRUE(work->isCompleted() && !work->getFuture()->hasError());
    Counts want;
    want.op(true, 4 * count, 4 * count);
    expectCounts(*pgs[r], before, want, "nccl", "the allreduce on a slow comm stream");
  });
}

// braid::DistributedDataParallel on a module moved to a (simulated) CUDA
// device ends with the same parameters as on the CPU, bit for bit: the
// simulated device runs ATen's CPU kernels (Note [ATen on the simulated
// device]) and both paths sum each bucket in the same order.
// On CUDA, `executor` is the one the group must run.
std::vector<at::Tensor> trainCppDdp(const PG& pg, int rank, c10::Device device, bool bucketView,
                                    const std::string& executor) {
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
  {
    torch::NoGradGuard noGrad;  // ranks start apart: DDP must broadcast rank 0's
    int i = 0;
    for (auto& p : net->parameters())
      p.copy_(at::sin(at::arange(p.numel()).to(at::kFloat) * 0.37 + (rank + 1) * (++i)).view_as(p));
  }
  net->to(device);
  braid::DDPOptions opts;
  opts.bucket_cap_mb = 0.0002;  // several buckets
  opts.first_bucket_mb = 0.0001;
  opts.gradient_as_bucket_view = bucketView;
  braid::DistributedDataParallel ddp(
      net, braid::compat::wrapAsProcessGroup(pg, c10::make_intrusive<c10d::HashStore>()), opts);
  // From here on the group's CUDA ops are the buckets' allreduces (the
  // buckets' rebuild broadcasts a CPU tensor): each step reduces every
  // gradient once, in the first buckets at step 0, the rebuilt ones after.
  const braid::CudaExecutorStats before = statsOf(*pg);
  const size_t firstBuckets = ddp.reducer().bucketIndices().size();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = at::cos(at::arange(32).to(at::kFloat) * (step + 1) + rank).view({4, 8});
    at::Tensor y = at::sin(at::arange(8).to(at::kFloat) * (rank + 2) + step).view({4, 2});
    opt.zero_grad();
    at::Tensor out = ddp.forward([&] { return net->forward(x.to(device)); });
    torch::nn::functional::mse_loss(out, y.to(device)).backward();
    opt.step();
  }
  std::vector<at::Tensor> params;
  uint64_t paramBytes = 0;
  for (auto& p : net->parameters()) {
    params.push_back(p.detach().to(at::kCPU));
    paramBytes += p.nbytes();
  }
  if (device.is_cuda()) {
    const bool nccl = executor == "nccl";
    const size_t buckets = firstBuckets + 3 * ddp.reducer().bucketIndices().size();
    Counts want;
    if (nccl) {
      want.ncclOps = buckets;
      want.ncclBytes = 4 * paramBytes;
    } else {
      want.stagedOps = buckets;
      want.d2h = want.h2d = 4 * paramBytes;
    }
    expectCounts(*pg, before, want, executor, "C++ DDP's 4 steps");
  }
  return params;
}

TEST_P(CudaBackend, CppDdpTrainsACudaModuleAsOnCpu) {
  const int n = 2;
  for (bool bucketView : {false, true}) {
    auto pgs = makeGroup(n);
    std::vector<std::vector<at::Tensor>> cpu(n), cuda(n);
    onRanks(n, [&](int r) {
      cpu[r] = trainCppDdp(pgs[r], r, c10::Device(c10::kCPU), bucketView, GetParam());
      cuda[r] = trainCppDdp(pgs[r], r, c10::Device(c10::DeviceType::CUDA, r), bucketView,
                            GetParam());
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cpu[r].size(), cuda[r].size());
      for (size_t i = 0; i < cpu[r].size(); ++i) {
        EXPECT_TRUE(cpu[r][i].equal(cuda[r][i]))
            << "rank " << r << " parameter " << i << " bucket_view=" << bucketView;
        EXPECT_TRUE(cuda[r][i].equal(cuda[0][i])) << "rank " << r << " parameter " << i;
      }
    }
  }
}

// Note [A current device per thread] in cuda/on_device.h: the group's
// workers, watchdog and completions, and its destruction on a thread that
// never set a device, leave the process no context but its ranks' devices.
// The ranks are on devices 2 and 3, so that a context on device 0 can only be
// a leak (Note [Simulated contexts] in tests/sim/device/sim_device.h).
TEST_P(CudaBackend, NoThreadMakesAContextOnDevice0) {
  const int n = 2;
  braid::sim::device().forgetContexts();
  auto pgs = makeGroup(n);
  braid_test::onRanks(n, [&](int r) {
    const int device = 2 + r;
    c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA)
        .setDevice(c10::Device(c10::DeviceType::CUDA, device));
    std::vector<at::Tensor> t{onDevice(at::full({1000}, float(r + 1)), device)};
    pgs[r]->allreduce(t)->wait();
    EXPECT_TRUE(braid::sim::read(t[0]).equal(at::full({1000}, 3.f)));
    EXPECT_EQ(statsOf(*pgs[r]).executor.rfind(GetParam(), 0), 0u) << statsOf(*pgs[r]).executor;
  });
  std::thread([&] { pgs.clear(); }).join();  // the groups go where no device was set
  EXPECT_EQ(braid::sim::device().contexts(), (std::vector<int>{2, 3}));
}

INSTANTIATE_TEST_SUITE_P(Executors, CudaBackend, ::testing::Values("staged", "nccl"));

// Note [No exception out of teardown] (cuda/teardown.h): after a sticky
// device error every free fails, and the pool's destructor, a pinned tensor's
// deleter and the group's teardown must go on rather than terminate the
// process. Each case runs in a child process (a terminate would end the
// suite), re-executed so that it starts with no simulated stream threads.
// A sticky fault on every call ("*"), raised by the first hostFree.
braid::cuda::DeviceFault stickyFromFirstHostFree() {
  braid::cuda::DeviceFault f;
  f.call = "hostFree";
  f.sticky = true;
  return f;
}

// Each runs in the child and exits 0 when the teardown went on.
[[noreturn]] void pinnedPoolWithFailingFrees() {
  braid::sim::install(kDevices, &braid::setDeviceApiForTesting);
  braid::cuda::FaultyDevice faulty(braid::sim::device());
  {
    braid::PinnedPool pool(faulty, 1 << 20);
    size_t small = 0, big = 0;
    void* a = pool.acquire(1000, &small);
    void* b = pool.acquire(size_t{4} << 20, &big);  // over the idle limit
    pool.release(a, small);                          // kept idle
    faulty.inject(stickyFromFirstHostFree());
    pool.release(b, big);  // freed at once: fails
  }                        // frees `a`: fails
  std::exit(faulty.failures() == 2 && braid::cuda::teardownErrors() == 2 ? 0 : 3);
}

[[noreturn]] void groupAndPinnedTensorAfterAStickyError() {
  braid::sim::install(kDevices, &braid::setDeviceApiForTesting);
  braid::cuda::FaultyDevice faulty(braid::sim::device());
  braid::setDeviceApiForTesting(&faulty);  // no NCCL for it: staged
  at::Tensor kept;
  {
    auto pgs = braid_test::makeGroup(2, kTimeout);
    braid_test::onRanks(2, [&](int r) {
      c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA)
          .setDevice(c10::Device(c10::DeviceType::CUDA, r));
      at::Tensor t = braid::sim::empty({1000}, at::kFloat, r);
      braid::sim::write(t, at::full({1000}, float(r + 1)));
      std::vector<at::Tensor> v{t};
      pgs[r]->allreduce(v)->wait();
      if (!braid::sim::read(t).equal(at::full({1000}, 3.f))) std::exit(4);
    });
    kept = pgs[0]->cudaContext()->pinnedLike(at::zeros({1 << 20}));
    faulty.inject(stickyFromFirstHostFree());
    // The group goes while its pool holds idle blocks; `kept` outlives it.
  }
  kept = at::Tensor();  // its deleter frees the block: fails
  std::exit(faulty.failures() > 0 && braid::cuda::teardownErrors() > 0 ? 0 : 3);
}

TEST(CudaTeardownDeathTest, PinnedPoolSurvivesFailingHostFree) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(pinnedPoolWithFailingFrees(), ::testing::ExitedWithCode(0), "");
}

TEST(CudaTeardownDeathTest, GroupAndPinnedTensorSurviveAStickyError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(groupAndPinnedTensorAfterAStickyError(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
