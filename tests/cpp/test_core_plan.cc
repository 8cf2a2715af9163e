// plan() (collectives/shm/plan.h), the paths it picks, and the settings fixed
// when a group is created (Note [Settings that shape an op]).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/shm/collectives.h"
#include "common/settings.h"
#include "core_group.h"
#include "machine_skip.h"

namespace braid {
namespace {

using collectives::Algo;
using collectives::CollectiveConfig;
using collectives::Communicator;
using collectives::GroupLimits;
using collectives::OpDesc;
using collectives::OpKind;
using testing::desc;
using testing::Group;
using testing::runRanks;

TEST(Plan, ChoosesByKindSizeAndSettings) {
  CollectiveConfig cfg;  // defaults: one-shot up to 64 KiB, direct from 256 KiB
  cfg.directOps = collectives::parseDirectOps("allreduce,broadcast,reduce,alltoall", 0);
  const GroupLimits shm{1 << 20, false}, cma{1 << 20, true}, small{4096, true};
  auto plan = [&](OpKind k, size_t b, const GroupLimits& g) {
    return collectives::plan(k, b, cfg, g);
  };
  EXPECT_EQ(plan(OpKind::kAllreduce, 0, cma), Algo::kOneShot);
  EXPECT_EQ(plan(OpKind::kAllreduce, 64 << 10, cma), Algo::kOneShot);
  EXPECT_EQ(plan(OpKind::kAllreduce, (64 << 10) + 4, cma), Algo::kShm);
  EXPECT_EQ(plan(OpKind::kAllreduce, 256 << 10, cma), Algo::kDirect);
  EXPECT_EQ(plan(OpKind::kAllreduce, 256 << 10, shm), Algo::kShm);
  EXPECT_EQ(plan(OpKind::kAllreduce, 8192, small), Algo::kShm);  // larger than a slot
  EXPECT_EQ(plan(OpKind::kReduce, 16, cma), Algo::kOneShot);
  EXPECT_EQ(plan(OpKind::kReduce, 1 << 30, cma), Algo::kShm);  // listed, but no direct path
  EXPECT_EQ(plan(OpKind::kBroadcast, 16, cma), Algo::kShm);
  EXPECT_EQ(plan(OpKind::kBroadcast, 256 << 10, cma), Algo::kDirect);
  EXPECT_EQ(plan(OpKind::kAllgather, 1 << 30, cma), Algo::kShm);  // not listed
  EXPECT_EQ(plan(OpKind::kAlltoall, (256 << 10) - 1, cma), Algo::kShm);
  EXPECT_EQ(plan(OpKind::kAlltoall, 256 << 10, cma), Algo::kDirect);
  EXPECT_EQ(plan(OpKind::kBarrier, 0, cma), Algo::kHeaderOnly);
  EXPECT_EQ(collectives::directOpsList(cfg.directOps), "allreduce,broadcast,reduce,alltoall");
  EXPECT_EQ(collectives::directOpsList(collectives::parseDirectOps("none", 0)), "none");
}

float val(int rank, size_t i) { return static_cast<float>((rank + 1) * 100 + i % 7); }

// Each path of allreduce and reduce for counts 0, 1, odd and large (400 KB:
// one-shot in a 512 KiB slot; pipelined in 390 chunks of 1 KiB). The settings
// make plan() pick the path, which the test checks; count 0 always plans
// one-shot (0 bytes are within any threshold), so the path's own function
// runs it.
class Paths : public ::testing::TestWithParam<std::tuple<OpKind, Algo, size_t>> {};

void runPath(Communicator& c, OpKind kind, Algo path, const OpDesc& d, const void* in, void* out) {
  if (kind == OpKind::kReduce) {
    return path == Algo::kOneShot ? collectives::reduceOneShot(c, d, in, out)
                                  : collectives::reducePipelined(c, d, in, out);
  }
  switch (path) {
    case Algo::kOneShot: return collectives::allreduceOneShot(c, d, in, out);
    case Algo::kDirect: return collectives::allreduceDirect(c, d, in, out);
    default: return collectives::allreduceRsAg(c, d, in, out);
  }
}

TEST_P(Paths, GiveClosedForms) {
  const OpKind kind = std::get<0>(GetParam());
  const Algo path = std::get<1>(GetParam());
  const size_t count = std::get<2>(GetParam());
  const int n = 3;
  CollectiveConfig cfg;
  cfg.chunkBytes = 1024;
  cfg.allreduceOneShotMax = cfg.reduceOneShotMax = path == Algo::kOneShot ? 1 << 30 : 0;
  cfg.directOps = path == Algo::kDirect ? collectives::opBit(OpKind::kAllreduce) : 0;
  cfg.directMinBytes = 0;
  Group g(n, testing::withConfig(testing::slots(512 << 10), cfg));
  if (path == Algo::kDirect && !g.comms[0]->window().canReadPeers()) {
    BRAID_MACHINE_SKIP("direct reads are not permitted here");
  }
  runRanks(n, [&](int r) {
    Communicator& c = *g.comms[r];
    if (count > 0) {
      ASSERT_EQ(c.plan(kind, count * sizeof(float)), path);
    }
    std::vector<float> in(count), out(count, -1.f);
    for (size_t i = 0; i < count; ++i) in[i] = val(r, i);
    runPath(c, kind, path, desc(kind, count, DataType::kFloat32, 1), in.data(), out.data());
    for (size_t i = 0; i < count; ++i) {
      float want = kind == OpKind::kReduce && r != 1 ? -1.f : val(0, i) + val(1, i) + val(2, i);
      ASSERT_EQ(out[i], want) << "rank " << r << " i " << i;
    }
    // The group still works: the header steps of the paths stayed aligned.
    collectives::barrier(c, desc(OpKind::kBarrier, 0, DataType::kUInt8));
  });
}

std::string pathCase(const ::testing::TestParamInfo<std::tuple<OpKind, Algo, size_t>>& p) {
  const char* path = std::get<1>(p.param) == Algo::kOneShot ? "OneShot"
                     : std::get<1>(p.param) == Algo::kDirect ? "Direct"
                                                             : "Pipelined";
  return strCat(path, "_count", std::get<2>(p.param));
}

const size_t kCounts[] = {0, 1, 7, 100000};
INSTANTIATE_TEST_SUITE_P(
    Allreduce, Paths,
    ::testing::Combine(::testing::Values(OpKind::kAllreduce),
                       ::testing::Values(Algo::kOneShot, Algo::kShm, Algo::kDirect),
                       ::testing::ValuesIn(kCounts)),
    pathCase);
INSTANTIATE_TEST_SUITE_P(Reduce, Paths,
                         ::testing::Combine(::testing::Values(OpKind::kReduce),
                                            ::testing::Values(Algo::kOneShot, Algo::kShm),
                                            ::testing::ValuesIn(kCounts)),
                         pathCase);

// Values are read when the group is created, never per op.
TEST(Settings, ReadOnceWhenTheGroupIsCreated) {
  setenv("BRAID_ALLREDUCE_ONESHOT_MAX", "0", 1);
  setenv("BRAID_CHUNK_BYTES", "2K", 1);
  Group g(2, 8192);
  setenv("BRAID_ALLREDUCE_ONESHOT_MAX", "1G", 1);  // too late for this group
  unsetenv("BRAID_CHUNK_BYTES");
  runRanks(2, [&](int r) {
    Communicator& c = *g.comms[r];
    EXPECT_EQ(c.config().allreduceOneShotMax, 0u);
    EXPECT_EQ(c.chunkBytes(), 2048u);
    EXPECT_EQ(c.plan(OpKind::kAllreduce, 4), Algo::kShm);
    std::vector<float> buf(3, float(r + 1));
    collectives::allreduce(c, desc(OpKind::kAllreduce, 3), buf.data(), buf.data());
    EXPECT_EQ(buf[2], 3.f);
  });
  unsetenv("BRAID_ALLREDUCE_ONESHOT_MAX");
}

// What fixes the shared memory's layout differs: creating the group fails
// on every rank, naming the setting and both values.
// Note [Renamed settings]: the former name is still read while the new one
// is unset, and a warning naming both is printed once per process.
TEST(Settings, ARenamedSettingStillReadsItsFormerNameAndSaysSo) {
  static const IntSetting renamed("BRAID_TEST_NEW_NAME", 7, "a test setting",
                                  "BRAID_TEST_OLD_NAME");
  EXPECT_EQ(renamed.get(), 7);
  setenv("BRAID_TEST_OLD_NAME", "64K", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(renamed.get(), 64 << 10);
  EXPECT_EQ(renamed.get(), 64 << 10);
  std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("[braid settings W] BRAID_TEST_OLD_NAME was renamed BRAID_TEST_NEW_NAME: "
                      "its value is used"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("renamed"), said.rfind("renamed")) << "once per process: " << said;
  setenv("BRAID_TEST_NEW_NAME", "5", 1);
  EXPECT_EQ(renamed.get(), 5);  // the new name wins
  unsetenv("BRAID_TEST_OLD_NAME");
  unsetenv("BRAID_TEST_NEW_NAME");
}

TEST(Settings, DifferentWindowLayoutsFailEveryRank) {
  for (bool slot : {true, false}) {
    testing::MemoryStore store;
    std::vector<std::string> errors(2);
    runRanks(2, [&](int r) {
      transport::shm::WindowOptions o;
      o.controlBytes = Communicator::controlBytesFor(2);
      o.slotBytes = slot && r == 1 ? 8192 : 4096;
      o.channelBytes = !slot && r == 1 ? 8192 : 4096;
      o.timeout = std::chrono::seconds(20);
      try {
        transport::shm::ShmWindow::create(store, r, 2, o);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
    const char* name = slot ? "BRAID_SHM_SLOT_BYTES" : "BRAID_SHM_P2P_BYTES";
    EXPECT_NE(errors[0].find(strCat("braid init (rank 0): rank 1 runs with ", name,
                                    "=8192, this rank with ", name, "=4096")),
              std::string::npos)
        << errors[0];
    EXPECT_NE(errors[1].find(strCat("rank 0 runs with ", name, "=4096, this rank with ", name,
                                    "=8192")),
              std::string::npos)
        << errors[1];
  }
}

// BRAID_SHM_CMA only lowers what the group can do: one rank without direct
// reads turns them off for all, and every op agrees on its path.
TEST(Settings, DirectReadsOffOnOneRankAreOffForAll) {
  Group probe(2, testing::slots(4096));
  if (!probe.comms[0]->window().canReadPeers()) {
    BRAID_MACHINE_SKIP("direct reads are not permitted");
  }
  testing::MemoryStore store;
  std::vector<std::unique_ptr<Communicator>> comms(2);
  runRanks(2, [&](int r) {
    transport::shm::WindowOptions w;
    w.controlBytes = Communicator::controlBytesFor(2);
    w.slotBytes = 4096;
    w.channelBytes = 4096;
    w.useCma = r == 0 ? 0 : 1;
    comms[r] = std::make_unique<Communicator>(transport::shm::ShmWindow::create(store, r, 2, w),
                                              testing::directEverywhere());
  });
  runRanks(2, [&](int r) {
    Communicator& c = *comms[r];
    EXPECT_FALSE(c.limits().canReadPeers);
    EXPECT_EQ(c.plan(OpKind::kAllgather, 1 << 20), Algo::kShm);
    std::vector<float> in(5000, float(r + 1));
    std::vector<std::vector<float>> outs(2, std::vector<float>(5000));
    std::vector<void*> outP{outs[0].data(), outs[1].data()};
    collectives::allgather(c, desc(OpKind::kAllgather, 5000), in.data(), outP.data());
    EXPECT_EQ(outs[0][4999], 1.f);
    EXPECT_EQ(outs[1][4999], 2.f);
  });
}

// A Window that counts direct reads, to tell which path an op took.
class CountingWindow : public transport::Window {
 public:
  CountingWindow(std::unique_ptr<transport::Window> w, std::atomic<int>* reads)
      : w_(std::move(w)), reads_(reads) {}
  int rank() const override { return w_->rank(); }
  int size() const override { return w_->size(); }
  size_t slotBytes() const override { return w_->slotBytes(); }
  size_t controlBytes() const override { return w_->controlBytes(); }
  uint8_t* data(int r, uint64_t s) override { return w_->data(r, s); }
  uint8_t* control(int r, uint64_t s) override { return w_->control(r, s); }
  uint64_t published(int r) const override { return w_->published(r); }
  void publish(uint64_t s) override { w_->publish(s); }
  void wait(int p, uint64_t s, const transport::WaitContext& c) override { w_->wait(p, s, c); }
  void waitAll(uint64_t s, const transport::WaitContext& c) override { w_->waitAll(s, c); }
  transport::ByteChannel& to(int p) override { return w_->to(p); }
  transport::ByteChannel& from(int p) override { return w_->from(p); }
  uint32_t activityEpoch() override { return w_->activityEpoch(); }
  void waitActivity(uint32_t e, std::chrono::microseconds m) override { w_->waitActivity(e, m); }
  void notifyActivity() override { w_->notifyActivity(); }
  bool peerGone(int p, std::string* why) override { return w_->peerGone(p, why); }
  bool canReadPeers() const override { return w_->canReadPeers(); }
  void readPeer(int p, uint64_t a, void* d, size_t b, const transport::WaitContext& c) override {
    ++*reads_;
    w_->readPeer(p, a, d, b, c);
  }
  void abort() override { w_->abort(); }
  void markClosed() override { w_->markClosed(); }
  void giveUp(const std::string& why) override { w_->giveUp(why); }

 private:
  std::unique_ptr<transport::Window> w_;
  std::atomic<int>* reads_;
};

// alltoall follows BRAID_DIRECT_OPS and BRAID_DIRECT_MIN_BYTES (Note
// [Alltoall's path]): it reads directly when the largest block any rank sends
// reaches the minimum, also on ranks whose own blocks are smaller.
TEST(Alltoall, FollowsDirectOpsAndTheLargestBlock) {
  const int n = 3;
  struct Case {
    const char* ops;
    uint64_t directMin, bigBlock;  // rank 0 sends bigBlock bytes to each peer, the others 40
    bool direct;
  };
  for (Case k : {Case{"alltoall", 1000, 4000, true}, Case{"alltoall", 1000, 999, false},
                 Case{"allgather", 0, 4000, false}, Case{"alltoall", 256 << 10, 4000, false}}) {
    testing::MemoryStore store;
    std::atomic<int> reads{0};
    std::vector<std::unique_ptr<Communicator>> comms(n);
    CollectiveConfig cfg;
    cfg.directOps = collectives::parseDirectOps(k.ops, 0);
    cfg.directMinBytes = k.directMin;
    runRanks(n, [&](int r) {
      transport::shm::WindowOptions w;
      w.controlBytes = Communicator::controlBytesFor(n);
      w.slotBytes = 4096;
      w.channelBytes = 4096;
      auto win = std::make_unique<CountingWindow>(
          transport::shm::ShmWindow::create(store, r, n, w), &reads);
      comms[r] = std::make_unique<Communicator>(std::move(win), cfg);
    });
    if (!comms[0]->window().canReadPeers()) BRAID_MACHINE_SKIP("direct reads are not permitted");
    runRanks(n, [&](int r) {
      auto bytes = [&](int from) { return from == 0 ? k.bigBlock : 40; };
      std::vector<uint64_t> sendB(n, bytes(r)), recvB(n);
      std::vector<std::vector<uint8_t>> outs(n);
      std::vector<uint8_t> in(bytes(r), static_cast<uint8_t>(r + 1));
      std::vector<const void*> inP(n, in.data());
      std::vector<void*> outP(n);
      for (int q = 0; q < n; ++q) {
        recvB[q] = bytes(q);
        outs[q].assign(bytes(q), 0);
        outP[q] = outs[q].data();
      }
      OpDesc d = desc(OpKind::kAlltoall, 0, DataType::kUInt8);
      d.sendBytes = sendB.data();
      d.recvBytes = recvB.data();
      collectives::alltoall(*comms[r], d, inP.data(), outP.data());
      for (int q = 0; q < n; ++q) {
        for (uint8_t b : outs[q]) ASSERT_EQ(b, q + 1) << "from rank " << q;
      }
    });
    EXPECT_EQ(reads.load() > 0, k.direct)
        << k.ops << " min " << k.directMin << " block " << k.bigBlock << ": " << reads << " reads";
  }
}

}  // namespace
}  // namespace braid
