// The cores a process may use (Note [Counting cores] in common/cpu_cores.h),
// read from fake cgroup files, and the spin policy chosen from them (Note
// [How long to spin]); SpinBoost's scopes (Note [Spinning for a blocked rank]).
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "common/cpu_cores.h"
#include "common/rank_pinning.h"
#include "transport/shm/futex.h"

namespace braid {
namespace {

using std::chrono::microseconds;

// A fake /proc/self/cgroup and cgroup mount under a fresh temporary folder,
// removed at the end.
class FakeCgroup {
 public:
  FakeCgroup() {
    char tmpl[] = "/tmp/braid-cgroup-XXXXXX";
    root_ = mkdtemp(tmpl);
    files.procSelfCgroup = root_ + "/proc-self-cgroup";
    files.mountRoot = root_ + "/sys-fs-cgroup";
  }
  ~FakeCgroup() { std::system(("rm -rf '" + root_ + "'").c_str()); }

  // Writes `text` to `rel` under the mount (folders made as needed).
  void write(const std::string& rel, const std::string& text) {
    const std::string path = files.mountRoot + "/" + rel;
    mkdir(files.mountRoot.c_str(), 0755);
    for (size_t at = files.mountRoot.size(); (at = path.find('/', at + 1)) != std::string::npos;) {
      mkdir(path.substr(0, at).c_str(), 0755);
    }
    std::ofstream(path) << text << "\n";
  }
  void selfCgroup(const std::string& text) { std::ofstream(files.procSelfCgroup) << text; }

  CgroupFiles files;

 private:
  std::string root_;
};

TEST(Cores, NoCgroupFilesLeavesTheAffinity) {
  FakeCgroup cg;  // neither /proc/self/cgroup nor the mount exists
  UsableCores u = usableCores(cg.files, 8);
  EXPECT_EQ(u.affinity, 8);
  EXPECT_EQ(u.quotaCores, 0);
  EXPECT_EQ(u.cores, 8);
  EXPECT_NE(u.describe().find("no cgroup quota"), std::string::npos) << u.describe();
}

TEST(Cores, V2QuotaCutsTheAffinity) {
  FakeCgroup cg;
  cg.selfCgroup("0::/job/rank\n");
  cg.write("job/rank/cpu.max", "250000 100000");  // 2.5 cores: 2 can spin
  UsableCores u = usableCores(cg.files, 8);
  EXPECT_DOUBLE_EQ(u.quotaCores, 2.5);
  EXPECT_EQ(u.cores, 2);
  EXPECT_EQ(u.quotaFile, cg.files.mountRoot + "/job/rank/cpu.max");
  EXPECT_NE(u.describe().find("2.5"), std::string::npos) << u.describe();
}

TEST(Cores, V2MaxIsNoQuota) {
  FakeCgroup cg;
  cg.selfCgroup("0::/job\n");
  cg.write("job/cpu.max", "max 100000");
  cg.write("cpu.max", "max");
  EXPECT_EQ(cgroupQuotaCores(cg.files), 0);
  EXPECT_EQ(usableCores(cg.files, 4).cores, 4);
}

TEST(Cores, V2AncestorQuotaCounts) {
  FakeCgroup cg;
  cg.selfCgroup("0::/a/b\n");
  cg.write("a/b/cpu.max", "max 100000");
  cg.write("a/cpu.max", "300000 100000");
  EXPECT_DOUBLE_EQ(cgroupQuotaCores(cg.files), 3.0);
  EXPECT_EQ(usableCores(cg.files, 16).cores, 3);
}

TEST(Cores, V2PathNotUnderTheMountReadsTheRoot) {
  FakeCgroup cg;  // a container without a cgroup namespace: its own cgroup is the mount's root
  cg.selfCgroup("0::/docker/abc\n");
  cg.write("cpu.max", "150000 100000");
  EXPECT_DOUBLE_EQ(cgroupQuotaCores(cg.files), 1.5);
  EXPECT_EQ(usableCores(cg.files, 4).cores, 1);
}

TEST(Cores, V1Quota) {
  FakeCgroup cg;
  cg.selfCgroup("12:memory:/x\n4:cpu,cpuacct:/slice/job\n1:name=systemd:/\n");
  cg.write("cpu,cpuacct/slice/job/cpu.cfs_quota_us", "400000");
  cg.write("cpu,cpuacct/slice/job/cpu.cfs_period_us", "100000");
  std::string where;
  EXPECT_DOUBLE_EQ(cgroupQuotaCores(cg.files, &where), 4.0);
  EXPECT_EQ(where, cg.files.mountRoot + "/cpu,cpuacct/slice/job/cpu.cfs_quota_us");
  EXPECT_EQ(usableCores(cg.files, 2).cores, 2);  // the affinity is smaller
  EXPECT_EQ(usableCores(cg.files, 64).cores, 4);
}

TEST(Cores, V1MinusOneIsNoQuota) {
  FakeCgroup cg;
  cg.selfCgroup("3:cpu:/\n");
  cg.write("cpu/cpu.cfs_quota_us", "-1");
  cg.write("cpu/cpu.cfs_period_us", "100000");
  EXPECT_EQ(cgroupQuotaCores(cg.files), 0);
  EXPECT_EQ(usableCores(cg.files, 2).cores, 2);
}

TEST(Cores, V1QuotaWithoutPeriodIsIgnored) {
  FakeCgroup cg;
  cg.selfCgroup("3:cpu:/\n");
  cg.write("cpu/cpu.cfs_quota_us", "50000");  // no cpu.cfs_period_us
  EXPECT_EQ(cgroupQuotaCores(cg.files), 0);
}

TEST(Cores, QuotaBelowOneCoreStillCountsOne) {
  FakeCgroup cg;
  cg.selfCgroup("0::/\n");
  cg.write("cpu.max", "50000 100000");
  UsableCores u = usableCores(cg.files, 8);
  EXPECT_DOUBLE_EQ(u.quotaCores, 0.5);
  EXPECT_EQ(u.cores, 1);
}

TEST(Cores, TheSmallestOfV1AndV2Wins) {
  FakeCgroup cg;  // a hybrid host: both hierarchies listed
  cg.selfCgroup("4:cpu:/j\n0::/j\n");
  cg.write("cpu/j/cpu.cfs_quota_us", "600000");
  cg.write("cpu/j/cpu.cfs_period_us", "100000");
  cg.write("j/cpu.max", "200000 100000");
  EXPECT_DOUBLE_EQ(cgroupQuotaCores(cg.files), 2.0);
}

TEST(Cores, ThisProcessHasAtLeastOne) {
  UsableCores u = usableCores();
  EXPECT_GE(u.cores, 1);
  EXPECT_LE(u.cores, u.affinity);
}

TEST(SpinPolicy, EveryRankHasACoreSpinsLong) {
  SpinPolicy p = chooseSpinPolicy(2, 2, kBraidThreadsPerRank, -1, -1);
  EXPECT_TRUE(p.everyRankHasACore);
  EXPECT_EQ(p.longSpin, kLongSpin);
  EXPECT_EQ(p.shortSpin, kShortSpin);
  EXPECT_EQ(p.workerIdle, microseconds(0));  // no core for the worker beside its rank
}

TEST(SpinPolicy, OversubscribedSpinsShort) {
  SpinPolicy p = chooseSpinPolicy(2, 4, kBraidThreadsPerRank, -1, -1);
  EXPECT_FALSE(p.everyRankHasACore);
  EXPECT_EQ(p.longSpin, kShortSpin);
  EXPECT_EQ(p.shortSpin, kShortSpin);
  EXPECT_EQ(p.workerIdle, microseconds(0));
  EXPECT_NE(p.describe().find("ranks outnumber the cores"), std::string::npos) << p.describe();
}

TEST(SpinPolicy, SpareCoresLetTheWorkerPoll) {
  // 4 ranks, 2 threads of braid's each beside the rank's: 12 cores needed.
  EXPECT_EQ(chooseSpinPolicy(11, 4, 2, -1, -1).workerIdle, microseconds(0));
  EXPECT_EQ(chooseSpinPolicy(12, 4, 2, -1, -1).workerIdle, kLongSpin);
}

TEST(SpinPolicy, ExplicitSettingsWin) {
  SpinPolicy p = chooseSpinPolicy(2, 4, 2, 500, 7);
  EXPECT_EQ(p.longSpin, microseconds(500));
  EXPECT_EQ(p.shortSpin, microseconds(500));
  EXPECT_EQ(p.workerIdle, microseconds(7));
  EXPECT_TRUE(p.shmSpinSet && p.workerSpinSet);
  p = chooseSpinPolicy(64, 2, 2, 0, 0);
  EXPECT_EQ(p.longSpin, microseconds(0));
  EXPECT_EQ(p.workerIdle, microseconds(0));
  EXPECT_NE(p.describe().find("BRAID_SHM_SPIN_US"), std::string::npos) << p.describe();
}

TEST(SpinBoost, ScopesNestAndFollowTheFlag) {
  EXPECT_FALSE(SpinBoost::active());
  std::atomic<int> waiters{0};
  {
    SpinBoost b(&waiters);
    EXPECT_FALSE(SpinBoost::active());
    waiters = 1;
    EXPECT_TRUE(SpinBoost::active());
    {
      SpinBoost none(nullptr);
      EXPECT_FALSE(SpinBoost::active());
    }
    EXPECT_TRUE(SpinBoost::active());
    std::thread([] { EXPECT_FALSE(SpinBoost::active()); }).join();  // per thread
  }
  EXPECT_FALSE(SpinBoost::active());
  SpinBoost always(SpinBoost::always());
  EXPECT_TRUE(SpinBoost::active());
}

long involuntarySwitches() {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nivcsw;
}

// A boosted waiter spins past the short spin and never sleeps: the
// publisher sees no sleeper. An unboosted one sleeps after the short spin.
// A boosted one that the kernel preempts sleeps too (Note [A preempted
// spinner sleeps]): such a try proves nothing either way.
TEST(SpinBoost, BoostedWaitSpinsLong) {
  using namespace transport::shm;
  auto sleptWhileWaiting = [](bool boosted, bool* preempted) {
    Counter c;
    std::atomic<bool> sawSleeper{false};
    std::thread pub([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      sawSleeper = c.sleepers.load() > 0;
      c.publish(1);
    });
    SpinBoost b(boosted ? SpinBoost::always() : nullptr);
    const long before = involuntarySwitches();
    EXPECT_EQ(waitAtLeast(c, 1, std::chrono::seconds(5), microseconds(20), std::chrono::seconds(5)),
              WaitResult::kReached);
    *preempted = involuntarySwitches() != before;
    pub.join();
    return sawSleeper.load();
  };
  bool preempted = false;
  EXPECT_TRUE(sleptWhileWaiting(false, &preempted));
  for (int i = 0; i < 10; ++i) {
    const bool slept = sleptWhileWaiting(true, &preempted);
    EXPECT_TRUE(!slept || preempted) << "try " << i << ": a boosted waiter slept unpreempted";
    if (!preempted) break;
  }
}

// Note [Spin less when spinning fails]: a boosted wait whose long spin ran
// out says so; one that the spin saw through, or an unboosted one, does not.
TEST(SpinBoost, ALongSpinThatRanOutSaysSo) {
  using namespace transport::shm;
  SpinBoost b(SpinBoost::always());
  for (int lateMs : {0, 30}) {
    Counter c;
    bool spunOut = false;
    std::thread pub([&] {
      if (lateMs) std::this_thread::sleep_for(std::chrono::milliseconds(lateMs));
      c.publish(1);
    });
    if (!lateMs) pub.join();
    EXPECT_EQ(waitAtLeast(c, 1, std::chrono::seconds(5), microseconds(20), microseconds(1000),
                          &spunOut),
              WaitResult::kReached);
    if (lateMs) pub.join();
    EXPECT_EQ(spunOut, lateMs > 0) << "publisher late by " << lateMs << " ms";
  }
  SpinBoost none(nullptr);
  Counter c;
  bool spunOut = false;
  EXPECT_EQ(waitAtLeast(c, 1, microseconds(2000), microseconds(20), microseconds(1000), &spunOut),
            WaitResult::kTimedOut);
  EXPECT_FALSE(spunOut);
}

// Note [Pinning ranks on a full host]: which ranks are bound, and where.
TEST(RankPinning, AutoBindsOnlyUnplacedRanksThatOutnumberTheCores) {
  const std::vector<int> all = {0, 1, 2, 3};
  // 6 ranks on 4 cores, nobody placed them: rank r on the (r mod 4)-th CPU.
  for (int r = 0; r < 6; ++r) {
    const PinDecision d = choosePin(PinMode::kAuto, r, 6, all, 4, 4);
    EXPECT_TRUE(d.pin) << d.why;
    EXPECT_EQ(d.cpu, r % 4) << d.why;
  }
  // As many ranks as cores, or fewer: every rank has a core.
  for (int ranks : {1, 3, 4}) {
    const PinDecision d = choosePin(PinMode::kAuto, 0, ranks, all, 4, 4);
    EXPECT_FALSE(d.pin) << ranks << " ranks: " << d.why;
    EXPECT_NE(d.why.find("every rank has a core"), std::string::npos) << d.why;
  }
  // A cgroup quota of 2 cores on 4 CPUs: 3 ranks outnumber it.
  EXPECT_TRUE(choosePin(PinMode::kAuto, 2, 3, all, 4, 2).pin);
  // Placed by somebody (its mask allows 2 of the host's 4 CPUs): left alone.
  const PinDecision placed = choosePin(PinMode::kAuto, 1, 8, {2, 3}, 4, 2);
  EXPECT_FALSE(placed.pin);
  EXPECT_NE(placed.why.find("already placed (its mask allows 2 of 4 CPUs)"), std::string::npos)
      << placed.why;
}

TEST(RankPinning, OnBindsWithinTheMaskAndOffNever) {
  // BRAID_PIN_RANKS=1: within the given mask, even with cores to spare.
  for (int r = 0; r < 5; ++r) {
    const PinDecision d = choosePin(PinMode::kOn, r, 5, {4, 6, 9}, 16, 16);
    EXPECT_TRUE(d.pin) << d.why;
    EXPECT_EQ(d.cpu, (std::vector<int>{4, 6, 9})[r % 3]);
  }
  const PinDecision off = choosePin(PinMode::kOff, 0, 64, {0, 1}, 2, 2);
  EXPECT_FALSE(off.pin);
  EXPECT_EQ(off.why, "BRAID_PIN_RANKS=0");
  EXPECT_FALSE(choosePin(PinMode::kOn, 0, 2, {}, 2, 2).pin);  // no mask read: nothing to choose
}

}  // namespace
}  // namespace braid
